#!/usr/bin/env bash
# The API reference: doxygen over include/ember/*.h (docs/api/Doxyfile) into build/docs/html,
# failing on any warning: an undocumented public function, type, field or macro, or a broken
# doc command. Then a self-check: the same run over a copy of the headers with one
# undocumented function added must fail and name it (so the gate cannot pass by accident).
# Usage: scripts/docs.sh [output-dir]   (default build/docs)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v doxygen >/dev/null || { echo "docs: doxygen is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
out="${1:-build/docs}"
rm -rf "$out" && mkdir -p "$out"
EMBER_DOCS_OUT="$(cd "$out" && pwd)" doxygen docs/api/Doxyfile
echo "docs: the API reference is in $out/html ($(find "$out/html" -name '*.html' | wc -l) pages); doxygen gave no warning"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include" "$tmp/docs"
cp -r include/ember "$tmp/include/"
cp -r docs/api "$tmp/docs/"
printf '/* A header of the self-check. */\nint em_docs_self_check_undocumented(int x);\n' >"$tmp/include/ember/zz_self_check.h"
if (cd "$tmp" && EMBER_DOCS_OUT="$tmp/out" doxygen docs/api/Doxyfile >"$tmp/log" 2>&1); then
    echo "docs: FAIL: doxygen passed headers with an undocumented function" >&2
    exit 1
fi
grep -q "em_docs_self_check_undocumented.*is not documented" "$tmp/log" || {
    echo "docs: FAIL: doxygen failed the self-check for another reason:" >&2; cat "$tmp/log" >&2; exit 1; }
echo "docs: self-check: an undocumented function fails the build, as it should"
