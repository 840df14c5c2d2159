#!/bin/sh
# Language-model inference on the CPU: prefill and decode tokens/s of a Llama-shaped bf16 model
# folder, Ember against PyTorch + transformers (bench/lm_torch.py) and llama.cpp through
# llama-cpp-python (bench/lm_llama_cpp.py, on the same folder converted to a bf16 GGUF), on 1
# and 2 threads, in one run: ROUNDS rounds, each running every implementation once (the order
# rotates from round to round, and so does the order of the thread counts), and each figure the
# median over the rounds. Each round also measures the machine on the same thread counts
# (bench_gemv --bandwidth-only): its read bandwidth (a pure read of 512 MiB in 2 MiB pages, the
# better of one stream and four streams per thread, best 32 MiB slice), its a = b + c bandwidth,
# and its bf16 GEMM peak (Ember's bf16 matmul at 2048^3, 4096^3 and the prefill's 512 x 2048 x
# 8192, best of three runs each, best size). The summary prints, per implementation and thread
# count:
#   decode GB/s   the weight bytes a token reads (every weight but the input embedding's table,
#                 whose one row is read; the output head counted once even when tied) times
#                 decode tokens/s, and its share of the read bandwidth;
#   prefill GFLOP/s  2 x the layers' matmul parameters x prompt tokens, plus the causal
#                 attention's 2 x layers x q_dim x P(P+1) (QK^T and PV over the keys each query
#                 sees), plus the output head for the last position (what all three compute),
#                 over prefill seconds, and its share of the GEMM peak;
# then the targets' figures for Ember: decode >= 85% of read and >= 1.0x llama.cpp, prefill
# >= 70% of the GEMM peak, both >= PyTorch.
#
# Usage: bench/run_lm.sh [build-dir]        (a Release build; default build)
# Environment:
#   LM_MODEL      the folder (default /work/models/llama-1b: scripts/make_model_folder.py
#                 --preset llama-1b writes it)
#   LM_7B=1       also the folder LM_MODEL_7B (default /work/models/llama2-7b, --preset llama2-7b)
#   LM_NO_MMAP=1  both Ember and llama.cpp read the weights into memory instead of mapping the
#                 files (ember generate --no-mmap, llama.cpp's use_mmap=False)
#   ROUNDS        rounds (default 3); NEW_TOKENS decode steps per run (default 16); PROMPT
#                 prompt tokens (default 512)
#   TORCH_PYTHON  an interpreter with torch and transformers (default /work/venv-lm/bin/python);
#                 it also runs llama.cpp's converter and tokenizes the prompt
#   LLAMA_PYTHON  an interpreter with llama-cpp-python (default /work/venv-llama/bin/python)
#   LLAMA_CPP     llama.cpp's source tree, for convert_hf_to_gguf.py and its gguf-py package
#                 (default: the tree vendored in llama-cpp-python's sdist, unpacked under
#                 /work/llama-src)
#   CONVERT_PYTHONPATH  a folder holding sentencepiece, which the converter imports before it
#                 finds no tokenizer.model and reads tokenizer.json instead (made by
#                 `pip install --target DIR sentencepiece`; default /work/llama-src/pydeps)
#   GGUF_DIR      where the converted files go (default /work/models/gguf)
# A side whose interpreter or command is missing is reported as skipped, with the reason.
# Ember's side runs `ember generate MODEL_DIR --prompt TEXT --max-new-tokens N --temperature 0 --dtype bf16
# --threads T --json` and reads prefill_seconds, decode_seconds and decode_tokens from its JSON.
set -eu
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ROUNDS=${ROUNDS:-3}
NEW_TOKENS=${NEW_TOKENS:-16}
PROMPT=${PROMPT:-512}
TORCH_PYTHON=${TORCH_PYTHON:-/work/venv-lm/bin/python}
LLAMA_PYTHON=${LLAMA_PYTHON:-/work/venv-llama/bin/python}
LLAMA_CPP=${LLAMA_CPP:-$(ls -d /work/llama-src/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)}
GGUF_DIR=${GGUF_DIR:-/work/models/gguf}
CONVERT_PYTHONPATH=${CONVERT_PYTHONPATH:-/work/llama-src/pydeps}
MODELS=${LM_MODEL:-/work/models/llama-1b}
EMBER_MMAP=; LLAMA_MMAP=; WEIGHTS=mapped
[ "${LM_NO_MMAP:-0}" = 1 ] && EMBER_MMAP=--no-mmap && LLAMA_MMAP=--no-mmap && WEIGHTS="read into memory (no mmap)"
[ "${LM_7B:-0}" = 1 ] && MODELS="$MODELS ${LM_MODEL_7B:-/work/models/llama2-7b}"

if [ ! -x "$BUILD/bench_gemv" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j2 --target bench_gemv >/dev/null
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

have_torch=yes; "$TORCH_PYTHON" -c "import torch, transformers" 2>/dev/null || have_torch="no ($TORCH_PYTHON has no torch + transformers)"
have_llama=yes; "$LLAMA_PYTHON" -c "import llama_cpp" 2>/dev/null || have_llama="no ($LLAMA_PYTHON has no llama_cpp)"
have_ember=yes; "$BUILD/ember" generate --help >/dev/null 2>&1 || have_ember="no ($BUILD/ember has no generate command yet)"
[ "$have_torch" = yes ] || { echo "run_lm: $have_torch: it tokenizes the prompt and converts to GGUF" >&2; exit 1; }

for MODEL in $MODELS; do
    [ -f "$MODEL/config.json" ] || { echo "run_lm: $MODEL has no config.json (scripts/make_model_folder.py writes one)" >&2; exit 1; }
    NAME=$(basename "$MODEL")
    GGUF="$GGUF_DIR/$NAME-bf16.gguf"
    if [ "$have_llama" = yes ] && [ ! -f "$GGUF" ]; then
        if [ -z "$LLAMA_CPP" ] || [ ! -f "$LLAMA_CPP/convert_hf_to_gguf.py" ]; then
            have_llama="no (no llama.cpp source tree with convert_hf_to_gguf.py: set LLAMA_CPP)"
        else
            mkdir -p "$GGUF_DIR"
            echo "converting $MODEL to $GGUF" >&2
            PYTHONPATH="$LLAMA_CPP/gguf-py${CONVERT_PYTHONPATH:+:$CONVERT_PYTHONPATH}" "$TORCH_PYTHON" "$LLAMA_CPP/convert_hf_to_gguf.py" "$MODEL" \
                --outtype bf16 --outfile "$GGUF.part" >"$TMP/convert.log" 2>&1 ||
                { tail -5 "$TMP/convert.log" >&2; echo "run_lm: the conversion failed" >&2; exit 1; }
            mv "$GGUF.part" "$GGUF"
        fi
    fi
    # the prompt: PROMPT - 1 words that are one token each, after <s>; its ids from transformers
    "$TORCH_PYTHON" - "$MODEL" "$PROMPT" "$TMP/prompt.txt" "$TMP/ids.txt" <<'EOF'
import sys
from transformers import AutoTokenizer
model, n, text_path, ids_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
letters = "abcdefghijklmnopqrstuvwxyz"
words = [letters[i % 26] + letters[(i * 7 // 26) % 26] for i in range(n - 1)]
text = "".join(" " + w for w in words)[1:]
ids = AutoTokenizer.from_pretrained(model)(text).input_ids
if len(ids) != n:
    sys.exit(f"run_lm: the prompt is {len(ids)} tokens, not {n}: the tokenizer is not make_model_folder.py's")
open(text_path, "w").write(text)
open(ids_path, "w").write(" ".join(map(str, ids)))
EOF
    # Every side maps or reads its files: have them in the page cache before the first round,
    # each brought in as its own load brings it. Ember's mapping is advised into huge pages,
    # so the pages it reads first come in as 2 MiB folios, where pages read by `cat` (or
    # PyTorch) would stay in 4 KiB ones: drop the folder's cached pages, then one short Ember
    # run reads them. llama.cpp's mapping takes no such advice: `cat` reads its file as it would.
    "$TORCH_PYTHON" -c 'import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a hint: clean, unmapped pages only
    os.close(fd)' "$MODEL"/*.safetensors
    if [ "$have_ember" = yes ] && [ -z "$EMBER_MMAP" ]; then
        "$BUILD/ember" generate "$MODEL" --prompt "a" --max-new-tokens 1 --temperature 0 --dtype bf16 >/dev/null 2>&1 ||
            { echo "run_lm: ember generate $MODEL failed" >&2; exit 1; }
    else
        cat "$MODEL"/*.safetensors >/dev/null
    fi
    [ "$have_llama" = yes ] && cat "$GGUF" >/dev/null
    : >"$TMP/results.jsonl"
    r=0
    while [ "$r" -lt "$ROUNDS" ]; do
        case $((r % 2)) in 0) THREADS="1 2" ;; *) THREADS="2 1" ;; esac
        case $((r % 3)) in 0) ORDER="ember pytorch llama" ;; 1) ORDER="pytorch llama ember" ;; *) ORDER="llama ember pytorch" ;; esac
        "$BUILD/bench_gemv" 1 --bandwidth-only | awk '/^(read_gbs|triad_gbs|gemm_peak_gflops)/ {printf "{\"impl\": \"machine\", \"what\": \"%s\", \"t1\": %s, \"t2\": %s}\n", $1, $3, $4}' >>"$TMP/results.jsonl"
        for impl in $ORDER; do
            case $impl in
            pytorch)
                "$TORCH_PYTHON" bench/lm_torch.py "$MODEL" "$TMP/ids.txt" --threads $THREADS --new-tokens "$NEW_TOKENS" \
                    2>"$TMP/err" >>"$TMP/results.jsonl" || { tail -3 "$TMP/err" >&2; exit 1; } ;;
            llama)
                [ "$have_llama" = yes ] || continue
                "$LLAMA_PYTHON" bench/lm_llama_cpp.py "$GGUF" "$TMP/ids.txt" --threads $THREADS --new-tokens "$NEW_TOKENS" $LLAMA_MMAP \
                    2>"$TMP/err" >>"$TMP/results.jsonl" || { tail -3 "$TMP/err" >&2; exit 1; } ;;
            ember)
                [ "$have_ember" = yes ] || continue
                for t in $THREADS; do
                    "$BUILD/ember" generate "$MODEL" --prompt "$(cat "$TMP/prompt.txt")" --max-new-tokens $((NEW_TOKENS + 1)) \
                        --temperature 0 --dtype bf16 --threads "$t" --json $EMBER_MMAP 2>"$TMP/err" >"$TMP/ember.json" || { tail -3 "$TMP/err" >&2; exit 1; }
                    "$TORCH_PYTHON" -c 'import json, sys
j = json.load(open(sys.argv[1])); t = int(sys.argv[2])
print(json.dumps({"impl": "ember", "threads": t, "prompt_tokens": len(j["prompt_tokens"]),
                  "prefill_tps": len(j["prompt_tokens"]) / j["prefill_seconds"], "decode_tokens": j["decode_tokens"],
                  "decode_tps": j["decode_tokens"] / j["decode_seconds"]}))' "$TMP/ember.json" "$t" >>"$TMP/results.jsonl"
                done ;;
            esac
        done
        r=$((r + 1))
        echo "round $r of $ROUNDS done" >&2
    done
    echo "== $MODEL: bf16, prompt $PROMPT tokens, $NEW_TOKENS decode steps, median of $ROUNDS alternated rounds"
    echo "   ember: $have_ember; pytorch: $have_torch; llama.cpp: $have_llama; weights $WEIGHTS"
    "$TORCH_PYTHON" - "$MODEL" "$TMP/results.jsonl" "$PROMPT" <<'EOF'
import json, statistics, sys
model, path, P = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open(model + "/config.json"))
h, L, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
d = c.get("head_dim") or h // c["num_attention_heads"]
q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
matmul_params = h * q + 2 * h * kv + q * h + 3 * h * i
per_layer = matmul_params + 2 * h
weights_read = 2 * (L * per_layer + h + v * h)  # bf16 bytes a token reads: layers, final norm, head
prefill_flops = 2 * L * matmul_params * P + 2 * L * q * P * (P + 1) + 2 * v * h
rows = [json.loads(l) for l in open(path) if l.strip()]
bw = {(r["what"], t): statistics.median(x[f"t{t}"] for x in rows if x.get("what") == r["what"])
      for r in rows if r["impl"] == "machine" for t in (1, 2)}
print(f"   weights read per token: {weights_read / 1e9:.3f} GB; prefill of {P} tokens: {prefill_flops / 1e9:.1f} GFLOP")
for t in (1, 2):
    print(f"   machine, {t} thread{'s' if t > 1 else ''}: read {bw[('read_gbs', t)]:.2f} GB/s, "
          f"a = b + c {bw[('triad_gbs', t)]:.2f} GB/s, bf16 GEMM peak {bw[('gemm_peak_gflops', t)]:.1f} GFLOP/s")
print(f"   {'impl':<10} {'thr':>3} {'prefill tok/s':>14} {'GFLOP/s':>8} {'% of peak':>10} "
      f"{'decode tok/s':>13} {'decode GB/s':>12} {'% of read':>10}")
med = {}
for impl in ("ember", "pytorch", "llama.cpp"):
    for t in (1, 2):
        sel = [r for r in rows if r["impl"] == impl and r["threads"] == t]
        if not sel:
            continue
        pre = statistics.median(r["prefill_tps"] for r in sel)
        dec = statistics.median(r["decode_tps"] for r in sel)
        med[impl, t] = (pre, dec)
        gbs = dec * weights_read / 1e9
        gflops = pre / P * prefill_flops / 1e9
        print(f"   {impl:<10} {t:>3} {pre:>14.1f} {gflops:>8.1f} {100 * gflops / bw[('gemm_peak_gflops', t)]:>9.0f}% "
              f"{dec:>13.2f} {gbs:>12.2f} {100 * gbs / bw[('read_gbs', t)]:>9.0f}%")
def ratio(t, k, other):
    return f"{med['ember', t][k] / med[other, t][k]:.2f}x {other}" if (other, t) in med else f"no {other} figure"
for t in (1, 2):
    if ("ember", t) not in med:
        continue
    pre, dec = med["ember", t]
    share_read = 100 * dec * weights_read / 1e9 / bw[("read_gbs", t)]
    share_peak = 100 * pre / P * prefill_flops / 1e9 / bw[("gemm_peak_gflops", t)]
    print(f"   targets, ember {t} thread{'s' if t > 1 else ''}: decode {share_read:.0f}% of read (>= 85%), "
          f"{ratio(t, 1, 'llama.cpp')} (>= 1.0), {ratio(t, 1, 'pytorch')} (>= 1.0); "
          f"prefill {share_peak:.0f}% of the GEMM peak (>= 70%), {ratio(t, 0, 'pytorch')} (>= 1.0)")
EOF
done
