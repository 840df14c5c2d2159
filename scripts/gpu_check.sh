#!/usr/bin/env bash
# The one-command proof of Ember's CUDA backend on an NVIDIA GPU (docs/GPU_CHECK.md).
#
# Usage: scripts/gpu_check.sh OUT_DIR [--part proof|1|2|lm|all] [--quick] [--dry-run]
#                                     [--build-dir DIR] [--only STEP,...] [--budget SECONDS]
#
# Run from a copy of the repository with .gpu/ beside it (scripts/gpu_prepare.sh makes it: a
# private prefix with OpenBLAS and zlib, Fashion-MNIST, and the kernel cache). With the device tool:
#   run(command="scripts/gpu_check.sh $OUT", carry=[".gpu"], timeout_s=500)
# That is the proof in one call of at most 8 minutes on a fresh machine, the build included
# (--part proof, the default, with a 440 s budget): it builds only what its steps run, and its
# steps come most telling first, so that what the budget cuts is the least missed. Each run
# builds Ember first when its build is missing (a later call may land on a fresh machine),
# runs its steps each under `timeout`, stops starting steps when its time budget is spent,
# and leaves exactly three files in OUT_DIR:
#   report-TAG.md, report-TAG.json       pass/fail/skip per step, the figures, each figure as
#                                        a fraction of the roofline (measured and spec)
#   logs-TAG.tar.gz                      every step's full output
# (TAG: the part, "partN" for 1 and 2, "quick" with --quick.)
# proof: preflight, deps, build, devices, golden (the golden and backend-op suites with
#         EMBER_CUDA_LAUNCH_BLOCKING=1), lm_models (random-weight GPT-2 124M, Llama-3.2-1B and
#         Llama-2-7B-shaped folders), lm_decode / lm_decode_torch (the 1B model's prefill and
#         decode tokens/s against the memory bandwidth), gpt2_train / gpt2_train_torch /
#         gpt2_train_compile (a GPT-2 124M training step, batch 8 x 1024, bf16 autocast, AdamW:
#         tokens/s and model FLOP utilisation; PyTorch eager and torch.compile), attention /
#         attention_torch (causal bf16 attention forward and backward at 1024-8192 against
#         PyTorch's SDPA), lora_7b (a LoRA step of the 7B model under EMBER_MEMORY_CAP=cuda=24GiB,
#         its peak printed), zero_nccl (GPT-2 fully fine-tuned with ZeRO-3 as one rank over NCCL,
#         its losses against the same steps without ZeRO), mlp_graphs (the seed MLP's epoch with and without CUDA graphs),
#         train_cuda, train_torch, copy_d2d, roofline_torch, bench; then, budget permitting,
#         memcheck.
# --quick: the proof's build, devices, golden, lm_models, lm_decode(_torch), gpt2_train(_torch)
#         and attention(_torch): a second look in about half the time.
# lm:     the language-model steps alone (after preflight, deps, build, devices).
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
# all:    every step of every part (for a machine without the 600 s limit of a call).
# --only STEP,...: those steps, from any part, after preflight, deps, build and devices;
#   e.g. what a part had to skip for time: --part 2 --only racecheck,synccheck
# --dry-run: on a machine without a GPU, every step that needs one is reported "skip" with
#   the reason; the others run, the language-model steps on the CPU with tiny folders (CI runs
#   this: scripts/gpu_check_test.sh). Without --dry-run a missing GPU fails those steps.
# Environment: EMBER_GPU_DIR (.gpu), PYTHON (python3), EMBER_GPU_CHECK_BUILD (build-gpu).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
OUT="" PART=proof DRY=0 ONLY="" BUDGET="" QUICK=0
BUILD=${EMBER_GPU_CHECK_BUILD:-build-gpu}
while (($#)); do
    case "$1" in
    --part) PART=${2:-}; shift 2 || { echo "gpu_check: --part needs proof, 1, 2, lm or all" >&2; exit 2; } ;;
    --quick) QUICK=1; shift ;;
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
case "$PART" in proof | 1 | 2 | lm | all) ;; *) echo "gpu_check: --part expects proof, 1, 2, lm or all, got '$PART'" >&2; exit 2 ;; esac
((QUICK)) && [ "$PART" != proof ] && { echo "gpu_check: --quick is a subset of --part proof, not of --part $PART" >&2; exit 2; }
# the proof fits one call of the device tool (at most 8 minutes with the machine's start);
# a part of the old two-call split has the rest of a 600 s call
if [ -z "$BUDGET" ]; then
    BUDGET=530
    [ "$PART" = proof ] && BUDGET=440
    ((QUICK)) && BUDGET=240
fi
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget expects whole seconds, got '$BUDGET'" >&2; exit 2; }
[ -n "$BUILD" ] || { echo "gpu_check: --build-dir is empty" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
TAG=part$PART
case "$PART" in all | proof | lm) TAG=$PART ;; esac
((QUICK)) && TAG=quick
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
# make_model_folder.py needs numpy: this interpreter's, else the system's
NUMPY_PY=""
for p in "$PY" /usr/bin/python3; do
    "$p" -c "import numpy" >/dev/null 2>&1 && { NUMPY_PY=$p; break; }
done

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
        models) [ -r "$MODELS/llama-1b/config.json" ] || why=${why:-"skipped: no model folders (the lm_models step did not make them)"} ;;
        numpy) [ -n "$NUMPY_PY" ] || why=${why:-"skipped: neither $PY nor /usr/bin/python3 imports numpy"} ;;
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
export ORIG_LD ROOT BUILD DEPS EMBER PY SAN DATA DRY QUICK NPROC FACTS LOGS GPU_DIR TRIPLET
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
        # shellcheck disable=SC2086  # BUILD_TARGETS is a list of words
        if cmake --build "$BUILD" -j"$NPROC" ${BUILD_TARGETS:+--target $BUILD_TARGETS}; then
            [ -n "$tried" ] && note "built only with$tried (see build.log for why)"
            break
        fi
        [ "$fallback" = -DEMBER_BLAS=OFF ] && return 1
    done
    grep -E "^(EMBER_BLAS|EMBER_WERROR|EMBER_OPENBLAS_LIB|EMBER_CBLAS_INCLUDE|OPENBLAS_LIBRARIES|EMBER_CUDA_INCLUDE|ZLIB_LIBRARY_RELEASE|OpenCL_LIBRARY)" \
        "$BUILD/CMakeCache.txt" | tee "$FACTS/cmake_found"
    [ -x "$BUILD/ember" ]
}

# The golden and backend-op suites on cuda:0, each op waited for (an error names its op)
LM_GOLDEN='^(test_golden_ops|test_backend_ops|test_lm_golden|test_attention_fused|test_optim_golden)$'
s_golden() {
    export STEP_NAME=golden
    EMBER_CUDA_LAUNCH_BLOCKING=1 ctest_run 150 4 -R "$LM_GOLDEN"
    local rc=$?
    note "$(grep -E '^[0-9]+% tests passed' "$LOGS/golden.log" 2>/dev/null | tail -n1)"
    return $rc
}

# ---- the language-model steps ----
# Random-weight folders (scripts/make_model_folder.py, numpy only), made once into the build
# directory; the 1B and 7B ones with --repeat-block (they are only timed and sized). A dry run makes tiny
# ones and runs Ember's side on the CPU, which proves the commands and what reads their output.
MODELS=$BUILD/lm-models
LMDEV=cuda:0
((DRY)) && LMDEV=cpu
make_folder() { # name preset-and-options...
    [ -r "$MODELS/$1/config.json" ] && { echo "$MODELS/$1: already made"; return 0; }
    "$NUMPY_PY" "$ROOT/scripts/make_model_folder.py" "$MODELS/$1" "${@:2}"
}
s_lm_models() {
    export STEP_NAME=lm_models
    mkdir -p "$MODELS" || return 1
    if ((DRY)); then
        make_folder gpt2 --preset gpt2-124m --layers 2 --hidden 64 --heads 4 --intermediate 256 --vocab 1024 &&
            make_folder llama-1b --preset tiny &&
            make_folder llama2-7b --preset tiny --kv-heads 4 --repeat-block || return 1
    else
        make_folder gpt2 --preset gpt2-124m && make_folder llama-1b --preset llama-1b --repeat-block || return 1
        ((QUICK)) || make_folder llama2-7b --preset llama2-7b --repeat-block || return 1
    fi
    # the text the training steps read: the repository's own documents, enough for every step
    cat "$ROOT"/README.md "$ROOT"/docs/*.md >"$MODELS/train.txt" || return 1
    du -sh "$MODELS"/*
}
# a prompt of n tokens for make_model_folder's tokenizer: " ab" is one token, after the BOS
lm_prompt() { local n=$1 w=""; for ((i = 0; i < n; i++)); do w+=" ab"; done; echo "${w# }"; }
s_lm_decode() {
    export STEP_NAME=lm_decode
    local n=512 new=128
    ((DRY)) && n=32 new=8
    "$EMBER" generate "$MODELS/llama-1b" --device "$LMDEV" --dtype bf16 --prompt "$(lm_prompt $n)" \
        --max-new-tokens $new --temperature 0 --json >"$FACTS/lm_decode_ember.json" || return 1
    cat "$FACTS/lm_decode_ember.json"
    # how the decode steps ran: replayed from a CUDA graph, or eager and why
    note "cuda graph: $(lm_decode_graph "$FACTS/lm_decode_ember.json")"
    ((DRY)) && return 0
    # a second run with CUDA graphs off, when this build has them
    EMBER_CUDA_GRAPHS=0 "$EMBER" generate "$MODELS/llama-1b" --device "$LMDEV" --dtype bf16 --prompt "$(lm_prompt $n)" \
        --max-new-tokens $new --temperature 0 --json >"$FACTS/lm_decode_ember_nographs.json" || return 1
    cat "$FACTS/lm_decode_ember_nographs.json"
    note "graphs off: cuda graph: $(lm_decode_graph "$FACTS/lm_decode_ember_nographs.json")"
    lm_decode_graph "$FACTS/lm_decode_ember.json" | grep -q '^decode replayed' ||
        { note "the decode step was not replayed from a graph"; return 1; }
}
# The "cuda_graph" field of an `ember generate --json` output file.
lm_decode_graph() { sed -n 's/.*"cuda_graph": "\(\([^"\\]\|\\.\)*\)".*/\1/p' "$1"; }
s_lm_decode_torch() {
    export STEP_NAME=lm_decode_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/lm_gpu_torch.py" llama-decode --device cuda:0 --prompt 512 \
        --new-tokens 128 | tee "$FACTS/lm_decode_torch.txt"
    return "${PIPESTATUS[0]}"
}
# Full training of GPT-2 124M (ember finetune --full: AdamW over every weight, float32 masters)
s_gpt2_train() {
    export STEP_NAME=gpt2_train
    local seq=1024 batch=8 steps=12
    ((DRY)) && seq=64 batch=2 steps=3
    "$EMBER" finetune "$MODELS/gpt2" --full --data "$MODELS/train.txt" --out "$MODELS/gpt2-out" --device "$LMDEV" \
        --dtype f32 --amp bf16 --seq $seq --batch-size $batch --max-steps $steps --lr 6e-4 --warmup-steps 2 2>&1 |
        tee "$FACTS/gpt2_train_ember.txt"
    return "${PIPESTATUS[0]}"
}
s_gpt2_train_torch() {
    export STEP_NAME=gpt2_train_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/lm_gpu_torch.py" gpt2-train --device cuda:0 --batch 8 --seq 1024 \
        --steps 10 --peak-tflops 989.5 | tee "$FACTS/gpt2_train_torch.txt"
    return "${PIPESTATUS[0]}"
}
s_gpt2_train_compile() {
    export STEP_NAME=gpt2_train_compile
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/lm_gpu_torch.py" gpt2-train --compile --device cuda:0 --batch 8 \
        --seq 1024 --steps 10 --peak-tflops 989.5 | tee "$FACTS/gpt2_train_compile.txt"
    return "${PIPESTATUS[0]}"
}
s_attention() {
    export STEP_NAME=attention
    local lengths=1024,2048,4096,8192 t=0.3
    ((DRY)) && lengths=64,128 t=0.02
    "$BUILD/bench_attention" "$LMDEV" --lengths $lengths --batch 4 --heads 16 --head-dim 64 --min-time $t |
        tee "$FACTS/attention_ember.txt"
    return "${PIPESTATUS[0]}"
}
s_attention_torch() {
    export STEP_NAME=attention_torch
    LD_LIBRARY_PATH=$ORIG_LD "$PY" "$ROOT/bench/lm_gpu_torch.py" sdpa --device cuda:0 --lengths 1024,2048,4096,8192 \
        --batch 4 --heads 16 --head-dim 64 --min-time 0.3 | tee "$FACTS/attention_torch.txt"
    return "${PIPESTATUS[0]}"
}
# Seed 002's "one 24 GB card is enough with LoRA": the 7B model's LoRA step under a 24 GiB cap
s_lora_7b() {
    export STEP_NAME=lora_7b
    local cap=cuda=24GiB seq=512
    ((DRY)) && cap=cpu=24GiB seq=64
    EMBER_MEMORY_CAP=$cap "$EMBER" finetune "$MODELS/llama2-7b" --data "$MODELS/train.txt" --out "$MODELS/lora-out" \
        --device "$LMDEV" --dtype bf16 --amp bf16 --checkpoint-activations --seq $seq --batch-size 1 --max-steps 3 \
        --lora-rank 8 2>&1 | tee "$FACTS/lora_7b_ember.txt"
    local rc=${PIPESTATUS[0]}
    note "$(grep -E '^step ' "$FACTS/lora_7b_ember.txt" | tail -n1)"
    return "$rc"
}
# ZeRO over NCCL with real kernels: GPT-2 fully fine-tuned at stage 3 as one rank under mpirun
# on cuda:0 (backend "auto" picks NCCL: the units' all-gathers and reduce-scatters go through
# libnccl), against the same steps without ZeRO; the losses must agree (one rank: the same sums)
s_zero_nccl() {
    export STEP_NAME=zero_nccl
    command -v mpirun >/dev/null || { note "mpirun not found"; return 1; }
    local args=(finetune "$MODELS/gpt2" --full --data "$MODELS/train.txt" --device "$LMDEV" --dtype f32 --amp bf16
        --seq 128 --batch-size 2 --max-steps 3 --warmup-steps 1) rc=0 want=nccl
    ((DRY)) && want=mpi
    "$EMBER" "${args[@]}" --out "$MODELS/zero-plain" >"$FACTS/zero_plain.log" 2>&1 || rc=1
    OMPI_MCA_plm=isolated mpirun --allow-run-as-root --oversubscribe -np 1 "$EMBER" "${args[@]}" --zero 3 \
        --out "$MODELS/zero-out" 2>&1 | tee "$FACTS/zero_nccl.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    grep -q "over 1 rank ($want)" "$FACTS/zero_nccl.log" || { note "ZeRO did not run over $want"; rc=1; }
    local losses
    losses=$(paste <(awk '/^step /{print $6}' "$FACTS/zero_plain.log") <(awk '/^step /{print $6}' "$FACTS/zero_nccl.log"))
    note "losses without and with ZeRO-3: $(echo "$losses" | tr '\t\n' '/ ')"
    echo "$losses" | awk 'NF != 2 || ($1 - $2 > 1e-3 * ($1 > 0 ? $1 : -$1) || $2 - $1 > 1e-3 * ($1 > 0 ? $1 : -$1)) { bad = 1 }
                          END { exit bad || NR != 3 }' || { note "the losses differ (or a run ended early)"; rc=1; }
    return "$rc"
}
# The seed MLP, launch-bound: its epoch with CUDA graphs (the default) and without
s_mlp_graphs() {
    export STEP_NAME=mlp_graphs
    train_ember cuda:0 2 | tee "$FACTS/mlp_graphs_on.log"
    local rc=${PIPESTATUS[0]}
    EMBER_CUDA_GRAPHS=0 train_ember cuda:0 2 | tee "$FACTS/mlp_graphs_off.log"
    local rc_off=${PIPESTATUS[0]}
    # each epoch's "cuda graph:" line: the first run replayed its step, the second was off
    note "graphs on: $(grep 'cuda graph:' "$FACTS/mlp_graphs_on.log" | tail -n1 | sed 's/^ *//')"
    note "graphs off: $(grep 'cuda graph:' "$FACTS/mlp_graphs_off.log" | tail -n1 | sed 's/^ *//')"
    grep -q 'cuda graph: step replayed' "$FACTS/mlp_graphs_on.log" || { note "the step was not replayed from a graph"; rc=1; }
    ((rc_off == 0 && rc == 0))
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
export -f ctest_run sanitize make_folder lm_prompt lm_decode_graph
export GOLDEN LM_GOLDEN MODELS LMDEV NUMPY_PY

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
    roofline_torch train_cuda train_cpu train_torch train_amp nccl train_cnn train_cnn_torch golden lm_models \
    lm_decode lm_decode_torch gpt2_train gpt2_train_torch gpt2_train_compile attention attention_torch lora_7b zero_nccl \
    mlp_graphs; do
    export -f "s_$f"
done

# The proof builds only what its steps run (a fresh machine's build is part of its 8 minutes)
BUILD_TARGETS=""
if [ "$PART" = proof ] || [ "$PART" = lm ]; then
    BUILD_TARGETS="ember_cli bench_attention bench_device_copy"
    [ "$PART" = proof ] && BUILD_TARGETS="$BUILD_TARGETS test_golden_ops test_backend_ops test_lm_golden test_attention_fused test_optim_golden"
fi
[ -n "$ONLY" ] && BUILD_TARGETS="" # --only may name any step
export BUILD_TARGETS
# A kernel cache made here (scripts/gpu_prepare.sh: NVRTC's output for sm_90) saves the
# first run's compiles; copied, since the carried folder may be read-only
if [ -d "$GPU_DIR/kernel-cache" ] && [ -z "${EMBER_CACHE_DIR:-}" ]; then
    mkdir -p "$BUILD/kernel-cache" && cp -n "$GPU_DIR"/kernel-cache/* "$BUILD/kernel-cache/" 2>/dev/null
    export EMBER_CACHE_DIR=$BUILD/kernel-cache
fi

echo "gpu_check: part $PART$( ((QUICK)) && echo ' --quick')$( ((DRY)) && echo ' (dry run)'), build in $BUILD, report in $OUT, budget ${BUDGET} s"
step preflight "" 60 s_preflight
step deps "" 120 s_deps
use_deps # the prefix the deps step unpacked
step build "" 420 s_build
step devices build 60 s_devices
# --only names steps of any part
P1=0 P2=0 PLM=0 PROOF=0
case "$PART" in
1) P1=1 ;;
2) P2=1 ;;
lm) PLM=1 ;;
proof) PROOF=1 ;;
all) P1=1 P2=1 PLM=1 ;;
esac
[ -n "$ONLY" ] && P1=1 P2=1 PLM=1 PROOF=0
lm_steps() { # the language-model steps, the figures first; --quick leaves out the slowest
    step lm_models build,numpy 150 s_lm_models
    step lm_decode build,models 90 s_lm_decode
    step lm_decode_torch gpu,torch 90 s_lm_decode_torch
    step gpt2_train build,models 120 s_gpt2_train
    step gpt2_train_torch gpu,torch 90 s_gpt2_train_torch
    step attention build 90 s_attention
    step attention_torch gpu,torch 90 s_attention_torch
    ((QUICK)) && return 0
    step lora_7b build,models 150 s_lora_7b
    step zero_nccl build,models 120 s_zero_nccl
    step mlp_graphs gpu,build,data 90 s_mlp_graphs
    step gpt2_train_compile gpu,torch 150 s_gpt2_train_compile
}
if ((PROOF)); then
    step golden gpu,build 150 s_golden
    lm_steps
    if ((!QUICK)); then
        step train_cuda gpu,build,data 120 s_train_cuda
        step train_torch gpu,torch,data 120 s_train_torch
        step copy_d2d gpu,build 60 s_copy_d2d
        step roofline_torch gpu,torch 120 s_roofline_torch
        step memcheck gpu,sanitizer,build 200 s_memcheck
    fi
fi
if ((P1)); then
    step ctest gpu,build 330 s_ctest
    step blocking gpu,build 200 s_blocking
    step memcheck gpu,sanitizer,build 200 s_memcheck
fi
((PLM)) && lm_steps
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
"$PY" "$ROOT/scripts/gpu_report.py" report --part "$PART" --tag "$TAG" --dry-run "$DRY" --logs "$LOGS" \
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
