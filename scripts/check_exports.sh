#!/usr/bin/env bash
# The export rule: libember.so exports exactly the public API, the functions include/ember/*.h
# declares with EM_API (include/ember/export.h); every other global of the library (the em__
# internals) is hidden by -fvisibility=hidden.
#   scripts/check_exports.sh [--coverage] LIBEMBER_SO INCLUDE_DIR [LIBEMBER_A]
#                                          --coverage: a --coverage build, whose libember.so
#                                          carries GCC's coverage runtime and its exports
#                                          (__gcov_*, mangle_path): those are not counted
#   scripts/check_exports.sh --self-test   a small library with a leak, a hidden public function
#                                          and a forgotten EM_API: each must fail the check
# Fails when
#   - `nm -D` shows a defined symbol that is not an EM_API name (a leaked internal);
#   - an EM_API name is not em_ (public names are em_, internal ones em__) or is not exported;
#   - an EM_API line does not carry the declared function's name before its '(' (the check
#     reads names from those lines: keep `EM_API type name(` on one line);
#   - with LIBEMBER_A: a global that the static library defines and a header names (em_...) is
#     not exported: a public function declared without EM_API;
#   - with LIBEMBER_A: a global that the static library defines is neither an EM_API name nor
#     em__-prefixed (the naming rule: em_ public, em__ internal).
# DLPack's header (include/ember/dlpack.h) declares types only, so no DLPack symbol is allowed.
set -euo pipefail

self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

check() { # LIB.so INCLUDE_DIR [LIB.a]
    local so="$1" inc="$2" ar="${3:-}" fail=0 tmp
    tmp="$(mktemp -d -p "$work")"
    [ -r "$so" ] || { echo "check_exports: no shared library at $so" >&2; return 1; }
    # the names the headers export: `EM_API <type> name(` (a deprecated name's
    # `EM_DEPRECATED("...")` mark dropped first)
    grep -h '^[[:space:]]*EM_API[[:space:]]' "$inc"/ember/*.h | sed -E 's/EM_DEPRECATED\("[^"]*"\)//' \
        >"$tmp/api_lines" || true
    if grep -v '^[[:space:]]*EM_API[^(]*[A-Za-z_][A-Za-z0-9_]*[[:space:]]*(' "$tmp/api_lines" >"$tmp/bad_lines"; then
        sed 's/^/check_exports: an EM_API line without "name(": /' "$tmp/bad_lines" >&2
        fail=1
    fi
    sed -nE 's/^[[:space:]]*EM_API[^(]*[^A-Za-z0-9_(]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\1/p' \
        "$tmp/api_lines" | sort -u >"$tmp/api"
    [ -s "$tmp/api" ] || { echo "check_exports: no EM_API declaration under $inc/ember" >&2; return 1; }
    grep -vE '^em_[a-z0-9]' "$tmp/api" | sed 's/^/check_exports: EM_API on a name that is not public (em_): /' >&2 && fail=1
    # what the library exports
    nm -D --defined-only "$so" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/exported"
    if [ "$coverage" = 1 ]; then
        grep -vE '^(__gcov_.*|mangle_path)$' "$tmp/exported" >"$tmp/exported_own" || true
        mv "$tmp/exported_own" "$tmp/exported"
    fi
    comm -23 "$tmp/exported" "$tmp/api" >"$tmp/leaked"
    if [ -s "$tmp/leaked" ]; then
        echo "check_exports: $so exports $(wc -l <"$tmp/leaked") symbol(s) the headers do not declare with EM_API:" >&2
        sed 's/^/  /' "$tmp/leaked" | head -40 >&2
        fail=1
    fi
    comm -13 "$tmp/exported" "$tmp/api" >"$tmp/missing"
    if [ -s "$tmp/missing" ]; then
        echo "check_exports: $so does not export $(wc -l <"$tmp/missing") EM_API function(s):" >&2
        sed 's/^/  /' "$tmp/missing" | head -40 >&2
        fail=1
    fi
    if [ -n "$ar" ]; then
        # a public function whose declaration lacks EM_API: named in a header, defined by the
        # library, not exported
        cat "$inc"/ember/*.h | grep -oE '\bem_[a-z0-9][A-Za-z0-9_]*' | sort -u >"$tmp/named"
        nm -g --defined-only "$ar" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ { print $3 }' | sort -u >"$tmp/defined"
        comm -12 "$tmp/named" "$tmp/defined" | comm -23 - "$tmp/exported" >"$tmp/unmarked"
        if [ -s "$tmp/unmarked" ]; then
            echo "check_exports: named in include/ember and defined by the library, but not exported (EM_API missing?):" >&2
            sed 's/^/  /' "$tmp/unmarked" | head -40 >&2
            fail=1
        fi
        # (names the compiler makes are not Ember's: reserved __ names such as ASan's
        # __odr_asan.NAME, and NAME.SUFFIX clones)
        grep -v -e '^em__' -e '^__' -e '\.' "$tmp/defined" | comm -23 - "$tmp/api" >"$tmp/misnamed" || true
        if [ -s "$tmp/misnamed" ]; then
            echo "check_exports: globals of the library that are neither EM_API functions nor em__ internals:" >&2
            sed 's/^/  /' "$tmp/misnamed" | head -40 >&2
            fail=1
        fi
    fi
    [ "$fail" = 0 ] && echo "check_exports: $(basename "$so") exports the $(wc -l <"$tmp/api") EM_API functions and nothing else"
    return $fail
}

self_test() {
    local tmp cc="${CC:-cc}" out
    tmp="$(mktemp -d -p "$work")"
    mkdir -p "$tmp/include/ember"
    cat >"$tmp/include/ember/t.h" <<'EOF'
#define EM_API __attribute__((visibility("default")))
EM_API int em_public_one(int x);
EM_API const char *em_public_two(void);
int em_unmarked(void); /* public, but EM_API forgotten */
EOF
    # lib.c defines: two public functions, one leaked internal, one public-but-unmarked
    cat >"$tmp/lib.c" <<'EOF'
#include <ember/t.h>
int em__internal(int x) { return x + 1; }
int em_public_one(int x) { return em__internal(x); }
const char *em_public_two(void) { return "two"; }
int em_unmarked(void) { return 3; }
EOF
    build() { # NAME EXTRA_CFLAGS...
        local name="$1"; shift
        "$cc" -fPIC -I"$tmp/include" "$@" -c "$tmp/lib.c" -o "$tmp/$name.o" &&
        "$cc" -shared -o "$tmp/$name.so" "$tmp/$name.o" && ar rcs "$tmp/$name.a" "$tmp/$name.o"
    }
    # 1. built without -fvisibility=hidden: em__internal and em_unmarked leak
    build leaky
    if out="$(check "$tmp/leaky.so" "$tmp/include" 2>&1)"; then echo "self-test: a leaking library passed" >&2; return 1; fi
    grep -q '^  em__internal$' <<<"$out" || { echo "self-test: the leak of em__internal was not named: $out" >&2; return 1; }
    # 2. hidden: em_unmarked is named in the header, defined, but not exported
    build hidden -fvisibility=hidden
    if out="$(check "$tmp/hidden.so" "$tmp/include" "$tmp/hidden.a" 2>&1)"; then
        echo "self-test: a public function without EM_API passed" >&2; return 1; fi
    grep -q '^  em_unmarked$' <<<"$out" || { echo "self-test: em_unmarked was not named: $out" >&2; return 1; }
    # 3. the header fixed: passes
    sed -i 's/^int em_unmarked/EM_API int em_unmarked/' "$tmp/include/ember/t.h"
    build fixed -fvisibility=hidden
    check "$tmp/fixed.so" "$tmp/include" "$tmp/fixed.a" >/dev/null || { echo "self-test: a clean library failed" >&2; return 1; }
    # 4. an internal global without the em__ prefix
    printf 'int stray_counter = 1;\n' >>"$tmp/lib.c"
    build misnamed -fvisibility=hidden
    if out="$(check "$tmp/misnamed.so" "$tmp/include" "$tmp/misnamed.a" 2>&1)"; then
        echo "self-test: an internal global named outside em__ passed" >&2; return 1; fi
    grep -q '^  stray_counter$' <<<"$out" || { echo "self-test: stray_counter was not named: $out" >&2; return 1; }
    sed -i '/stray_counter/d' "$tmp/lib.c"
    # 5. a public function declared but hidden (its definition built without the header's EM_API)
    sed -i 's/^#include <ember\/t.h>/#define EM_API/' "$tmp/lib.c"
    build unexported -fvisibility=hidden
    if out="$(check "$tmp/unexported.so" "$tmp/include" 2>&1)"; then
        echo "self-test: a library missing its EM_API functions passed" >&2; return 1; fi
    grep -q '^  em_public_one$' <<<"$out" || { echo "self-test: the missing em_public_one was not named: $out" >&2; return 1; }
    echo "check_exports: self-test: a leaked internal, a forgotten EM_API, a global outside em__ and a hidden public function each fail"
}

coverage=0
if [ "${1:-}" = --self-test ]; then
    self_test
else
    [ "${1:-}" = --coverage ] && { coverage=1; shift; }
    [ $# -ge 2 ] || { echo "usage: $self [--coverage] LIBEMBER_SO INCLUDE_DIR [LIBEMBER_A] | --self-test" >&2; exit 2; }
    check "$@"
fi
