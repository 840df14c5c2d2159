#!/usr/bin/env bash
# Prints the skipped tests and cases of a ctest run, with their reasons, from ctest's log.
# tests/test.h prints "SKIP case: why"; a program whose every case skipped exits 77, which
# ctest reports as skipped. Usage: scripts/list_skips.sh build/Testing/Temporary/LastTest.log
set -euo pipefail
log="${1:-build/Testing/Temporary/LastTest.log}"
[ -f "$log" ] || { echo "list_skips: no ctest log at $log"; exit 0; }
awk '
  /^[0-9]+\/[0-9]+ Testing: / { test = $3; next }
  /^SKIP [^:]+: / { sub(/^SKIP /, ""); owner[++n] = test; lines[n] = $0; next }
  /^0 passed, 0 failed, [1-9][0-9]* skipped$/ { whole[test] = 1 }
  END {
    if (n == 0) { print "skipped: none"; exit }
    print "skipped (" n " cases; not counted as passed; * = the whole test shows as skipped):"
    for (i = 1; i <= n; i++) printf "  %s%-24s %s\n", (owner[i] in whole) ? "*" : " ", owner[i], lines[i]
  }' "$log"
