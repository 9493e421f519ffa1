#!/usr/bin/env bash
# make upstream: build upstream llama.cpp's llama-server, rpc-server
# (ggml-rpc-server), llama-batched-bench and llama-bench once, for
# side-by-side figures (issues 42 and 44).
#   upstream-llama.sh [DIR]   (default: $SHARDD_UPSTREAM, else ~/.cache/shardd/upstream)
#
# The llama.cpp tree is the one the PyPI sdist llama-cpp-python==0.3.36
# vendors (vendor/llama.cpp, October 2026), as shardd's own library is
# (scripts/llama-sdist.sh fetches it and checks its digest), here without
# shardd's patches. The tree is unpacked and built with CMake (Release,
# -march=native like the project's own library, CPU only, RPC on). A build whose binaries
# are there is skipped, so a rerun does nothing. Nothing lands in git.
#
# Prints the bin directory. Exits non-zero with
# the error when the sdist cannot be fetched or the build fails.
set -euo pipefail

dir=${1:-${SHARDD_UPSTREAM:-$HOME/.cache/shardd/upstream}}
out="$dir/$("$(dirname "$0")/llama-sdist.sh" --version | cut -d' ' -f1)" # llama-cpp-python-VERSION
bin="$out/build/bin"
targets="llama-server ggml-rpc-server llama-batched-bench llama-bench"
missing=0
for t in $targets; do [ -x "$bin/$t" ] || missing=1; done
if [ $missing = 0 ]; then
  echo "$bin"; exit 0
fi
# A build from before a target was added: back to the path CMake's cache
# names, where only the missing targets are built.
if [ -d "$out" ] && [ ! -d "$out.tmp" ]; then
  mv "$out" "$out.tmp"
fi
tarball=$(SHARDD_UPSTREAM=$dir "$(dirname "$0")/llama-sdist.sh")
# An earlier build stopped part way is resumed (CMake rebuilds only what
# is missing).
if [ ! -f "$out.tmp/vendor/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  tar -xzf "$tarball" -C "$out.tmp" --strip-components=1
fi
src="$out.tmp/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "upstream: the sdist has no vendor/llama.cpp" >&2; exit 1; }
jobs=$(nproc)
cmake -S "$src" -B "$out.tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_RPC=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
# shellcheck disable=SC2086 # the target list splits on purpose
cmake --build "$out.tmp/build" -j "$jobs" --target $targets >&2
rm -rf "$out"
mv "$out.tmp" "$out"
# CMake's cache names the tree it was configured in; the binaries are static
# and do not.
echo "$bin"
