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
# LeakSanitizer's own tracer can crash while it stops the process's threads at exit
# ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal error": LLVM's
# StopTheWorld racing a PoCL or OpenMP thread, seen once in test_lowp_matmul after all its
# cases had passed; 6 runs alone did not repeat it). That is the sanitizer failing, not a leak
# found, so when every failed test failed that way, those tests run once more, under the
# same sanitizers and leak checking; any other failure stands as it is.
t="$dir/Testing/Temporary"
if [ "$rc" -ne 0 ] && [ "$dir" = build-asan ] && [ -s "$t/LastTestsFailed.log" ]; then
  nfail=$(wc -l <"$t/LastTestsFailed.log")
  ntracer=$(grep -c "LeakSanitizer has encountered a fatal error" "$t/LastTest.log" || true)
  if [ "$nfail" -eq "$ntracer" ]; then
    echo "sanitize: $nfail test(s) stopped by LeakSanitizer's tracer crashing (not a leak report):" \
         "$(cut -d: -f2 "$t/LastTestsFailed.log" | tr '\n' ' ')- running them once more"
    cp "$t/LastTest.log" "$t/FirstTry.log" # the whole run's log: its skips are listed below
    skiplog="$t/FirstTry.log"
    rc=0
    ctest --test-dir "$dir" --output-on-failure --rerun-failed || rc=$?
  fi
fi
scripts/list_skips.sh "${skiplog:-$t/LastTest.log}"
exit "$rc"
