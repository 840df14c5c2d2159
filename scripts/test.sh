#!/usr/bin/env bash
# Builds Ember and runs the whole test suite (unit, conformance, golden, examples), then
# lists every skipped test and case with its reason (a skip is never counted as a pass).
# Usage: scripts/test.sh              release build in build/
#        scripts/test.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-asan
  EMBER_BUILD_TYPE=Debug scripts/build.sh "$dir" -DEMBER_SANITIZE=ON
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  dir=build
  scripts/build.sh "$dir"
fi
rc=0
ctest --test-dir "$dir" --output-on-failure -j2 || rc=$?
scripts/list_skips.sh "$dir/Testing/Temporary/LastTest.log"
exit "$rc"
