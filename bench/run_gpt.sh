#!/bin/sh
# GPT benchmark: the step time of `ember train --model gpt` on the CPU against the
# same model in PyTorch (bench/gpt_torch.py: same layers, sizes, AdamW, gradient clipping),
# in one run, 1 and 2 threads, against every PyTorch interpreter given. Fixed size: batch 32,
# context 64, 2 layers, d_model 128, 4 heads, vocabulary 114 (the fortunes' characters).
# Prints milliseconds per step (Ember: the mean of a second epoch of STEPS steps, after a
# first one as warm-up; PyTorch: STEPS steps after 5 warm-up steps), the ratio Ember / PyTorch
# (target <= 0.7) and the fraction of the CPU's FP32 peak each reaches, also from each side's process
# CPU time per step divided by the threads (robust to a loaded machine) (FLOPs counted as
# 6 x tokens x the matmul parameters + 12 x layers x context x d_model x tokens for attention).
# Usage: bench/run_gpt.sh [build-dir]
# Environment: STEPS (30), THREADS ("1 2"), TORCH_PYTHON (default "/usr/bin/python3
#   /work/venv-torch/bin/python": Debian's 1.13 and 2.x), PEAK_GFLOPS (one thread's FP32
#   peak; default measured now by bench_fma_peak).
set -eu
BUILD=${1:-build}
STEPS=${STEPS:-30}
THREADS=${THREADS:-1 2}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3 /work/venv-torch/bin/python}
PEAK_GFLOPS=${PEAK_GFLOPS:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/ember" ] || [ ! -x "$BUILD/bench_fma_peak" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target ember_cli bench_fma_peak >/dev/null
fi
export OMP_WAIT_POLICY=PASSIVE
if [ -z "$PEAK_GFLOPS" ]; then
    PEAK_GFLOPS=$("$BUILD/bench_fma_peak" 2>/dev/null | awk '/^fma_peak_gflops/ { print $2 }')
fi
B=32 T=64 L=2 D=128 H=4 V=114
# FLOPs per step: forward 2 x tokens x matmul params, backward twice that; attention's two
# batched products (q k^T and w v): 2 x 2 x T x D per token per layer, times 3 with backward
FLOP=$(awk -v b=$B -v t=$T -v l=$L -v d=$D -v v=$V 'BEGIN {
    tok = b * t; mm = l * 12 * d * d + d * v
    printf "%.0f", 6 * tok * mm + 12 * l * t * d * tok }')
echo "GPT step: batch $B, context $T, $L layers, d_model $D, $H heads, vocab $V: $(awk -v f=$FLOP 'BEGIN { printf "%.2f", f / 1e9 }') GFLOP per step; FP32 peak $PEAK_GFLOPS GFLOP/s per thread"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-22s %10s %12s %10s %14s %12s %10s\n' threads who ms/step ratio %peak cpu-ms/thread cpu-ratio cpu-%peak
for th in $THREADS; do
    peak=$(awk -v p="$PEAK_GFLOPS" -v t=$th 'BEGIN { print p * t }')
    out=$(OPENBLAS_NUM_THREADS=$th "$BUILD/ember" train --model gpt --device cpu --epochs 2 --steps-per-epoch "$STEPS" \
          --batch-size $B --context $T --layers $L --d-model $D --heads $H --sample-chars 0 --checkpoint none \
          --threads "$th" 2>/dev/null)
    ember=$(echo "$out" | awk '/^epoch 2\/2:/ { for (i = 1; i <= NF; i++) if ($i == "ms/step") print $(i - 1) }')
    # process CPU time per step over the threads: what the step would take with its cores to itself
    ecpu=$(echo "$out" | awk -v t=$th '/^epoch 2\/2:/ { for (i = 1; i <= NF; i++) if ($i == "CPU" && $(i + 1) == "time") printf "%.1f", $(i + 2) / t }')
    printf '%-8s %-22s %10s %12s %9.1f%% %14s %12s %9.1f%%\n' "$th" "Ember" "$ember" "-" \
        "$(awk -v f=$FLOP -v ms="$ember" -v p="$peak" 'BEGIN { print 100 * f / (ms / 1000) / 1e9 / p }')" "$ecpu" "-" \
        "$(awk -v f=$FLOP -v ms="$ecpu" -v p="$peak" 'BEGIN { print 100 * f / (ms / 1000) / 1e9 / p }')"
    for py in $TORCH_PYTHON; do
        v=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) || { echo "$py: no torch (not compared)"; continue; }
        tout=$(OPENBLAS_NUM_THREADS=$th OMP_NUM_THREADS=$th "$py" bench/gpt_torch.py --threads "$th" --steps "$STEPS" \
             --batch $B --context $T --layers $L --d-model $D --heads $H --vocab $V)
        ms=$(echo "$tout" | awk '/^ms_per_step/ { print $2 }')
        tcpu=$(echo "$tout" | awk -v t=$th '/^cpu_ms_per_step/ { printf "%.1f", $2 / t }')
        printf '%-8s %-22s %10s %12s %9.1f%% %14s %12s %9.1f%%\n' "$th" "PyTorch $v" "$ms" \
            "$(awk -v e="$ember" -v t="$ms" 'BEGIN { printf "%.2fx", e / t }')" \
            "$(awk -v f=$FLOP -v ms="$ms" -v p="$peak" 'BEGIN { print 100 * f / (ms / 1000) / 1e9 / p }')" "$tcpu" \
            "$(awk -v e="$ecpu" -v t="$tcpu" 'BEGIN { printf "%.2fx", e / t }')" \
            "$(awk -v f=$FLOP -v ms="$tcpu" -v p="$peak" 'BEGIN { print 100 * f / (ms / 1000) / 1e9 / p }')"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(ratio = Ember's ms/step / PyTorch's: below 1 Ember is faster; the target is <= 0.7)"
echo "(cpu-ms/thread: the process's CPU time per step divided by the threads, which waiting for a core on a"
echo " loaded machine does not inflate; cpu-ratio and cpu-%peak are computed from it)"
