#!/usr/bin/env bash
# Line coverage of src/ by the whole test suite, per directory (gcov; no other tool needed).
# Builds in build-cov/ with --coverage, runs ctest there, prints a table and the files
# below 90%. Usage: scripts/coverage.sh [build-dir]   (CI runs it; about a minute of tests)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-cov}"
root="$(pwd)"
EMBER_BUILD_TYPE=Release scripts/build.sh "$dir" -DCMAKE_C_FLAGS=--coverage \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage
find "$dir" -name '*.gcda' -delete
rc=0
ctest --test-dir "$dir" -j2 --output-on-failure >"$dir/coverage-ctest.log" 2>&1 || rc=$?
tail -n 3 "$dir/coverage-ctest.log"
# gcov -n prints, per source file, "File '<path>'" then "Lines executed:P% of N"; an object
# no test ran (no .gcda) counts as 0%.
objdir="$dir/CMakeFiles/ember_obj.dir"
( cd "$objdir" && find . -name '*.gcno' | while read -r g; do
    gcov -n -o "$(dirname "$g")" "$g" 2>/dev/null || true
  done ) | awk -v root="$root/" '
  /^File / { f = $2; gsub(/\047/, "", f); sub(root, "", f); next }
  /^Lines executed:/ {
    if (f !~ /^src\// || seen[f]++) next
    split($2, a, ":"); pct = a[2]; sub(/%/, "", pct)
    printf "%s %d %.2f\n", f, $4, pct * $4 / 100
  }' | sort >"$dir/coverage-files.txt"
awk '
  { d = $1; sub(/\/[^\/]*$/, "", d); if (!(d in tot)) order[++nd] = d
    tot[d] += $2; hit[d] += $3; T += $2; H += $3
    if ($2 > 0 && $3 < 0.9 * $2) low[++nl] = sprintf("  %-44s %6.1f%% of %d", $1, 100 * $3 / $2, $2) }
  END {
    printf "%-24s %8s %8s %8s\n", "line coverage", "lines", "covered", "percent"
    for (i = 1; i <= nd; i++) { d = order[i]; printf "%-24s %8d %8d %7.1f%%\n", d, tot[d], hit[d], 100 * hit[d] / tot[d] }
    printf "%-24s %8d %8d %7.1f%%\n", "all of src/", T, H, T ? 100 * H / T : 0
    print "files below 90%:"
    for (i = 1; i <= nl; i++) print low[i]
  }' "$dir/coverage-files.txt"
exit "$rc"
