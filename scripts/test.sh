#!/usr/bin/env bash
# Builds Ember and runs the whole test suite (unit, conformance, golden, examples).
# Usage: scripts/test.sh              release build in build/
#        scripts/test.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  EMBER_BUILD_TYPE=Debug scripts/build.sh build-asan -DEMBER_SANITIZE=ON
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir build-asan --output-on-failure -j2
else
  scripts/build.sh build
  ctest --test-dir build --output-on-failure -j2
fi
