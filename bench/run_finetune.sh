#!/bin/sh
# Fine-tuning steps against PyTorch + PEFT: tokens/s and peak memory of a LoRA step (rank 8,
# q_proj,v_proj, AdamW on the adapters; bf16 base weights) on MODEL and a full step (AdamW on
# every weight; float32 master weights and states: 16 bytes a parameter, 20 GB for the 1B, so
# a smaller FULL_MODEL) on FULL_MODEL, the forward under bf16 autocast, at 1 and 2 threads. `ember finetune` and
# bench/finetune_torch.py alternate ROUNDS times; each figure is the median over the rounds
# (tokens/s: of each run's steps after the first) or the largest peak.
# Usage: bench/run_finetune.sh [build-dir]
# Env: MODEL (/work/models/llama-1b), FULL_MODEL (/work/models/llama-300m: make_model_folder.py
#      --preset llama-1b --hidden 1024 --layers 16 --heads 16 --kv-heads 8 --intermediate 4096
#      --vocab 32000, 2.8e8 parameters), SEQ (512), BATCH (1), STEPS (3: the first is not timed),
#      ROUNDS (3), THREADS ("1 2"), MODES ("lora full"), CKPT (0; 1: both checkpoint each layer),
#      TORCH_PYTHON (/work/venv-lm/bin/python).
# Peak memory: Ember's is step 2's rss_growth (max RSS less the RSS at the command's start);
# PyTorch's the same from getrusage in the script. Ember's full step needs `ember finetune
# --full`; without it that row says so. Targets: Ember >= 1.5x PyTorch's tokens/s, <= 0.8x
# its peak.
set -eu
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=${MODEL:-/work/models/llama-1b} FULL_MODEL=${FULL_MODEL:-/work/models/llama-300m} SEQ=${SEQ:-512} BATCH=${BATCH:-1} STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-"1 2"} MODES=${MODES:-"lora full"} CKPT=${CKPT:-0}
TORCH_PYTHON=${TORCH_PYTHON:-/work/venv-lm/bin/python}
EMBER="$BUILD/ember"
[ -x "$EMBER" ] || { echo "build $EMBER first (scripts/build.sh)" >&2; exit 1; }
[ "$STEPS" -ge 2 ] || { echo "STEPS must be at least 2 (the first step is not timed)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT="$TMP/results"
: >"$OUT"
# plain text the folder's tokenizer packs into enough sequences of SEQ tokens
i=0
while [ "$i" -lt $((BATCH * STEPS * SEQ / 8 + 200)) ]; do
    echo "the model learns from text while memory stays small and training runs on two cores"
    i=$((i + 1))
done >"$TMP/data.txt"
ckpt_flag=""
[ "$CKPT" = 1 ] && ckpt_flag="--checkpoint-activations"
has_full=0
"$EMBER" finetune --help 2>&1 | grep -q -- '--full' && has_full=1

# ember's step time from its cumulative tokens/s: steps 2..STEPS
ember_run() { # mode threads
    extra="--dtype bf16" model=$MODEL
    [ "$1" = full ] && extra="--full --dtype f32" model=$FULL_MODEL
    "$EMBER" finetune "$model" --data "$TMP/data.txt" --out "$TMP/out" --seq "$SEQ" --batch-size "$BATCH" \
        --max-steps "$STEPS" --amp bf16 --threads "$2" $ckpt_flag $extra 2>&1 |
        awk -v mode="$1" -v th="$2" -v tok=$((SEQ * BATCH)) '
            /^step / { split($2, s, "/"); k = s[1]
                       for (i = 1; i <= NF; i++) { if ($i == "tokens/s") tps = $(i + 1); if ($i == "rss_growth") rss = $(i + 1) }
                       t[k] = k * tok / tps; if (rss > peak) peak = rss; n = k }
            END { if (n >= 2) printf "ember %s %s %.1f %.1f\n", mode, th, (n - 1) * tok / (t[n] - t[1]), peak
                  else printf "ember %s %s failed\n", mode, th }'
}
torch_run() { # mode threads
    model=$MODEL
    [ "$1" = full ] && model=$FULL_MODEL
    "$TORCH_PYTHON" bench/finetune_torch.py "$model" "$1" "$SEQ" "$BATCH" "$STEPS" "$2" "$CKPT" 2>/dev/null |
        awk -v mode="$1" -v th="$2" '$1 == "tokens_per_s" { tps = $2 } $1 == "peak_rss_growth_mib" { rss = $2 }
            $1 == "torch_version" { v = $2 }
            END { if (tps) printf "torch %s %s %s %s %s\n", mode, th, tps, rss, v; else printf "torch %s %s failed\n", mode, th }'
}
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    for mode in $MODES; do
        for th in $THREADS; do
            if [ "$mode" = full ] && [ "$has_full" = 0 ]; then
                echo "ember full $th skipped" >>"$OUT"
            else
                ember_run "$mode" "$th" >>"$OUT"
            fi
            torch_run "$mode" "$th" >>"$OUT"
        done
    done
    r=$((r + 1))
done
med() { awk -v w="$1" -v m="$2" -v t="$3" -v c="$4" '$1 == w && $2 == m && $3 == t && $4 != "failed" && $4 != "skipped" { print $c }' "$OUT" |
        sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }
top() { awk -v w="$1" -v m="$2" -v t="$3" '$1 == w && $2 == m && $3 == t && $4 != "failed" && $4 != "skipped" { print $5 }' "$OUT" |
        sort -n | tail -1; }
echo "lora: $MODEL (bf16 weights), full: $FULL_MODEL (float32 masters); seq $SEQ, batch $BATCH, bf16 autocast, checkpointing $CKPT; $ROUNDS alternated rounds of $STEPS steps"
echo "PyTorch $(awk '$1 == "torch" && NF >= 6 { print $6; exit }' "$OUT"); load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-8s %14s %14s %8s %16s %16s %8s\n' mode threads "ember tok/s" "torch tok/s" ratio "ember peak MiB" "torch peak MiB" ratio
for mode in $MODES; do
    for th in $THREADS; do
        et=$(med ember "$mode" "$th" 4) tt=$(med torch "$mode" "$th" 4)
        ep=$(top ember "$mode" "$th") tp=$(top torch "$mode" "$th")
        [ -n "$ep" ] || ep="-"
        [ -n "$tp" ] || tp="-"
        awk -v m="$mode" -v th="$th" -v et="$et" -v tt="$tt" -v ep="$ep" -v tp="$tp" 'BEGIN {
            rt = (et != "-" && tt != "-" && tt > 0) ? sprintf("%.2fx", et / tt) : "-"
            rp = (ep != "-" && tp != "-" && tp > 0) ? sprintf("%.2fx", ep / tp) : "-"
            printf "%-6s %-8s %14s %14s %8s %16s %16s %8s\n", m, th, et, tt, rt, ep, tp, rp }'
    done
done
grep -q "skipped" "$OUT" && echo "(ember full: skipped, this ember finetune has no --full)"
grep -q "failed" "$OUT" && { echo "some runs failed:"; grep failed "$OUT" | sort | uniq -c; }
exit 0
