#!/usr/bin/env python3
"""Write a Llama- or GPT-2-shaped Hugging Face model folder with random bfloat16 weights.

Run:  /work/venv-lm/bin/python scripts/make_model_folder.py --preset llama-1b /work/models/llama-1b
      /work/venv-lm/bin/python scripts/make_model_folder.py --preset llama2-7b /work/models/llama2-7b
      /work/venv-lm/bin/python scripts/make_model_folder.py --preset gpt2-124m /tmp/gpt2
      (needs only numpy; any shape: --hidden, --layers, --heads, --kv-heads, --intermediate,
      --vocab, --tied, --seed, --shard-gb; --repeat-block for a quick folder to time and size)

Presets:
  llama2-7b  Llama 2 7B's shape: hidden 4096, 32 layers, 32 heads (no GQA), intermediate 11008,
             vocabulary 32000, untied; 6.74e9 parameters, 13.5 GB in bfloat16
  llama-1b   Llama 3.2 1B's shape: hidden 2048, 16 layers, 32 heads and 8 key/value heads,
             intermediate 8192, vocabulary 128256, tied embeddings, llama3 rope scaling;
             1.24e9 parameters, 2.47 GB
  gpt2-124m  GPT-2's smallest shape: hidden 768, 12 layers, 12 heads, intermediate 3072,
             vocabulary 50257, 1024 positions, tied; 1.24e8 parameters, 0.25 GB (GPT2LMHeadModel:
             Conv1D weights stored [in, out], LayerNorm weights 1 and biases 0, other biases 0)
  tiny       a few MB, for checking the script and the tools that read its output

The folder holds what transformers, llama.cpp's convert_hf_to_gguf.py and Ember read:
config.json (LlamaForCausalLM), generation_config.json, the weights as model.safetensors or,
above --shard-gb, as model-0000i-of-0000n.safetensors shards with model.safetensors.index.json,
and a tokenizer (tokenizer.json in the SentencePiece-style BPE that transformers writes for
Llama 2, with byte fallback, plus tokenizer_config.json). The tokenizer covers the whole
vocabulary: <unk>, <s>, </s>, the 256 byte pieces, printable ASCII and "▁", then pieces built
by merging one more character onto an existing piece (every "▁" plus two characters is one
token, so a prompt of N words like " ab" is N tokens).

Weights: every linear and embedding weight is drawn from normal(0, 0.02) (transformers' Llama
initialisation), the RMSNorm weights are 1; activations stay finite through any number of
layers. A draw is a uniform 16-bit index into a table of the distribution's 65536 quantiles
(in bfloat16), several times faster than numpy's normal generator and a rounding per value,
which matters at 6.7e9 values. Each tensor draws from its own
numpy generator seeded by (seed, tensor index), so the folder is the same on every run and
machine. The tensors are generated and written a block of rows at a time, so memory stays
near 64 MiB plus the block's indexes whatever the model's size, and each shard's safetensors
header is written first from the shapes alone.

--repeat-block draws one block of 64 MiB once and writes it again and again (the values keep
their distribution; a weight matrix's rows repeat every 64 MiB): several times faster, for a
folder that is only timed or sized (the GPU check makes a 7B folder this way), never for a
model whose outputs are compared.
"""
import argparse
import json
import os
import statistics
import struct
import sys

import numpy as np

PRESETS = {
    "llama2-7b": dict(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000, tied=False,
                      rope_theta=10000.0, max_positions=4096, rope_scaling=None),
    "llama-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, tied=True,
                     rope_theta=500000.0, max_positions=131072,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "gpt2-124m": dict(family="gpt2", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=3072,
                      vocab=50257, tied=True, max_positions=1024),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=176, vocab=1024, tied=False,
                 rope_theta=10000.0, max_positions=2048, rope_scaling=None),
}
BLOCK_BYTES = 64 << 20  # rows generated at once: about this many bytes of bfloat16


def tensor_list(c):
    """(name, shape, kind) in transformers' order; kind 'normal', 'ones' or 'zeros'."""
    if c.get("family") == "gpt2":
        return gpt2_tensor_list(c)
    h, d = c["hidden"], c["hidden"] // c["heads"]
    kv = c["kv_heads"] * d
    out = [("model.embed_tokens.weight", (c["vocab"], h), "normal")]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), "ones"),
                (p + "self_attn.q_proj.weight", (h, h), "normal"),
                (p + "self_attn.k_proj.weight", (kv, h), "normal"),
                (p + "self_attn.v_proj.weight", (kv, h), "normal"),
                (p + "self_attn.o_proj.weight", (h, h), "normal"),
                (p + "post_attention_layernorm.weight", (h,), "ones"),
                (p + "mlp.gate_proj.weight", (c["intermediate"], h), "normal"),
                (p + "mlp.up_proj.weight", (c["intermediate"], h), "normal"),
                (p + "mlp.down_proj.weight", (h, c["intermediate"]), "normal")]
    out.append(("model.norm.weight", (h,), "ones"))
    if not c["tied"]:
        out.append(("lm_head.weight", (c["vocab"], h), "normal"))
    return out


def gpt2_tensor_list(c):
    """GPT2LMHeadModel's tensors: Conv1D weights are [in, out]; the head is tied to wte."""
    h, i = c["hidden"], c["intermediate"]
    out = [("transformer.wte.weight", (c["vocab"], h), "normal"),
           ("transformer.wpe.weight", (c["max_positions"], h), "normal")]
    for n in range(c["layers"]):
        p = f"transformer.h.{n}."
        out += [(p + "ln_1.weight", (h,), "ones"), (p + "ln_1.bias", (h,), "zeros"),
                (p + "attn.c_attn.weight", (h, 3 * h), "normal"), (p + "attn.c_attn.bias", (3 * h,), "zeros"),
                (p + "attn.c_proj.weight", (h, h), "normal"), (p + "attn.c_proj.bias", (h,), "zeros"),
                (p + "ln_2.weight", (h,), "ones"), (p + "ln_2.bias", (h,), "zeros"),
                (p + "mlp.c_fc.weight", (h, i), "normal"), (p + "mlp.c_fc.bias", (i,), "zeros"),
                (p + "mlp.c_proj.weight", (i, h), "normal"), (p + "mlp.c_proj.bias", (h,), "zeros")]
    out += [("transformer.ln_f.weight", (h,), "ones"), ("transformer.ln_f.bias", (h,), "zeros")]
    return out


def nbytes(shape):
    n = 2
    for s in shape:
        n *= s
    return n


def to_bf16(f32):
    """float32 -> bfloat16 bits, round to nearest even (the values are finite)."""
    u = f32.view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype(np.uint16)


def normal_table():
    """bf16 bits of 0.02 * the normal distribution's 65536 quantiles, (i + 0.5) / 65536."""
    nd = statistics.NormalDist(0.0, 0.02)
    q = np.array([nd.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)
    return to_bf16(q)


REPEATED = {}  # --repeat-block: the one block every normal tensor writes


def write_tensor(f, index, shape, kind, seed, table, repeat=False):
    rows = shape[0]
    cols = nbytes(shape) // 2 // rows
    if kind in ("ones", "zeros"):
        f.write(np.full(shape, 0x3F80 if kind == "ones" else 0, dtype=np.uint16).tobytes())  # 1.0 or 0 in bfloat16
        return
    if repeat:
        if "block" not in REPEATED:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed])))
            REPEATED["block"] = table[np.frombuffer(rng.bytes(BLOCK_BYTES), dtype=np.uint16)].tobytes()
        block, left = REPEATED["block"], nbytes(shape)
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        return
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index])))
    step = max(1, BLOCK_BYTES // (2 * cols))
    for r in range(0, rows, step):
        n = min(step, rows - r)
        f.write(table[np.frombuffer(rng.bytes(2 * n * cols), dtype=np.uint16)].tobytes())


def write_shard(path, tensors, seed, first_index, table, repeat=False):
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, _ in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes(shape)]}
        off += nbytes(shape)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path + ".part", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for i, (name, shape, kind) in enumerate(tensors):
            write_tensor(f, first_index + i, shape, kind, seed, table, repeat)
    os.replace(path + ".part", path)  # an interrupted run leaves no shard that looks whole
    return off


def tokenizer(vocab_size):
    """A Llama-2-style tokenizer.json (SentencePiece-style BPE, byte fallback) of vocab_size ids."""
    specials = ["<unk>", "<s>", "</s>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    chars = ["▁"] + [chr(c) for c in range(33, 127)]
    if vocab_size < len(pieces) + len(chars):
        sys.exit(f"make_model_folder: a vocabulary of {vocab_size} is too small for the tokenizer "
                 f"(at least {len(pieces) + len(chars)})")
    pieces += chars
    seen = set(pieces)
    merges = []
    frontier = list(chars)  # pieces to extend by one character, shortest first, "▁..." first
    while len(pieces) < vocab_size:
        nxt = []
        for p in sorted(frontier, key=lambda s: (not s.startswith("▁"), s)):
            for ch in chars:
                q = p + ch
                if q in seen or (ch == "▁" and p != "▁"):
                    continue
                seen.add(q)
                pieces.append(q)
                merges.append([p, ch])
                nxt.append(q)
                if len(pieces) == vocab_size:
                    break
            if len(pieces) == vocab_size:
                break
        frontier = nxt
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(specials)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                          {"type": "Replace", "pattern": {"String": " "},
                                                           "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(pieces)}, "merges": merges},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the folder to write (created; must not hold a model unless --force)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, dest=k)
    ap.add_argument("--tied", choices=("yes", "no"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=2.0, help="largest shard, in GB (1e9 bytes)")
    ap.add_argument("--force", action="store_true", help="overwrite a model folder already there")
    ap.add_argument("--repeat-block", action="store_true",
                    help="write one random 64 MiB block again and again: quick, for timing and sizing only")
    a = ap.parse_args()
    c = dict(PRESETS[a.preset])
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        if getattr(a, k) is not None:
            c[k] = getattr(a, k)
    if a.tied:
        c["tied"] = a.tied == "yes"
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        if c[k] < 1:
            sys.exit(f"make_model_folder: --{k.replace('_', '-')} must be at least 1, got {c[k]}")
    if c.get("family") == "gpt2":
        if a.kv_heads is not None and a.kv_heads != c["heads"]:
            sys.exit(f"make_model_folder: GPT-2 has no grouped key/value heads (--kv-heads {a.kv_heads}, "
                     f"--heads {c['heads']})")
        if not c["tied"]:
            sys.exit("make_model_folder: this GPT-2 ties its head to the token embedding (--tied no is Llama's)")
        c["kv_heads"] = c["heads"]
    if c["hidden"] % c["heads"] or c["heads"] % c["kv_heads"]:
        sys.exit(f"make_model_folder: hidden {c['hidden']} must divide into {c['heads']} heads, and the heads "
                 f"into {c['kv_heads']} key/value heads")
    if os.path.exists(os.path.join(a.out, "config.json")) and not a.force:
        sys.exit(f"make_model_folder: {a.out} already holds a model (config.json); --force overwrites it")
    os.makedirs(a.out, exist_ok=True)

    tensors = tensor_list(c)
    total = sum(nbytes(s) for _, s, _ in tensors)
    params = total // 2
    limit = int(a.shard_gb * 1e9)
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        if cur and cur_bytes + nbytes(t[1]) > limit:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += nbytes(t[1])
    shards.append(cur)

    print(f"{a.out}: {params} parameters ({params / 1e9:.3f}e9), {total / 1e9:.2f} GB of bfloat16 in {len(shards)} "
          f"file{'s' if len(shards) > 1 else ''}", flush=True)
    weight_map, index, table = {}, 0, normal_table()
    for i, shard in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(a.out, name), shard, a.seed, index, table, a.repeat_block)
        index += len(shard)
        for t in shard:
            weight_map[t[0]] = name
        print(f"  {name}: {len(shard)} tensors", flush=True)
    index_path = os.path.join(a.out, "model.safetensors.index.json")
    if len(shards) > 1:
        with open(index_path, "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    elif os.path.exists(index_path):
        os.remove(index_path)

    head_dim = c["hidden"] // c["heads"]
    if c.get("family") == "gpt2":
        config = {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c["vocab"],
            "n_positions": c["max_positions"], "n_embd": c["hidden"], "n_layer": c["layers"], "n_head": c["heads"],
            "n_inner": c["intermediate"], "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
            "scale_attn_weights": True, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "bfloat16", "use_cache": True,
        }
    else:
        config = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": c["hidden"], "intermediate_size": c["intermediate"], "num_hidden_layers": c["layers"],
            "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"], "head_dim": head_dim,
            "vocab_size": c["vocab"], "max_position_embeddings": c["max_positions"], "rms_norm_eps": 1e-5,
            "rope_theta": c["rope_theta"], "rope_scaling": c["rope_scaling"], "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02,
            "tie_word_embeddings": c["tied"], "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
            "use_cache": True,
        }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer(c["vocab"]), f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": False,
                   "model_max_length": c["max_positions"]}, f, indent=2)


if __name__ == "__main__":
    main()
