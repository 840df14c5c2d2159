#!/usr/bin/env bash
# The one-way layering rule (docs/ARCHITECTURE.md), checked on #include lines.
#   scripts/check_layers.sh [ROOT]      check the tree at ROOT (default: this repository)
#   scripts/check_layers.sh --self-test plant bad includes in a copy and expect each to fail
#
# Private: every header under src/core, src/backends, src/memory and src/kernels.
# Allowed across the line:
#   src/nn, src/optim, src/data,
#   src/dist, src/models         -> src/core/internal_api.h only (the core's interface for them)
#   src/autograd                 -> also src/core/tensor_impl.h and src/core/errors.h: core calls
#                                   autograd through record.h, whose nodes hang off tensors
#   tools/                       -> nothing under src/ (the public API in include/ember/ only)
# src/util (no dependencies) and the upper layers' own headers are open to all of them.
# A quoted include resolves against the including file's folder, then against src/ (the
# library's -Isrc); <...> resolves against src/ only.
set -euo pipefail

self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

check() {
    local root fail=0 file dir inc target rel layer allowed
    root="$(cd "$1" && pwd)"
    while IFS= read -r -d '' file; do
        rel="${file#"$root"/}"
        case "$rel" in
            src/autograd/*) layer=autograd ;;
            src/nn/*|src/optim/*|src/data/*|src/dist/*|src/models/*) layer=upper ;;
            tools/*) layer=tools ;;
            *) continue ;;
        esac
        dir="$(dirname "$file")"
        while IFS= read -r inc; do
            target=""
            case "$inc" in
                \"*) inc="${inc:1:${#inc}-2}"
                     if [ -e "$dir/$inc" ]; then target="$dir/$inc"; else target="$root/src/$inc"; fi ;;
                \<*) inc="${inc:1:${#inc}-2}"
                     [ -e "$root/src/$inc" ] && target="$root/src/$inc" ;;
            esac
            [ -n "$target" ] || continue
            target="$(realpath -m --relative-to="$root" "$target")"
            allowed=yes
            case "$layer:$target" in
                tools:src/*) allowed=no ;;
                *:src/core/internal_api.h) ;;
                autograd:src/core/tensor_impl.h|autograd:src/core/errors.h) ;;
                *:src/core/*|*:src/backends/*|*:src/memory/*|*:src/kernels/*) allowed=no ;;
            esac
            if [ "$allowed" = no ]; then
                echo "layering: $rel includes $target (private to the lower layers; see docs/ARCHITECTURE.md)" >&2
                fail=1
            fi
        done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*([<"][^>"]+[>"]).*/\1/p' "$file")
    done < <(find "$root/src/autograd" "$root/src/nn" "$root/src/optim" "$root/src/data" "$root/src/dist" \
                  "$root/src/models" "$root/tools" \
                  -type f \( -name '*.c' -o -name '*.h' \) -print0 2>/dev/null)
    return $fail
}

self_test() {
    local repo tmp bad=0
    repo="$(cd "$(dirname "$self")/.." && pwd)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    cp -r "$repo/src" "$repo/tools" "$tmp/"
    if ! check "$tmp" 2>/dev/null; then echo "self-test: the clean tree fails" >&2; return 1; fi
    # file | line planted | must fail (1) or pass (0)
    local cases=(
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
        "src/dist/ddp.c|#include \"../core/tensor_impl.h\"|1"
        "src/dist/collectives.c|#include \"../memory/allocator.h\"|1"
        "src/models/tokenizer.c|#include \"../core/tensor_impl.h\"|1"
        "src/models/tok_bpe.c|#include <backends/backend.h>|1"
        "src/models/tokenizer.c|#include \"../data/json.h\"|0"
        "src/nn/layers.c|#include \"../util/strbuf.h\"|0"
        "src/optim/clip.c|#include \"../core/internal_api.h\"|0"
        "src/autograd/formulas.c|#include \"../core/tensor_impl.h\"|0"
    )
    local c file line want got
    for c in "${cases[@]}"; do
        IFS='|' read -r file line want <<< "$c"
        cp "$tmp/$file" "$tmp/saved"
        printf '%s\n' "$line" >> "$tmp/$file"
        if check "$tmp" 2>"$tmp/err"; then got=0; else got=1; fi
        if [ "$got" != "$want" ] || { [ "$want" = 1 ] && ! grep -q "$file" "$tmp/err"; }; then
            echo "self-test: planting '$line' in $file: expected $([ "$want" = 1 ] && echo failure || echo success)" >&2
            bad=1
        fi
        mv "$tmp/saved" "$tmp/$file"
    done
    [ "$bad" = 0 ] && echo "check_layers self-test: ${#cases[@]} planted includes judged right"
    return $bad
}

if [ "${1:-}" = "--self-test" ]; then
    self_test
else
    root="${1:-$(dirname "$self")/..}"
    check "$root" && echo "check_layers: the upper layers include only public headers and src/core/internal_api.h"
fi
