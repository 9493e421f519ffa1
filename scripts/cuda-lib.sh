#!/usr/bin/env bash
# cuda-lib.sh: the CUDA toolkit from PyPI wheels, and ggml's CUDA backend
# compiled from the pinned llama.cpp sources into one static library,
# libshardd_ggml_cuda.a, for `make build-cuda`.
#
#   scripts/cuda-lib.sh --toolkit   fetch the toolkit if missing, print its library folder
#   scripts/cuda-lib.sh             also build the library if missing, print its folder
#   scripts/cuda-lib.sh --dir       print the library's folder only (no build)
#   scripts/cuda-lib.sh --dry-run   print what would be fetched and compiled
#
# CUDA_ARCHS lists the GPU architectures ("80 89 90", the default: A100,
# L4/L40/RTX 40, H100/H200); each is compiled as real code plus the PTX of
# the newest, so a later GPU can JIT it. One architecture compiles about
# three times faster than three.
#
# The toolkit is NVIDIA's CUDA 13 wheels (nvcc, the runtime, cuBLAS, CCCL),
# downloaded with pip (no install, no dependencies) into
# $SHARDD_CUDA_CACHE (default ~/.cache/shardd/cuda) and unpacked there:
# nothing is installed system-wide and nothing is committed. Their CUDA 12
# counterparts ship no nvcc driver (ptxas and libnvvm only), so CUDA 13 it
# is: running the binary needs an NVIDIA driver for CUDA 13 (580 or later).
# CUDA_HOME=/usr/local/cuda uses an installed toolkit (12 or 13) instead:
# nothing is fetched, and the binary runs on that toolkit's driver.
#
# The sources are ggml-cuda's own list (its CMakeLists.txt): every *.cu, and
# of the template instances the flash-attention tiles and MMA kernels, the
# quantized matmuls, and the vector flash attention for f16, bf16, q4_0 and
# q8_0 KV only. Flags are the CMake build's release flags, with GGML_CUDA_NO_VMM
# (no link against the driver library, libcuda, which only a machine with a
# GPU has) and CUDA graphs on. The library lands beside libshardd_llama.a,
# under $(go env GOCACHE)/shardd-llama/, keyed by the sdist's digest, the
# sources, the toolkit, the host compiler and every flag.
set -euo pipefail

GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

toolkit_ver=13.5.37
# name==version of each wheel; the toolkit is these, unpacked together.
wheels="nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37
nvidia-cublas==13.10.0.20 nvidia-cuda-cccl==13.3.5.0.6"
archs=${CUDA_ARCHS:-80 89 90}
cache=${SHARDD_CUDA_CACHE:-$HOME/.cache/shardd/cuda}
tk=$cache/toolkit-$toolkit_ver
# CUDA_HOME: a toolkit already on the machine (CUDA 12 or 13, with nvcc and
# cuBLAS) instead of the wheels, for a GPU machine without network.
if [ -n "${CUDA_HOME:-}" ]; then
	[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "cuda-lib: CUDA_HOME=$CUDA_HOME has no bin/nvcc" >&2; exit 2; }
	tk=$CUDA_HOME
fi

# ggml-cuda's sources come from the pinned llama.cpp sdist (llama-sdist.sh),
# as it ships them: shardd's patches touch none of ggml-cuda's files or the
# headers they include.
src_ver=$(scripts/llama-sdist.sh --version)
tarball=$(scripts/llama-sdist.sh)
ggml_in_tar=$(basename "$tarball" .tar.gz)/vendor/llama.cpp/ggml
ggml=ggml # the extracted copy, under the work folder when compiling
cu=$ggml/src/ggml-cuda
listing=$(tar -tzf "$tarball" "$ggml_in_tar/src/ggml-cuda" | sed "s#^$ggml_in_tar/##")

# The vector flash attention's K-V type pairs, as ggml's CMake compiles
# them by default (GGML_CUDA_FA_QUANTS); fattn.cu reads, for every pair of
# its types, GGML_CUDA_FA_<K>_<V>: 1 for these, 0 for the others.
fa_pairs="q4_0-q4_0 q8_0-q8_0 f16-f16 bf16-bf16"
fa_defs=""
for v in q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16; do
	for k in q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16; do
		on=0
		case " $fa_pairs " in *" $k-$v "*) on=1 ;; esac
		fa_defs="$fa_defs -DGGML_CUDA_FA_$(echo "${k}_$v" | tr '[:lower:]' '[:upper:]')=$on"
	done
done

sources() {
	local t=src/ggml-cuda/template-instances
	echo "$listing" | grep -E "^src/ggml-cuda/[^/]*\.cu\$" || true
	echo "$listing" | grep -E "^$t/(fattn-tile|fattn-mma|mmq|mmf)[^/]*\.cu\$" || true
	echo "$listing" | grep -E "^$t/fattn-vec-instance-(${fa_pairs// /|})\.cu\$" || true
}

# Checked here, not in gencode: an exit in a command substitution would
# not stop the script.
for a in $archs; do
	case $a in *[!0-9]*) echo "cuda-lib: CUDA_ARCHS must be numbers such as 90, not $a" >&2; exit 2 ;; esac
done
[ -n "${archs// /}" ] || { echo "cuda-lib: CUDA_ARCHS is empty" >&2; exit 2; }

gencode() {
	local a last=""
	for a in $archs; do
		printf -- '-gencode=arch=compute_%s,code=sm_%s ' "$a" "$a"
		last=$a
	done
	printf -- '-gencode=arch=compute_%s,code=compute_%s' "$last" "$last"
}

# tklib is the toolkit's library folder (lib64 in NVIDIA's installs).
tklib() {
	if [ -d "$tk/lib64" ]; then echo "$tk/lib64"; else echo "$tk/lib"; fi
}

defs="-DNDEBUG -DGGML_USE_CUDA -DGGML_CUDA_NO_VMM -DGGML_CUDA_USE_GRAPHS -DGGML_CUDA_PEER_MAX_BATCH_SIZE=128 -DGGML_VERSION=0x0 -DGGML_COMMIT=0x0$fa_defs"
nvflags="-O3 -std=c++17 -use_fast_math -extended-lambda -Xcompiler -fPIC,-Wno-pedantic"

if [ "${1:-}" = --dry-run ]; then
	if [ -n "${CUDA_HOME:-}" ]; then echo "toolkit: $tk (CUDA_HOME)"; else echo "toolkit: $tk (CUDA $toolkit_ver), wheels: $(echo $wheels)"; fi
	echo "architectures: $archs ($(gencode))"
	echo "sources: $(sources | wc -l) files from $cu"
	echo "nvcc $nvflags $defs -I$ggml/include -I$ggml/src -I$cu -c FILE.cu"
	exit 0
fi

# fetch_toolkit downloads and unpacks the wheels once.
fetch_toolkit() {
	[ -x "$tk/bin/nvcc" ] && return 0
	if [ -n "${CUDA_HOME:-}" ]; then return 0; fi
	local pip
	if command -v pip3 >/dev/null 2>&1; then pip="pip3"
	elif python3 -m pip --version >/dev/null 2>&1; then pip="python3 -m pip"
	else echo "cuda-lib: pip is needed to fetch the CUDA wheels (apt-get install python3-pip)" >&2; exit 1
	fi
	echo "cuda-lib: fetching the CUDA $toolkit_ver toolkit wheels (about 570 MB) into $cache" >&2
	mkdir -p "$cache/wheels"
	# shellcheck disable=SC2086
	$pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 -d "$cache/wheels" $wheels >&2
	local tmp
	tmp=$(mktemp -d "$cache/toolkit.XXXXXX")
	local w name
	for w in $wheels; do
		name=$(echo "${w%%==*}" | tr - _)
		unzip -q -o "$cache/wheels/${name}-${w##*==}-"*.whl 'nvidia/*' -d "$tmp"
	done
	chmod +x "$tmp"/nvidia/cu13/bin/* "$tmp"/nvidia/cu13/nvvm/bin/*
	# Unversioned names for the linker (-lcublas finds libcublas.so).
	local so
	for so in "$tmp"/nvidia/cu13/lib/lib*.so.*; do
		ln -sf "$(basename "$so")" "${so%.so.*}.so"
	done
	rm -rf "$tk"
	mv "$tmp/nvidia/cu13" "$tk"
	rm -rf "$tmp" "$cache/wheels"
}

fetch_toolkit
if [ "${1:-}" = --toolkit ]; then
	tklib # the library folder: what the link needs
	exit 0
fi

nvcc=$tk/bin/nvcc
# Compressed device code from CUDA 12.8 on, as ggml's CMake build does.
ver=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
if [ "${ver% *}" -gt 12 ] || { [ "${ver% *}" -eq 12 ] && [ "${ver#* }" -ge 8 ]; }; then
	nvflags="$nvflags -compress-mode=size"
fi
cxx=$($GO env CXX)
gc=$(gencode)
# The key is what the objects are made of: the sdist, the sources, the
# compiler and host compiler, every flag (not this script's text, so a
# comment does not cost a 17-minute rebuild).
key=$( {
	echo "$src_ver"
	sources | xargs -n1 basename
	"$nvcc" --version | tail -1
	"$cxx" --version | head -1
	echo "$nvflags $gc $defs"
} | sha256sum | cut -c1-16)
out=${SHARDD_LLAMA_CACHE:-$($GO env GOCACHE)/shardd-llama}/cuda-$key

if [ "${1:-}" = --dir ]; then
	echo "$out"
	exit 0
fi
if [ -f "$out/libshardd_ggml_cuda.a" ]; then
	echo "$out"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/shardd-cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT
mk=$work/Makefile
objs=()
n=0
# Largest sources first (the template instances are the long compiles).
mkdir -p "$work/ggml"
tar -xzf "$tarball" -C "$work/ggml" --strip-components=4 "$ggml_in_tar/include" "$ggml_in_tar/src"
ggml=$work/ggml
cu=$ggml/src/ggml-cuda
for f in $(sources | sed "s#^#$ggml/#" | xargs stat -c '%s %n' | sort -rn | cut -d' ' -f2); do
	n=$((n + 1))
	obj=$work/o$n-$(basename "${f%.cu}").o
	objs+=("$obj")
	printf '%s: %s\n\t%s -ccbin %s %s %s %s -I%s/include -I%s/src -I%s -c %s -o %s\n' "$obj" "$f" \
		"$nvcc" "$cxx" "$nvflags" "$gc" "$defs" "$ggml" "$ggml" "$cu" "$f" "$obj" >>"$mk"
done
printf 'all: %s\n' "${objs[*]}" >>"$mk"

jobs=$(nproc 2>/dev/null || echo 2)
echo "cuda-lib: compiling ggml's CUDA backend for sm_${archs// /, sm_} ($n files, $jobs jobs; README: how long) into $out" >&2
log=$work/build.log
rc=0
if [ "${V:-0}" = 1 ]; then
	make -s -j"$jobs" -f "$mk" all 2>&1 | tee "$log" || rc=$?
else
	make -s -j"$jobs" -f "$mk" all >"$log" 2>&1 || rc=$?
fi
if [ "$rc" -ne 0 ]; then
	grep -E -B2 -A6 'error' "$log" | head -60 >&2 || tail -40 "$log" >&2
	echo "cuda-lib: compile failed (full log: V=1)" >&2
	exit 1
fi
ar rcs "$work/libshardd_ggml_cuda.a" "${objs[@]}"
mkdir -p "$work/lib" "$(dirname "$out")"
mv "$work/libshardd_ggml_cuda.a" "$log" "$work/lib/"
mv -T "$work/lib" "$out" 2>/dev/null || true
echo "$out"
