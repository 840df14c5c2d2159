#!/usr/bin/env python3
"""Hugging Face's tokenizers on the files bench/tokenizer.c reads, printing the same keys.

  tokenizer_hf.py TOKENIZER TEXT          measure (TOKENIZER: a tokenizer.json or its folder)
  tokenizer_hf.py --train OUT TEXT SIZE   train a byte-level BPE with Llama 3's pre-tokenizer and
                                          a vocabulary of SIZE on TEXT, save it as OUT/tokenizer.json

Needs `pip install tokenizers` (bench/run_tokenizer.sh takes the interpreter from TOKENIZERS_PYTHON).
The best of 5 runs of each (3 line by line), wall-clock seconds; encode of one string, and of
the lines one by one, runs on one thread; encode_batch of the lines on every core.
"""
import os
import sys
import time

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train(out, text_path, size):
    with open(text_path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=size, min_frequency=2, special_tokens=["<|begin_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))


def measure(path, text_path):
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    with open(text_path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load = time.perf_counter() - t0
    enc = dec = float("inf")
    ids = []
    for _ in range(5):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=True).ids
        enc = min(enc, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tok.decode(ids, skip_special_tokens=False)
        dec = min(dec, time.perf_counter() - t0)
    lines = text.split("\n")
    seq = batch = float("inf")
    line_tokens = 0
    for _ in range(3):
        t0 = time.perf_counter()
        line_tokens = sum(len(tok.encode(line, add_special_tokens=False).ids) for line in lines)
        seq = min(seq, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tok.encode_batch(lines, add_special_tokens=False)
        batch = min(batch, time.perf_counter() - t0)
    stream = float("inf")
    if hasattr(tokenizers, "decoders") and hasattr(tokenizers.decoders, "DecodeStream"):
        for _ in range(2):   # one token at a time costs a Python call each
            t0 = time.perf_counter()
            s = tokenizers.decoders.DecodeStream(skip_special_tokens=False)
            for i in ids:
                s.step(tok, i)
            stream = min(stream, time.perf_counter() - t0)
    checksum = 0
    for i in ids:
        checksum = (checksum * 31 + i) % 1000000007
    nbytes = len(text.encode("utf-8"))
    print("implementation tokenizers-" + tokenizers.__version__)
    print("vocab", tok.get_vocab_size(with_added_tokens=True))
    print("text_bytes", nbytes)
    print("tokens", len(ids))
    print("ids_checksum", checksum)
    print(f"load_s {load:.4f}")
    print(f"encode_s {enc:.4f}")
    print(f"encode_mb_s {nbytes / enc / 1e6:.2f}")
    print(f"encode_tokens_s {len(ids) / enc:.0f}")
    print("lines_tokens", line_tokens)
    print(f"lines_encode_s {seq:.4f}")
    print(f"lines_batch_s {batch:.4f}")
    print(f"decode_s {dec:.4f}")
    print(f"stream_decode_s {stream:.4f}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 3:
        measure(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
