#!/bin/sh
# Training benchmark (issue 5): Ember CPU (`ember train`) against PyTorch 1.13 CPU
# (bench/train_mlp_torch.py) in one run, same machine, same model (784-256-10, ReLU), same
# batch order (checked against Ember's loader), Adam lr 1e-3, 5 epochs, batch 64 and 256,
# 1 and 2 threads. Prints seconds per epoch, the ratio, test accuracy after the last epoch
# and the fraction of the CPU's FP32 peak the training loop reaches.
# Usage: bench/run_train.sh [build-dir]   (a Release build; default build)
# Environment: EPOCHS (5), SEED (0), THREADS ("1 2"), BATCHES ("64 256"),
#   PEAK_GFLOPS (the FP32 peak of one thread; default: measured now by bench_fma_peak).
# PyTorch's GEMMs run in OpenBLAS, whose own threads torch.set_num_threads does not limit
# (measured: "1 thread" GEMMs used 2 cores, 2x CPU time over wall time); OPENBLAS_NUM_THREADS
# gives both sides the same thread count.
# PyTorch runs with OMP_WAIT_POLICY=PASSIVE: with its default spinning OpenMP threads, 2 threads
# on these 2 vCPUs run ~25x slower than 1 (idle threads spin on the core the busy one needs).
set -eu
BUILD=${1:-build}
EPOCHS=${EPOCHS:-5}
SEED=${SEED:-0}
THREADS=${THREADS:-1 2}
BATCHES=${BATCHES:-64 256}
# FP32 peak per thread, measured now unless given (bench/fma_peak.c)
PEAK_GFLOPS=${PEAK_GFLOPS:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/ember" ] || [ ! -x "$BUILD/bench_loader_order" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target ember_cli bench_loader_order >/dev/null
fi
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
export OMP_WAIT_POLICY=PASSIVE

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
CHECK="--check-order $BUILD/bench_loader_order"
for t in $THREADS; do
    for b in $BATCHES; do
        "$BUILD/ember" train --device cpu --epochs "$EPOCHS" --batch-size "$b" --threads "$t" --seed "$SEED" \
            --checkpoint none >"$LOG/ember_${t}_$b" 2>/dev/null
        # shellcheck disable=SC2086  # CHECK is two words, or empty after the first run
        OPENBLAS_NUM_THREADS="$t" /usr/bin/python3 bench/train_mlp_torch.py --epochs "$EPOCHS" --batch-size "$b" --threads "$t" \
            --seed "$SEED" $CHECK >"$LOG/torch_${t}_$b"
        CHECK=""
    done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "^batch order" "$LOG"/torch_* || true

# Ember's epoch lines: "epoch e/N: ..., test accuracy A%, ..., R samples/s (T s), memory ..."
# -> "mean_s best_s accuracy samples_per_s" (seconds from the rate: 60000 / R, more digits than T)
ember_stats() {
    awk '/^epoch [0-9]+\/[0-9]+: / {
            for (i = 1; i <= NF; i++) {
                if ($i == "accuracy") { acc = $(i + 1); sub("%,", "", acc) }
                if ($i == "samples/s") r = $(i - 1)
            }
            s = 60000 / r; sum += s; n++; if (best == 0 || s < best) best = s
         }
         END { if (n) printf "%.3f %.3f %s %.0f\n", sum / n, best, acc, 60000 * n / sum; else print "- - - -" }' "$1"
}
torch_stats() {
    awk '/^result / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                      printf "%.3f %.3f %s %s\n", v["s_per_epoch"], v["best_s_per_epoch"], v["accuracy"], v["samples_per_s"] }' "$1"
}
# what the loop computes per sample: forward x@W1.t and h@W2.t, backward dW1, dW2 and dh
# (no gradient for the input x): 2 flops per multiply-add
FLOP_PER_SAMPLE=$((2 * (2 * 784 * 256 + 3 * 256 * 10)))
if [ -z "$PEAK_GFLOPS" ]; then
    [ -x "$BUILD/bench_fma_peak" ] || cmake --build "$BUILD" -j2 --target bench_fma_peak >/dev/null
    PEAK_GFLOPS=$("$BUILD/bench_fma_peak" 2>/dev/null | awk '/^fma_peak_gflops/ { print $2 }')
fi
echo
echo "seconds per epoch (training loop only; mean over $EPOCHS epochs, best in brackets), test accuracy after"
echo "epoch $EPOCHS, and the share of the FP32 peak ($PEAK_GFLOPS GFLOP/s per thread, measured by bench_fma_peak,"
echo "times the threads) at $FLOP_PER_SAMPLE FLOP per sample (the GEMMs of forward and backward)."
echo "ratio = PyTorch s/epoch / Ember s/epoch (>= 2 is the target)."
printf '%3s %5s %16s %16s %6s %6s %8s %8s %7s %7s\n' thr batch "ember s/ep" "pytorch s/ep" ratio "best" \
    "acc em" "acc pt" "%pk em" "%pk pt"
for t in $THREADS; do
    for b in $BATCHES; do
        set -- $(ember_stats "$LOG/ember_${t}_$b")
        em_mean=$1 em_best=$2 em_acc=$3 em_rate=$4
        set -- $(torch_stats "$LOG/torch_${t}_$b")
        pt_mean=$1 pt_best=$2 pt_acc=$3 pt_rate=$4
        echo "$t $b $em_mean $em_best $pt_mean $pt_best $em_acc $pt_acc $em_rate $pt_rate $FLOP_PER_SAMPLE $PEAK_GFLOPS" |
            awk '{ printf "%3s %5s %7.3f (%6.3f) %7.3f (%6.3f) %6.2f %6.2f %7s%% %7s%% %6.1f%% %6.1f%%\n",
                          $1, $2, $3, $4, $5, $6, $5 / $3, $6 / $4, $7, $8,
                          100 * $9 * $11 / ($1 * $12 * 1e9), 100 * $10 * $11 / ($1 * $12 * 1e9) }'
    done
done
echo "(best = ratio of the best epochs. The machine is shared: compare only numbers from one run.)"
