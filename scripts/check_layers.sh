#!/usr/bin/env bash
# The one-way layering rule (docs/ARCHITECTURE.md, "Layers and the one-way rule"), checked on
# the #include lines of every file under src/ (*.c, *.h, and the kernels' *.k) and tools/.
#   scripts/check_layers.sh [ROOT]      check the tree at ROOT (default: this repository)
#   scripts/check_layers.sh --self-test plant bad includes in a copy and expect each to fail
#
# The order, bottom to top (a layer includes only its own and lower layers' headers):
#   kernels < backends < memory < core < autograd < {nn, optim, data, dist, models} < tools
# and src/util (no dependencies) is open to every layer of src/. Within a layer, and going down:
#   backends   a backend's folder (cpu/, opencl/, cuda/) includes its own headers, the interface
#              at the top of src/backends (backend.h, op_call.h, optim_args.h) and kernels/;
#              opencl/ and cuda/ also the shared GPU layer gpu/; never another backend's folder.
#              The interface includes no backend's folder.
#   memory, core   lower layers' headers, but of the backends only the interface.
#   autograd   of the layers below only src/core/internal_api.h and src/core/tensor_impl.h.
#   nn, optim, data, dist, models   of the layers below only src/core/internal_api.h (public headers
#              otherwise); among themselves optim and dist may include src/nn/nn_internal.h
#              (they build on nn), and models (language models) src/data/json.h and
#              src/data/parsers.h (it reads files and JSON with data's readers); nothing else
#              crosses: nn includes none of theirs, and data, which nn and optim use through its
#              public API, none of the others'.
#   tools/     nothing under src/: the public API in include/ember/ only.
# The upward edges that remain are the EXCEPTIONS below, each exactly one (layer, header)
# pair with its reason; anything else upward fails. A folder of src/ that is in no layer
# fails too, so that a new one gets its place here and in docs/ARCHITECTURE.md.
# A quoted include resolves against the including file's folder, then against src/ (the
# library's -Isrc); <...> resolves against src/ only (<ember/...> is the public API).
set -euo pipefail

self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

# including layer (a folder: "backends" is every backend, "backends/cuda" only CUDA) | header | why
EXCEPTIONS=(
    "core|src/autograd/record.h|core's differentiable ops record their autograd nodes (core and autograd are partners)"
    "backends|src/core/tensor_impl.h|an op call hands core's tensors to the backend, which reads their layout"
    "backends/cuda|src/memory/allocator.h|cuBLAS's and cuDNN's workspaces come from the caching allocator, and the CUDA backend installs itself as the pinned-memory provider"
)

# The layer of a path relative to the root, into LAYER and SUB: SUB is the backend's folder
# ("-" for the interface at the top of src/backends) or the upper layer's name; LAYER is
# "none" outside src/ and tools/, "unknown" for a folder of src/ in no layer.
layer_of() {
    SUB=-
    case "$1" in
        src/util/*) LAYER=util ;;
        src/kernels/*) LAYER=kernels ;;
        src/backends/*/*) LAYER=backends; SUB="${1#src/backends/}"; SUB="${SUB%%/*}" ;;
        src/backends/*) LAYER=backends ;;
        src/memory/*) LAYER=memory ;;
        src/core/*) LAYER=core ;;
        src/autograd/*) LAYER=autograd ;;
        src/nn/*|src/optim/*|src/data/*|src/dist/*|src/models/*) LAYER=upper; SUB="${1#src/}"; SUB="${SUB%%/*}" ;;
        tools/*) LAYER=tools ;;
        src/*/*) LAYER=unknown ;;
        *) LAYER=none ;;
    esac
}

# Bottom to top, into RANK.
rank_of() {
    case "$1" in
        util) RANK=0 ;; kernels) RANK=1 ;; backends) RANK=2 ;; memory) RANK=3 ;; core) RANK=4 ;;
        autograd) RANK=5 ;; upper) RANK=6 ;; tools) RANK=7 ;; *) RANK=99 ;;
    esac
}

# "a/b/../c/./d" -> "a/c/d" (no symlinks to follow in a source tree), into NORM.
normalize() {
    local part out=() IFS=/
    for part in $1; do
        case "$part" in
            ''|.) ;;
            ..) if [ ${#out[@]} -gt 0 ]; then unset 'out[${#out[@]}-1]'; else out+=(..); fi ;;
            *) out+=("$part") ;;
        esac
    done
    NORM="${out[*]}"
}

# Why file f (relative) may not include target t (relative), into WHY ("" when it may).
judge() {
    local f="$1" t="$2" fl fs tl ts e who what why
    WHY=""
    layer_of "$f"; fl=$LAYER; fs=$SUB
    layer_of "$t"; tl=$LAYER; ts=$SUB
    for e in "${EXCEPTIONS[@]}"; do
        IFS='|' read -r who what why <<< "$e"
        if [ "$t" = "$what" ] && { [ "$who" = "$fl" ] || [ "$who" = "$fl/$fs" ]; }; then return 0; fi
    done
    if [ "$fl" = tools ]; then
        case "$t" in src/*) WHY="tools use the public API only (include/ember/)" ;; esac
        return 0
    fi
    case "$tl" in none|util) return 0 ;; esac
    if [ "$fl" = "$tl" ]; then
        case "$fl" in
            backends)
                if [ "$ts" = - ] || [ "$fs" = "$ts" ]; then return 0; fi
                if [ "$ts" = gpu ] && { [ "$fs" = opencl ] || [ "$fs" = cuda ]; }; then return 0; fi
                if [ "$fs" = - ]; then
                    WHY="the backend interface includes no backend's folder"
                else
                    WHY="another backend's folder: a backend includes its own, the interface (backend.h,"
                    WHY+=" op_call.h, optim_args.h), kernels/, and gpu/ for the GPU backends"
                fi ;;
            upper)
                [ "$fs" = "$ts" ] && return 0
                if [ "$t" = src/nn/nn_internal.h ] && { [ "$fs" = optim ] || [ "$fs" = dist ]; }; then return 0; fi
                if [ "$fs" = models ] && { [ "$t" = src/data/json.h ] || [ "$t" = src/data/parsers.h ]; }; then return 0; fi
                WHY="src/$fs may not include src/$ts: among the upper layers only optim and dist"
                WHY+=" include nn's nn_internal.h, and models data's json.h and parsers.h" ;;
        esac
        return 0
    fi
    local rf rt
    rank_of "$fl"; rf=$RANK
    rank_of "$tl"; rt=$RANK
    if [ "$rt" -gt "$rf" ]; then
        WHY="an upward include: $fl is below $tl"
        return 0
    fi
    case "$fl" in
        upper)
            [ "$t" = src/core/internal_api.h ] ||
                WHY="nn, optim, data, dist and models reach the layers below only through src/core/internal_api.h" ;;
        autograd)
            case "$t" in src/core/internal_api.h|src/core/tensor_impl.h) ;;
                *) WHY="autograd reaches below only core's internal_api.h and tensor_impl.h" ;; esac ;;
        *)
            if [ "$tl" = backends ] && [ "$ts" != - ]; then
                WHY="above the backends only their interface (backend.h, op_call.h, optim_args.h),"
                WHY+=" never a backend's folder"
            fi ;;
    esac
}

# check ROOT [FILE...]: the include lines of FILEs (paths relative to ROOT; default: every
# file of src/ and tools/), each judged; a message per bad one on stderr; fails if any.
check() {
    local root fail=0 rel dir inc target
    root="$(cd "$1" && pwd)"
    shift
    local files=("$@")
    if [ ${#files[@]} -eq 0 ]; then
        while IFS= read -r -d '' rel; do files+=("${rel#"$root"/}"); done < \
            <(find "$root/src" "$root/tools" -type f \( -name '*.c' -o -name '*.h' -o -name '*.k' \) -print0 2>/dev/null)
    fi
    for rel in "${files[@]}"; do
        layer_of "$rel"
        if [ "$LAYER" = unknown ]; then
            echo "layering: $rel is in a folder of src/ that no layer names (give it its place in" \
                 "scripts/check_layers.sh and docs/ARCHITECTURE.md)" >&2
            fail=1
            continue
        fi
        dir="$(dirname "$rel")"
        while IFS= read -r inc; do
            target=""
            case "$inc" in
                \"*) inc="${inc:1:${#inc}-2}"
                     if [ -e "$root/$dir/$inc" ]; then target="$dir/$inc"; else target="src/$inc"; fi ;;
                \<*) inc="${inc:1:${#inc}-2}"
                     [ -e "$root/src/$inc" ] && target="src/$inc" ;;
            esac
            [ -n "$target" ] && [ -e "$root/$target" ] || continue
            normalize "$target"
            judge "$rel" "$NORM"
            if [ -n "$WHY" ]; then
                echo "layering: $rel includes $NORM: $WHY (docs/ARCHITECTURE.md)" >&2
                fail=1
            fi
        done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*([<"][^>"]+[>"]).*/\1/p' "$root/$rel")
    done
    return $fail
}

self_test() {
    local repo tmp bad=0
    repo="$(cd "$(dirname "$self")/.." && pwd)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    cp -r "$repo/src" "$repo/tools" "$tmp/"
    if ! check "$tmp" 2>"$tmp/err"; then
        echo "self-test: the clean tree fails:" >&2
        cat "$tmp/err" >&2
        return 1
    fi
    # file | line planted | must fail (1) or pass (0)
    local cases=(
        # the upper layers and tools: only the public API and internal_api.h
        "src/nn/layers.c|#include \"../core/tensor_impl.h\"|1"
        "src/optim/optimizer.c|#include \"../backends/backend.h\"|1"
        "src/data/io.c|#include \"../core/core_internal.h\"|1"
        "src/nn/module.c|#include <core/ops_internal.h>|1"
        "src/autograd/engine.c|#include \"../memory/allocator.h\"|1"
        "src/autograd/engine.c|#include \"../core/core_internal.h\"|1"
        "src/data/loader.c|  #  include \"../backends/gpu/gpu.h\"|1"
        "src/nn/state_dict.c|#include \"../kernels/layout.h\"|1"
        "tools/ember/cmd_smi.c|#include \"backends/cuda/cuda_smi.h\"|1"
        "tools/ember/main.c|#include \"../../src/core/internal_api.h\"|1"
        "tools/ember/main.c|#include \"../../src/util/strbuf.h\"|1"
        "src/dist/ddp.c|#include \"../core/tensor_impl.h\"|1"
        "src/dist/collectives.c|#include \"../memory/allocator.h\"|1"
        "src/nn/layers.c|#include \"../autograd/record.h\"|1"
        # the lower layers, upward
        "src/core/tensor.c|#include \"../nn/nn_internal.h\"|1"
        "src/core/dist_seam.c|#include \"../dist/dist_internal.h\"|1"
        "src/memory/caching.c|#include \"../dist/dist_internal.h\"|1"
        "src/memory/allocator.h|#include \"../core/tensor_impl.h\"|1"
        "src/memory/estimate.c|#include \"../optim/optim_internal.h\"|1"
        "src/backends/cpu/cpu_rng.c|#include \"../../core/core_internal.h\"|1"
        "src/backends/cpu/cpu_matmul.c|#include \"../../memory/allocator.h\"|1"
        "src/backends/backend.h|#include \"../memory/allocator.h\"|1"
        "src/kernels/rng.k|#include \"../core/tensor_impl.h\"|1"
        "src/kernels/layout.h|#include \"../backends/op_call.h\"|1"
        "src/util/strbuf.c|#include \"../core/core_internal.h\"|1"
        "src/core/ops_common.c|#include \"../autograd/node.h\"|1"
        "src/autograd/engine.c|#include \"../nn/nn_internal.h\"|1"
        # a backend's folder: only from within, and never another backend's
        "src/backends/cpu/cpu_copy.c|#include \"backends/cuda/cuda_internal.h\"|1"
        "src/backends/cpu/cpu_copy.c|#include \"../opencl/opencl_internal.h\"|1"
        "src/backends/cpu/cpu_copy.c|#include \"../gpu/gpu.h\"|1"
        "src/backends/gpu/gpu_run.c|#include \"../cuda/cuda_internal.h\"|1"
        "src/backends/opencl/opencl_gemm.c|#include \"../cuda/cuda_launch.h\"|1"
        "src/backends/op_call.h|#include \"cpu/cpu_internal.h\"|1"
        "src/core/dist_seam.c|#include \"../backends/cuda/cuda_internal.h\"|1"
        "src/memory/pinned.c|#include \"../backends/cpu/cpu_internal.h\"|1"
        # among nn, optim, data, dist
        "src/nn/module.c|#include \"../optim/optim_internal.h\"|1"
        "src/nn/data_parallel.c|#include \"../dist/dist_internal.h\"|1"
        "src/data/loader.c|#include \"../nn/nn_internal.h\"|1"
        "src/optim/optimizer.c|#include \"../data/data_internal.h\"|1"
        "src/dist/ddp.c|#include \"../optim/optim_internal.h\"|1"
        "src/optim/clip.c|#include \"../nn/module_impl.h\"|1"
        # what the order allows
        "src/nn/layers.c|#include \"../util/strbuf.h\"|0"
        "src/optim/clip.c|#include \"../core/internal_api.h\"|0"
        "src/optim/clip.c|#include \"../nn/nn_internal.h\"|0"
        "src/dist/ddp.c|#include \"../nn/nn_internal.h\"|0"
        "src/models/tokenizer.c|#include \"../data/json.h\"|0"
        "src/models/tokenizer.c|#include \"../core/tensor_impl.h\"|1"
        "src/nn/layers.c|#include \"../models/tokenizer_internal.h\"|1"
        "src/autograd/formulas.c|#include \"../core/tensor_impl.h\"|0"
        "src/core/tensor.c|#include \"../memory/allocator.h\"|0"
        "src/core/device.c|#include \"../backends/op_call.h\"|0"
        "src/core/ops_common.c|#include \"../kernels/op_list.h\"|0"
        "src/memory/caching.c|#include \"../backends/backend.h\"|0"
        "src/memory/caching.c|#include \"../util/errors.h\"|0"
        "src/backends/opencl/opencl_gemm.c|#include \"../gpu/gpu.h\"|0"
        "src/backends/cuda/cuda_gemm.c|#include \"../../kernels/layout.h\"|0"
        "src/backends/cpu/cpu_copy.c|#include \"../backend.h\"|0"
        "src/kernels/rng.k|#include \"philox.h\"|0"
        # the exceptions, each exactly where it is named
        "src/core/ops_common.c|#include \"../autograd/record.h\"|0"
        "src/backends/cpu/cpu_copy.c|#include \"../../core/tensor_impl.h\"|0"
        "src/backends/cuda/cuda_gemm.c|#include \"../../memory/allocator.h\"|0"
    )
    local c file line want got
    for c in "${cases[@]}"; do
        IFS='|' read -r file line want <<< "$c"
        cp "$tmp/$file" "$tmp/saved"
        printf '%s\n' "$line" >> "$tmp/$file"
        if check "$tmp" "$file" 2>"$tmp/err"; then got=0; else got=1; fi
        if [ "$got" != "$want" ] || { [ "$want" = 1 ] && ! grep -q "$file" "$tmp/err"; }; then
            echo "self-test: planting '$line' in $file: expected $([ "$want" = 1 ] && echo failure || echo success)" >&2
            bad=1
        fi
        mv "$tmp/saved" "$tmp/$file"
    done
    # a folder of src/ in no layer
    mkdir -p "$tmp/src/widgets"
    printf '#include <ember/nn.h>\n' > "$tmp/src/widgets/gauge.c"
    if check "$tmp" src/widgets/gauge.c 2>"$tmp/err" || ! grep -q "src/widgets/gauge.c" "$tmp/err"; then
        echo "self-test: a file in src/widgets/ (no layer) was not refused" >&2
        bad=1
    fi
    rm -r "$tmp/src/widgets"
    [ "$bad" = 0 ] && echo "check_layers self-test: $((${#cases[@]} + 1)) planted includes and files judged right"
    return $bad
}

if [ "${1:-}" = "--self-test" ]; then
    self_test
else
    root="${1:-$(dirname "$self")/..}"
    check "$root" && echo "check_layers: every include goes down the layers (or is one of the ${#EXCEPTIONS[@]} named exceptions)"
fi
