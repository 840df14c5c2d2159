#!/usr/bin/env bash
# A short `ember train` run (and `ember eval` of its checkpoint) under valgrind's memcheck:
# any invalid access, or any byte definitely or indirectly lost, fails.
# Usage: scripts/valgrind_train.sh [build-dir]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
vg=(valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect
    --errors-for-leak-kinds=definite,indirect --error-exitcode=3)
"${vg[@]}" "$build/ember" train --device cpu --epochs 2 --train-samples 256 --test-samples 128 \
    --checkpoint "$tmp/ckpt.safetensors"
"${vg[@]}" "$build/ember" eval "$tmp/ckpt.safetensors" --device cpu --test-samples 128
echo "valgrind: ember train and ember eval ran clean (no errors, nothing lost)"
