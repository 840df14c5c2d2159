#!/usr/bin/env bash
# The one-command proof of Ember's CUDA backend on an NVIDIA GPU (docs/GPU_CHECK.md).
#
# Usage: scripts/gpu_check.sh OUT_DIR [--part 1|2|all] [--dry-run] [--build-dir DIR]
#                                     [--only STEP,...] [--budget SECONDS]
#
# Run from a copy of the repository with .gpu/ beside it (scripts/gpu_prepare.sh makes it: a
# private prefix with OpenBLAS and zlib, and Fashion-MNIST). With the device tool:
#   run(command="scripts/gpu_check.sh $OUT --part 1", carry=[".gpu"], timeout_s=600)
#   run(command="scripts/gpu_check.sh $OUT --part 2", carry=[".gpu"], timeout_s=600)
# Each part builds Ember first when its build is missing (a later call may land on a fresh
# machine), runs its steps each under `timeout`, stops starting steps when its time budget
# (default 530 s) is spent, and leaves exactly three files in OUT_DIR:
#   report-partN.md, report-partN.json   pass/fail/skip per step, the figures, each figure as
#                                        a fraction of the roofline (measured and spec)
#   logs-partN.tar.gz                    every step's full output
# Part 1: preflight, deps, build, devices, ctest (whole suite with cuda:0 present),
#         blocking (golden + backend-ops suites with EMBER_CUDA_LAUNCH_BLOCKING=1),
#         memcheck (compute-sanitizer over backend-ops and golden).
# Part 2: preflight, deps, build, devices, smi (ember devices/smi against nvidia-smi field by
#         field), bench (ember bench --device cuda:0: matmul per dtype at 4096 and 8192, copies,
#         launch latency, crossover; f32 again with TF32), copy_d2d (device-to-device bandwidth
#         through Ember), roofline_torch (the same GPU through PyTorch), train_cuda,
#         train_torch, train_cpu (ember train on cuda:0, the same MLP and batches in PyTorch on
#         the GPU, ember train on the CPU), bench_cpu, train_amp (--amp bf16 and f16 on cuda:0),
#         nccl (the DDP seed twin as one rank over NCCL), train_cnn, train_cnn_torch (the CNN
#         through cuDNN, and in PyTorch on the GPU), racecheck, synccheck.
# --only STEP,...: those steps, from either part, after preflight, deps, build and devices;
#   e.g. what a part had to skip for time: --part 2 --only racecheck,synccheck
# --dry-run: on a machine without a GPU, every step that needs one is reported "skip" with
#   the reason; the others run (CI runs this: scripts/gpu_check_test.sh). Without --dry-run a
#   missing GPU fails those steps.
# Environment: EMBER_GPU_DIR (.gpu), PYTHON (python3), EMBER_GPU_CHECK_BUILD (build-gpu).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
OUT="" PART=all DRY=0 ONLY="" BUDGET=530
BUILD=${EMBER_GPU_CHECK_BUILD:-build-gpu}
while (($#)); do
    case "$1" in
    --part) PART=${2:-}; shift 2 || { echo "gpu_check: --part needs 1, 2 or all" >&2; exit 2; } ;;
    --dry-run) DRY=1; shift ;;
    --build-dir) BUILD=${2:-}; shift 2 || { echo "gpu_check: --build-dir needs a directory" >&2; exit 2; } ;;
    --only) ONLY=${2:-}; shift 2 || { echo "gpu_check: --only needs step names" >&2; exit 2; } ;;
    --budget) BUDGET=${2:-}; shift 2 || { echo "gpu_check: --budget needs seconds" >&2; exit 2; } ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "gpu_check: one OUT_DIR expected, got '$OUT' and '$1'" >&2; exit 2; }
       OUT=$1; shift ;;
    esac
done
[ -n "$OUT" ] || { echo "gpu_check: OUT_DIR missing (--help for usage)" >&2; exit 2; }
case "$PART" in 1 | 2 | all) ;; *) echo "gpu_check: --part expects 1, 2 or all, got '$PART'" >&2; exit 2 ;; esac
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget expects whole seconds, got '$BUDGET'" >&2; exit 2; }
[ -n "$BUILD" ] || { echo "gpu_check: --build-dir is empty" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
TAG=part$PART
[ "$PART" = all ] && TAG=all
PY=${PYTHON:-python3}
GPU_DIR=${EMBER_GPU_DIR:-$ROOT/.gpu}
NPROC=$(nproc 2>/dev/null || echo 2)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOGS=$WORK/logs-$TAG
FACTS=$LOGS/facts
mkdir -p "$FACTS"
STEPS=$LOGS/steps.tsv
: >"$STEPS"
SECONDS=0

# ---- what this machine has ----
GPU_OK=1 GPU_WHY=""
if ((DRY)); then
    GPU_OK=0 GPU_WHY="skipped: no driver (dry run)"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
    GPU_OK=0 GPU_WHY="no driver: nvidia-smi not found"
elif ! nvidia-smi -L >/dev/null 2>&1; then
    GPU_OK=0 GPU_WHY="no driver: nvidia-smi -L fails ($(nvidia-smi -L 2>&1 | head -n1))"
fi
if command -v compute-sanitizer >/dev/null 2>&1; then SAN=compute-sanitizer
elif [ -x /usr/local/cuda/bin/compute-sanitizer ]; then SAN=/usr/local/cuda/bin/compute-sanitizer
else SAN=""; fi
TORCH_OK=0
"$PY" -c "import torch" >/dev/null 2>&1 && TORCH_OK=1

# The private prefix of .gpu/deps.tar.xz, unpacked once into the build directory.
DEPS=$BUILD/deps
ORIG_LD=${LD_LIBRARY_PATH-} # PyTorch runs with the machine's own libraries, not the prefix
TRIPLET=$( (gcc -print-multiarch || cc -print-multiarch) 2>/dev/null | head -n1)
TRIPLET=${TRIPLET:-x86_64-linux-gnu}
use_deps() {
    [ -d "$DEPS/usr" ] || return 0
    [[ ":${CMAKE_PREFIX_PATH-}:" == *":$DEPS/usr:"* ]] && return 0 # once
    export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    local l=$DEPS/usr/lib/$TRIPLET
    export LD_LIBRARY_PATH=$l:$l/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}
use_deps
if [ -d "$GPU_DIR/fashion-mnist" ]; then DATA=$GPU_DIR/fashion-mnist
else DATA=""; fi
[ -n "$DATA" ] && export EMBER_DATA_DIR=$DATA
EMBER=$BUILD/ember

# ---- steps ----
# step NAME NEEDS LIMIT FUNCTION: NEEDS is a comma list of gpu, sanitizer, torch, data, build.
# The function runs in a child bash under `timeout`, its output in logs/NAME.log; 0 is pass,
# 124/137 timeout, anything else fail. A step whose needs are missing is a skip in a dry run
# (or when a prerequisite, not the GPU, is what is missing) and a fail otherwise.
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$STEPS"; }
# preflight, deps, build and devices always run (cheap when done; what the rest stands on)
wanted() { [ -z "$ONLY" ] || [[ ",preflight,deps,build,devices,$ONLY," == *",$1,"* ]]; }
step() {
    local name=$1 needs=$2 limit=$3 fn=$4 why="" hard=0
    wanted "$name" || return 0
    for n in ${needs//,/ }; do
        case $n in
        gpu) ((GPU_OK)) || { why=$GPU_WHY; ((DRY)) || hard=1; } ;;
        sanitizer) [ -n "$SAN" ] || { why=${why:-"skipped: compute-sanitizer not found"}; ((DRY)) || hard=1; } ;;
        torch) ((TORCH_OK)) || why=${why:-"skipped: $PY cannot import torch"} ;;
        data) [ -n "$DATA" ] || [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
                  why=${why:-"skipped: no Fashion-MNIST ($GPU_DIR/fashion-mnist or the Debian package)"} ;;
        build) [ -x "$EMBER" ] || why=${why:-"skipped: no build ($BUILD/ember missing)"} ;;
        esac
    done
    if [ -n "$why" ]; then
        if ((hard)); then
            record "$name" fail "" 0 "$limit" "$why"
            echo "gpu_check: $name: FAIL ($why)"
        else
            record "$name" skip "" 0 "$limit" "${why#skipped: }"
            echo "gpu_check: $name: skip (${why#skipped: })"
        fi
        return 0
    fi
    local left=$((BUDGET - SECONDS - 15))
    if ((left < 10)); then
        record "$name" skip "" 0 "$limit" "the part's time budget (${BUDGET} s) is spent"
        echo "gpu_check: $name: skip (time budget spent)"
        return 0
    fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS rc status
    echo "gpu_check: $name (at most ${limit} s) ..."
    timeout -k 10 "$limit" bash -c "$fn" >"$LOGS/$name.log" 2>&1
    rc=$?
    case $rc in
    0) status=pass ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
    esac
    local why_note
    why_note=$(tail -n1 "$FACTS/$name.note" 2>/dev/null)
    # a failure without a note says what its log ended with
    [ -z "$why_note" ] && [ "$status" != pass ] && why_note=$(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -n2 | paste -sd '/' | cut -c1-300)
    [ "$status" = timeout ] && why_note="killed after $limit s${why_note:+; $why_note}"
    record "$name" "$status" "$rc" $((SECONDS - t0)) "$limit" "${why_note//$'\t'/ }"
    echo "gpu_check: $name: $status ($((SECONDS - t0)) s)"
}
note() { echo "$*" >>"$FACTS/$STEP_NAME.note"; }

# Everything a step function uses must reach the child bash.
export ORIG_LD ROOT BUILD DEPS EMBER PY SAN DATA DRY NPROC FACTS LOGS GPU_DIR TRIPLET
export -f use_deps note

s_preflight() {
    export STEP_NAME=preflight
    echo "== date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname), $(uname -srm)"
    echo "== cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $NPROC cores; $(grep MemTotal /proc/meminfo)"
    echo "== commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    # the device tool copies the working tree, whose .git may be older than the files in it:
    # say when they differ from the commit named
    local changed
    changed=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
    { git -C "$ROOT" rev-parse HEAD 2>/dev/null | tr -d '\n'
      ((changed > 0)) && printf ' + %s changed files' "$changed"; echo; } >"$FACTS/commit"
    for tool in cmake cc gcc nvcc compute-sanitizer ncu nvidia-smi "$PY"; do
        p=$(command -v "$tool" 2>/dev/null || true)
        [ -z "$p" ] && [ -x "/usr/local/cuda/bin/$tool" ] && p=/usr/local/cuda/bin/$tool
        echo "== $tool: ${p:-not found}"
        [ -n "$p" ] && [ "$tool" != nvidia-smi ] && [ "$tool" != "$PY" ] && timeout 15 "$p" --version 2>&1 | head -n4
    done
    timeout 60 "$PY" -c 'import sys, torch; print("== torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n1
    timeout 60 "$PY" -c 'import torch; print(torch.__version__)' >"$FACTS/torch_version" 2>/dev/null
    echo "== .gpu: $(ls "$GPU_DIR" 2>/dev/null | tr '\n' ' ')"
    [ -r "$GPU_DIR/MANIFEST" ] && sed 's/^/   /' "$GPU_DIR/MANIFEST"
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 30 nvidia-smi
        timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm,clocks.max.memory,power.limit,pcie.link.gen.max,pcie.link.width.max \
            --format=csv >"$FACTS/nvidia_smi_gpu.csv" 2>&1
        cat "$FACTS/nvidia_smi_gpu.csv"
        timeout 30 nvidia-smi -q | grep -i -m3 "CUDA Version\|Driver Version"
    else
        echo "== no nvidia-smi: no NVIDIA driver on this machine"
    fi
    command -v cmake >/dev/null && command -v cc >/dev/null
}

s_deps() {
    export STEP_NAME=deps
    if [ ! -r "$GPU_DIR/deps.tar.xz" ]; then
        note "no $GPU_DIR/deps.tar.xz (scripts/gpu_prepare.sh makes it): the build uses this machine's libraries"
        echo "no $GPU_DIR/deps.tar.xz"
        return 0
    fi
    if [ -d "$DEPS/usr" ] && [ "$DEPS/.stamp" -nt "$GPU_DIR/deps.tar.xz" ]; then
        note "prefix already unpacked in $DEPS"
    else
        rm -rf "$DEPS" && mkdir -p "$DEPS" || return 1
        # no xz binary on the machine? Python's tarfile reads .tar.xz too
        if command -v xz >/dev/null 2>&1; then
            tar -C "$DEPS" -xJf "$GPU_DIR/deps.tar.xz" || return 1
        else
            "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
                "$GPU_DIR/deps.tar.xz" "$DEPS" || return 1
        fi
        touch "$DEPS/.stamp"
        note "unpacked $GPU_DIR/deps.tar.xz into $DEPS"
    fi
    find "$DEPS/usr" -name '*.so*' -o -name '*.h' | sed "s|$DEPS/||" | sort
}

# Configure when there is no build and build (incremental). If that fails, try again with
# warnings not fatal (this machine's compiler may warn where Debian 12's GCC 12 does not),
# then also without OpenBLAS (the prefix's may not link here); the note says which.
s_build() {
    export STEP_NAME=build
    use_deps
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
        cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEMBER_WERROR=ON || return 1
    fi
    local tried="" fallback
    for fallback in "" -DEMBER_WERROR=OFF -DEMBER_BLAS=OFF; do
        if [ -n "$fallback" ]; then
            tried="$tried $fallback"
            echo "== the build failed: again with$tried"
            cmake -S "$ROOT" -B "$BUILD" $tried || return 1
        fi
        if cmake --build "$BUILD" -j"$NPROC"; then
            [ -n "$tried" ] && note "built only with$tried (see build.log for why)"
            break
        fi
        [ "$fallback" = -DEMBER_BLAS=OFF ] && return 1
    done
    grep -E "^(EMBER_BLAS|EMBER_WERROR|EMBER_OPENBLAS_LIB|EMBER_CBLAS_INCLUDE|OPENBLAS_LIBRARIES|EMBER_CUDA_INCLUDE|ZLIB_LIBRARY_RELEASE|OpenCL_LIBRARY)" \
        "$BUILD/CMakeCache.txt" | tee "$FACTS/cmake_found"
    [ -x "$BUILD/ember" ]
}

s_devices() {
    export STEP_NAME=devices
    echo "== ember devices (EMBER_CUDA_TRACE=1: where each library was looked for)"
    EMBER_CUDA_TRACE=1 "$EMBER" devices || return 1
    "$EMBER" devices --json >"$FACTS/devices.json" || return 1
    note "$(grep -m1 'gemm:' <("$EMBER" devices) | sed 's/.*gemm: /cpu gemm: /')"
}

ctest_run() { ctest --test-dir "$BUILD" --output-on-failure --timeout "$1" -j"$2" "${@:3}"; }
s_ctest() {
    export STEP_NAME=ctest
    ctest_run 240 "$(( NPROC > 8 ? 8 : NPROC ))"
    local rc=$?
    local pocl=""
    # PoCL before 7.0 can abort in its dlhandle cache when two devices run one kernel
    # (pocl/pocl c9ac4c0c3; docs/BENCHMARKS.md, "CUDA on an NVIDIA H200"): named, still a failure
    grep -q "pocl_release_dlhandle_cache: Assertion" "$LOGS/ctest.log" 2>/dev/null &&
        pocl="; a PoCL abort among them (its dlhandle-cache bug, fixed in PoCL 7.0)"
    note "$(grep -E '^[0-9]+% tests passed' "$LOGS/ctest.log" 2>/dev/null | tail -n1)$pocl"
    return $rc
}
GOLDEN='^(test_golden_ops|test_backend_ops|test_backend_ops_nd|test_optim_golden|test_lm_golden)$'
s_blocking() {
    export STEP_NAME=blocking
    grep -q EMBER_CUDA_LAUNCH_BLOCKING "$ROOT/src/backends/cuda/cuda_backend.c" ||
        echo "note: src/backends/cuda does not read EMBER_CUDA_LAUNCH_BLOCKING"
    EMBER_CUDA_LAUNCH_BLOCKING=1 ctest_run 200 4 -R "$GOLDEN"
    local rc=$?
    note "$(grep -E '^[0-9]+% tests passed' "$LOGS/blocking.log" 2>/dev/null | tail -n1)"
    return $rc
}
# compute-sanitizer TOOL over one test program (and its child processes)
sanitize() {
    local tool=$1 test=$2
    echo "== $SAN --tool $tool $test"
    (cd "$ROOT" && EMBER_TEST_DATA=$ROOT/tests/data "$SAN" --tool "$tool" --target-processes all \
        --error-exitcode 86 "$BUILD/$test")
    local rc=$?
    echo "== $tool $test: exit $rc"
    echo "$tool $test: exit $rc$( ((rc == 86)) && echo ' (sanitizer errors)')" >>"$FACTS/sanitizers"
    return $rc
}
s_memcheck() { export STEP_NAME=memcheck; local r=0; sanitize memcheck test_backend_ops || r=1; sanitize memcheck test_golden_ops || r=1; return $r; }
s_racecheck() { export STEP_NAME=racecheck; local r=0; sanitize racecheck test_backend_ops || r=1; sanitize racecheck test_golden_ops || r=1; return $r; }
s_synccheck() { export STEP_NAME=synccheck; local r=0; sanitize synccheck test_backend_ops || r=1; sanitize synccheck test_golden_ops || r=1; return $r; }
export -f ctest_run sanitize
export GOLDEN

SMI_FIELDS=name,index,count,driver_version,memory.total,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,compute_cap
s_smi() {
    export STEP_NAME=smi
    "$EMBER" smi || return 1
    "$EMBER" smi -L
    nvidia-smi -L
    "$EMBER" smi --query-gpu="$SMI_FIELDS" --format=csv,noheader,nounits >"$FACTS/smi_ember.csv" || return 1
    nvidia-smi --query-gpu="$SMI_FIELDS" --format=csv,noheader,nounits >"$FACTS/smi_nvidia.csv" || return 1
    nvidia-smi --query-gpu=name,memory.total,compute_cap,count --format=csv,noheader,nounits >"$FACTS/smi_nvidia_devices.csv"
    "$PY" "$ROOT/scripts/gpu_report.py" compare-smi "$SMI_FIELDS" "$FACTS/smi_ember.csv" "$FACTS/smi_nvidia.csv" \
        "$FACTS/devices.json" | tee "$FACTS/smi_compare.txt"
    local rc=${PIPESTATUS[0]}
    note "$(tail -n1 "$FACTS/smi_compare.txt")"
    return "$rc"
}
s_bench() {
    export STEP_NAME=bench
    "$EMBER" bench --device cuda:0 --json --dtype f32,f16,bf16,f64 --sizes 4096,8192 >"$FACTS/bench.json" || return 1
    # f32 again with TF32 tensor cores allowed (PyTorch's allow_tf32)
    EMBER_CUDA_ALLOW_TF32=1 "$EMBER" bench --device cuda:0 --json --dtype f32 --sizes 4096,8192 --only matmul \
        >"$FACTS/bench_tf32.json" || return 1
    "$EMBER" bench --device cuda:0 --dtype f32,f16,bf16,f64 --sizes 4096,8192 --only matmul --quick
}
s_bench_cpu() {
    export STEP_NAME=bench_cpu
    if ((DRY)); then "$EMBER" bench --device cpu --json --quick --dtype f32,f64 --sizes 128,256 --only matmul,launch --min-time 0.02
    else "$EMBER" bench --device cpu --json --dtype f32,f64 --sizes 1024,2048 --only matmul,launch; fi >"$FACTS/bench_cpu.json"
}
s_copy_d2d() {
    export STEP_NAME=copy_d2d
    "$BUILD/bench_device_copy" cuda:0 1024 1 | tee "$FACTS/device_copy.txt"
    return "${PIPESTATUS[0]}"
}
s_roofline_torch() {
    export STEP_NAME=roofline_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/gpu_roofline_torch.py" --device cuda:0 --n 8192 >"$FACTS/roofline_torch.json"
}
EPOCHS=3
train_ember() { # device epochs extra...
    "$EMBER" train --device "$1" --epochs "$2" --checkpoint none --seed 0 --batch-size 64 ${DATA:+--data "$DATA"} "${@:3}"
}
s_train_cuda() { export STEP_NAME=train_cuda; train_ember cuda:0 "$EPOCHS" | tee "$FACTS/train_cuda.log"; return "${PIPESTATUS[0]}"; }
# Mixed precision on the GPU: bf16 autocast, and f16 with the loss scaler whose
# inf/NaN check and skip stay on the device
s_train_amp() {
    export STEP_NAME=train_amp
    local rc=0
    for dt in bf16 f16; do
        train_ember cuda:0 "$EPOCHS" --amp "$dt" | tee "$FACTS/train_amp_$dt.log"
        ((PIPESTATUS[0] == 0)) || { note "ember train --amp $dt failed"; rc=1; }
    done
    return $rc
}
# The CNN (conv2d through cuDNN), Ember's and PyTorch's, the same batches
s_train_cnn() {
    export STEP_NAME=train_cnn
    train_ember cuda:0 2 --model cnn | tee "$FACTS/train_cnn_cuda.log"
    return "${PIPESTATUS[0]}"
}
s_train_cnn_torch() {
    export STEP_NAME=train_cnn_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/train_cnn_torch.py" --device cuda:0 --epochs 2 --batch-size 64 --seed 0 \
        --threads "$NPROC" --data "${DATA:-/usr/share/datasets/fashion-mnist}" | tee "$FACTS/train_cnn_torch.log"
    return "${PIPESTATUS[0]}"
}
# NCCL for real: the DDP seed twin as one rank under mpirun on cuda:0 (backend "auto"
# picks NCCL; one GPU is one rank's worth), its all-reduces through libnccl
s_nccl() {
    export STEP_NAME=nccl
    command -v mpirun >/dev/null || { note "mpirun not found"; return 1; }
    OMPI_MCA_plm=isolated mpirun --allow-run-as-root --oversubscribe -np 1 "$BUILD/example_seed_002_ddp" |
        tee "$FACTS/nccl.log"
    local rc=${PIPESTATUS[0]}
    grep -q "on cuda:0 (backend nccl)" "$FACTS/nccl.log" || { note "the rank did not train on cuda:0 with NCCL"; rc=1; }
    return "$rc"
}
s_train_cpu() {
    export STEP_NAME=train_cpu
    if ((DRY)); then train_ember cpu 1 --train-samples 6000 --test-samples 1000
    else train_ember cpu "$EPOCHS"; fi | tee "$FACTS/train_cpu.log"
    return "${PIPESTATUS[0]}"
}
s_train_torch() {
    export STEP_NAME=train_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/train_mlp_torch.py" --device cuda:0 --epochs "$EPOCHS" --batch-size 64 --seed 0 \
        --threads "$NPROC" --data "${DATA:-/usr/share/datasets/fashion-mnist}" | tee "$FACTS/train_torch.log"
    return "${PIPESTATUS[0]}"
}
export SMI_FIELDS EPOCHS
export -f train_ember

for f in preflight deps build devices ctest blocking memcheck racecheck synccheck smi bench bench_cpu copy_d2d \
    roofline_torch train_cuda train_cpu train_torch train_amp nccl train_cnn train_cnn_torch; do
    export -f "s_$f"
done

echo "gpu_check: part $PART$( ((DRY)) && echo ' (dry run)'), build in $BUILD, report in $OUT, budget ${BUDGET} s"
step preflight "" 60 s_preflight
step deps "" 120 s_deps
use_deps # the prefix the deps step unpacked
step build "" 420 s_build
step devices build 60 s_devices
# --only names steps of either part
P1=1 P2=1
[ -z "$ONLY" ] && [ "$PART" = 2 ] && P1=0
[ -z "$ONLY" ] && [ "$PART" = 1 ] && P2=0
if ((P1)); then
    step ctest gpu,build 330 s_ctest
    step blocking gpu,build 200 s_blocking
    step memcheck gpu,sanitizer,build 200 s_memcheck
fi
if ((P2)); then # the figures first; the slow sanitizers last, where the budget cuts
    step smi gpu,build 60 s_smi
    step bench gpu,build 180 s_bench
    step copy_d2d gpu,build 60 s_copy_d2d
    step roofline_torch gpu,torch 120 s_roofline_torch
    step train_cuda gpu,build,data 120 s_train_cuda
    step train_torch gpu,torch,data 120 s_train_torch
    step train_cpu build,data 120 s_train_cpu
    step bench_cpu build 90 s_bench_cpu
    step train_amp gpu,build,data 150 s_train_amp
    step nccl gpu,build 90 s_nccl
    step train_cnn gpu,build,data 150 s_train_cnn
    step train_cnn_torch gpu,torch,data 150 s_train_cnn_torch
    step racecheck gpu,sanitizer,build 150 s_racecheck
    step synccheck gpu,sanitizer,build 100 s_synccheck
fi

# ---- the report, and the logs in one archive ----
"$PY" "$ROOT/scripts/gpu_report.py" report --part "$PART" --dry-run "$DRY" --logs "$LOGS" \
    --md "$OUT/report-$TAG.md" --json "$OUT/report-$TAG.json"
rep=$?
# a runaway log (a sanitizer's error flood) keeps its first and last 4 MiB
for f in "$LOGS"/*.log; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((10 << 20)) ]; then
        { head -c $((4 << 20)) "$f"; printf '\n[... cut by gpu_check.sh ...]\n'; tail -c $((4 << 20)) "$f"; } >"$f.cut" && mv "$f.cut" "$f"
    fi
done
tar -C "$WORK" -czf "$OUT/logs-$TAG.tar.gz" "logs-$TAG"
echo "gpu_check: wrote $OUT/report-$TAG.md, report-$TAG.json, logs-$TAG.tar.gz in ${SECONDS} s"
[ -r "$OUT/report-$TAG.md" ] && sed -n '/^## Steps/q; p' "$OUT/report-$TAG.md" | head -n 40
if ((rep != 0)); then
    echo "gpu_check: the report could not be written (exit $rep)" >&2
    exit 1
fi
# exit 0 only when no step failed
! grep -qP '\t(fail|timeout)\t' "$STEPS"
