#!/usr/bin/env bash
# llama-lib.sh: compile llama.cpp and ggml (CPU) from the pinned ollama module
# once per machine, as one static library that every Go build mode links
# (plain, -race, fuzz), and print the folder that holds it.
#
#   scripts/llama-lib.sh            build if missing, print the folder
#   scripts/llama-lib.sh --dir      print the folder only (no build)
#
# The file list and each package's cgo flags come from `go list`, so the
# objects are the ones `go build` of ollama's packages would compile for this
# GOOS/GOARCH, with the same flags: CGO_CPPFLAGS/CGO_CFLAGS/CGO_CXXFLAGS from
# the environment first, then the package's own directives.
#
# The folder is $SHARDD_LLAMA_CACHE/<key>, by default beside Go's build
# cache, $(go env GOCACHE)/shardd-llama/<key>: whatever keeps Go's build
# cache between runs (a CI cache) keeps the library too; Go's own trimming
# leaves it alone. The key hashes this script, the module version, the
# compilers, the flags and the platform, and not the checkout's path, so
# every clone on the machine shares one build.
# Compiler output (pages of third-party warnings) goes to build.log beside it
# and is shown only when V=1 or when a compile fails.
#
# scripts/llama-patches/*.patch are small, documented changes to the module's
# sources (paths relative to the module root). Each is applied to a copy of
# the files it touches, which is compiled in place of the original; a patch
# that no longer applies to the pinned module stops the build.
set -euo pipefail

GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

mod_dir=$($GO list -m -f '{{.Dir}}' github.com/ollama/ollama)
mod_ver=$($GO list -m -f '{{.Version}}' github.com/ollama/ollama)
cc=$($GO env CC)
cxx=$($GO env CXX)
# cmd/go's own compiler flags (-fPIC, -m64, -pthread, ...) less the
# per-invocation file-prefix map.
gccflags=$($GO env GOGCCFLAGS | tr ' ' '\n' | grep -v -e '^-ffile-prefix-map' -e '^$' | tr '\n' ' ')
goos=$($GO env GOOS)
goarch=$($GO env GOARCH)
cppflags=${CGO_CPPFLAGS:-}
cflags=${CGO_CFLAGS:--O2 -g}
cxxflags=${CGO_CXXFLAGS:--O2 -g}

# The packages whose C and C++ files make up the library: llama.cpp's core
# and ggml with its CPU backend. ollama's Go wrapper, common/ and mtmd/ are
# not needed by shardd and are left out.
roots="github.com/ollama/ollama/llama/llama.cpp/src github.com/ollama/ollama/ml/backend/ggml/ggml/src"

key=$( {
	cat "$0"
	echo "$mod_ver $goos $goarch $gccflags"
	echo "cpp=$cppflags"
	echo "c=$cflags"
	echo "cxx=$cxxflags"
	"$cc" --version | head -1
	"$cxx" --version | head -1
	cat "$root"/scripts/llama-patches/*.patch 2>/dev/null
} | sha256sum | cut -c1-16)
out=${SHARDD_LLAMA_CACHE:-$($GO env GOCACHE)/shardd-llama}/$key

if [ "${1:-}" = --dir ]; then
	echo "$out"
	exit 0
fi
if [ -f "$out/libshardd_llama.a" ]; then
	echo "$out"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/shardd-llama.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The patched copies, under $work/src at the module's relative paths.
src=$work/src
for p in "$root"/scripts/llama-patches/*.patch; do
	[ -f "$p" ] || continue
	for rel in $(sed -n 's#^+++ b/\([^[:space:]]*\).*#\1#p' "$p"); do
		# A patched copy of one of the module's headers would reach only the
		# patched sources beside it: the others find the original first (a
		# quoted include looks in the including file's folder), so one
		# build would mix both. New headers are fine.
		case $rel in *.h | *.hpp) if [ -f "$mod_dir/$rel" ]; then
			echo "llama-lib: $(basename "$p") changes the module's header $rel: change the sources that use it instead" >&2
			exit 1
		fi ;;
		esac
		if [ ! -f "$src/$rel" ] && [ -f "$mod_dir/$rel" ]; then # a new file: the patch creates it
			mkdir -p "$src/$(dirname "$rel")"
			cp "$mod_dir/$rel" "$src/$rel"
			chmod u+w "$src/$rel"
		fi
	done
	if ! (cd "$src" && git apply --check "$p" 2>/dev/null && git apply "$p"); then
		echo "llama-lib: $(basename "$p") no longer applies to $mod_ver: update it for the new sources" >&2
		exit 1
	fi
done

# The build's line of the runtime recipe (engine.Recipe), compiled into the
# library so a binary reports what its llama.cpp was made of: the module
# version, the patches applied (names and a hash of their text), the
# compilers and the flags, with -march resolved to the target it means
# here. What the ISA lets ggml use is read from ggml itself at run time.
patches=$(for p in "$root"/scripts/llama-patches/*.patch; do if [ -f "$p" ]; then basename "$p" .patch; fi; done | paste -sd, -)
phash=$(cat "$root"/scripts/llama-patches/*.patch 2>/dev/null | sha256sum | cut -c1-16)
target=$({ "$cc" $cflags -Q --help=target 2>/dev/null || true; } | awk '$1=="-march=" {m=$2} $1=="-mtune=" {t=$2} END {printf "march=%s mtune=%s", m, t}')
opt=$(printf '%s\n' $cflags | { grep -v -e '^-march=' -e '^-mtune=' || true; } | paste -sd' ' -)
optxx=$(printf '%s\n' $cxxflags | { grep -v -e '^-march=' -e '^-mtune=' || true; } | paste -sd' ' -)
defs=$(printf '%s\n' $cppflags | { grep '^-D' || true; } | paste -sd' ' -)
build="llama.cpp $mod_ver patches=${patches:-none}:$phash, cc=$("$cc" --version | head -1), cxx=$("$cxx" --version | head -1), cflags=$opt $target, cxxflags=$optxx${defs:+, $defs}"
build=${build//\\/}
build=${build//\"/}
mkdir -p "$src"
printf 'const char *shardd_llama_build(void) { return "%s"; }\n' "$build" >"$src/shardd_build.c"

# One make rule per object, so `make -j` uses every core (cmd/go compiles a
# package's C files one after another).
mk=$work/Makefile
objs=(); n=1
objs+=("$work/o1-shardd_build.o")
printf '%s: %s\n\t%s -c %s -o %s\n' "$work/o1-shardd_build.o" "$src/shardd_build.c" "$cc $gccflags $cflags" "$src/shardd_build.c" "$work/o1-shardd_build.o" >>"$mk"
while IFS='|' read -r dir cfiles cxxfiles pcpp pcf pcxx; do
	for f in $cfiles $cxxfiles; do
		n=$((n + 1))
		obj=$work/o$n-${f%.*}.o
		objs+=("$obj")
		srcf=$dir/$f
		if [ -f "$src/${dir#"$mod_dir"/}/$f" ]; then
			srcf=$src/${dir#"$mod_dir"/}/$f # patched; includes still resolve through -I $dir
		fi
		case $f in
		*.c) cmd="$cc -I $dir $gccflags $cppflags $pcpp $cflags $pcf" ;;
		*) cmd="$cxx -I $dir $gccflags $cppflags $pcpp $cxxflags $pcxx" ;;
		esac
		printf '%s: %s\n\t%s -c %s -o %s\n' "$obj" "$srcf" "$cmd" "$srcf" "$obj" >>"$mk"
	done
	# Sources a patch adds in a new folder under this package's (the
	# module's nearest folder above them), compiled with its flags.
	rel=${dir#"$mod_dir"/}
	for f in $(cd "$src" 2>/dev/null && find "$rel" -mindepth 2 \( -name '*.c' -o -name '*.cpp' \) 2>/dev/null); do
		[ -f "$mod_dir/$f" ] && continue
		d=$(dirname "$f")
		while [ ! -d "$mod_dir/$d" ]; do d=$(dirname "$d"); done
		[ "$d" = "$rel" ] || continue
		n=$((n + 1))
		obj=$work/o$n-$(basename "${f%.*}").o
		objs+=("$obj")
		case $f in
		*.c) cmd="$cc -I $dir -I $src/$(dirname "$f") $gccflags $cppflags $pcpp $cflags $pcf" ;;
		*) cmd="$cxx -I $dir -I $src/$(dirname "$f") $gccflags $cppflags $pcpp $cxxflags $pcxx" ;;
		esac
		printf '%s: %s\n\t%s -c %s -o %s\n' "$obj" "$src/$f" "$cmd" "$src/$f" "$obj" >>"$mk"
	done
done < <($GO list -deps -f '{{if or .CFiles .CXXFiles}}{{.Dir}}|{{join .CFiles " "}}|{{join .CXXFiles " "}}|{{join .CgoCPPFLAGS " "}}|{{join .CgoCFLAGS " "}}|{{join .CgoCXXFLAGS " "}}{{end}}' $roots | grep -v '^$' | grep "^$mod_dir/")
# Largest sources first, so the long compiles do not start last and leave a
# core idle at the end.
order=$(grep -E '^[^[:space:]]+\.o: ' "$mk" | while read -r o src; do echo "$(stat -c %s "$src") ${o%:}"; done | sort -rn | cut -d' ' -f2 | tr '\n' ' ')
printf 'all: %s\n' "$order" >>"$mk"

jobs=$(nproc 2>/dev/null || echo 2)
echo "llama-lib: compiling llama.cpp and ggml once for this machine ($n files, $jobs jobs; a few minutes on 2 cores) into $out" >&2
mkdir -p "$(dirname "$out")"
log=$work/build.log
if [ "${V:-0}" = 1 ]; then
	make -s -j"$jobs" -f "$mk" all 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
else
	rc=0
	make -s -j"$jobs" -f "$mk" all >"$log" 2>&1 || rc=$?
fi
if [ "$rc" -ne 0 ]; then
	grep -E -B2 -A6 'error' "$log" | head -60 >&2 || tail -40 "$log" >&2
	echo "llama-lib: compile failed (full log: V=1 make ...)" >&2
	exit 1
fi
ar rcs "$work/libshardd_llama.a" "${objs[@]}"
mkdir -p "$work/lib"
mv "$work/libshardd_llama.a" "$log" "$work/lib/"
# A concurrent build that finished first wins; ours is dropped.
mv -T "$work/lib" "$out" 2>/dev/null || true
echo "$out"
