#!/usr/bin/env bash
# The CNN's accuracy target: `ember train --model cnn` reaches at least 90% test
# accuracy on Fashion-MNIST after 5 epochs on the CPU, and `ember eval` reloads its checkpoint
# (the checkpoint names its model) and measures the same accuracy. Prints how long it took.
# Usage: scripts/cnn_accuracy.sh [build-dir]   (after scripts/build.sh)
# Environment: CNN_MIN_ACCURACY (default 90), CNN_EPOCHS (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
min="${CNN_MIN_ACCURACY:-90}"
epochs="${CNN_EPOCHS:-5}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
"$build/ember" train --model cnn --device cpu --epochs "$epochs" --checkpoint "$tmp/cnn.safetensors" \
    2>/dev/null | tee "$tmp/train.log"
acc=$(sed -n 's/^epoch [0-9]*\/[0-9]*: .*test accuracy \([0-9.]*\)%.*/\1/p' "$tmp/train.log" | tail -n 1)
"$build/ember" eval "$tmp/cnn.safetensors" --device cpu | tee "$tmp/eval.log"
eval_acc=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$tmp/eval.log")
secs=$(( $(date +%s) - start ))
if [ -z "$acc" ] || [ -z "$eval_acc" ]; then
    echo "cnn_accuracy: FAILED: no accuracy in the output" >&2
    exit 1
fi
if ! awk -v a="$acc" -v m="$min" 'BEGIN { exit !(a >= m) }'; then
    echo "cnn_accuracy: FAILED: test accuracy $acc% after $epochs epochs, expected at least $min%" >&2
    exit 1
fi
if [ "$acc" != "$eval_acc" ]; then
    echo "cnn_accuracy: FAILED: ember eval measured $eval_acc% on the checkpoint, training reported $acc%" >&2
    exit 1
fi
echo "cnn_accuracy: $acc% after $epochs epochs (at least $min%), ember eval agrees; ${secs} s in all"
