#!/usr/bin/env bash
# `ember mem`'s estimate of a LoRA fine-tuning step against `ember finetune`'s measured peak.
#
# Usage: bench/finetune_mem.sh MODEL_DIR "BATCH SEQ [--checkpoint-activations]" ...
#   e.g. bench/finetune_mem.sh /work/models/llama-1b "1 512" "1 512 --checkpoint-activations"
# Env: EMBER (default build/ember), DATA (a text file; default: made here), RANK (8),
#      EXTRA (more options for both commands, e.g. "--amp bf16"), TOLERANCE (0.10).
#
# Each shape runs `ember finetune --max-steps 2 --dtype <the folder's dtype>` and reads step 2's
# line: peak_alloc (the CPU allocator's peak) and rss_growth (getrusage's max RSS less the RSS at
# the command's start). The measured peak compared is peak_alloc + the folder's weight bytes
# (the weights are mapped, not allocated: the RSS holds them as file pages); rss_growth is
# printed beside it (it also holds the tokenizer, the data and the allocator's cached
# segments, and loses weight pages the kernel evicts under memory pressure). The exit status
# is 1 when an estimate is off by more than TOLERANCE.
set -euo pipefail
cd "$(dirname "$0")/.."
EMBER=${EMBER:-build/ember}
RANK=${RANK:-8}
TOLERANCE=${TOLERANCE:-0.10}
EXTRA=${EXTRA:-}
model=${1:?usage: bench/finetune_mem.sh MODEL_DIR \"BATCH SEQ [--checkpoint-activations]\" ...}
shift
[ $# -gt 0 ] || set -- "1 512" "1 512 --checkpoint-activations"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=${DATA:-$tmp/data.txt}
if [ -z "${DATA:-}" ]; then
  words=(the model learns from text and memory stays small while training runs on two cores with adapters)
  for i in $(seq 1 400); do
    line=""
    for j in $(seq 1 40); do line+="${words[$(( (i * 7 + j * 13) % ${#words[@]} ))]} "; done
    echo "$line"
  done > "$data"
fi
dtype=$(sed -n 's/.*"\(torch_dtype\|dtype\)": *"\([a-z0-9]*\)".*/\2/p' "$model/config.json" | head -1)
case "$dtype" in bfloat16) dt=bf16 ;; float16) dt=f16 ;; *) dt=f32 ;; esac
weights=$(cat "$model"/*.safetensors | wc -c)
status=0
printf '%-44s %12s %12s %8s %12s\n' "shape" "estimate MB" "measured MB" "error" "rss_growth"
for shape in "$@"; do
  read -r batch seq ckpt <<<"$shape"
  est=$("$EMBER" mem --model "$model" --mode lora --lora-rank "$RANK" --batch "$batch" --seq "$seq" --dtype "$dt" \
        $ckpt $EXTRA --json | sed -n 's/.*"total_bytes": \([0-9]*\).*/\1/p' | head -1)
  line=$("$EMBER" finetune "$model" --data "$data" --out "$tmp/out" --lora-rank "$RANK" --batch-size "$batch" \
         --seq "$seq" --max-steps 2 --dtype "$dt" $ckpt $EXTRA 2>&1 | grep '^step 2/' || true)
  if [ -z "$line" ] || [ -z "$est" ]; then
    echo "$shape: no estimate or no step 2 line"; status=1; continue
  fi
  alloc=$(sed -n 's/.*peak_alloc \([0-9.]*\) MB.*/\1/p' <<<"$line")
  rss=$(sed -n 's/.*rss_growth \([0-9.]*\) MB.*/\1/p' <<<"$line")
  read -r e m err bad < <(awk -v est="$est" -v a="$alloc" -v w="$weights" -v tol="$TOLERANCE" 'BEGIN {
      m = a * 1048576 + w; err = (est - m) / m
      printf "%.1f %.1f %+.1f%% %d\n", est / 1048576, m / 1048576, 100 * err, (err > tol || err < -tol) }')
  printf '%-44s %12s %12s %8s %12s\n' "batch $batch seq $seq ${ckpt:+ckpt} $EXTRA" "$e" "$m" "$err" "$rss"
  [ "$bad" = 0 ] || status=1
done
echo "(MB = 2^20 bytes; measured = peak_alloc + the weights' $((weights / 1048576)) MB)"
exit $status
