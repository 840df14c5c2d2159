"""llama.cpp side of bench/run_lm.sh (through llama-cpp-python): prefill and decode speed of a GGUF.

For each thread count, a llama.cpp context over GGUF_FILE (memory-mapped, n_ctx 1024, the
whole prompt in one batch: n_batch = n_ubatch = 512), then: the prompt's ids in one eval
(prefill), then --new-tokens greedy steps of one token each (the argmax of the last logits).
Prints one JSON object per thread count, as bench/lm_torch.py does. The load is not timed; a
warm-up of 8 prompt tokens and 2 steps runs first in each context.
Usage: python bench/lm_llama_cpp.py GGUF_FILE IDS_FILE --threads 1 2 [--new-tokens N]
"""
import argparse
import json
import time

import numpy as np
from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("ids")
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
ap.add_argument("--new-tokens", type=int, default=16)
ap.add_argument("--no-mmap", action="store_true", help="read the file into memory instead of mapping it (use_mmap=False)")
a = ap.parse_args()
ids = [int(t) for t in open(a.ids).read().split()]


def run(llm, prompt, steps):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    n_vocab = llm.n_vocab()
    for _ in range(steps):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        llm.eval([int(logits.argmax())])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


for t in a.threads:
    llm = Llama(model_path=a.gguf, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=t, n_threads_batch=t,
                use_mmap=not a.no_mmap, verbose=False)
    run(llm, ids[:8], 2)
    pre, dec = run(llm, ids, a.new_tokens)
    print(json.dumps({"impl": "llama.cpp", "threads": t, "prompt_tokens": len(ids), "prefill_tps": len(ids) / pre,
                      "decode_tokens": a.new_tokens, "decode_tps": a.new_tokens / dec}), flush=True)
    llm.close()
