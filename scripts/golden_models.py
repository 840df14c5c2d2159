#!/usr/bin/env python3
"""Golden data for Ember's language models (src/models), from transformers.

Run:  python scripts/golden_models.py [outdir]   (default tests/data/models)
      needs torch, transformers (>= 5) and safetensors from PyPI, e.g.
      python3 -m venv /tmp/v && /tmp/v/bin/pip install torch transformers safetensors
Nothing is downloaded: each model is built from a config with random weights, saved with
save_pretrained as a model folder <outdir>/<name>/ (config.json, generation_config.json and the
weights), and run by transformers on the CPU. tests/test_models.c loads each folder with Ember
and compares.

Folders (hidden sizes about 64, vocabularies of 500, so the data stays small):
  llama    LlamaForCausalLM: grouped-query attention (4 heads, 2 key-value heads), llama3 rope
           scaling, untied lm_head, float32, sharded (model.safetensors.index.json and three
           files), two end-of-sequence ids
  qwen2    Qwen2ForCausalLM: biases on q, k, v, tied embeddings, multi-query (1 key-value
           head), bfloat16 weights
  gpt2     GPT2LMHeadModel: learned positions, LayerNorm, gelu_new, Conv1D weights, float32
  mistral  MistralForCausalLM: head_dim 16 with hidden 48 (q is wider than hidden), linear
           rope scaling, a sliding window of 64, float16 weights
Norm weights and biases are randomized too (transformers initializes them to ones and zeros),
so that every parameter matters.

golden.safetensors holds, per model M (metadata "M": its dtype and the perplexity's numbers):
  M/single/ids [1, 16] and M/single/logits       one prompt
  M/left/{ids,mask,logits}  [2, 10]              a batch left-padded with pad id 0, attention_mask,
                                                 no position_ids (transformers then counts from 0)
  M/left_pos/{ids,mask,positions,logits}         the same with position_ids = cumsum(mask) - 1
                                                 (1 at the padding), as generate() makes them
  M/right/{ids,mask,logits}                      the batch right-padded
  M/ppl/ids [300]                                a sequence for the perplexity guide's strided
                                                 windows (max_length 64, stride 24)
Each model runs as from_pretrained(folder, dtype=...) loads it. The logits are in the model's
dtype (as transformers returns them). For the bfloat16 and float16 models also, per case,
logits_f32: the same folder loaded in float32 (Ember converts it on load), the answer the
16-bit logits approximate; and in the metadata spread_max and spread_rms: how far apart
transformers' own two attention paths (sdpa and eager) put the 16-bit logits, in units of the
dtype (2^-8 for bfloat16, 2^-11 for float16) relative to |logit| plus the case's mean |logit|:
the scale of "within its rounding" for a model whose every op rounds.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import (GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                         "data", "models")
VOCAB = 500
PPL_MAX_LENGTH, PPL_STRIDE = 64, 24
torch.manual_seed(2025)
tensors, meta = {}, {}


def randomize(model):
    """Norm weights around 1 and biases around 0 instead of exactly 1 and 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))


def build(name, model_cls, config, dtype, shard=None, eos=None):
    model = model_cls(config).eval()
    randomize(model)
    model = model.to(dtype)
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    if eos is not None:
        model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=eos, pad_token_id=0)
    model.save_pretrained(folder, max_shard_size=shard) if shard else model.save_pretrained(folder)
    # run what from_pretrained gives, as users get it: module.to(dtype) would also round the
    # rotary embedding's float32 inv_freq buffer to the dtype, from_pretrained keeps it float32
    return model_cls.from_pretrained(folder, dtype=dtype).eval()


def perplexity(model, ids):
    """transformers' perplexity guide, as written there."""
    seq_len = ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, PPL_STRIDE):
        end_loc = min(begin_loc + PPL_MAX_LENGTH, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            outputs = model(input_ids, labels=target_ids)
            neg_log_likelihood = outputs.loss
        num_valid_tokens = (target_ids != -100).sum().item()
        batch_size = target_ids.size(0)
        num_loss_tokens = num_valid_tokens - batch_size
        nll_sum += neg_log_likelihood * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    avg_nll = nll_sum / n_tokens
    return float(avg_nll), float(torch.exp(avg_nll)), n_tokens


def put(key, t):
    tensors[key] = t.detach().contiguous().clone()


def golden(name, model, dtype):
    single = torch.randint(3, VOCAB, (1, 16))
    a, b = torch.randint(3, VOCAB, (10,)), torch.randint(3, VOCAB, (6,))
    left = torch.zeros(2, 10, dtype=torch.long)
    left[0], left[1, 4:] = a, b
    left_mask = (left != 0).long()
    right = torch.zeros(2, 10, dtype=torch.long)
    right[0], right[1, :6] = a, b
    right_mask = (right != 0).long()
    positions = (left_mask.cumsum(-1) - 1).masked_fill(left_mask == 0, 1)
    cases = {"single": dict(input_ids=single), "left": dict(input_ids=left, attention_mask=left_mask),
             "right": dict(input_ids=right, attention_mask=right_mask),
             "left_pos": dict(input_ids=left, attention_mask=left_mask, position_ids=positions)}
    lowp = dtype != torch.float32
    if lowp:
        folder = os.path.join(OUT, name)
        as_f32 = type(model).from_pretrained(folder, dtype=torch.float32).eval()
        eager = type(model).from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
        unit = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
        spread_max, spread_sq, spread_n = 0.0, 0.0, 0
    with torch.no_grad():
        for case, args in cases.items():
            put(f"{name}/{case}/ids", args["input_ids"])
            if "attention_mask" in args:
                put(f"{name}/{case}/mask", args["attention_mask"])
            if "position_ids" in args:
                put(f"{name}/{case}/positions", args["position_ids"])
            logits = model(**args).logits
            put(f"{name}/{case}/logits", logits)
            if lowp:
                # the float32 answer for the same weights, and how far transformers' own two
                # attention paths (sdpa, the default, and eager) are apart in this dtype, in units
                # of the dtype relative to |logit| + the mean |logit| (as tests/test_models.c measures)
                truth = as_f32(**args).logits
                put(f"{name}/{case}/logits_f32", truth)
                other = eager(**args).logits.double()
                ref = logits.double()
                scale = ref.abs().mean()
                r = (other - ref).abs() / (unit * (ref.abs() + scale))
                if "attention_mask" in args:
                    r = r[args["attention_mask"].bool()]
                spread_max = max(spread_max, float(r.max()))
                spread_sq += float(r.pow(2).sum())
                spread_n += r.numel()
    ppl_ids = torch.randint(0, VOCAB, (1, 300))
    put(f"{name}/ppl/ids", ppl_ids[0])
    nll, ppl, n = perplexity(model, ppl_ids)
    meta[name] = (f"dtype={str(dtype).replace('torch.', '')} max_length={PPL_MAX_LENGTH} stride={PPL_STRIDE} "
                  f"nll={nll!r} ppl={ppl!r} tokens={n}")
    if lowp:
        meta[name] += f" spread_max={spread_max:.4f} spread_rms={(spread_sq / spread_n) ** 0.5:.4f}"


common = dict(vocab_size=VOCAB, max_position_embeddings=128, initializer_range=0.1)
llama = build("llama", LlamaForCausalLM,
              LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, rms_norm_eps=1e-5,
                          rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=32),
                          bos_token_id=1, eos_token_id=2, **common),
              torch.float32, shard="200KB", eos=[2, 3])
golden("llama", llama, torch.float32)

qwen2 = build("qwen2", Qwen2ForCausalLM,
              Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=1, tie_word_embeddings=True, rope_parameters=dict(rope_theta=1000000.0),
                          **common),
              torch.bfloat16)
golden("qwen2", qwen2, torch.bfloat16)

gpt2 = build("gpt2", GPT2LMHeadModel,
             GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB, bos_token_id=1,
                        eos_token_id=2, initializer_range=0.1),
             torch.float32)
golden("gpt2", gpt2, torch.float32)

mistral = build("mistral", MistralForCausalLM,
                MistralConfig(hidden_size=48, head_dim=16, intermediate_size=96, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, sliding_window=64,
                              rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0), **common),
                torch.float16)
golden("mistral", mistral, torch.float16)

save_file(tensors, os.path.join(OUT, "golden.safetensors"), metadata=meta)
for name in ("llama", "qwen2", "gpt2", "mistral"):
    files = sorted(os.listdir(os.path.join(OUT, name)))
    print(name, files, meta[name])
