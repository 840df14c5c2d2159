#!/usr/bin/env python3
"""Hostile inputs for the language-model commands, run against an `ember` binary.

Run:  scripts/hostile_model_inputs.py build-asan/ember [config|adapter|index|resume ...]

Each run starts from one of the tiny model folders in tests/data/models (Llama with shards,
Qwen2, GPT-2, Mistral) and breaks one thing:
  config   every key of config.json and generation_config.json that Ember reads, set to each
           of 22 hostile values (0, -1, 2^31, 2^63, 1e300, 0.5, "x", null, true, [], {}, ...)
           or deleted; then generate, mem --model --lora-rank, perplexity and finetune
  adapter  every key of an adapter_config.json that `ember finetune` wrote, set to 25 values;
           then generate --adapter
  index    the shard index's weight_map and metadata replaced, and single entries pointed at
           missing, foreign or outside files; then generate and mem --model
  resume   every metadata value of a finetune checkpoint set to 24 values; then
           finetune --resume (the unchanged checkpoint must resume)
A run is bad when the command ends by a signal or with a status other than 0, 1 or 2, takes
more than 120 s, prints a sanitizer's report, or fails without a message. Under a
sanitizer build (a path holding "asan") give the environment scripts/test.sh --sanitize
sets, and allocator_may_return_null=1 so that a huge request fails as it does in a release
build; the release build runs under `ulimit -v 8000000`. Prints each bad run, each resumed
forgery (resume), and a count; exits 1 when any run was bad.
"""
import json, os, shutil, struct, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
EMBER = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
PARTS = sys.argv[2:] or ["config", "adapter", "index", "resume"]
WORK = tempfile.mkdtemp(prefix="ember-hostile-")
SANITIZED = EMBER is not None and "asan" in EMBER
runs = bad = 0


def run(label, cmd):
    """Runs cmd; counts and prints it when it ends badly. Returns (status, stderr)."""
    global runs, bad
    runs += 1
    wrap = 'exec "$@"' if SANITIZED else 'ulimit -v 8000000; exec "$@"'
    try:
        p = subprocess.run(["bash", "-c", wrap, "run"] + cmd, capture_output=True, timeout=120)
        rc, err = p.returncode, p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        rc, err = "timeout", ""
    why = ("timeout" if rc == "timeout" else f"status {rc}" if rc < 0 or rc > 2 else
           "sanitizer" if "Sanitizer" in err or "runtime error" in err else
           "failed without a message" if rc != 0 and not err.strip() else None)
    if why:
        bad += 1
        print(f"BAD {label}: ember {' '.join(cmd[1:3])}: {why}\n    {err[-800:]!r}", flush=True)
    return rc, err


def folder_with(src, name, text):
    """A fresh folder of links to src's files, with `name` written as text."""
    d = tempfile.mkdtemp(dir=WORK)
    for f in os.listdir(src):
        if f != name:
            os.symlink(os.path.join(src, f), os.path.join(d, f))
    if "tokenizer.json" not in os.listdir(d):   # the Mistral folder has none of its own
        os.symlink(os.path.join(MODELS, "llama", "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, name), "w") as f:
        f.write(text)
    return d


VALUES = [0, -1, 1, 2, 3, 7, 2**31 - 1, 2**31, 2**32 + 4, 2**53, 2**63, 1e300, -1e300, 0.5, 1e-300,
          "x", None, True, [], {}, [1], "DELETE"]
READ = set("""activation_function add_cross_attention architectures attention_bias bos_token_id eos_token_id
factor head_dim hidden_act hidden_size high_freq_factor intermediate_size layer_norm_epsilon layer_types
low_freq_factor max_position_embeddings max_window_layers mlp_bias n_embd n_head n_inner n_layer n_positions
num_attention_heads num_hidden_layers num_key_value_heads original_max_position_embeddings pad_token_id
rms_norm_eps rope_parameters rope_scaling rope_theta rope_type scale_attn_by_inverse_layer_idx
scale_attn_weights sliding_window tie_word_embeddings torch_dtype type use_sliding_window vocab_size""".split())


def keys(obj, prefix=()):
    for k, v in obj.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from keys(v, prefix + (k,))


def changed(obj, path, v):
    o = json.loads(json.dumps(obj))
    at = o
    for k in path[:-1]:
        at = at[k]
    if v == "DELETE":
        at.pop(path[-1], None)
    else:
        at[path[-1]] = v
    return o


text = os.path.join(WORK, "text.txt")
with open(text, "w") as f:
    f.write("The quick brown fox jumps over the lazy dog. " * 20)
jsonl = os.path.join(WORK, "data.jsonl")
with open(jsonl, "w") as f:
    f.write('{"prompt": "a b", "completion": "c d"}\n' * 8)

if "config" in PARTS:
    for fam in ["llama", "qwen2", "gpt2", "mistral"]:
        src = os.path.join(MODELS, fam)
        for name in ["config.json", "generation_config.json"]:
            base = json.load(open(os.path.join(src, name)))
            for path in [p for p in keys(base) if p[-1] in READ]:
                for v in VALUES:
                    d = folder_with(src, name, json.dumps(changed(base, path, v)))
                    label = f"{fam}/{name}: {'.'.join(path)} = {v!r}"
                    run(label, [EMBER, "generate", d, "--prompt", "hello world", "--max-new-tokens", "4",
                                "--temperature", "0"])
                    run(label, [EMBER, "mem", "--model", d, "--lora-rank", "4", "--batch", "1", "--seq", "32"])
                    run(label, [EMBER, "perplexity", d, text])
                    run(label, [EMBER, "finetune", d, "--data", jsonl, "--out", d + "/out", "--max-steps", "1",
                                "--seq", "16"])
                    shutil.rmtree(d)

if "adapter" in PARTS:
    values = VALUES[:-1] + [2**40, "", ["q_proj", "q_proj"], ["nope"],
                            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "DELETE"]
    for fam in ["llama", "gpt2", "qwen2"]:
        m = os.path.join(MODELS, fam)
        ad = os.path.join(WORK, "adapter-" + fam)
        rc, err = run("making the adapter", [EMBER, "finetune", m, "--data", jsonl, "--out", ad, "--max-steps", "1",
                                             "--seq", "16", "--lora-rank", "4"])
        if rc != 0:
            sys.exit(f"ember finetune could not make the adapter to break: {err}")
        base = json.load(open(os.path.join(ad, "adapter_config.json")))
        for key in list(base) + ["use_dora", "use_rslora"]:
            for v in values:
                d = folder_with(ad, "adapter_config.json", json.dumps(changed(base, (key,), v)))
                run(f"{fam} adapter: {key} = {v!r}", [EMBER, "generate", m, "--adapter", d, "--prompt", "hi",
                                                     "--max-new-tokens", "2", "--temperature", "0"])
                shutil.rmtree(d)

if "index" in PARTS:
    m = os.path.join(MODELS, "llama")
    base = json.load(open(os.path.join(m, "model.safetensors.index.json")))
    names = list(base["weight_map"])
    edits = [(("weight_map",), v) for v in VALUES] + [(("metadata",), v) for v in VALUES]
    for n in names[:3] + names[-2:]:
        for v in ["", "/etc/passwd", "../llama/config.json", "model-00009-of-00003.safetensors", "config.json",
                  "x" * 5000, 0, None, [], "model-00001-of-00003.safetensors", "DELETE"]:
            edits.append((("weight_map", n), v))
    edits.append((("weight_map", "extra.weight"), "model-00001-of-00003.safetensors"))
    for path, v in edits:
        d = folder_with(m, "model.safetensors.index.json", json.dumps(changed(base, path, v)))
        label = f"index: {'.'.join(path)} = {str(v)[:40]!r}"
        run(label, [EMBER, "generate", d, "--prompt", "hi", "--max-new-tokens", "2", "--temperature", "0"])
        run(label, [EMBER, "mem", "--model", d])
        shutil.rmtree(d)

if "resume" in PARTS:
    m = os.path.join(MODELS, "llama")
    out = os.path.join(WORK, "resume")
    # a checkpoint after step 2 of 4 (8 examples, batch 4: 2 micro-batches an epoch)
    p = subprocess.run([EMBER, "finetune", m, "--data", jsonl, "--out", out, "--max-steps", "4", "--seq", "16",
                        "--interrupt-after", "2"], capture_output=True)
    if p.returncode != 128 + 15:
        sys.exit(f"ember finetune --interrupt-after 2 did not stop as a SIGTERM would: {p.returncode} {p.stderr}")
    ck = os.path.join(out, "checkpoint.safetensors")
    raw = open(ck, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    values = ["KEEP", "-1", "0", "1", "3", "7", "8", "9", "100", "99999999999999999999", "9223372036854775807",
              "-9223372036854775808", "1x", "", " 2", "nan", "inf", "1e3", "0x10",
              "r=9999 alpha=16 targets=q_proj,v_proj", "r=8 alpha=16 targets=", "r=8 alpha=16 targets=q_proj",
              "garbage", "DELETE"]
    resumed = []
    for key in list(header["__metadata__"]):
        for v in values if key == "finetune.step" else values[1:]:
            h = json.loads(json.dumps(header))
            if v == "DELETE":
                del h["__metadata__"][key]
            elif v != "KEEP":
                h["__metadata__"][key] = v
            if v != "KEEP" and h == header:
                continue   # the value it holds: not a forgery
            hb = json.dumps(h).encode()
            hb += b" " * (-len(hb) % 8)
            d = tempfile.mkdtemp(dir=WORK)
            with open(os.path.join(d, "checkpoint.safetensors"), "wb") as f:
                f.write(struct.pack("<Q", len(hb)) + hb + body)
            rc, err = run(f"resume: {key} = {v!r}", [EMBER, "finetune", m, "--data", jsonl, "--out", d, "--max-steps",
                                                   "4", "--seq", "16", "--resume"])
            if v == "KEEP" and rc != 0:
                sys.exit(f"the unchanged checkpoint did not resume: {err}")
            if v != "KEEP" and rc == 0:
                resumed.append(f"{key} = {v!r}")
            shutil.rmtree(d)
    print(f"resume: {len(resumed)} forgeries resumed" + "".join(f"\n    {r}" for r in resumed))

shutil.rmtree(WORK, ignore_errors=True)
print(f"{runs} runs, {bad} bad")
sys.exit(1 if bad else 0)
