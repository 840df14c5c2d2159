#!/usr/bin/env bash
# ThreadSanitizer: builds build-tsan (EMBER_SANITIZE=thread) and runs the threaded tests
# under it: the stress test (threads creating, computing on and freeing tensors on the CPU
# and OpenCL, sharing read-only tensors, raising errors on one thread), the CPU worker pool
# and the data loader's prefetch thread, DataParallel's replica threads, the low-precision GEMMs
# (oneDNN's cache and the AMX kernel's buffer pool, called from several threads at once), the
# bf16 GEMV split over the worker pool, and one tokenizer encoding on several threads at once.
# Any report fails the script. The stress test runs twice: linked with the static library, as
# ctest builds it, and with the shared one (libember.so), whose loading runs code the static
# link never does (ifunc resolvers, constructors) and has crashed before main under TSan.
# Usage: scripts/tsan.sh [stress rounds per thread (40)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-40}"
tests=(test_threads_stress test_cpu_threads test_data_loader test_data_parallel test_lowp_matmul test_cpu_gemv test_tokenizer)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DEMBER_SANITIZE=thread -DEMBER_WERROR=ON >/dev/null
cmake --build build-tsan -j"$(nproc)" --target "${tests[@]}" ember
# the stress test over libember.so: it uses the public API only, so it links as a user's program does
${CC:-cc} -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=thread -fno-omit-frame-pointer -Iinclude -Itests \
  tests/test_threads_stress.c -o build-tsan/test_threads_stress_shared \
  -Lbuild-tsan -lember -Wl,-rpath,"$PWD/build-tsan" -lpthread -lm
tests+=(test_threads_stress_shared)
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
export EMBER_STRESS_ROUNDS="$rounds" EMBER_TEST_DATA="$PWD/tests/data"
status=0
for t in "${tests[@]}"; do
  echo "== $t (ThreadSanitizer)"
  if ! build-tsan/"$t"; then echo "$t FAILED under ThreadSanitizer"; status=1; fi
done
# The check of the check: a deliberate race (a shared tensor written in place by one thread
# and read by another with nothing ordering the two, so it is a race on every run whatever
# the timing) must be reported, or this TSan build sees nothing.
echo "== test_threads_stress with a deliberate race (must be reported)"
if EMBER_STRESS_RACE=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66 report_thread_leaks=0" \
     build-tsan/test_threads_stress >/dev/null 2>build-tsan/race.log; then
  echo "ThreadSanitizer did not report the deliberate race"; status=1
elif ! grep -q "WARNING: ThreadSanitizer: data race" build-tsan/race.log; then
  echo "the deliberate race run failed without a ThreadSanitizer report:"; tail -5 build-tsan/race.log; status=1
else
  echo "reported, as it must be"
fi
exit $status
