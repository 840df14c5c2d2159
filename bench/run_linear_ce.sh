#!/bin/sh
# The fused linear cross-entropy head in one run: Ember's em_linear_cross_entropy and its
# composition (bench/linear_ce.c, alternated inside the program) and PyTorch's
# F.cross_entropy(F.linear(...).float()) (bench/linear_ce_torch.py), the two programs alternated
# ROUNDS times; each figure is the median of the per-run medians (times) or the largest peak.
# Usage: bench/run_linear_ce.sh [build-dir] [N H V chunk rounds dtype]
#   (default: build 1024 1024 32000 0 3 f32; llm.c's GPT-2 head is N=4096 H=768 V=50257,
#   a Llama head N=4096 H=2048 V=32000)
# TORCH_PYTHON: the interpreter whose PyTorch to compare (default /work/venv-lm/bin/python).
set -eu
BUILD=${1:-build}
N=${2:-1024} H=${3:-1024} V=${4:-32000} CHUNK=${5:-0} ROUNDS=${6:-3} DT=${7:-f32}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TORCH_PYTHON=${TORCH_PYTHON:-/work/venv-lm/bin/python}
[ -x "$BUILD/bench_linear_ce" ] || { echo "build $BUILD/bench_linear_ce first (scripts/build.sh)" >&2; exit 1; }
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
THREADS=$(nproc)
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    "$BUILD/bench_linear_ce" "$N" "$H" "$V" "$CHUNK" 3 "$DT" >>"$OUT"
    "$TORCH_PYTHON" bench/linear_ce_torch.py "$N" "$H" "$V" 3 "$THREADS" "$DT" >>"$OUT"
    i=$((i + 1))
done
med() { awk -v k="$1" '$1 == k { print $2 }' "$OUT" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
top() { awk -v k="$1" '$1 == k { print $2 }' "$OUT" | sort -n | tail -1; }
grep '^shape' "$OUT" | head -1
echo "PyTorch $(awk '$1 == "torch_version" { print $2; exit }' "$OUT"), $ROUNDS alternated runs of 3 rounds each"
printf '%-40s %10s %16s\n' path "ms/step" "peak MiB"
printf '%-40s %10s %16s\n' "ember em_linear_cross_entropy (fused)" "$(med fused_ms)" "$(top fused_peak_mib)"
printf '%-40s %10s %16s\n' "ember cross_entropy(addmm) (composed)" "$(med composed_ms)" "$(top composed_peak_mib)"
printf '%-40s %10s %16s\n' "torch cross_entropy(linear) (composed)" "$(med torch_ms)" "$(top torch_peak_rss_mib) (RSS)"
echo "losses: fused $(awk '$1 == "fused_loss" { print $2; exit }' "$OUT"), composed $(awk '$1 == "composed_loss" { print $2; exit }' "$OUT")"
