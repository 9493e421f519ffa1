#!/usr/bin/env bash
# llama-sdist.sh: fetch the llama.cpp source shardd builds on, once, and
# print the path of the tarball.
#
# The source is the tree the PyPI sdist llama-cpp-python==0.3.36 vendors
# (vendor/llama.cpp, October 2026), pinned here by the sdist's SHA-256. pip
# downloads the sdist (no install, no dependencies) into
# ${SHARDD_UPSTREAM:-~/.cache/shardd/upstream}/sdist, like the models; a
# tarball whose digest differs is removed and the script fails. Nothing
# lands in git. Used by llama-lib.sh (shardd's own library) and
# upstream-llama.sh (upstream's binaries, for side-by-side figures).
#
#   llama-sdist.sh            fetch if missing, check, print the path
#   llama-sdist.sh --version  print "llama-cpp-python-VERSION SHA256" only
set -euo pipefail

version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

if [ "${1:-}" = --version ]; then
	echo "llama-cpp-python-$version $sha256"
	exit 0
fi

dir=${SHARDD_UPSTREAM:-$HOME/.cache/shardd/upstream}/sdist
tarball=$dir/llama_cpp_python-$version.tar.gz
if [ -f "$tarball" ] && [ -f "$tarball.sha256" ] && [ "$(cat "$tarball.sha256")" = "$sha256" ] && [ ! "$tarball" -nt "$tarball.sha256" ]; then
	echo "$tarball"
	exit 0
fi
mkdir -p "$dir"
if [ ! -f "$tarball" ]; then
	echo "llama-sdist: fetching llama-cpp-python==$version (sdist, llama.cpp's source)" >&2
	if command -v pip3 >/dev/null 2>&1; then pip=(pip3); else pip=(python3 -m pip); fi
	"${pip[@]}" download --quiet --disable-pip-version-check --no-deps --no-binary=:all: \
		-d "$dir" "llama-cpp-python==$version" >&2 || {
		echo "llama-sdist: could not download the llama-cpp-python==$version sdist with pip; see the error above" >&2
		exit 1
	}
fi
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
	rm -f "$tarball" "$tarball.sha256"
	echo "llama-sdist: $tarball has SHA-256 $got, want $sha256 (removed)" >&2
	exit 1
fi
echo "$sha256" >"$tarball.sha256"
echo "$tarball"
