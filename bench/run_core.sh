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
ratio() { echo "$1 $2" | awk '{ printf "%.2f", $1 / $2 }'; }
echo "C loop a[i] = b[i] + c[i] over 64M floats (restrict, -O2), timed alongside ember's kernels:" \
    "$(get "$EM" stream_gbs_t1) and $(get "$EM" stream_gbs_t2) GB/s; ratios use the larger"
STREAM=$(echo "$(get "$EM" stream_gbs_t1) $(get "$EM" stream_gbs_t2)" | awk '{ print ($1 > $2 ? $1 : $2) }')
echo "times in ns (lower is better), bandwidths in GB/s at 12 bytes per element (higher is better)"
printf '%-18s %3s %10s %10s %14s %12s %12s\n' measure thr ember pytorch ember/pytorch "ember/strm" "torch/strm"
for k in tiny_add_ns linear16_ns add_out_gbs add_inplace_gbs add_gbs; do
    for t in 1 2; do
        e=$(get "$EM" "${k}_t$t"); p=$(get "$PT" "${k}_t$t")
        case $k in
        *_gbs) printf '%-18s %3s %10s %10s %14s %12s %12s\n' "$k" "$t" "$e" "$p" "$(ratio "$e" "$p")" \
                   "$(ratio "$e" "$STREAM")" "$(ratio "$p" "$STREAM")" ;;
        *) printf '%-18s %3s %10s %10s %14s\n' "$k" "$t" "$e" "$p" "$(ratio "$e" "$p")" ;;
        esac
    done
done
echo "ember, 2 threads vs 1 (time ratio <= 1 or bandwidth ratio >= 1 means no slower):"
for k in tiny_add_ns linear16_ns add_out_gbs add_inplace_gbs add_gbs; do
    printf '  %-18s %s\n' "$k" "$(ratio "$(get "$EM" "${k}_t2")" "$(get "$EM" "${k}_t1")")"
done
