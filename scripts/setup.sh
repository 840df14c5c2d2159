#!/usr/bin/env bash
# Installs, idempotently, every Debian package Ember needs on a fresh machine, then builds it.
# Usage: scripts/setup.sh            (packages + release build in build/)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config clang        # compilers (clang for the fuzz targets)
  libopenblas-dev zlib1g-dev                     # CPU GEMM, .gz data files
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo   # OpenCL, run on the CPU by PoCL
  libclblast-dev                                 # CLBlast GEMM (dlopen'ed): its test runs, not skips
  libdnnl-dev                                    # oneDNN: bf16/f16 CPU matmul (AMX), convolution
  libpcre2-dev libicu-dev                        # tokenizers: split patterns; NFC/NFKC normalizers
  libopenmpi-dev openmpi-bin                     # MPI: distributed training, the launcher
  iproute2                                       # ip netns: the two-host distributed test
  fortunes                                       # plain English text for `ember train --model gpt`
  dataset-fashion-mnist                          # the data `ember train` uses
  valgrind                                       # leak check of a training run in CI
  python3                                        # scripts/gpu_check_test.sh (CI) reads its JSON
  # packaging, DLPack, docs: CPack's .deb needs dpkg-dev (dpkg-shlibdeps)
  dpkg-dev python3-numpy                         # the .deb; DLPack tests with NumPy (ctypes shim)
  doxygen python3-jsonschema                     # API reference (scripts/docs.sh); --json schemas
  # TensorBoard: the virtual environment of tests/python/test_tensorboard.py
  python3-venv python3-pip
  # plots: `ember bench --plot`, `ember train --plot` draw PNG and SVG with cairo
  libcairo2-dev libfontconfig-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

# TensorBoard: its own reader (EventAccumulator, from PyPI) checks Ember's event
# files in tests/python/test_tensorboard.py, which skips (77) without this environment.
if ! .venv-tests/bin/python -c "import tensorboard" 2>/dev/null; then
  echo "setup: making .venv-tests with tensorboard (pip)"
  # no PyPI (an offline machine): a warning, and the test reports a skip saying why
  python3 -m venv .venv-tests && .venv-tests/bin/pip install -q --disable-pip-version-check 'tensorboard>=2.14,<3' ||
    echo "setup: WARNING: could not install tensorboard into .venv-tests; python_test_tensorboard will skip" >&2
fi

scripts/build.sh
