#!/usr/bin/env bash
# Ember built from source inside another project, as projects that embed it meet it (CI, from
# .ci/run), outside this tree and with no network:
#  1. add_subdirectory (tests/consumer/add_subdirectory): a parent that adds warnings of its
#     own through CMAKE_C_FLAGS (-Wshadow, and -Wc++-compat, which C's uncast malloc always
#     trips) and leaves every EMBER_ option at its default. Its build of everything must pass
#     although the compiler warns in Ember's sources (EMBER_WERROR is off); no test,
#     benchmark or example of Ember may be built; Ember's own flags (-Werror, -Wall, -march,
#     -fvisibility, _GNU_SOURCE, sanitizers) must not reach the parent's compile lines; the
#     consumer program must run linked shared and static; libember.so exports the public API
#     only (scripts/check_exports.sh).
#  2. FetchContent (tests/consumer/fetch_content): Ember fetched from a local git repository
#     holding a snapshot of this tree (its tracked and untracked, not ignored, files), built
#     and linked; the consumer program must run.
# Usage: scripts/test_embed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_embed: FAIL: $*" >&2; exit 1; }
jobs="$(nproc)"
cp -r tests/consumer "$tmp/consumer"

cache_is() { # cache_is BUILD VAR VALUE
    grep -q "^$2:[A-Z]*=$3\$" "$1/CMakeCache.txt" || fail "$2 is not $3 in $1: $(grep "^$2:" "$1/CMakeCache.txt" || echo unset)"
}

# the compile line of every file of compile_commands.json whose path matches a pattern
compile_lines() { # compile_lines BUILD REGEX
    python3 - "$1/compile_commands.json" "$2" <<'EOF'
import json, re, sys
for e in json.load(open(sys.argv[1])):
    if re.search(sys.argv[2], e["file"]):
        print(e.get("command") or " ".join(e["arguments"]))
EOF
}

# ---- 1. add_subdirectory ---------------------------------------------------------------
sub="$tmp/sub"
cmake -S "$tmp/consumer/add_subdirectory" -B "$sub" -DEMBER_SOURCE="$root" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS="-Wshadow -Wc++-compat" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$tmp/sub_configure.log" ||
    { cat "$tmp/sub_configure.log" >&2; fail "the add_subdirectory parent does not configure"; }
for v in EMBER_BUILD_TESTS EMBER_BUILD_BENCH EMBER_BUILD_EXAMPLES EMBER_WERROR EMBER_NATIVE; do
    cache_is "$sub" "$v" OFF
done
cmake --build "$sub" -j"$jobs" >"$tmp/sub_build.log" 2>&1 ||
    { tail -40 "$tmp/sub_build.log" >&2; fail "the add_subdirectory parent does not build"; }
# the proof that warnings do not fail the build: the compiler did warn, in Ember's sources
warned="$(grep -cE "^$root/(src|tools)/.*warning: .*\[-W(shadow|c\+\+-compat)\]" "$tmp/sub_build.log" || true)"
[ "$warned" -gt 0 ] || fail "no warning in Ember's sources: pick flags that warn there, or this proves nothing"
grep -q "\[-Werror" "$tmp/sub_build.log" && fail "a warning was an error in the parent's build"
echo "test_embed: add_subdirectory: built with -Wshadow -Wc++-compat: $warned warnings in Ember's sources, none an error"

# nothing of Ember's tests, benchmarks or examples was configured or built
others="$(compile_lines "$sub" "^$root/(tests|bench|examples|fuzz)/")"
[ -z "$others" ] || fail "the parent compiles Ember's tests, benchmarks or examples: $(head -3 <<<"$others")"
for exe in "$sub"/ember/test_* "$sub"/ember/bench_* "$sub"/ember/example_* "$sub"/ember/soak_train; do
    [ ! -e "$exe" ] || fail "the parent built $exe"
done
[ ! -e "$sub/ember/CTestTestfile.cmake" ] || fail "Ember registered tests in the parent's build"

# Ember's flags stay on Ember's targets; the parent's flags are the parent's
parent_line="$(compile_lines "$sub" "/consumer/main\\.c$" | sed -n 1p)"
[ -n "$parent_line" ] || fail "no compile line for the parent's main.c"
grep -q -- "-Wshadow -Wc++-compat" <<<"$parent_line" || fail "the parent's own flags are missing: $parent_line"
for flag in -Werror -Wall -Wextra -march -mtune -fvisibility -D_GNU_SOURCE -fsanitize -DEMBER_HAVE; do
    if grep -q -- "$flag" <<<"$parent_line"; then fail "Ember's $flag reached the parent's compile line: $parent_line"; fi
done
ember_line="$(compile_lines "$sub" "$root/src/core/tensor\\.c$" | sed -n 1p)"
grep -q -- "-Wall" <<<"$ember_line" || fail "Ember's own -Wall is missing from its compile line: $ember_line"
grep -q -- "-Werror" <<<"$ember_line" && fail "EMBER_WERROR is off but Ember's compile line has -Werror: $ember_line"
grep -qE -- "-march|-mtune" <<<"$ember_line" && fail "EMBER_NATIVE is off but Ember's compile line has -march/-mtune: $ember_line"
echo "test_embed: add_subdirectory: no test, benchmark or example built; Ember's flags stay on Ember's targets"

libs="$(ldd "$sub/consumer_subdir_shared")"
grep "libember\.so" <<<"$libs" | grep -q "$sub/ember/" || fail "consumer_subdir_shared does not use the parent's libember.so: $libs"
"$sub/consumer_subdir_shared" >/dev/null || fail "consumer_subdir_shared failed"
"$sub/consumer_subdir_static" >/dev/null || fail "consumer_subdir_static failed"
scripts/check_exports.sh "$sub/ember/libember.so" include "$sub/ember/libember.a" >/dev/null ||
    fail "the parent's libember.so exports more or less than the public API"
echo "test_embed: add_subdirectory: Ember::ember and Ember::ember_static linked and ran; libember.so exports the public API only"

# ---- 2. FetchContent from a local git repository --------------------------------------
repo="$tmp/ember.git"
mkdir -p "$repo"
# this tree as it is (uncommitted changes included), not what HEAD was
git ls-files -z --cached --others --exclude-standard |
    tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$repo"
git -C "$repo" init -q
git -C "$repo" add -A
git -C "$repo" -c user.name=test_embed -c user.email=test_embed@localhost commit -qm "a snapshot for test_embed"
tag="$(git -C "$repo" rev-parse HEAD)"
fc="$tmp/fetch"
cmake -S "$tmp/consumer/fetch_content" -B "$fc" -DEMBER_GIT_REPOSITORY="file://$repo" -DEMBER_GIT_TAG="$tag" \
      -DCMAKE_BUILD_TYPE=Release >"$tmp/fetch_configure.log" 2>&1 ||
    { tail -40 "$tmp/fetch_configure.log" >&2; fail "the FetchContent parent does not configure"; }
[ -f "$fc/_deps/ember-src/include/ember/ember.h" ] || fail "FetchContent did not fetch Ember into _deps/ember-src"
cache_is "$fc" EMBER_BUILD_TESTS OFF
cmake --build "$fc" -j"$jobs" --target consumer_fetch >"$tmp/fetch_build.log" 2>&1 ||
    { tail -40 "$tmp/fetch_build.log" >&2; fail "the FetchContent parent does not build"; }
"$fc/consumer_fetch" >/dev/null || fail "consumer_fetch failed"
echo "test_embed: FetchContent (git, commit ${tag:0:12} of a local snapshot): Ember::ember linked and ran"
