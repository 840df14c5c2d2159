#!/bin/sh
# CNN benchmark: `ember train --model cnn` against PyTorch (bench/train_cnn_torch.py)
# in one run, same machine, same network, same batch order (checked against Ember's loader),
# Adam lr 1e-3, batch 64, 1 and 2 threads, every PyTorch interpreter given (Debian's 1.13 and
# 2.x from PyPI); then conv2d forward + backward GFLOP/s for the CNN's two convolutions
# (bench_conv: Ember against oneDNN called directly).
# Prints seconds per epoch, Ember's time over PyTorch's (target: at most 0.7), the test accuracy
# after the last epoch and the share of the CPU's FP32 peak.
# Usage: bench/run_cnn.sh [build-dir]   (a Release build; default build)
# Environment: EPOCHS (2), SEED (0), THREADS ("1 2"), BATCH (64), SAMPLES (training samples per
#   epoch, default all 60000; fewer for a quick run: times are reported per 60000 samples),
#   TORCH_PYTHON: interpreters whose PyTorch to compare, space-separated (default
#     /usr/bin/python3, Debian's 1.13), e.g. TORCH_PYTHON="/usr/bin/python3 /work/venv-torch/bin/python";
#   PEAK_GFLOPS (FP32 peak of one thread; default: measured now by bench_fma_peak).
# Both sides run with OMP_WAIT_POLICY=PASSIVE (oneDNN and PyTorch use OpenMP; spinning idle
# threads steal the cores of a 2-vCPU machine) and OPENBLAS_NUM_THREADS = the thread count.
set -eu
BUILD=${1:-build}
EPOCHS=${EPOCHS:-2}
SEED=${SEED:-0}
THREADS=${THREADS:-1 2}
BATCH=${BATCH:-64}
SAMPLES=${SAMPLES:-60000}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
PEAK_GFLOPS=${PEAK_GFLOPS:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target ember_cli bench_loader_order bench_fma_peak bench_conv >/dev/null
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
export OMP_WAIT_POLICY=PASSIVE

k=0
for py in $TORCH_PYTHON; do
    k=$((k + 1))
    if v=$("$py" -c 'import torch; print(torch.__version__)' 2>"$LOG/torch_err_$k"); then
        echo "$k $py $v" >>"$LOG/torches"
        echo "PyTorch $v: $py"
    else
        echo "PyTorch MISSING for $py (not compared): $(tail -n 1 "$LOG/torch_err_$k")"
    fi
done
touch "$LOG/torches"
if [ -z "$PEAK_GFLOPS" ]; then
    "$BUILD/bench_fma_peak" >"$LOG/peak" 2>/dev/null
    PEAK_GFLOPS=$(awk '/^fma_peak_gflops/ { print $2 }' "$LOG/peak")
    PEAK_HOW="measured now by bench_fma_peak: $(sed -n 's/^isa //p' "$LOG/peak")"
else
    PEAK_HOW="given as PEAK_GFLOPS"
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
CHECK="--check-order $BUILD/bench_loader_order"
for t in $THREADS; do
    OPENBLAS_NUM_THREADS="$t" "$BUILD/ember" train --model cnn --device cpu --epochs "$EPOCHS" --batch-size "$BATCH" \
        --threads "$t" --seed "$SEED" --train-samples "$SAMPLES" --checkpoint none >"$LOG/ember_$t" 2>/dev/null
    while read -r k py v; do
        # shellcheck disable=SC2086  # CHECK is two words, or empty after the first run
        OPENBLAS_NUM_THREADS="$t" "$py" bench/train_cnn_torch.py --epochs "$EPOCHS" --batch-size "$BATCH" \
            --threads "$t" --seed "$SEED" --train-samples "$SAMPLES" $CHECK >"$LOG/torch${k}_$t" || true
        CHECK=""
    done <"$LOG/torches"
    echo "  done: $t thread(s) (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "^batch order" "$LOG"/torch* 2>/dev/null | sort -u || true

# "mean_s accuracy samples_per_s" from Ember's epoch lines / PyTorch's result line
ember_stats() {
    awk '/^epoch [0-9]+\/[0-9]+: / {
            for (i = 1; i <= NF; i++) {
                if ($i == "accuracy") { acc = $(i + 1); sub("%,", "", acc) }
                if ($i == "samples/s") r = $(i - 1)
            }
            sum += 60000 / r; n++
         }
         END { if (n) printf "%.3f %s %.0f\n", sum / n, acc, 60000 * n / sum; else print "- - -" }' "$1"
}
# PyTorch's seconds per 60000 samples (its epochs may be shorter: SAMPLES)
torch_stats() {
    awk '/^result / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                      printf "%.3f %s %s\n", 60000 / v["samples_per_s"], v["accuracy"], v["samples_per_s"]; found = 1 }
         END { if (!found) print "- - -" }' "$1" 2>/dev/null || echo "- - -"
}
pct_peak() { echo "$1 $2" | awk -v f="$FLOP_PER_SAMPLE" -v p="$PEAK_GFLOPS" '
    $2 == "-" || p == "" { print "-"; next } { printf "%.1f%%", 100 * $2 * f / ($1 * p * 1e9) }'; }
ratio() { echo "$1 $2" | awk '$1 == "-" || $2 == "-" { print "-"; next } { printf "%.2f", $1 / $2 }'; }

# per sample, 2 FLOP per multiply-add: conv1 forward and weight gradient (its input needs no
# gradient), conv2 forward, data and weight gradients, the Linears' forward and two gradients
C1=$((2 * 16 * 28 * 28 * 25)) C2=$((2 * 32 * 10 * 10 * 400)) L=$((2 * (800 * 128 + 128 * 10)))
FLOP_PER_SAMPLE=$((2 * C1 + 3 * C2 + 3 * L))
echo
echo "FP32 peak: $PEAK_GFLOPS GFLOP/s per thread ($PEAK_HOW), times the threads;"
echo "the CNN does $FLOP_PER_SAMPLE FLOP per training sample (convolutions and Linears, forward and backward)."
echo "s/ep: seconds per 60000 training samples (mean of $EPOCHS epochs of $SAMPLES samples); ember/pt: Ember's time over PyTorch's (target <= 0.70);"
echo "acc: test accuracy after epoch $EPOCHS; %pk: share of the FP32 peak."
printf '%3s %9s %6s %6s' thr "ember s/ep" acc "%pk"
while read -r k py v; do printf ' | %-14s %9s %6s %6s' "pt $v s/ep" "ember/pt" acc "%pk"; done <"$LOG/torches"
echo
for t in $THREADS; do
    # shellcheck disable=SC2046
    set -- $(ember_stats "$LOG/ember_$t")
    em=$1
    printf '%3s %9s %6s %6s' "$t" "$1" "$2" "$(pct_peak "$t" "$3")"
    while read -r k py v; do
        # shellcheck disable=SC2046
        set -- $(torch_stats "$LOG/torch${k}_$t")
        printf ' | %14s %9s %6s %6s' "$1" "$(ratio "$em" "$1")" "$2" "$(pct_peak "$t" "$3")"
    done <"$LOG/torches"
    echo
done
echo
for t in $THREADS; do OMP_WAIT_POLICY=PASSIVE "$BUILD/bench_conv" "$t" 30; done
echo "(FP32 peak per thread: $PEAK_GFLOPS GFLOP/s. The machine may be shared: compare numbers from one run, and note the load average.)"
