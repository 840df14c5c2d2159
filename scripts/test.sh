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
  # so only the full unwinder names them. intercept_tls_get_addr=0: GCC 12's runtime (up to
  # GCC 13 and LLVM 16) takes a thread's dynamically allocated TLS block (a dlopen'd library's
  # __thread data: PoCL's, Open MPI's components') that happens to start 16 bytes into a page
  # for glibc 2.19's layout, reads the two words before it as that block's bounds, and its
  # leak checker's tracer then dies scanning them ("Tracer caught signal 11"; the sanitizers'
  # report "Detecting GLIBC version (DTLS SIGSEGV)"). Where the heap's layout puts a block
  # there, every run of that test does it.
  # Without the interceptor those blocks are ordinary heap blocks, reached from the thread's
  # DTV like any other, so a leak is still found.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0 \
         LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  dir=build
  scripts/build.sh "$dir"
fi
rc=0
ctest --test-dir "$dir" --output-on-failure -j2 || rc=$?
# LeakSanitizer's own tracer can still crash while it stops the process's threads at exit
# ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal error") for reasons
# other than the TLS guess above (LLVM's StopTheWorld racing a thread that is ending). That is
# the sanitizer failing, not a leak found, so while every failed test failed that way, those
# tests run again, under the same sanitizers and leak checking, up to three times; any other
# failure stands as it is. A crash that comes back on every try (as the TLS guess's did: it
# follows the heap's layout) still fails; test_sanitizer_leaks checks that the options above
# keep the tracer alive on a dlopen'd library's thread-local block and still find a leak.
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
