#!/usr/bin/env bash
# llama-lib.sh: compile llama.cpp and ggml (CPU) once per machine, as one
# static library that every Go build mode links (plain, -race, fuzz), and
# print the folder that holds it.
#
#   scripts/llama-lib.sh            build if missing, print the folder
#   scripts/llama-lib.sh --dir      print the folder only (no build)
#
# The source is llama.cpp as the pinned sdist llama-cpp-python==0.3.36
# vendors it (October 2026; scripts/llama-sdist.sh fetches it and checks its
# SHA-256), with scripts/llama-patches/*.patch applied in name order. Each
# patch is a small, documented change; a patch that no longer applies, or
# applies only at other lines than it names, stops the build.
# CMake builds the targets llama, ggml, ggml-base and ggml-cpu (Release,
# static, no OpenMP), whose archives are combined into libshardd_llama.a.
# The instruction set comes from CGO_CFLAGS / CGO_CXXFLAGS (-march=...),
# not from ggml's own detection, so `make build MARCH=x86-64-v3` builds for
# that target. Of CGO_CPPFLAGS only the -D definitions are used
# (make build-cuda passes -DGGML_USE_CUDA).
#
# The folder, $SHARDD_LLAMA_CACHE/<key> (by default beside Go's build cache,
# $(go env GOCACHE)/shardd-llama/<key>), holds:
#   libshardd_llama.a   the library
#   include/            llama.h and ggml's public headers, for cgo
#   build.log           the compiler's output
# Whatever keeps Go's build cache between runs (a CI cache) keeps the
# library too; Go's own trimming leaves it alone. The key hashes this
# script, the sdist's digest, the patches, the compilers, the flags and the
# platform, and not the checkout's path, so every clone on the machine
# shares one build. Compiler output goes to build.log and is shown only when
# V=1 or when a compile fails.
set -euo pipefail

GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

sdist=$(scripts/llama-sdist.sh --version) # "llama-cpp-python-VERSION SHA256"
cc=$($GO env CC)
cxx=$($GO env CXX)
goos=$($GO env GOOS)
goarch=$($GO env GOARCH)
defs=$(printf '%s\n' ${CGO_CPPFLAGS:-} | { grep '^-D' || true; } | paste -sd' ' -)
cflags=${CGO_CFLAGS:--O2 -g}
cxxflags=${CGO_CXXFLAGS:--O2 -g}

key=$( {
	cat "$0"
	echo "$sdist $goos $goarch"
	echo "defs=$defs"
	echo "c=$cflags"
	echo "cxx=$cxxflags"
	"$cc" --version | head -1
	"$cxx" --version | head -1
	cmake --version 2>/dev/null | head -1
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
command -v cmake >/dev/null 2>&1 || {
	echo "llama-lib: cmake is not installed (make deps installs it)" >&2
	exit 1
}
tarball=$(scripts/llama-sdist.sh)

work=$(mktemp -d "${TMPDIR:-/tmp}/shardd-llama.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The parts of the tree a library build reads, patched.
tree=$work/tree
mkdir -p "$tree" "$work/lib"
top=$(basename "$tarball" .tar.gz) # the sdist's one top folder
parts=(CMakeLists.txt LICENSE cmake ggml include src vendor)
tar -xzf "$tarball" -C "$tree" --strip-components=3 "${parts[@]/#/$top/vendor/llama.cpp/}"
# Each hunk must apply at the line it names: a hunk that applies only
# somewhere else may have found the same text in another function (a
# class's matmul copied into a new class did that once), so an offset
# stops the build as a failure does.
for p in "$root"/scripts/llama-patches/*.patch; do
	[ -f "$p" ] || continue
	if ! dry=$(cd "$tree" && patch -p1 --dry-run -F0 <"$p" 2>&1); then
		echo "llama-lib: $(basename "$p") no longer applies to ${sdist% *}'s llama.cpp: update it for the new sources" >&2
		exit 1
	fi
	if moved=$(echo "$dry" | grep -E 'offset|fuzz'); then
		echo "llama-lib: $(basename "$p") applies only elsewhere than it says ($moved): check where it lands, then update it" >&2
		exit 1
	fi
	(cd "$tree" && patch -p1 -F0 -s <"$p")
done

# The build's line of the runtime recipe (engine.Recipe), compiled into the
# library so a binary reports what its llama.cpp was made of: the source
# (the sdist and the start of its digest), the patches applied (names and a
# hash of their text), the compilers and the flags, with -march resolved to
# the target it means here. What the ISA lets ggml use is read from ggml
# itself at run time.
patches=$(for p in "$root"/scripts/llama-patches/*.patch; do if [ -f "$p" ]; then basename "$p" .patch; fi; done | paste -sd, -)
phash=$(cat "$root"/scripts/llama-patches/*.patch 2>/dev/null | sha256sum | cut -c1-16)
target=$({ "$cc" $cflags -Q --help=target 2>/dev/null || true; } | awk '$1=="-march=" {m=$2} $1=="-mtune=" {t=$2} END {printf "march=%s mtune=%s", m, t}')
opt=$(printf '%s\n' $cflags | { grep -v -e '^-march=' -e '^-mtune=' || true; } | paste -sd' ' -)
optxx=$(printf '%s\n' $cxxflags | { grep -v -e '^-march=' -e '^-mtune=' || true; } | paste -sd' ' -)
src_id=$(echo "$sdist" | awk '{print $1 "@" substr($2, 1, 16)}')
build="llama.cpp $src_id patches=${patches:-none}:$phash, cc=$("$cc" --version | head -1), cxx=$("$cxx" --version | head -1), cflags=$opt $target, cxxflags=$optxx${defs:+, $defs}"
build=${build//\\/}
build=${build//\"/}
printf 'const char *shardd_llama_build(void) { return "%s"; }\n' "$build" >"$work/shardd_build.c"

jobs=$(nproc 2>/dev/null || echo 2)
echo "llama-lib: compiling llama.cpp and ggml once for this machine ($jobs jobs; a few minutes on 2 cores) into $out" >&2
log=$work/lib/build.log
# Release adds -O3 -DNDEBUG after our flags; ggml's instruction-set options
# are off so that -march in our flags alone decides.
cfg=(
	-S "$tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release
	-DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
	-DCMAKE_C_FLAGS="$defs $cflags" -DCMAKE_CXX_FLAGS="$defs $cxxflags"
	-DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF
	-DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF
	-DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF
	-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF
)
rc=0
{
	cmake "${cfg[@]}" &&
		cmake --build "$work/build" -j "$jobs" --target llama ggml ggml-base ggml-cpu &&
		"$cc" $defs $cflags -fPIC -c "$work/shardd_build.c" -o "$work/shardd_build.o"
} >"$log" 2>&1 || rc=$?
if [ "${V:-0}" = 1 ]; then cat "$log" >&2; fi
if [ "$rc" -ne 0 ]; then
	grep -E -B2 -A6 'error' "$log" | head -60 >&2 || tail -40 "$log" >&2
	echo "llama-lib: compile failed (full log: V=1 make ...)" >&2
	exit 1
fi
libs=()
for t in libllama.a libggml.a libggml-base.a libggml-cpu.a; do
	f=$(find "$work/build" -name "$t" -print -quit)
	[ -n "$f" ] || {
		echo "llama-lib: the build made no $t" >&2
		exit 1
	}
	libs+=("$f")
done
{
	echo "CREATE $work/lib/libshardd_llama.a"
	for f in "${libs[@]}"; do echo "ADDLIB $f"; done
	echo "ADDMOD $work/shardd_build.o"
	echo SAVE
	echo END
} | ar -M
ranlib "$work/lib/libshardd_llama.a"
mkdir -p "$work/lib/include"
cp "$tree"/include/*.h "$tree"/ggml/include/*.h "$work/lib/include/"
mkdir -p "$(dirname "$out")"
# A concurrent build that finished first wins; ours is dropped.
mv -T "$work/lib" "$out" 2>/dev/null || true
echo "$out"
