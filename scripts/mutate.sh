#!/usr/bin/env bash
# Mutation testing: plants each mutation of scripts/mutations.txt alone in the source tree,
# rebuilds what the mutation's tests need (in build-mut/), runs those tests, restores the
# file, and prints whether the tests caught it. Not run by CI (several minutes).
# Usage: scripts/mutate.sh [list-file] [filter]   (filter: only mutations whose line contains it)
# Don't edit or build the same checkout while it runs: it changes files under src/.
set -euo pipefail
cd "$(dirname "$0")/.."
list="${1:-scripts/mutations.txt}"
filter="${2:-}"
dir=build-mut
scripts/build.sh "$dir" >/dev/null

backup=""; target=""
# The restored file gets a new mtime (no cp -p), so that the next build recompiles it.
restore() { if [ -n "$backup" ]; then cp "$backup" "$target"; rm -f "$backup"; backup=""; fi; }
trap restore EXIT
trap 'restore; exit 130' INT TERM

# Replaces the one occurrence of $2 in file $1 with $3; exit 2 when it is not exactly one.
plant() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
n = text.count(old)
if n != 1:
    print(f"found {n} times", end="")
    sys.exit(2)
open(path, "w").write(text.replace(old, new))
PY
}

caught=0; total=0; missed=(); stale=(); invalid=()
while IFS= read -r line <&3; do
  case "$line" in ''|\#*) continue ;; esac
  [ -n "$filter" ] && [[ "$line" != *"$filter"* ]] && continue
  # fields separated by " | "
  rest="$line"; fields=()
  for _ in 1 2 3; do fields+=("${rest%% | *}"); rest="${rest#* | }"; done
  fields+=("$rest")
  file="${fields[0]}"; old="${fields[1]}"; new="${fields[2]}"; tests="${fields[3]}"
  total=$((total + 1))
  label="$file: ${old:0:60}"
  if [ ! -f "$file" ]; then
    found=$(find src -name "$(basename "$file")" -type f)
    [ "$(printf '%s\n' "$found" | grep -c .)" = 1 ] && file="$found"
  fi
  if [ ! -f "$file" ]; then
    echo "STALE: $label (no such file)"; stale+=("$label"); continue
  fi
  target="$file"; backup="$(mktemp)"; cp "$file" "$backup"
  if ! why=$(plant "$file" "$old" "$new"); then
    restore; echo "STALE: $label ($why)"; stale+=("$label"); continue
  fi
  names=$(ctest --test-dir "$dir" -N -R "$tests" | sed -n 's/^ *Test *#[0-9]*: //p')
  if [ -z "$names" ]; then
    restore; echo "STALE: $label (no test matches '$tests')"; stale+=("$label"); continue
  fi
  # shellcheck disable=SC2086
  if ! cmake --build "$dir" -j"$(nproc)" --target ember_cli $names >"$dir/mutate-build.log" 2>&1; then
    result="INVALID (does not build: see $dir/mutate-build.log)"
  elif ctest --test-dir "$dir" -R "$tests" -j2 --timeout 300 >"$dir/mutate-test.log" 2>&1; then
    result="NOT caught"
  else
    failing=$(grep -E '^ *[0-9]+/[0-9]+ Test .*(Failed|Timeout|Exception)' "$dir/mutate-test.log" |
              sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/' | tr '\n' ' ')
    result="caught (by ${failing% })"
  fi
  restore
  if [[ "$result" == caught* ]]; then caught=$((caught + 1))
  elif [[ "$result" == INVALID* ]]; then invalid+=("$label")
  else missed+=("$label"); fi
  printf "%s: %s -> %s [%s]\n" "$result" "$label" "${new:0:50}" "$tests"
done 3<"$list"
echo "mutations caught: $caught of $total (stale: ${#stale[@]}, not building: ${#invalid[@]})"
for m in "${missed[@]+"${missed[@]}"}"; do echo "  not caught: $m"; done
# leave build-mut built from the unmutated sources
cmake --build "$dir" -j"$(nproc)" >/dev/null
