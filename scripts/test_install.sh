#!/usr/bin/env bash
# The installed package, as its users meet it (CI, from .ci/run):
#  1. cmake --install of the release build into a temporary prefix; the layout and the soname;
#  2. tests/consumer built outside the tree against that prefix with find_package(Ember CONFIG)
#     and with pkg-config, each linked shared and static, and run;
#  3. the .deb from CPack: its dependencies listed, installed with dpkg -i, `ember --version`
#     and `ember devices` run from /usr/bin, then purged again (needs root; otherwise
#     reported as skipped).
# Usage: scripts/test_install.sh [build-dir]   (default build/, built first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build="${1:-build}"
scripts/build.sh "$build" >/dev/null
tmp="$(mktemp -d)"
deb_installed=""
cleanup() {
    [ -n "$deb_installed" ] && dpkg -P ember >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

# ---- 1. install ----------------------------------------------------------------------------
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(dirname "$(find "$prefix" -name libember.a | head -1)")"
[ -n "$libdir" ] || fail "no libember.a under $prefix"
for f in "$prefix/bin/ember" "$prefix/include/ember/ember.h" "$prefix/include/ember/version.h" \
         "$libdir/libember.so" "$libdir/pkgconfig/ember.pc" "$libdir/cmake/Ember/EmberConfig.cmake" \
         "$libdir/cmake/Ember/EmberConfigVersion.cmake" "$prefix/share/man/man1/ember.1" \
         "$prefix/share/bash-completion/completions/ember" "$prefix/include/ember/dlpack.h"; do
    [ -e "$f" ] || fail "missing after install: ${f#"$prefix"/}"
done
major="$(sed -n 's/^#define EMBER_VERSION_MAJOR \([0-9]*\).*/\1/p' include/ember/version.h)"
soname="$(readelf -d "$libdir/libember.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[ "$soname" = "libember.so.$major" ] || fail "soname is '$soname', expected libember.so.$major"
[ -e "$libdir/$soname" ] || fail "$soname is not installed"
version="$(sed -n 's/^#define EMBER_VERSION_STRING "\([^"]*\)".*/\1/p' include/ember/version.h)"
[ "$("$prefix/bin/ember" --version | head -1)" = "ember $version" ] || fail "ember --version does not say $version"
echo "test_install: installed into a temporary prefix: $soname, libember.a, ember $version"

check_links() { # check_links EXE shared|static
    # ldd's output is read whole first: `ldd | grep -q` under pipefail fails at random when
    # grep exits at its first match and ldd, still writing, dies of SIGPIPE
    local libs
    libs="$(ldd "$1")"
    if grep -q 'libember\.so' <<<"$libs"; then
        [ "$2" = shared ] || fail "$1 is linked static but needs libember.so"
        grep 'libember\.so' <<<"$libs" | grep "$prefix" >/dev/null || fail "$1 does not use the installed libember.so"
    else
        [ "$2" = static ] || fail "$1 is linked shared but does not need libember.so"
    fi
    "$1" >/dev/null || fail "$1 failed"
}

# ---- 2. consumers outside the tree ---------------------------------------------------------
cp -r tests/consumer "$tmp/src"
cmake -S "$tmp/src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
check_links "$tmp/cmake/consumer_shared" shared
check_links "$tmp/cmake/consumer_static" static
echo "test_install: find_package(Ember CONFIG): Ember::ember and Ember::ember_static built and ran"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion ember)" = "$version" ] || fail "pkg-config --modversion ember is not $version"
# shellcheck disable=SC2046 # the flags are words
cc -std=c11 -o "$tmp/pc_shared" "$tmp/src/main.c" $(pkg-config --cflags --libs ember) \
   -Wl,-rpath,"$(pkg-config --variable=libdir ember)"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/pc_static" "$tmp/src/main.c" $(pkg-config --cflags ember) \
   $(pkg-config --static --libs ember | sed 's/-lember\b/-l:libember.a/')
check_links "$tmp/pc_shared" shared
check_links "$tmp/pc_static" static
echo "test_install: pkg-config ember: shared and static built and ran"

# ---- 3. the .deb ---------------------------------------------------------------------------
rm -f "$build"/ember_*.deb
(cd "$build" && cpack -G DEB >/dev/null)
deb="$(ls "$build"/ember_*.deb)"
depends="$(dpkg-deb -f "$deb" Depends)"
echo "test_install: $(basename "$deb"): Depends: $depends"
for need in zlib1g libopenblas ocl-icd-libopencl1; do
    case "$depends" in *"$need"*) ;; *) fail "the .deb does not depend on $need" ;; esac
done
# plots: a command built with cairo (--plot) needs libcairo2
if nm -D "$build/ember" 2>/dev/null | grep ' U cairo_create' >/dev/null; then
    case "$depends" in *libcairo2*) ;; *) fail "the command uses cairo but the .deb does not depend on libcairo2" ;; esac
fi
dpkg-deb -c "$deb" >"$tmp/contents.txt"
for f in ./usr/bin/ember ./usr/include/ember/ember.h "./usr/lib/.*libember\.so\.$major" "./usr/lib/.*pkgconfig/ember.pc" \
         "./usr/lib/.*cmake/Ember/EmberConfig.cmake" ./usr/share/man/man1/ember.1 ./usr/share/bash-completion/completions/ember; do
    grep -q " $f\( \|$\)" "$tmp/contents.txt" || fail "the .deb has no $f"
done
if [ "$(id -u)" -ne 0 ]; then
    echo "test_install: SKIP: dpkg -i needs root"
    exit 0
fi
if dpkg-query -W -f='${Status}' ember 2>/dev/null | grep -q "ok installed"; then
    echo "test_install: SKIP: a package named ember is installed already; not replacing it"
    exit 0
fi
dpkg -i "$deb" >/dev/null
deb_installed=1
[ "$(/usr/bin/ember --version | head -1)" = "ember $version" ] || fail "/usr/bin/ember --version is not $version"
/usr/bin/ember devices >"$tmp/devices.txt" || fail "ember devices failed: $(cat "$tmp/devices.txt")"
grep -q cpu "$tmp/devices.txt" || fail "ember devices does not list the CPU"
[ "$(pkg-config --modversion ember)" = "$version" ] || fail "the .deb's ember.pc is not found"
dpkg -P ember >/dev/null
deb_installed=""
[ ! -e /usr/bin/ember ] || fail "/usr/bin/ember is still there after dpkg -P"
echo "test_install: the .deb installed, ran 'ember devices' ($(grep -c . "$tmp/devices.txt") lines), purged it"
