#!/usr/bin/env bash
# Ember without OpenBLAS (CMake -DEMBER_BLAS=OFF: the built-in GEMM of src/backends/cpu/cpu_gemm.c)
# and without oneDNN (-DEMBER_DNNL=OFF: bf16/f16 matmul converts to float32, the portable path,
# except bf16 on a CPU with AMX: Ember's own AMX kernel, which needs no library) builds and
# passes the matmul tests: the direct GEMM test, the CPU matmul test, the golden ops (against
# PyTorch), linear algebra, nn, the bf16/f16 matmul test, the AMX kernel's test (a skip without
# AMX) and the fused attention (its small per-head GEMMs take the built-in one, with its own
# alpha and beta). Only those targets are built, to stay short.
# Usage: scripts/test_noblas.sh [build-dir]   (default build-noblas)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-noblas}
tests=(test_cpu_gemm test_cpu_matmul test_golden_ops test_core_linalg test_nn test_optim_golden test_lowp_matmul
       test_cpu_amx test_attention_fused)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DEMBER_BLAS=OFF -DEMBER_DNNL=OFF -DEMBER_WERROR=ON >/dev/null
grep -q "^EMBER_BLAS:BOOL=OFF" "$dir/CMakeCache.txt"
grep -q "^EMBER_DNNL:BOOL=OFF" "$dir/CMakeCache.txt"
cmake --build "$dir" -j"$(nproc)" --target ember_cli "${tests[@]}"
"$dir/ember" devices | grep "gemm: built-in (" >/dev/null || { echo "test_noblas: ember devices does not report the built-in GEMM" >&2; exit 1; }
"$dir/ember" devices | grep -E "bf16 matmul: (float32 GEMM after conversion \(built without oneDNN\)|Ember's AMX kernel)" \
    >/dev/null || { echo "test_noblas: ember devices reports neither bf16 matmul's portable path nor the AMX kernel" >&2; exit 1; }
ctest --test-dir "$dir" --output-on-failure -j2 -R "^($(IFS='|'; echo "${tests[*]}"))\$"
