"""The ember command's conventions: --version, `ember help COMMAND`, exit codes
(0 ok, 1 failure, 2 usage, 130 interrupted) across the commands, every --json output valid
against its JSON Schema in docs/schemas/ (python3-jsonschema, or the small validator below
where it is missing), the man page generated from the help texts, and bash completion.
The command: $EMBER_TOOL (ctest sets it), else build/ember."""
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EMBER = os.environ.get("EMBER_TOOL") or os.path.join(ROOT, "build", "ember")
MAN = os.environ.get("EMBER_MAN") or os.path.join(os.path.dirname(EMBER), "ember.1")
SCHEMAS = os.path.join(ROOT, "docs", "schemas")

try:
    import jsonschema
except ImportError:
    jsonschema = None


def run(*args, timeout=300):
    p = subprocess.run([EMBER, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---- a small JSON Schema validator (the keywords docs/schemas/ uses), where jsonschema is missing
def _type_ok(v, t):
    if isinstance(t, list):
        return any(_type_ok(v, x) for x in t)
    return {"object": isinstance(v, dict), "array": isinstance(v, list), "string": isinstance(v, str),
            "boolean": isinstance(v, bool), "null": v is None,
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool)}[t]


def mini_errors(v, s, root, path="$"):
    if "$ref" in s:
        node = root
        for part in s["$ref"].lstrip("#/").split("/"):
            node = node[part]
        yield from mini_errors(v, node, root, path)
    if "type" in s and not _type_ok(v, s["type"]):
        yield f"{path}: {v!r} is not of type {s['type']}"
        return
    if "enum" in s and v not in s["enum"]:
        yield f"{path}: {v!r} is not one of {s['enum']}"
    if "const" in s and v != s["const"]:
        yield f"{path}: {v!r} is not {s['const']!r}"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            yield f"{path}: {v} < {s['minimum']}"
        if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
            yield f"{path}: {v} <= {s['exclusiveMinimum']}"
    if isinstance(v, str):
        if "pattern" in s and not re.search(s["pattern"], v):
            yield f"{path}: {v!r} does not match {s['pattern']}"
        if "minLength" in s and len(v) < s["minLength"]:
            yield f"{path}: {v!r} is too short"
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            yield f"{path}: fewer than {s['minItems']} items"
        for i, x in enumerate(v):
            if "items" in s:
                yield from mini_errors(x, s["items"], root, f"{path}[{i}]")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                yield f"{path}: '{k}' is a required property"
        props, pats = s.get("properties", {}), s.get("patternProperties", {})
        for k, x in v.items():
            known = False
            if k in props:
                known = True
                yield from mini_errors(x, props[k], root, f"{path}.{k}")
            for pat, sub in pats.items():
                if re.search(pat, k):
                    known = True
                    yield from mini_errors(x, sub, root, f"{path}.{k}")
            if not known and s.get("additionalProperties") is False:
                yield f"{path}: additional property '{k}'"
            if "propertyNames" in s:
                yield from mini_errors(k, s["propertyNames"], root, f"{path}.<{k}>")
    for sub in s.get("allOf", []):
        yield from mini_errors(v, sub, root, path)
    if "anyOf" in s and not any(not list(mini_errors(v, x, root, path)) for x in s["anyOf"]):
        yield f"{path}: matches none of anyOf"
    if "oneOf" in s and sum(not list(mini_errors(v, x, root, path)) for x in s["oneOf"]) != 1:
        yield f"{path}: does not match exactly one of oneOf"
    if "not" in s and not list(mini_errors(v, s["not"], root, path)):
        yield f"{path}: matches a 'not' schema"


def schema_errors(doc, name):
    with open(os.path.join(SCHEMAS, f"{name}.schema.json")) as f:
        schema = json.load(f)
    mini = list(mini_errors(doc, schema, schema))
    if not jsonschema:
        return mini
    jsonschema.Draft202012Validator.check_schema(schema)
    full = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    assert bool(full) == bool(mini), f"the validators disagree: jsonschema {full}, the small one {mini}"
    return full


def opencl_available():
    rc, out, _ = run("devices", "--json")
    return rc == 0 and any(t["type"] == "opencl" and t["available"] for t in json.loads(out)["types"])


class JsonSchemas(unittest.TestCase):
    def check(self, name, *args):
        rc, out, err = run(*args)
        self.assertEqual(rc, 0, err)
        doc = json.loads(out)
        errors = schema_errors(doc, name)
        self.assertEqual(errors, [], f"ember {' '.join(args)}")
        return doc

    def test_every_command_with_json_has_a_schema(self):
        rc, out, _ = run("--help")
        commands = re.findall(r"^  (\w+) ", out.split("commands:")[1].split("\n\n")[0], re.M)
        with_json = [c for c in commands if c != "help" and "--json" in run("help", c)[1]]
        self.assertIn("devices", with_json)
        for c in with_json:
            self.assertTrue(os.path.exists(os.path.join(SCHEMAS, f"{c}.schema.json")), f"no schema for ember {c}")

    def test_devices(self):
        doc = self.check("devices", "devices", "--json")
        broken = json.loads(json.dumps(doc))  # the schema can fail: a wrong type, a missing key
        broken["types"][0]["device_count"] = "one"
        del broken["auto"]
        self.assertGreaterEqual(len(schema_errors(broken, "devices")), 2)

    def test_mem(self):
        doc = self.check("mem", "mem", "7B", "--json")
        self.check("mem", "mem", "125M", "--mode", "full", "--dtype", "f32", "--optim", "sgd", "--json")
        # each break alone is caught (the two forms sit under one oneOf, which reports one error)
        for key, value in (("total_bytes", -1), ("surprise", 1)):
            broken = json.loads(json.dumps(doc))
            broken["estimates"][0][key] = value
            self.assertGreaterEqual(len(schema_errors(broken, "mem")), 1, key)

    def test_mem_builtin_models(self):
        # --model mlp|cnn give the estimates form, --model gpt its own form; both in one schema
        for model in ("mlp", "cnn"):
            doc = self.check("mem", "mem", "--model", model, "--json")
            self.assertTrue(any(e["mode"] == "full" and "measured_peak_bytes" in e for e in doc["estimates"]), model)
        for extra in ([], ["--checkpoint-activations", "--lora-rank", "4"]):
            doc = self.check("mem", "mem", "--model", "gpt", "--batch", "4", *extra, "--json")
            self.assertEqual(doc["model"], "gpt")
            self.assertEqual(doc["checkpoint_activations"], bool(extra))
        for breaking in (lambda d: d.update(total_bytes="many"), lambda d: d.pop("heads")):
            broken = json.loads(json.dumps(doc))
            breaking(broken)
            self.assertGreaterEqual(len(schema_errors(broken, "mem")), 1)

    def test_mem_model(self):
        # a checkpoint of Linear(8, 4): safetensors written by hand
        header = json.dumps({"0.weight": {"dtype": "F32", "shape": [32, 64], "data_offsets": [0, 8192]},
                             "0.bias": {"dtype": "F32", "shape": [32], "data_offsets": [8192, 8320]}}).encode()
        with tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False) as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(8320))
        try:
            doc = self.check("mem", "mem", "--model", f.name, "--batch", "2", "--json")
            self.assertEqual(doc["params"], 32 * 64 + 32)
        finally:
            os.unlink(f.name)

    def test_mem_model_folder(self):
        folder = os.path.join(ROOT, "tests", "data", "models", "llama")
        doc = self.check("mem", "mem", "--model", folder, "--json")
        self.assertEqual(doc["architecture"], "LlamaForCausalLM")
        self.assertEqual([e["mode"] for e in doc["estimates"]], ["inference", "full", "lora"])
        doc = self.check("mem", "mem", "--model", folder, "--batch", "2", "--seq", "64", "--json")
        self.assertEqual((doc["batch"], doc["seq"]), (2, 64))
        broken = json.loads(json.dumps(doc))
        del broken["kv_width"]
        self.assertGreaterEqual(len(schema_errors(broken, "mem")), 1)

    def test_perplexity(self):
        folder = os.path.join(ROOT, "tests", "data", "models", "gpt2")
        with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
            f.write(" ".join(str((7 * i) % 500) for i in range(100)))
        try:
            doc = self.check("perplexity", "perplexity", folder, f.name, "--ids", "--max-length", "32", "--json")
        finally:
            os.unlink(f.name)
        self.assertEqual((doc["ids"], doc["max_length"], doc["stride"]), (100, 32, 16))
        self.assertAlmostEqual(doc["perplexity"], math.exp(doc["nll"]), delta=1e-9 * doc["perplexity"])
        broken = json.loads(json.dumps(doc))
        broken["nll"] = "6.5"
        self.assertGreaterEqual(len(schema_errors(broken, "perplexity")), 1)

    def test_bench(self):
        args = ["bench", "--quick", "--min-time", "0.005", "--sizes", "32", "--dtype", "f32", "--json"]
        doc = self.check("bench", *args, "--device", "cpu")
        broken = json.loads(json.dumps(doc))
        broken["matmul"]["results"][0]["median_s"] = None  # null without an error
        self.assertGreaterEqual(len(schema_errors(broken, "bench")), 1)
        if opencl_available():  # host-device copies and the crossover
            self.check("bench", *args, "--device", "opencl:0", "--only", "copy,launch,crossover")


    def test_tokenize(self):
        folder = os.path.join(ROOT, "tests", "data", "tokenizer", "llama3")
        doc = self.check("tokenize", "tokenize", folder, "Hello, 세계! 123", "--json")
        self.assertEqual(doc["count"], len(doc["ids"]))
        self.assertEqual(len(doc["tokens"]), len(doc["ids"]))
        self.assertEqual(doc["tokens"][0], "<|begin_of_text|>")
        self.assertEqual(doc["text"], "<|begin_of_text|>Hello, 세계! 123")
        rc, out, err = run("tokenize", folder, "Hello, 세계! 123")
        self.assertEqual((rc, out.split()), (0, [str(i) for i in doc["ids"]]), err)
        back = self.check("tokenize", "tokenize", folder, "--decode", ",".join(map(str, doc["ids"])), "--json")
        self.assertEqual(back["ids"], doc["ids"])
        self.assertEqual(back["text"], doc["text"])
        rc, out, err = run("tokenize", folder, "--decode", " ".join(map(str, doc["ids"][1:])))
        self.assertEqual((rc, out), (0, "Hello, 세계! 123\n"), err)
        broken = json.loads(json.dumps(doc))
        broken["ids"][0] = -1
        self.assertGreaterEqual(len(schema_errors(broken, "tokenize")), 1)

    def test_generate(self):
        folder = os.path.join(ROOT, "tests", "data", "models", "gpt2")
        doc = self.check("generate", "generate", folder, "--prompt", "The quick brown fox", "--max-new-tokens", "6",
                         "--json")
        self.assertEqual(len(doc["tokens"]), 6)
        self.assertEqual(doc["finish"], "length")
        self.assertEqual(doc["dtype"], "float32")
        rc, out, err = run("tokenize", folder, "The quick brown fox")
        self.assertEqual(out.split(), [str(i) for i in doc["prompt_tokens"]], err)
        rc, out, err = run("tokenize", folder, "--decode", " ".join(map(str, doc["tokens"])))
        self.assertEqual((rc, out), (0, doc["text"] + "\n"), err)
        # streamed: the prompt and the same text on stdout, the statistics on stderr
        rc, out, err = run("generate", folder, "--prompt", "The quick brown fox", "--max-new-tokens", "6")
        self.assertEqual((rc, out), (0, "The quick brown fox" + doc["text"] + "\n"), err)
        self.assertIn("tokens/s", err)
        broken = json.loads(json.dumps(doc))
        broken["finish"] = "tired"
        self.assertGreaterEqual(len(schema_errors(broken, "generate")), 1)


class ExitCodes(unittest.TestCase):
    def test_version_and_help(self):
        rc, out, _ = run("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^ember [0-9]+\.[0-9]+\.[0-9]+\n")
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        self.assertIn("exit status:", out)
        for code in ("0", "1", "2", "130"):
            self.assertRegex(out, rf"\n  {code} +\w")

    def test_help_command_is_the_commands_help(self):
        rc, out, _ = run("--help")
        commands = re.findall(r"^  (\w+) ", out.split("commands:")[1].split("\n\n")[0], re.M)
        self.assertGreaterEqual(len(commands), 6)
        for c in commands:
            if c == "help":
                continue
            rc1, help1, _ = run("help", c)
            rc2, help2, _ = run(c, "--help")
            self.assertEqual((rc1, rc2), (0, 0), c)
            self.assertEqual(help1, help2, c)
            self.assertIn("usage: ember " + c, help1)
        self.assertEqual(run("help")[0], 0)
        rc, _, err = run("help", "frobnicate")
        self.assertEqual(rc, 2)
        self.assertIn("unknown command 'frobnicate'", err)

    def test_usage_is_2_failure_is_1(self):
        self.assertEqual(run()[0], 2)
        self.assertEqual(run("frobnicate")[0], 2)
        for c in ("devices", "smi", "bench", "train", "eval", "mem", "tokenize", "perplexity", "generate"):
            rc, _, err = run(c, "--no-such-option")
            self.assertEqual(rc, 2, f"ember {c} --no-such-option: {err}")
        self.assertEqual(run("bench", "--sizes")[0], 2)  # a missing value
        self.assertEqual(run("train", "--epochs", "zero")[0], 2)  # a bad value
        rc, _, err = run("eval", "/nonexistent/ember.safetensors")
        self.assertEqual(rc, 1, err)
        rc, _, err = run("mem", "--model", "/nonexistent/ember.safetensors")
        self.assertEqual(rc, 1, err)
        rc, _, err = run("train", "--data", "/nonexistent/fashion-mnist", "--epochs", "1")
        self.assertEqual(rc, 1, err)
        rc, _, err = run("tokenize", "/nonexistent/model", "text")
        self.assertEqual(rc, 1, err)
        self.assertIn("/nonexistent/model: cannot open", err)
        self.assertEqual(run("tokenize", "/nonexistent/model")[0], 2)  # no TEXT
        self.assertEqual(run("tokenize", "a", "b", "c")[0], 2)  # one TEXT too many
        self.assertEqual(run("tokenize", "a", "--decode", "1,x")[0], 2)
        rc, _, err = run("perplexity", "/nonexistent/model", "/dev/null", "--ids")
        self.assertEqual(rc, 1, err)
        rc, _, err = run("mem", "--model", "/nonexistent/model")
        self.assertEqual(rc, 1, err)
        self.assertEqual(run("perplexity", "/nonexistent/model")[0], 2)  # no FILE
        rc, _, err = run("generate", "/nonexistent/model", "--prompt", "x")
        self.assertEqual(rc, 1, err)
        self.assertEqual(run("generate", "/nonexistent/model")[0], 2)  # no --prompt
        self.assertEqual(run("generate", "a", "--prompt", "x", "--temperature", "-1")[0], 2)

    def test_interrupted_is_130(self):
        # a long benchmark, Ctrl-C'd once it runs: exit status 130, not death by signal
        p = subprocess.Popen([EMBER, "bench", "--device", "cpu", "--min-time", "30"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        self.assertIsNone(p.poll(), "ember bench ended before the signal")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("interrupted", err)


class ManPageAndCompletion(unittest.TestCase):
    def test_man_page(self):
        self.assertTrue(os.path.exists(MAN), f"no man page at {MAN} (the build writes it)")
        with open(MAN) as f:
            page = f.read()
        self.assertTrue(page.startswith(".TH EMBER 1"))
        for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS"):
            self.assertIn(f"\n.SH {section}\n", page)
        rc, out, _ = run("--help")
        for c in re.findall(r"^  (\w+) ", out.split("commands:")[1].split("\n\n")[0], re.M):
            if c != "help":
                self.assertIn(f"\n.SS ember {c}\n", page)
        self.assertIn("130", page.split(".SH EXIT STATUS")[1])
        # the sections come from the option tables: one entry per option, ember train --model gpt's too
        self.assertIn("\n.SS ember train \\-\\-model gpt\n", page)
        self.assertIn("\n.TP\n\\fB\\-\\-epochs\\fR \\fIN\\fR\n", page)
        self.assertIn("\n.TP\n\\fB\\-n\\fR, \\fB\\-\\-nproc\\fR \\fIN\\fR\n", page)

    def test_man_page_renders(self):
        if not shutil.which("man"):
            self.skipTest("man is not installed")
        self.assertTrue(os.path.exists(MAN), f"no man page at {MAN} (the build writes it)")
        r = subprocess.run(["man", "-l", "--warnings", MAN], capture_output=True, text=True,
                           env={**os.environ, "MANWIDTH": "100", "MANPAGER": "cat"})
        if "system has been minimized" in r.stdout:
            # Ubuntu's minimized images replace man with a script that prints this and exits 0
            self.skipTest("man is the minimized system's placeholder (unminimize restores it)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.strip(), "", "roff warnings")
        self.assertIn("ember help COMMAND", r.stdout)

    def complete(self, *words):
        script = (f"source '{ROOT}/tools/completion/ember.bash'; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
                  f"COMP_CWORD={len(words) - 1}; _ember; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
        return r.stdout.split()

    def test_bash_completion(self):
        self.assertEqual(self.complete(EMBER, "dev"), ["devices"])
        self.assertEqual(self.complete(EMBER, "help", "m"), ["mem", "memory-timeline"])
        self.assertEqual(self.complete(EMBER, "help", "memo"), ["memory-timeline"])
        self.assertIn("--quick", self.complete(EMBER, "bench", "--q"))
        self.assertIn("--resume", self.complete(EMBER, "train", "--re"))
        self.assertIn("opencl:0", self.complete(EMBER, "train", "--device", "open"))
        # values and options from the command's option table (ember help --options)
        self.assertEqual(self.complete(EMBER, "train", "--optimizer", "ad"), ["adam", "adamw"])
        self.assertEqual(self.complete(EMBER, "mem", "--mode", "l"), ["lora"])
        self.assertEqual(self.complete(EMBER, "train", "--model", "gpt", "--te"), ["--text"])
        self.assertNotIn("--rank-of-mpi", self.complete(EMBER, "launch", "--"))  # hidden: the launcher's own
        self.assertEqual(self.complete(EMBER, "train", "--epochs", ""), [])  # a number: nothing to offer


if __name__ == "__main__":
    if not os.access(EMBER, os.X_OK):
        print(f"ember is not built at {EMBER}")
        sys.exit(1)
    if jsonschema:
        from importlib.metadata import version
        print("validator: jsonschema", version("jsonschema"), "(and the small one in this file, checked against it)")
    else:
        print("validator: the small one in this file (python3-jsonschema is not installed)")
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
