#!/usr/bin/env python3
"""Golden data for Ember's LoRA fine-tuning (src/models/finetune.c), from PyTorch and PEFT.

      python scripts/golden_finetune.py [outdir]          (default tests/data/finetune)
      python scripts/golden_finetune.py --check BUILD_DIR
      python scripts/golden_finetune.py [outdir] --full-only   (golden_full.safetensors alone)
needs torch, transformers (>= 5), peft and safetensors from PyPI; reads the tiny model folders
of tests/data/models (scripts/golden_models.py). Nothing is downloaded.

For each case (the llama folder with LoRA on q_proj and v_proj, the gpt2 folder on c_attn;
r = 4, lora_alpha = 8, lora_dropout 0), the model in float32 and eval mode (no dropout, as
Ember trains):
1. adapters drawn from seed 11 with lora_B non-zero too (PEFT's own init makes B zero, which
   would leave lora_A's gradient zero) are saved with save_pretrained as <case>/init, the
   folder Ember's test loads;
2. a batch ids [2, 12] with labels equal to the ids but -100 on row 0's first 4 positions
   (a prompt) and row 1's last 2: the loss of model(ids, labels=labels) (transformers'
   ForCausalLMLoss) and the gradient of every adapter, in golden.safetensors as
   "<case>/loss" and "<case>/grad/<PEFT's name>";
3. from the same init, 10 steps on that batch of AdamW(lr 1e-2, PyTorch's betas and eps,
   weight_decay 0.01) with clip_grad_norm_(1.0) and the learning rate of Ember's em_lr_at
   for a linear warm-up of 3 steps then cosine to 0 at step 10: the loss before each step in
   "<case>/losses" [10], and the adapters after them in "<case>/final/<name>".

4. full fine-tuning (every weight trained, no adapters), from the folder's own weights: 5 steps
   on that batch of AdamW(lr 1e-3, weight_decay 0.1 on the weights of 2 or more dimensions,
   none on biases and norm weights: transformers' Trainer's two groups) with
   clip_grad_norm_(1.0) and em_lr_at's rates for a warm-up of 2 steps then cosine to 0 at
   step 5: the loss before each step in "<case>/losses" [5] and a few weights after them in
   "<case>/final/<name>" of golden_full.safetensors (a matrix, the token embedding, which a
   tied head also trains, and a norm weight, which no decay reaches).

--check BUILD_DIR runs BUILD_DIR/test_finetune with EMBER_FINETUNE_EXPORT set, which makes it
save the adapters of its 10 steps with em_model_lora_save, its logits on the batch and the
merged folder (em_model_save_merged): the adapters must load with PeftModel.from_pretrained
and the merged folder with from_pretrained, each giving the same logits (within 1e-4).
"""
import os
import subprocess
import sys
import tempfile

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = os.path.join(ROOT, "tests", "data", "models")
CASES = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}
RANK, ALPHA, LR, WD, STEPS, WARMUP = 4, 8.0, 1e-2, 0.01, 10, 3


def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, 500, (2, 12), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, -2:] = -100
    return ids, labels


def lr_at(t):
    """Ember's em_lr_at for em_lr_cosine(WARMUP, STEPS, 0)."""
    import math
    if t < WARMUP:
        return LR * (t + 1) / WARMUP
    if t >= STEPS:
        return 0.0
    progress = (t - WARMUP) / (STEPS - WARMUP)
    return 0.5 * LR * (1 + math.cos(math.pi * progress))


FULL_LR, FULL_WD, FULL_STEPS, FULL_WARMUP = 1e-3, 0.1, 5, 2
FULL_FINAL = {"llama": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"],
              "gpt2": ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.1.ln_2.weight",
                       "transformer.h.1.mlp.c_fc.bias", "transformer.ln_f.bias"]}


def full_lr_at(t):
    """em_lr_at for em_lr_cosine(FULL_WARMUP, FULL_STEPS, 0)."""
    import math
    if t < FULL_WARMUP:
        return FULL_LR * (t + 1) / FULL_WARMUP
    progress = (t - FULL_WARMUP) / (FULL_STEPS - FULL_WARMUP)
    return 0.5 * FULL_LR * (1 + math.cos(math.pi * progress))


def generate_full(out):
    tensors = {}
    ids, labels = batch()
    for name in CASES:
        model = base(name)
        params = dict(model.named_parameters())  # a tied head is the embedding, listed once
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": FULL_WD}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=FULL_LR)
        losses = []
        for t in range(FULL_STEPS):
            for group in opt.param_groups:
                group["lr"] = full_lr_at(t)
            loss = model(input_ids=ids, labels=labels).loss
            losses.append(loss.item())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        tensors[f"{name}/losses"] = torch.tensor(losses, dtype=torch.float32)
        for n in FULL_FINAL[name]:
            tensors[f"{name}/final/{n}"] = params[n].detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "golden_full.safetensors"))
    print("wrote", os.path.join(out, "golden_full.safetensors"))


def base(name):
    return AutoModelForCausalLM.from_pretrained(os.path.join(MODELS, name), dtype=torch.float32).eval()


def generate(out):
    tensors, ids_labels = {}, batch()
    ids, labels = ids_labels
    tensors["ids"], tensors["labels"] = ids, labels
    for name, targets in CASES.items():
        cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM")
        model = get_peft_model(base(name), cfg).eval()
        torch.manual_seed(11)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn_like(p) * 0.1)
        init_dir = os.path.join(out, name, "init")
        model.save_pretrained(init_dir)
        os.remove(os.path.join(init_dir, "README.md"))   # PEFT's model card template: nothing to test
        cfg_path = os.path.join(init_dir, "adapter_config.json")
        # the path this script saw is no one else's: a stable name instead
        import json
        with open(cfg_path) as f:
            c = json.load(f)
        c["base_model_name_or_path"] = f"tests/data/models/{name}"
        with open(cfg_path, "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n, _ in trainable)

        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        tensors[f"{name}/loss"] = loss.detach().reshape(1)
        for n, p in trainable:
            tensors[f"{name}/grad/{n.replace('.default', '')}"] = p.grad.detach().clone()
        model.zero_grad(set_to_none=True)

        # 10 AdamW steps from the same init
        opt = torch.optim.AdamW([p for _, p in trainable], lr=LR, weight_decay=WD)
        losses = []
        for t in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = lr_at(t)
            loss = model(input_ids=ids, labels=labels).loss
            losses.append(loss.item())
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in trainable], 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        tensors[f"{name}/losses"] = torch.tensor(losses, dtype=torch.float32)
        for n, p in trainable:
            tensors[f"{name}/final/{n.replace('.default', '')}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "golden.safetensors"))
    print("wrote", os.path.join(out, "golden.safetensors"))


def check(build):
    ids, labels = batch()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EMBER_FINETUNE_EXPORT=tmp)
        subprocess.run([os.path.join(build, "test_finetune")], cwd=ROOT, env=env, check=True)
        for name in CASES:
            folder = os.path.join(tmp, name)
            model = PeftModel.from_pretrained(base(name), folder).eval()
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            ember = load_file(os.path.join(folder, "ember_logits.safetensors"))["logits"]
            diff = (logits - ember).abs().max().item()
            print(f"{name}: PEFT's logits with Ember's adapters differ from Ember's by {diff:.3g}")
            assert diff < 1e-4, diff
            merged = AutoModelForCausalLM.from_pretrained(os.path.join(folder, "merged"), dtype=torch.float32).eval()
            with torch.no_grad():
                diff = (merged(input_ids=ids).logits - ember).abs().max().item()
            print(f"{name}: transformers' logits of Ember's merged folder differ from Ember's by {diff:.3g}")
            assert diff < 1e-4, diff
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        out = args[0] if args else os.path.join(ROOT, "tests", "data", "finetune")
        os.makedirs(out, exist_ok=True)
        if "--full-only" not in sys.argv:
            generate(out)
        generate_full(out)
