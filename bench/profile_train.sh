#!/bin/sh
# Where `ember train`'s step goes: perf records two epochs of `ember train` on one
# thread at each batch size (DWARF call graphs, 1 kHz), and bench/profile_train.py sorts the
# samples into GEMM, optimizer, elementwise, loss, loader, allocator and the rest.
# Usage: bench/profile_train.sh [build-dir]   (a Release build; default build)
# Environment: BATCHES ("64 256"), EPOCHS (2), FREQ (1000), and any EMBER_* variable
#   (e.g. EMBER_CPU_SGEMM=openblas to profile with OpenBLAS for every GEMM).
# Needs perf (Debian: linux-perf) and python3.
set -eu
BUILD=${1:-build}
BATCHES=${BATCHES:-64 256}
EPOCHS=${EPOCHS:-2}
FREQ=${FREQ:-1000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
command -v perf >/dev/null || { echo "profile_train.sh: perf not found (Debian: apt-get install linux-perf)"; exit 1; }
[ -x "$BUILD/ember" ] || { echo "profile_train.sh: $BUILD/ember not built (scripts/build.sh $BUILD)"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for b in $BATCHES; do
    perf record -q -F "$FREQ" --call-graph dwarf,16384 -o "$TMP/perf.data" \
        "$BUILD/ember" train --device cpu --threads 1 --epochs "$EPOCHS" --batch-size "$b" --checkpoint none \
        --test-samples 1000 >"$TMP/out" 2>/dev/null
    echo
    echo "== batch $b, 1 thread: $(grep "^epoch $EPOCHS/" "$TMP/out" | sed 's/.*, \([0-9]* samples\/s ([0-9.]* s)\).*/\1/')"
    perf script -i "$TMP/perf.data" -F comm,tid,ip,sym,dso 2>/dev/null | python3 bench/profile_train.py
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
