#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.c) with clang, ASan and UBSan, the library
# instrumented for coverage, and runs each for N seconds on a working corpus seeded from
# fuzz/corpus/<parser>/. Crashes are saved in fuzz-corpus/artifacts/ and fail the script.
# Each target's line ends with libFuzzer's final figures: executions (#N), cov (edges covered)
# and ft (features); docs/ROBUSTNESS.md records them. CI runs scripts/fuzz.sh 20.
# Usage: scripts/fuzz.sh [seconds-per-target (60)] [target ...]   e.g. scripts/fuzz.sh 10 fuzz_npy
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"; shift || true
if (($#)); then targets=("$@"); else
  targets=(); for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DEMBER_FUZZ=ON -DEMBER_WERROR=ON \
  -DCMAKE_C_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
cmake --build build-fuzz -j2 --target "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p fuzz-corpus/artifacts
status=0
for t in "${targets[@]}"; do
  kind="${t#fuzz_}"
  mkdir -p "fuzz-corpus/$kind"
  echo "== $t: ${secs}s"
  if ! build-fuzz/"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="fuzz-corpus/artifacts/$t-" -print_final_stats=1 \
       "fuzz-corpus/$kind" "fuzz/corpus/$kind" 2> "fuzz-corpus/$t.log"; then
    echo "$t FAILED: see fuzz-corpus/$t.log and fuzz-corpus/artifacts/"; status=1
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+.*DONE)" "fuzz-corpus/$t.log" | tr '\n' ' '; echo
done
exit $status
