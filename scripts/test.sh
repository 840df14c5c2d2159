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
  # other libraries' own leaks are suppressed (tests/lsan.supp: Open MPI, PoCL's kernel
  # compiler, the sanitizer's own start of a thread); they are built without frame pointers,
  # so only the full unwinder names them
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0 \
         LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  dir=build
  scripts/build.sh "$dir"
fi
rc=0
ctest --test-dir "$dir" --output-on-failure -j2 || rc=$?
# LeakSanitizer's own tracer can crash while it stops the process's threads at exit
# ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal error": LLVM's
# StopTheWorld racing a PoCL or OpenMP thread that is ending, after all of the test's cases
# passed; seen in test_lowp_matmul and test_estimate_measured, more often on a loaded
# machine: 1 run in 3 of the latter with other builds running). That is the sanitizer
# failing, not a leak found, so while every failed test failed that way, those tests run
# again, under the same sanitizers and leak checking, up to three times; any other failure
# stands as it is.
t="$dir/Testing/Temporary"
tries=0
while [ "$rc" -ne 0 ] && [ "$dir" = build-asan ] && [ "$tries" -lt 3 ] && [ -s "$t/LastTestsFailed.log" ]; do
  nfail=$(wc -l <"$t/LastTestsFailed.log")
  # the failed tests whose output has no tracer crash: counted by test, not by line (a
  # multi-rank test may print the message once per rank, and again among the reasons first)
  others=$(awk '/^[0-9]+\/[0-9]+ Testing: /{ name = $3 }
                /LeakSanitizer has encountered a fatal error/ && name != "" { crashed[name] = 1 }
                FILENAME == ARGV[2] { split($0, f, ":"); if (!(f[2] in crashed)) n++ }
                END { print n + 0 }' "$t/LastTest.log" "$t/LastTestsFailed.log")
  [ "$others" -eq 0 ] || break
  echo "sanitize: $nfail test(s) stopped by LeakSanitizer's tracer crashing (not a leak report):" \
       "$(cut -d: -f2 "$t/LastTestsFailed.log" | tr '\n' ' ')- running them once more"
  # the whole first run's log: its skips are listed below
  if [ "$tries" -eq 0 ]; then cp "$t/LastTest.log" "$t/FirstTry.log"; skiplog="$t/FirstTry.log"; fi
  tries=$((tries + 1))
  rc=0
  ctest --test-dir "$dir" --output-on-failure --rerun-failed || rc=$?
done
scripts/list_skips.sh "${skiplog:-$t/LastTest.log}"
exit "$rc"
