#!/bin/sh
# Distributed benchmark, one run: (1) all_reduce bus bandwidth from 4 KB to 64 MB,
# Ember's em_dist_all_reduce against Open MPI's MPI_Allreduce on the same buffers, 2 ranks;
# (2) DDP step time of MLPs at 1 and 2 ranks (same batch of 64 per rank) and the share of the
# all-reduce time hidden behind backward; (3) PyTorch DDP (gloo, 2 processes) on the same
# MLPs and batches, one thread per process on both sides.
# Usage: bench/run_dist.sh [build-dir]   (a Release build; default build)
#   ONLY=allreduce: the all_reduce part alone (a second run when the first was disturbed);
#   BENCH_DIST_BYTES="32768 65536": those all_reduce sizes instead of 4 KB to 64 MB by 4x;
#   ROUNDS=N: the all_reduce sweep N times (default 5), summarized per size
# Environment: TORCH_PYTHON, the PyTorch interpreters, space-separated, one column pair each
#   (default "/usr/bin/python3 /work/venv-torch/bin/python": Debian's 1.13 and 2.x from PyPI;
#   one without torch is left out); MODELS, the hidden widths of each MLP, ";"-separated
#   (default "256;1024 1024 1024").
set -eu
BUILD=${1:-build}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3 /work/venv-torch/bin/python}
MODELS=${MODELS:-256;1024 1024 1024}
ROUNDS=${ROUNDS:-5}
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "run_dist.sh: ROUNDS must be a whole number of at least 1, got '$ROUNDS'" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/bench_dist" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target bench_dist >/dev/null
fi
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1
# mpirun forwards its stdin to rank 0: every call below reads /dev/null, not the loop's list
MPI="mpirun --oversubscribe --allow-run-as-root --mca btl self,vader"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo
echo "## all_reduce, float32 sum, 2 ranks: each call timed alone on freshly written data, Ember / MPI_Allreduce / MPI_Iallreduce+Wait interleaved call by call"
echo "## (median and minimum over 32-400 calls; bus bandwidth = 2(n-1)/n x bytes / time, from the minimum)"
echo
echo "| bytes | calls | Ember us median | MPI_Allreduce us median | Ember vs MPI median | Ember us min | MPI_Allreduce us min | Ember vs MPI min | Ember GB/s | MPI GB/s | MPI_Iallreduce+Wait us median / min |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
# ROUNDS runs of the whole sweep, one after another: the table is the first; the summary
# below it gives each size's Ember-vs-MPI ratio in every round and their median, because
# this machine's speed moves between runs (one run cannot settle a 2% row)
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    $MPI ${BENCH_DIST_BYTES:+-x BENCH_DIST_BYTES} -np 2 "$BUILD/bench_dist" allreduce </dev/null |
        awk -v r="$r" '/^allreduce/ {print r, $0}' >>"$RAW"
    r=$((r + 1))
done
awk '$1 == 1 {
    $1 = ""; $0 = $0
    f = 1.0 * $3 / 1e3;   # 2(n-1)/n = 1 for 2 ranks: bytes / us / 1e3 = GB/s
    printf "| %s | %s | %s | %s | %+.1f%% | %s | %s | %+.1f%% | %.3f | %.3f | %s / %s |\n", $3, $5, $7, $9, $15, $21, $23, $25, f / $21, f / $23, $17, $27 }' "$RAW"
echo "load average after the all_reduce part: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "## Ember vs MPI_Allreduce over $ROUNDS rounds (by each round's median call; target: at most +5%, by the median of the rounds)"
echo
echo "| bytes | each round | median of the rounds | rounds over +5% |"
echo "|---|---|---|---|"
awk '{ b = $4; v = $16; n[b]++; val[b, n[b]] = v; if (!(b in seen)) { seen[b] = 1; order[++k] = b } }
END {
    over_all = 0
    for (i = 1; i <= k; i++) {
        b = order[i]; m = n[b]; list = ""; over = 0
        for (j = 1; j <= m; j++) { x[j] = val[b, j] + 0; list = list sprintf("%s%+.1f%%", j > 1 ? " " : "", x[j]); over += x[j] > 5 }
        for (p = 1; p <= m; p++) for (q = p + 1; q <= m; q++) if (x[q] < x[p]) { t = x[p]; x[p] = x[q]; x[q] = t }
        med = m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
        printf "| %s | %s | %+.1f%% | %d of %d |\n", b, list, med, over, m
        if (med > 5) bad = bad " " b
    }
    print ""
    if (bad == "") print "target (Ember at most 5% over MPI_Allreduce, median of the rounds): met at every size"
    else print "target (Ember at most 5% over MPI_Allreduce, median of the rounds): NOT met at" bad " bytes"
}' "$RAW"
[ "${ONLY:-}" = allreduce ] && exit 0
echo
echo "## DDP step (forward, backward with bucketed all-reduce, Adam), batch 64 per rank, 1 thread per rank"
echo
# the PyTorch interpreters that have torch, and their versions for the header
PYS="" HEAD="" RULE=""
for py in $TORCH_PYTHON; do
    v=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) || { echo "$py: no torch (left out)"; continue; }
    PYS="$PYS $py"
    HEAD="$HEAD PyTorch $v DDP gloo 2 procs ms | PyTorch $v / Ember |"
    RULE="$RULE---|---|"
done
echo "| MLP hidden | parameters | buckets | 1 rank ms | 2 ranks ms | 2 / 1 | all-reduce hidden |$HEAD"
echo "|---|---|---|---|---|---|---|$RULE"
printf '%s\n' "$MODELS" | tr ';' '\n' | while read -r hidden; do
    one=$($MPI -np 1 "$BUILD/bench_dist" ddp $hidden </dev/null | awk '/^ddp/ {print $11}')
    two=$($MPI -np 2 "$BUILD/bench_dist" ddp $hidden </dev/null | awk '/^ddp/ {print $7, $9, $11, $13}')
    torch=""
    for py in $PYS; do
        t=$("$py" bench/dist_ddp_torch.py 2 $hidden </dev/null 2>/dev/null | awk '/^torch_ddp/ {print $7}') || t=""
        torch="$torch|${t:--}"
    done
    set -- $two
    echo "$hidden|$1|$2|$one|$3|$4$torch" | awk -F'|' '{
        ratio = $4 > 0 ? $5 / $4 : 0;
        line = sprintf("| %s | %s | %s | %.3f | %.3f | %.2f | %s%% |", $1, $2, $3, $4, $5, ratio, $6);
        for (i = 7; i <= NF; i++)
            line = line sprintf(" %s | %s |", $i, ($i != "-" && $5 > 0) ? sprintf("%.2f", $i / $5) : "-");
        print line }'
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
