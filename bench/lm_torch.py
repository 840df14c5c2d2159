"""PyTorch + transformers side of bench/run_lm.sh: prefill and decode speed of a model folder.

Loads MODEL_DIR with AutoModelForCausalLM in bfloat16 (sdpa attention), then for each thread
count (torch.set_num_threads): one forward of the prompt's ids with a KV cache (prefill), then
--new-tokens greedy steps of one token each from that cache (decode), under inference_mode;
the logits of the last position only (logits_to_keep=1, as generate() asks), as llama.cpp
computes them.
Prints one JSON object per thread count: {"impl", "threads", "prompt_tokens", "prefill_tps",
"decode_tokens", "decode_tps"}. The load is not timed. A warm-up of 8 prompt tokens and 2
steps runs first at each thread count (allocator and thread-pool start).
Usage: python bench/lm_torch.py MODEL_DIR IDS_FILE --threads 1 2 [--new-tokens N]
IDS_FILE: the prompt's ids, whitespace-separated (run_lm.sh writes it).
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("ids")
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
ap.add_argument("--new-tokens", type=int, default=16)
a = ap.parse_args()
ids = [int(t) for t in open(a.ids).read().split()]
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa")
model.eval()


def run(prompt, steps):
    x = torch.tensor([prompt])
    t0 = time.perf_counter()
    out = model(input_ids=x, use_cache=True, logits_to_keep=1)
    t1 = time.perf_counter()
    cache, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(steps):
        out = model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=1)
        cache, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


with torch.inference_mode():
    for t in a.threads:
        torch.set_num_threads(t)
        run(ids[:8], 2)
        pre, dec = run(ids, a.new_tokens)
        print(json.dumps({"impl": "pytorch", "threads": t, "prompt_tokens": len(ids), "prefill_tps": len(ids) / pre,
                          "decode_tokens": a.new_tokens, "decode_tps": a.new_tokens / dec}), flush=True)
