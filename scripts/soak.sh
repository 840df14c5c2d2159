#!/usr/bin/env bash
# The soak test (not in the default suite): builds the release build and runs tests/soak_train.c,
# training steps with an evaluation and a checkpoint every N steps; it fails if device memory
# moves or RSS grows after warm-up, a file descriptor leaks or a temporary file is left.
# Usage: scripts/soak.sh [steps (20000)] [every (1000)] [device (cpu)]
#        scripts/soak.sh --short    the CI form: 2000 steps, a point every 200, CPU then opencl:0
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >/dev/null
if [ "${1:-}" = "--short" ]; then
  build/soak_train --steps 2000 --every 200 --device cpu
  if build/ember devices 2>/dev/null | grep "opencl:0" >/dev/null; then
    build/soak_train --steps 1000 --every 100 --device opencl:0
  else
    echo "soak: no OpenCL device, opencl:0 part SKIPPED"
  fi
else
  build/soak_train --steps "${1:-20000}" --every "${2:-1000}" --device "${3:-cpu}"
fi
