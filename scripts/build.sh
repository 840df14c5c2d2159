#!/usr/bin/env bash
# Configures and builds Ember with warnings as errors (EMBER_WERROR=ON; CMake's default is off).
# Usage: scripts/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"; shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-Release}" -DEMBER_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
