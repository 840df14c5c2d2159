#!/usr/bin/env python3
"""One fine-tuning configuration in PyTorch (+ PEFT), the counterpart of `ember finetune` in
bench/run_finetune.sh: a model folder in bfloat16, the forward under CPU bf16 autocast, the
causal LM loss, backward, AdamW; random token ids of the model's vocabulary, labels = ids.

Usage: finetune_torch.py MODEL_DIR MODE SEQ BATCH STEPS THREADS [CKPT]
  MODE lora: PEFT LoRA r=8, lora_alpha=16, q_proj,v_proj (adapters float32, PEFT's default),
             AdamW(lr 2e-4) on the adapters; full: AdamW on every weight, float32 weights and states
             under bf16 autocast.
  CKPT 1: model.gradient_checkpointing_enable() (each decoder layer recomputed in backward).
Prints "key value" lines: torch_version, step_ms (the median of the steps after the first),
tokens_per_s (from it), peak_rss_growth_mib (getrusage's max RSS less the max RSS before the
model is loaded), loss (the last step's).
"""
import resource
import statistics
import sys
import time


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    model_dir, mode = sys.argv[1], sys.argv[2]
    seq, batch, steps, threads = (int(a) for a in sys.argv[3:7])
    ckpt = len(sys.argv) > 7 and sys.argv[7] == "1"
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    start = max_rss_mib()
    # LoRA: the frozen base in bfloat16; full: float32 master weights (and AdamW states), the
    # compute in bfloat16 under autocast: the same recipes as ember finetune and --full
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16 if mode == "lora" else torch.float32)
    model.config.use_cache = False
    if ckpt:
        model.gradient_checkpointing_enable()
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))
        if ckpt:
            model.enable_input_require_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq))
    times, loss = [], float("nan")
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        loss = out.loss.item()
    step = statistics.median(times[1:] if len(times) > 1 else times)
    print(f"torch_version {torch.__version__}")
    print(f"step_ms {step * 1e3:.1f}")
    print(f"tokens_per_s {batch * seq / step:.1f}")
    print(f"peak_rss_growth_mib {max_rss_mib() - start:.1f}")
    print(f"loss {loss:.4f}")


if __name__ == "__main__":
    main()
