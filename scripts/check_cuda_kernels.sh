#!/usr/bin/env bash
# Proves, without a GPU, that Ember's CUDA kernels build: every shared kernel program
# (src/kernels/*.k as the CUDA backend assembles it) through NVRTC to PTX for compute_80 and
# compute_90, ptxas on that PTX for sm_80 and sm_90, then every op's argument list checked
# against the compiled kernels' parameters (tests/test_cuda_marshal.c).
# CI runs the same two tests through ctest, where a kernel disk cache may make them quick;
# this script runs them fresh, in an empty cache. Fails (non-zero) on any error, and when
# NVRTC cannot be found.
# Usage: scripts/check_cuda_kernels.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
[ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-Release}" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target test_cuda_kernels_compile test_cuda_marshal >/dev/null
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
export EMBER_CACHE_DIR="$cache"
EMBER_CUDA_CHECK_FRESH=1 "$dir/test_cuda_kernels_compile"
"$dir/test_cuda_marshal"
