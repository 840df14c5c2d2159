#!/bin/sh
# Tokenizer benchmark: Ember (bench/tokenizer.c) and Hugging Face's tokenizers
# (bench/tokenizer_hf.py) on the same tokenizer.json and the same ~1 MB text, side by side.
# Usage: bench/run_tokenizer.sh [build-dir]   (a Release build)
# TOKENIZERS_PYTHON: an interpreter with `tokenizers` (pip install tokenizers), default
# /work/venv-tok/bin/python; without one only Ember's numbers are printed. With it, a second
# tokenizer with a 32k vocabulary (Llama 3's pre-tokenizer) is trained on the text first.
# The text: the seeds' Korean tutorials, Debian's fortunes and code, repeated to 1 MiB.
set -eu
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x "$BUILD/bench_tokenizer" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target bench_tokenizer >/dev/null
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DATA=tests/data/tokenizer
for f in "$DATA/seeds_ko.txt" "$DATA/code_sample.txt" /usr/share/games/fortunes/computers \
         /usr/share/games/fortunes/science /usr/share/games/fortunes/literature; do
    [ -f "$f" ] && cat "$f" >>"$TMP/part"
done
while [ "$(wc -c <"$TMP/part")" -lt 1048576 ]; do cat "$TMP/part" "$TMP/part" >"$TMP/twice"; mv "$TMP/twice" "$TMP/part"; done
head -c 1048576 "$TMP/part" | iconv -f utf-8 -t utf-8 -c >"$TMP/text.txt"   # no character cut at the end
PY=${TOKENIZERS_PYTHON:-/work/venv-tok/bin/python}
have_hf=no
"$PY" -c "import tokenizers" 2>/dev/null && have_hf=yes
TOKENIZERS="$DATA/llama3 $DATA/llama2"
if [ "$have_hf" = yes ]; then
    "$PY" bench/tokenizer_hf.py --train "$TMP/llama3_32k" "$TMP/text.txt" 32000
    TOKENIZERS="$TOKENIZERS $TMP/llama3_32k"
else
    echo "tokenizers (Python) MISSING for $PY: Ember alone"
fi
get() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
echo "times in ms (best of 5); encode: the text as one string; lines: each line alone, one thread"
echo "(tokenizers' encode_batch of the lines, on every core, in brackets); MB/s and Mtok/s of the one string"
printf '%-11s %6s %7s %-10s %8s %9s %6s %6s %16s %8s %9s  %s\n' tokenizer vocab tokens impl load_ms \
    encode_ms "MB/s" "Mtok/s" lines_ms dec_ms stream_ms same_ids
for t in $TOKENIZERS; do
    name=$(basename "$t")
    "$BUILD/bench_tokenizer" "$t" "$TMP/text.txt" >"$TMP/em"
    impls="em"
    if [ "$have_hf" = yes ]; then "$PY" bench/tokenizer_hf.py "$t" "$TMP/text.txt" >"$TMP/hf"; impls="em hf"; fi
    for i in $impls; do
        same="-"
        [ "$i" = hf ] && { [ "$(get "$TMP/em" ids_checksum)" = "$(get "$TMP/hf" ids_checksum)" ] && same=yes || same=NO; }
        [ "$i" = hf ] && [ "$(get "$TMP/em" lines_tokens)" != "$(get "$TMP/hf" lines_tokens)" ] && same=NO
        ms() { echo "$1" | awk '{ printf "%.1f", $1 * 1000 }'; }
        lines_ms=$(ms "$(get "$TMP/$i" lines_encode_s)")
        [ "$i" = hf ] && lines_ms="$lines_ms ($(ms "$(get "$TMP/hf" lines_batch_s)"))"
        printf '%-11s %6s %7s %-10s %8s %9s %6s %6.2f %16s %8s %9s  %s\n' "$name" "$(get "$TMP/$i" vocab)" \
            "$(get "$TMP/$i" tokens)" "$(get "$TMP/$i" implementation | cut -c1-10)" \
            "$(ms "$(get "$TMP/$i" load_s)")" "$(ms "$(get "$TMP/$i" encode_s)")" "$(get "$TMP/$i" encode_mb_s)" \
            "$(echo "$(get "$TMP/$i" encode_tokens_s)" | awk '{ print $1 / 1e6 }')" "$lines_ms" \
            "$(ms "$(get "$TMP/$i" decode_s)")" "$(ms "$(get "$TMP/$i" stream_decode_s)")" "$same"
    done
done
