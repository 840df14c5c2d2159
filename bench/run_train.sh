#!/bin/sh
# Training benchmark: Ember CPU (`ember train`) against PyTorch CPU
# (bench/train_mlp_torch.py) in one run, same machine, same model (784-256-10, ReLU), same
# batch order (checked against Ember's loader), Adam lr 1e-3, 5 epochs, batch 64 and 256,
# 1 and 2 threads, against every PyTorch interpreter given (e.g. Debian's 1.13 and 2.x from
# PyPI in a virtual environment). Prints seconds per epoch, the ratios, test accuracy after
# the last epoch, the fraction of the CPU's true FP32 peak the training loop reaches, and
# every epoch's time (the slowest against the first: subnormal slowdowns show there).
# Usage: bench/run_train.sh [build-dir]   (a Release build; default build)
# Environment: EPOCHS (5), SEED (0), THREADS ("1 2"), BATCHES ("64 256"),
#   TORCH_PYTHON: the Python interpreters whose PyTorch to compare, space-separated
#     (default /usr/bin/python3, Debian's PyTorch 1.13), e.g.
#     TORCH_PYTHON="/usr/bin/python3 /work/venv-torch/bin/python" for 1.13 and 2.x in one run;
#     one without torch is reported as missing and its columns read "-",
#   PEAK_GFLOPS (the FP32 peak of one thread; default: measured now by bench_fma_peak with the
#     widest FMA the CPU has: AVX-512, AVX2 or SSE).
# PyTorch's GEMMs run in OpenBLAS (1.13) or oneDNN/MKL (2.x); OpenBLAS's own threads
# torch.set_num_threads does not limit (measured: "1 thread" GEMMs used 2 cores, 2x CPU time
# over wall time); OPENBLAS_NUM_THREADS gives both sides the same thread count.
# PyTorch runs with OMP_WAIT_POLICY=PASSIVE: with its default spinning OpenMP threads, 2 threads
# on these 2 vCPUs run ~25x slower than 1 (idle threads spin on the core the busy one needs).
set -eu
BUILD=${1:-build}
EPOCHS=${EPOCHS:-5}
SEED=${SEED:-0}
THREADS=${THREADS:-1 2}
BATCHES=${BATCHES:-64 256}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
PEAK_GFLOPS=${PEAK_GFLOPS:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/ember" ] || [ ! -x "$BUILD/bench_loader_order" ] || [ ! -x "$BUILD/bench_fma_peak" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target ember_cli bench_loader_order bench_fma_peak >/dev/null
fi
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
export OMP_WAIT_POLICY=PASSIVE

# Which interpreters have torch: "k python version" per line in $LOG/torches
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
[ -s "$LOG/torches" ] || echo "no PyTorch to compare against: only Ember's numbers follow"
touch "$LOG/torches"

if [ -z "$PEAK_GFLOPS" ]; then
    "$BUILD/bench_fma_peak" >"$LOG/peak" 2>/dev/null
    PEAK_GFLOPS=$(awk '/^fma_peak_gflops/ { print $2 }' "$LOG/peak")
    PEAK_HOW="measured now by bench_fma_peak: $(sed -n 's/^isa //p' "$LOG/peak")"
else
    PEAK_HOW="given as PEAK_GFLOPS"
fi
echo "CPU features: $("$BUILD/ember" devices 2>/dev/null | sed -n 's/^  features: //p')"

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
CHECK="--check-order $BUILD/bench_loader_order"
for t in $THREADS; do
    for b in $BATCHES; do
        "$BUILD/ember" train --device cpu --epochs "$EPOCHS" --batch-size "$b" --threads "$t" --seed "$SEED" \
            --checkpoint none >"$LOG/ember_${t}_$b" 2>/dev/null
        while read -r k py v; do
            # shellcheck disable=SC2086  # CHECK is two words, or empty after the first run
            OPENBLAS_NUM_THREADS="$t" "$py" bench/train_mlp_torch.py --epochs "$EPOCHS" --batch-size "$b" \
                --threads "$t" --seed "$SEED" $CHECK >"$LOG/torch${k}_${t}_$b" || true
            CHECK=""
        done <"$LOG/torches"
        echo "  done: $t thread(s), batch $b (load $(cut -d' ' -f1 /proc/loadavg))"
    done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "^batch order" "$LOG"/torch* 2>/dev/null | sort -u || true

# Ember's epoch lines: "epoch e/N: ..., test accuracy A%, ..., R samples/s (T s), memory ..."
# -> "mean_s best_s accuracy samples_per_s s1,s2,..." (seconds from the rate: 60000 / R, more
# digits than T)
ember_stats() {
    awk '/^epoch [0-9]+\/[0-9]+: / {
            for (i = 1; i <= NF; i++) {
                if ($i == "accuracy") { acc = $(i + 1); sub("%,", "", acc) }
                if ($i == "samples/s") r = $(i - 1)
            }
            s = 60000 / r; sum += s; n++; if (best == 0 || s < best) best = s
            ep = ep (n > 1 ? "," : "") sprintf("%.3f", s)
         }
         END { if (n) printf "%.3f %.3f %s %.0f %s\n", sum / n, best, acc, 60000 * n / sum, ep
               else print "- - - - -" }' "$1"
}
torch_stats() {
    awk '/^result / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                      printf "%.3f %.3f %s %s %s\n", v["s_per_epoch"], v["best_s_per_epoch"], v["accuracy"],
                             v["samples_per_s"], v["epoch_s"]; found = 1 }
         END { if (!found) print "- - - - -" }' "$1" 2>/dev/null || echo "- - - - -"
}
# slowest epoch over the first, in percent ("+3.1%")
drift() { echo "$1" | awk -F, '{ m = $1; for (i = 2; i <= NF; i++) if ($i > m) m = $i
                                  if ($1 > 0) printf "%+.1f%%", 100 * (m / $1 - 1); else print "-" }'; }
pct_peak() { echo "$1 $2" | awk -v f="$FLOP_PER_SAMPLE" -v p="$PEAK_GFLOPS" '
    $2 == "-" || p == "" { print "-"; next } { printf "%.1f%%", 100 * $2 * f / ($1 * p * 1e9) }'; }
ratio() { echo "$1 $2" | awk '$1 == "-" || $2 == "-" { print "-"; next } { printf "%.2f", $1 / $2 }'; }

# what the loop computes per sample: forward x@W1.t and h@W2.t, backward dW1, dW2 and dh
# (no gradient for the input x): 2 flops per multiply-add
FLOP_PER_SAMPLE=$((2 * (2 * 784 * 256 + 3 * 256 * 10)))
echo
echo "FP32 peak: $PEAK_GFLOPS GFLOP/s per thread ($PEAK_HOW), times the threads;"
echo "the loop does $FLOP_PER_SAMPLE FLOP per sample (the GEMMs of forward and backward)."
echo "s/ep: seconds per epoch of the training loop, mean over $EPOCHS epochs (best in brackets);"
echo "ratio = PyTorch s/epoch / Ember s/epoch (>= 2 is the target); acc: test accuracy after epoch $EPOCHS;"
echo "%pk: share of the FP32 peak; drift: slowest epoch against the first."
printf '%3s %5s %16s %6s %7s %7s' thr batch "ember s/ep" "acc" "%pk" drift
while read -r k py v; do printf ' | %-16s %6s %6s %6s %7s' "pt $v s/ep" ratio acc "%pk" drift; done <"$LOG/torches"
echo
for t in $THREADS; do
    for b in $BATCHES; do
        # shellcheck disable=SC2046
        set -- $(ember_stats "$LOG/ember_${t}_$b")
        em_mean=$1 em_best=$2 em_acc=$3 em_rate=$4 em_ep=$5
        printf '%3s %5s %7s (%6s) %6s %7s %7s' "$t" "$b" "$em_mean" "$em_best" "$em_acc" \
            "$(pct_peak "$t" "$em_rate")" "$(drift "$em_ep")"
        while read -r k py v; do
            # shellcheck disable=SC2046
            set -- $(torch_stats "$LOG/torch${k}_${t}_$b")
            printf ' | %7s (%6s) %6s %6s %6s %7s' "$1" "$2" "$(ratio "$1" "$em_mean")" "$3" \
                "$(pct_peak "$t" "$4")" "$(drift "$5")"
        done <"$LOG/torches"
        echo
    done
done
echo
echo "seconds of each epoch:"
for t in $THREADS; do
    for b in $BATCHES; do
        printf '  %s thr, batch %-4s ember %s\n' "$t" "$b" "$(ember_stats "$LOG/ember_${t}_$b" | cut -d' ' -f5)"
        while read -r k py v; do
            printf '  %s thr, batch %-4s pt %-8s %s\n' "$t" "$b" "$v" "$(torch_stats "$LOG/torch${k}_${t}_$b" | cut -d' ' -f5)"
        done <"$LOG/torches"
    done
done
echo "(The machine may be shared: compare only numbers from one run, and note the load average.)"
