#!/bin/sh
# Mixed-precision benchmark in one run: Ember (bench/amp_matmul.c) against PyTorch
# (bench/amp_torch.py) on the CPU, same machine, same problems:
#   1. the CPU's features, what runs Ember's bf16 matmul (oneDNN and its ISA), the one-thread
#      FP32 peak of the widest FMA unit and the bf16 peaks (AMX tiles, AVX512-BF16) measured by
#      microkernels;
#   2. square matmul GFLOP/s, float32 and bf16, 1 thread, SIZES (1024 2048 4096): ROUNDS
#      alternated rounds (Ember, then each PyTorch), each the best of several calls; the table
#      gives each side's median round, the target line how many rounds Ember won;
#   3. training steps (Linear layers with ReLU, cross-entropy, Adam): the seed's MLP
#      (784-256-10, tools/ember/mlp.c), 784-512-512-10, and a 4096-wide MLP of three 4096x4096
#      layers, each at batch 256 and 1024; float32 against bf16 (Ember: float32 master
#      weights cast to bf16 by hand; PyTorch: torch.autocast('cpu', dtype=torch.bfloat16)), on
#      1 and 2 threads.
# Each Ember run is followed by the same run in every PyTorch, so load from elsewhere hits both.
# Then the mixed-precision targets, each MET or NOT MET with the numbers it rests on.
# Usage: bench/run_amp.sh [build-dir]   (a Release build; default build)
# Environment: TORCH_PYTHON: the interpreters whose PyTorch to compare, space-separated
#   (default /usr/bin/python3, Debian's 1.13), e.g. "/usr/bin/python3 /work/venv-torch/bin/python";
#   THREADS ("1 2"), SIZES ("1024 2048 4096"), ROUNDS (matmul, 5), STEPS (small MLPs, 30),
#   BIG_STEPS (4096-wide, 5), MLP_ROUNDS (1): alternated rounds of all the training steps (on a
#   VM whose second vCPU the host takes now and then, one run of a 2-thread row can flip its
#   verdict; 3 rounds take about three times as long).
# Targets are judged on wall time (the median step; with MLP_ROUNDS > 1 the median of the
# rounds' medians, and how many rounds met the target); each line also gives the ratio of median
# CPU times per step (all threads), the steadier number when other programs load the machine.
# PyTorch runs with OMP_WAIT_POLICY=PASSIVE and OPENBLAS_NUM_THREADS=<threads> (bench/run_train.sh
# says why: spinning OpenMP threads and OpenBLAS's own threads would distort both sides).
set -eu
BUILD=${1:-build}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-1 2}
SIZES=${SIZES:-1024 2048 4096}
ROUNDS=${ROUNDS:-5}
MLP_ROUNDS=${MLP_ROUNDS:-1}
STEPS=${STEPS:-30}
BIG_STEPS=${BIG_STEPS:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/bench_amp_matmul" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target bench_amp_matmul >/dev/null
fi
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
export OMP_WAIT_POLICY=PASSIVE
B="$BUILD/bench_amp_matmul"

k=0
: >"$LOG/torches"
for py in $TORCH_PYTHON; do
    k=$((k + 1))
    if v=$("$py" -c 'import torch; print(torch.__version__)' 2>"$LOG/err"); then
        echo "torch$k $py $v" >>"$LOG/torches"
        echo "PyTorch $v: $py (column torch$k)"
    else
        echo "PyTorch MISSING for $py (not compared): $(tail -n 1 "$LOG/err")"
    fi
done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

echo "== CPU and peaks (one thread) =="
"$B" peaks | grep -v '^sink=' | tee "$LOG/peaks"
echo

# run WHO ARGS...: one line "WHO <bench output line>" per result into $LOG/results
run() {
    who=$1
    shift
    if [ "$who" = ember ]; then
        OPENBLAS_NUM_THREADS=1 "$B" "$@"
    else
        py=$(awk -v w="$who" '$1 == w { print $2 }' "$LOG/torches")
        OPENBLAS_NUM_THREADS=$2 "$py" bench/amp_torch.py "$@"
    fi | sed "s/^/$who /" >>"$LOG/results"
}
whos="ember $(awk '{ print $1 }' "$LOG/torches")"

# one round at a time over all sizes: a slow spell of the machine (its clock moves between
# runs: the AMX peak read 2580 and 3404 GFLOP/s in two sessions) then hits every side alike
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    r=$((r + 1))
    for n in $SIZES; do
        for w in $whos; do run "$w" matmul 1 "$n"; done
    done
done
r=0
while [ "$r" -lt "$MLP_ROUNDS" ]; do
    r=$((r + 1))
    for t in $THREADS; do
        for cfg in "784,256,10 256 $STEPS" "784,256,10 1024 $STEPS" "784,512,512,10 256 $STEPS" \
                   "784,512,512,10 1024 $STEPS" "4096,4096,4096,4096 256 $BIG_STEPS" \
                   "4096,4096,4096,4096 1024 $BIG_STEPS"; do
            set -- $cfg
            for dt in f32 bf16; do
                for w in $whos; do run "$w" mlp "$t" "$dt" "$2" "$3" "$1"; done
            done
        done
    done
done

val() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
# the median of the numbers on stdin (one per line), empty when none
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
PEAK32=$(val fp32_peak_gflops <"$LOG/peaks")
PEAKBF=$(val amx_bf16_peak_gflops <"$LOG/peaks")
[ -n "$PEAKBF" ] || PEAKBF=$(val avx512bf16_peak_gflops <"$LOG/peaks")

echo "== matmul, 1 thread: GFLOP/s, median of $ROUNDS alternated rounds (% of the FP32 peak ${PEAK32:-?} / of the bf16 peak ${PEAKBF:-?}) =="
printf '%-6s %-9s' n dtype
for w in $whos; do printf ' %16s' "$w"; done
echo
for n in $SIZES; do
    for dt in float32 bfloat16; do
        printf '%-6s %-9s' "$n" "$dt"
        for w in $whos; do
            g=$(awk -v w="$w" -v n="n=$n" -v d="dtype=$dt" '$1 == w && $2 == "matmul" && $3 == d && $4 == n' "$LOG/results" | val gflops | median)
            pk=$PEAK32
            [ "$dt" = bfloat16 ] && pk=$PEAKBF
            pct=$(awk -v g="${g:-0}" -v p="${pk:-0}" 'BEGIN { if (p > 0 && g > 0) printf "%.0f%%", 100 * g / p; else printf "-" }')
            printf ' %9s (%4s)' "${g:--}" "$pct"
        done
        echo
    done
done
echo

# step_table TITLE FIELD: per MLP, batch and threads, each side's median FIELD (over its rounds)
# in float32 and bf16, and the bf16 speedup
step_table() {
    echo "== training step, $1 (bf16 speedup over float32 of the same implementation) =="
    printf '%-20s %-5s %-3s' mlp batch thr
    for w in $whos; do printf ' %12s %12s %6s' "$w-f32" "$w-bf16" "x"; done
    echo
    grep ' mlp ' "$LOG/results" | awk '{ print $3, $4, $6 }' | sort -u | while read -r d b t; do
        printf '%-20s %-5s %-3s' "${d#dims=}" "${b#batch=}" "${t#threads=}"
        for w in $whos; do
            f=$(awk -v w="$w" -v d="$d" -v b="$b" -v t="$t" '$1 == w && $3 == d && $4 == b && $6 == t && $5 == "dtype=f32"' "$LOG/results" | val "$2" | median)
            h=$(awk -v w="$w" -v d="$d" -v b="$b" -v t="$t" '$1 == w && $3 == d && $4 == b && $6 == t && $5 == "dtype=bf16"' "$LOG/results" | val "$2" | median)
            x=$(awk -v f="${f:-0}" -v h="${h:-0}" 'BEGIN { if (f > 0 && h > 0) printf "%.2f", f / h; else printf "-" }')
            printf ' %12s %12s %6s' "${f:--}" "${h:--}" "$x"
        done
        echo
    done
    echo
}
step_table "median ms" step_ms
step_table "median CPU ms per step, all threads" " cpu_ms"

echo "== targets =="
amx=$(grep -c 'amx' "$LOG/peaks" || true)
for w in $(awk '{ print $1 }' "$LOG/torches"); do
    v=$(awk -v w="$w" '$1 == w { print $3 }' "$LOG/torches")
    for n in $SIZES; do
        es=$(awk -v n="n=$n" '$1 == "ember" && $2 == "matmul" && $3 == "dtype=bfloat16" && $4 == n' "$LOG/results" | val gflops)
        ps=$(awk -v w="$w" -v n="n=$n" '$1 == w && $2 == "matmul" && $3 == "dtype=bfloat16" && $4 == n' "$LOG/results" | val gflops)
        e=$(printf '%s\n' "$es" | median)
        p=$(printf '%s\n' "$ps" | median)
        # round by round (the k-th Ember line against the k-th of this PyTorch)
        printf '%s\n' "$ps" >"$LOG/ps"
        won=$(printf '%s\n' "$es" | paste - "$LOG/ps" | awk '$2 != "" && $1 >= $2 { k++ } END { print k + 0 }')
        awk -v e="${e:-0}" -v p="${p:-0}" -v n="$n" -v v="$v" -v won="$won" -v rounds="$ROUNDS" 'BEGIN {
            printf "bf16 matmul %s, 1 thread, Ember >= PyTorch %s: %s (medians %.1f vs %.1f GFLOP/s; Ember ahead in %d of %d rounds)\n", n, v,
                   (e >= p && p > 0) ? "MET" : "NOT MET", e, p, won, rounds }'
    done
done
# Two training steps of one MLP, batch and thread count (WHO_A WHO_B DIMS BATCH DTYPE_A DTYPE_B
# THREADS as the bench lines print them), compared on A / B against NEED (GE 1: >=, 0: <=):
# prints A's and B's median step, their median CPU ms per step, and in how many rounds (the k-th
# line of A against the k-th of B) the ratio passed
pair_stats() {
    for side in a b; do
        if [ "$side" = a ]; then who=$1 dt=$5; else who=$2 dt=$6; fi
        awk -v w="$who" -v d="$3" -v b="$4" -v dt="$dt" -v t="$7" \
            '$1 == w && $2 == "mlp" && $3 == d && $4 == b && $5 == dt && $6 == t' "$LOG/results" >"$LOG/$side"
        val step_ms <"$LOG/$side" >"$LOG/$side.steps"
    done
    ma=$(median <"$LOG/a.steps") mb=$(median <"$LOG/b.steps")
    ca=$(val " cpu_ms" <"$LOG/a" | median) cb=$(val " cpu_ms" <"$LOG/b" | median)
    printf '%s %s %s %s ' "${ma:-0}" "${mb:-0}" "${ca:-0}" "${cb:-0}" # 0: no such run (reported as not met)
    paste "$LOG/a.steps" "$LOG/b.steps" | awk -v need="$8" -v ge="$9" '
        $1 > 0 && $2 > 0 { r = $1 / $2; if ((ge && r >= need) || (!ge && r <= need)) k++ } END { print k + 0 }'
}
for t in $THREADS; do
    for bt in 256 1024; do
        need=1.6
        [ "$amx" -gt 0 ] && need=3
        set -- $(pair_stats ember ember dims=4096-4096-4096-4096 "batch=$bt" dtype=f32 dtype=bf16 "threads=$t" "$need" 1)
        awk -v f="${1:-0}" -v h="${2:-0}" -v fc="${3:-0}" -v hc="${4:-0}" -v met="${5:-0}" -v t="$t" -v bt="$bt" \
            -v need="$need" -v rounds="$MLP_ROUNDS" 'BEGIN {
            x = (f > 0 && h > 0) ? f / h : 0
            xc = (fc > 0 && hc > 0) ? fc / hc : 0
            printf "4096-wide MLP batch %s, %s thread(s), Ember bf16 step >= %sx faster than Ember float32: %s (%.2fx: %.1f vs %.1f ms; CPU time %.2fx; met in %d of %d rounds)\n",
                   bt, t, need, (x >= need) ? "MET" : "NOT MET", x, f, h, xc, met, rounds }'
    done
done
for w in $(awk '{ print $1 }' "$LOG/torches"); do
    v=$(awk -v w="$w" '$1 == w { print $3 }' "$LOG/torches")
    grep "^ember mlp .* dtype=bf16" "$LOG/results" | awk '{ print $3, $4, $6 }' | sort -u | while read -r d b t; do
        set -- $(pair_stats ember "$w" "$d" "$b" dtype=bf16 dtype=bf16 "$t" 0.7 0)
        awk -v e="${1:-0}" -v p="${2:-0}" -v ec="${3:-0}" -v pc="${4:-0}" -v met="${5:-0}" -v d="${d#dims=}" \
            -v b="${b#batch=}" -v t="${t#threads=}" -v v="$v" -v rounds="$MLP_ROUNDS" 'BEGIN {
            r = p > 0 ? e / p : 0
            rc = pc > 0 ? ec / pc : 0
            printf "MLP %s batch %s, %s thread(s): Ember bf16 step <= 0.7x PyTorch %s autocast: %s (%.2fx: %.2f vs %.2f ms; CPU time %.2fx; met in %d of %d rounds)\n",
                   d, b, t, v, (r > 0 && r <= 0.7) ? "MET" : "NOT MET", r, e, p, rc, met, rounds }'
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
