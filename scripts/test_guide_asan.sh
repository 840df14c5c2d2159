#!/usr/bin/env bash
# The user guide's code blocks (docs/GUIDE.md) under ASan + UBSan: tests/python/test_guide.py
# with every block compiled -fsanitize=address,undefined against build-asan/libember.so, so a
# guide example that leaks or misuses memory fails. The Release run is ctest's
# python_test_guide (python tests are left out of sanitizer builds: an instrumented
# libember.so cannot be loaded into python, but the blocks are separate programs).
# Usage: scripts/test_guide_asan.sh [build-asan-dir] [release-build-dir for the ember command]
set -euo pipefail
cd "$(dirname "$0")/.."
asan="${1:-build-asan}"
rel="${2:-build}"
[ -f "$asan/CMakeCache.txt" ] || cmake -S . -B "$asan" -DEMBER_SANITIZE=ON -DEMBER_WERROR=ON >/dev/null
cmake --build "$asan" -j"$(nproc)" --target ember >/dev/null
[ -x "$rel/ember" ] || scripts/build.sh "$rel"
EMBER_LIBRARY="$PWD/$asan/libember.so" EMBER_TOOL="$PWD/$rel/ember" \
EMBER_GUIDE_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -g" \
LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0" \
    python3 tests/python/test_guide.py
