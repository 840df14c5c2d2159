#!/usr/bin/env python3
"""Golden data for Ember's language-model ops, from PyTorch and transformers.

Run:  python scripts/golden_lm_ops.py [out]   (default tests/data/golden_lm_ops.safetensors)
      needs torch (>= 2.5: enable_gqa), transformers (>= 5: rope_parameters) and safetensors
      from PyPI, e.g. python3 -m venv /tmp/v && /tmp/v/bin/pip install torch transformers safetensors
The output is deterministic and committed; tests/test_lm_golden.c replays every case on every
available device (CPU, PoCL, CUDA).

Cases, each "c/<tensor>" with its meta string in the metadata entry "c":
  rms_norm_<dt>      transformers' LlamaRMSNorm (eps 1e-6) on x; y; in float32 also the
                     gradients dx, dw of sum(y * gy), computed in float64
  swiglu_<dt>        LlamaMLP's act_fn(gate) * up (SiLU)
  rope_table_<kind>  LlamaRotaryEmbedding for a config (default, linear, llama3): inv_freq,
                     positions [B, T], cos and sin in float32 and bfloat16
  rope_<dt>          apply_rotary_pos_emb(q, k, cos, sin) on q, k made [B, H, T, D] by a
                     transpose of [B, T, H, D] projections; float32 gradients of q, k in float64
  attn_<name>_<dt>   torch's scaled_dot_product_attention(q, k, v, bool mask, enable_gqa=True):
                     grouped-query heads, a causal offset (past), a key padding mask [B, S];
                     float32 gradients in float64
<dt> is f32 or bf16: bf16 cases start from bf16 inputs and keep PyTorch's bf16 result.
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

torch.manual_seed(2024)
tensors, meta = {}, {}
DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def put(case, m, **ts):
    meta[case] = m
    for k, v in ts.items():
        tensors[case + "/" + k] = v.detach().contiguous().clone()


# ---- RMSNorm ----
for dt in ("f32", "bf16"):
    x = torch.randn(2, 5, 64).to(DT[dt])
    norm = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    norm = norm.to(DT[dt])
    y = norm(x)
    assert torch.equal(y, torch.nn.functional.rms_norm(x.float(), (64,), None, 1e-6).to(DT[dt]) * norm.weight)
    out = {"x": x, "w": norm.weight, "y": y}
    if dt == "f32":
        gy = torch.randn(2, 5, 64)
        x64 = x.double().requires_grad_()
        n64 = LlamaRMSNorm(64, eps=1e-6).double()
        with torch.no_grad():
            n64.weight.copy_(norm.weight.double())
        n64(x64).backward(gy.double())
        out.update(gy=gy, dx=x64.grad.float(), dw=n64.weight.grad.float())
    put("rms_norm_" + dt, "op=rms_norm eps=1e-06", **out)

# ---- SwiGLU ----
for dt in ("f32", "bf16"):
    g = (torch.randn(3, 97) * 3).to(DT[dt])
    u = torch.randn(3, 97).to(DT[dt])
    put("swiglu_" + dt, "op=swiglu", gate=g, up=u, y=torch.nn.functional.silu(g) * u)

# ---- rotary tables ----
ROPES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
}
positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 1000]])
for kind, rp in ROPES.items():
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, rope_parameters=rp,
                      max_position_embeddings=2048)
    rope = LlamaRotaryEmbedding(cfg)
    c32, s32 = rope(torch.zeros(1, dtype=torch.float32), positions)
    c16, s16 = rope(torch.zeros(1, dtype=torch.bfloat16), positions)
    m = "op=rope_table head_dim=32 theta=%r scaling=%s" % (rp["rope_theta"], kind)
    if kind != "default":
        m += " factor=%r" % rp["factor"]
    if kind == "llama3":
        m += " low=%r high=%r original=%r" % (rp["low_freq_factor"], rp["high_freq_factor"],
                                              rp["original_max_position_embeddings"])
    put("rope_table_" + kind, m, inv_freq=rope.inv_freq, positions=positions, cos=c32, sin=s32, cos_bf16=c16,
        sin_bf16=s16)

# ---- apply_rotary_pos_emb ----
cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rope_parameters=ROPES["llama3"] | {"original_max_position_embeddings": 16})
rope = LlamaRotaryEmbedding(cfg)
pos = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
for dt in ("f32", "bf16"):
    q = torch.randn(2, 5, 4, 16).to(DT[dt]).transpose(1, 2)   # [B, H, T, D] views of [B, T, H, D]
    k = torch.randn(2, 5, 2, 16).to(DT[dt]).transpose(1, 2)
    cos, sin = rope(q, pos)
    qe, ke = apply_rotary_pos_emb(q, k, cos, sin)
    out = {"q": q, "k": k, "cos": cos, "sin": sin, "qe": qe, "ke": ke}
    if dt == "f32":
        gq, gk = torch.randn(qe.shape), torch.randn(ke.shape)
        q64, k64 = q.double().requires_grad_(), k.double().requires_grad_()
        a, b = apply_rotary_pos_emb(q64, k64, cos.double(), sin.double())
        (a * gq.double()).sum().add((b * gk.double()).sum()).backward()
        out.update(gq=gq, gk=gk, dq=q64.grad.float(), dk=k64.grad.float())
    put("rope_" + dt, "op=rope", **out)


# ---- attention ----
def keep_mask(B, L, S, past, causal, pad):
    """bool [B, 1, L, S]: key j visible to query i (at position past + i)"""
    i = torch.arange(L)[:, None] + past
    j = torch.arange(S)[None, :]
    m = (j <= i) if causal else torch.ones(L, S, dtype=torch.bool)
    m = m[None, None].expand(B, 1, L, S).clone()
    if pad is not None:
        m &= pad[:, None, None, :]
    return m


ATTN = [  # name, B, Hq, Hkv, L, S, E, past, causal, pad (left/right pads per sequence)
    ("decode", 2, 4, 2, 1, 9, 16, 8, True, None),
    ("decode_mqa", 1, 4, 1, 1, 12, 8, 11, True, None),
    ("prefill_left_pad", 2, 4, 2, 6, 6, 16, 0, True, ((2, 0), (0, 0))),
    ("chunk_after_cache", 2, 6, 2, 3, 8, 8, 5, True, ((0, 0), (1, 0))),
    ("not_causal", 2, 4, 4, 3, 5, 8, 0, False, ((0, 1), (0, 0))),
]
for name, B, Hq, Hkv, L, S, E, past, causal, pads in ATTN:
    pad = None
    if pads is not None:
        pad = torch.ones(B, S, dtype=torch.bool)
        for b, (left, right) in enumerate(pads):
            pad[b, :left] = False
            if right:
                pad[b, S - right:] = False
    mask = keep_mask(B, L, S, past, causal, pad)
    for dt in ("f32", "bf16"):
        q = torch.randn(B, Hq, L, E).to(DT[dt])
        k = torch.randn(B, Hkv, S, E).to(DT[dt])
        v = torch.randn(B, Hkv, S, E).to(DT[dt])
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out = {"q": q, "k": k, "v": v, "y": y}
        if pad is not None:
            out["key_mask"] = pad
        if dt == "f32":
            gy = torch.randn(y.shape)
            t64 = [t.double().requires_grad_() for t in (q, k, v)]
            y64 = torch.nn.functional.scaled_dot_product_attention(*t64, attn_mask=mask, enable_gqa=True)
            (y64 * gy.double()).sum().backward()
            out.update(gy=gy, dq=t64[0].grad.float(), dk=t64[1].grad.float(), dv=t64[2].grad.float())
        put("attn_%s_%s" % (name, dt), "op=attention past=%d causal=%d" % (past, causal), **out)

save_file(tensors, sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_lm_ops.safetensors", metadata=meta)
print("%d cases, torch %s" % (len(meta), torch.__version__))
