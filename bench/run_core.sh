#!/bin/sh
# Core op benchmark: Ember (bench/core_ops.c) and PyTorch 1.13 (bench/core_ops_torch.py) in
# one run, side by side, with ratios. Usage: bench/run_core.sh [build-dir]  (a Release build)
set -eu
BUILD=${1:-build-release}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/bench_core_ops" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target bench_core_ops >/dev/null
fi
EM=$(mktemp)
PT=$(mktemp)
trap 'rm -f "$EM" "$PT"' EXIT
"$BUILD/bench_core_ops" >"$EM"
/usr/bin/python3 bench/core_ops_torch.py --threads 1 >"$PT"
/usr/bin/python3 bench/core_ops_torch.py --threads 2 >>"$PT"
get() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
STREAM=$(get "$EM" stream_gbs)
echo "C stream loop a[i] = b[i] + c[i], 64M floats: $STREAM GB/s"
printf '%-34s %12s %12s %12s\n' "measure" "ember" "pytorch" "ratio"
for t in 1 2; do
    for k in tiny_add_ns linear16_ns; do
        e=$(get "$EM" "${k}_t$t"); p=$(get "$PT" "${k}_t$t")
        printf '%-34s %12s %12s %11.3fx\n' "$k (threads=$t; ember/pytorch)" "$e" "$p" "$(echo "$e / $p" | bc -l)"
    done
    for k in add_inplace_gbs add_gbs; do
        e=$(get "$EM" "${k}_t$t"); p=$(get "$PT" "${k}_t$t")
        printf '%-34s %12s %12s %11.3fx\n' "$k (threads=$t; ember/pytorch)" "$e" "$p" "$(echo "$e / $p" | bc -l)"
        printf '%-34s %12s %12s\n' "  as a fraction of stream" "$(echo "$e / $STREAM" | bc -l | cut -c1-5)" \
            "$(echo "$p / $STREAM" | bc -l | cut -c1-5)"
    done
done
