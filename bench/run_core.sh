#!/bin/sh
# Core op benchmark: Ember (bench/core_ops.c) and PyTorch (bench/core_ops_torch.py) in
# one run, side by side, with ratios. Usage: bench/run_core.sh [build-dir]  (a Release build)
# TORCH_PYTHON: the Python interpreters whose PyTorch to compare, space-separated (default
# /usr/bin/python3, Debian's 1.13), e.g. TORCH_PYTHON="/usr/bin/python3 /work/venv-torch/bin/python"
# for 1.13 and 2.x in one run: one table each; one without torch is reported as missing.
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
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
get() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
ratio() { echo "$1 $2" | awk '{ printf "%.2f", $1 / $2 }'; }
echo "C loop a[i] = b[i] + c[i] over 64M floats (restrict, -O2), timed alongside ember's kernels:" \
    "$(get "$EM" stream_gbs_t1) and $(get "$EM" stream_gbs_t2) GB/s; ratios use the larger"
STREAM=$(echo "$(get "$EM" stream_gbs_t1) $(get "$EM" stream_gbs_t2)" | awk '{ print ($1 > $2 ? $1 : $2) }')
echo "times in ns (lower is better), bandwidths in GB/s at 12 bytes per element (higher is better)"
for py in $TORCH_PYTHON; do
if ! v=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "PyTorch MISSING for $py: not compared"
    continue
fi
"$py" bench/core_ops_torch.py --threads 1 >"$PT"
"$py" bench/core_ops_torch.py --threads 2 >>"$PT"
echo
echo "against PyTorch $v ($py):"
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
done
echo "ember, 2 threads vs 1 (time ratio <= 1 or bandwidth ratio >= 1 means no slower):"
for k in tiny_add_ns linear16_ns add_out_gbs add_inplace_gbs add_gbs; do
    printf '  %-18s %s\n' "$k" "$(ratio "$(get "$EM" "${k}_t2")" "$(get "$EM" "${k}_t1")")"
done
