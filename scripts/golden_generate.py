#!/usr/bin/env python3
"""Golden data for Ember's generation (src/models/generate.c, sampling.c), from transformers.

Run after scripts/golden_models.py (it reads the model folders that script writes):
      python scripts/golden_generate.py [outdir]   (default tests/data/models)
      needs torch, transformers (>= 5), tokenizers and safetensors from PyPI.
Nothing is downloaded.

1. A tokenizer for the model folders: byte-level BPE (GPT-2's pre-tokenizer and decoder)
   trained by `tokenizers` on local text (Ember's code sample and the seeds' Korean text in
   tests/data/tokenizer) to exactly the models' vocabulary of 500, with the special tokens
   <pad> <s> </s> <|eot|> as ids 0..3 (the folders' pad, bos and end-of-sequence ids). It is
   written as tokenizer.json into the llama, qwen2 and gpt2 folders, so that they are whole
   model folders that `ember generate` runs.
2. Greedy continuations: for each of those models loaded in float32 (the qwen2 folder's
   bfloat16 weights converted on load, as Ember does), each prompt of PROMPTS (tokenized by
   that tokenizer, no special tokens added) alone, transformers' generate(do_sample=False,
   max_new_tokens=32) with the folder's generation_config (its end-of-sequence ids): the new
   ids, in gen/<model>/greedy/<i>; the same with repetition_penalty=1.3 in gen/<model>/rep/<i>.
   gen/<model>/prompt/<i> holds the prompt's ids.
3. Logits processors on fixed logits (proc/logits [4, 500] float32, proc/context [4, 24]
   int64 ids already seen): transformers' RepetitionPenaltyLogitsProcessor,
   TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, each alone and all four in
   generate()'s order (penalty, temperature, top-k, top-p), in proc/<case>; the metadata
   "proc/<case>" gives the parameters. Removed entries are -inf, as transformers leaves them.

Everything goes to <outdir>/golden_generate.safetensors (metadata "prompt/<i>": the prompts'
texts).
"""
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "models")
VOCAB = 500
SPECIALS = ["<pad>", "<s>", "</s>", "<|eot|>"]
PROMPTS = ["The quick brown fox", "int main(void) { return 0; }\nstatic", "한국어 텍스트와 emoji 🙂 and more words here"]
NEW_TOKENS = 32
torch.manual_seed(7)
tensors, meta = {}, {}


def put(key, t):
    tensors[key] = t.detach().contiguous().clone()


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = []
    for name in ("code_sample.txt", "seeds_ko.txt"):
        with open(os.path.join(ROOT, "tests", "data", "tokenizer", name), encoding="utf-8") as f:
            texts.append(f.read())
    tok.train_from_iterator(texts, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    return tok


tok = train_tokenizer()
for name in ("llama", "qwen2", "gpt2"):
    tok.save(os.path.join(OUT, name, "tokenizer.json"))
for i, text in enumerate(PROMPTS):
    meta[f"prompt/{i}"] = text

families = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gpt2": GPT2LMHeadModel}
for name, cls in families.items():
    model = cls.from_pretrained(os.path.join(OUT, name), dtype=torch.float32).eval()
    for i, text in enumerate(PROMPTS):
        ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
        put(f"gen/{name}/prompt/{i}", ids[0])
        for case, extra in (("greedy", {}), ("rep", {"repetition_penalty": 1.3})):
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NEW_TOKENS, pad_token_id=0, **extra)
            put(f"gen/{name}/{case}/{i}", out[0, ids.shape[1]:])
            print(name, case, i, out[0, ids.shape[1]:].tolist())

logits = torch.randn(4, VOCAB) * 3
context = torch.randint(0, VOCAB, (4, 24))
put("proc/logits", logits)
put("proc/context", context)
cases = {
    "rep": [("repetition_penalty", 1.5)],
    "temp": [("temperature", 0.7)],
    "topk": [("top_k", 10)],
    "topp": [("top_p", 0.9)],
    "all": [("repetition_penalty", 1.2), ("temperature", 0.8), ("top_k", 50), ("top_p", 0.8)],
}
for case, steps in cases.items():
    scores = logits.clone()
    for what, value in steps:
        proc = {"repetition_penalty": RepetitionPenaltyLogitsProcessor, "temperature": TemperatureLogitsWarper,
                "top_k": TopKLogitsWarper, "top_p": TopPLogitsWarper}[what](value)
        scores = proc(context, scores)
    put(f"proc/{case}", scores)
    meta[f"proc/{case}"] = " ".join(f"{w}={v}" for w, v in steps)

save_file(tensors, os.path.join(OUT, "golden_generate.safetensors"), metadata=meta)
print("wrote", len(tensors), "tensors")
