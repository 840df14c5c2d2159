#!/usr/bin/python3
"""Checks that PyTorch and NumPy read what Ember writes (not part of ctest: CI has no torch).
    /usr/bin/python3 tests/data/check_interop.py [build-dir]
Runs <build>/test_safetensors with EMBER_WRITE_INTEROP=<tmp> (it writes the tensors of
gen_data_files.py as ember.safetensors and one .npy each), then reads them back: the
safetensors file by the format's spec (the `safetensors` module is not installed here)
into torch tensors, the .npy files with numpy.load, and compares with the formulas."""
import json, os, struct, subprocess, sys, tempfile
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_data_files import st_tensors, ST_NAMES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH = {v: k for k, v in ST_NAMES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned"
    raw = data[8:8 + n]
    assert raw.rstrip(b" ") == raw.rstrip(), "header padding must be spaces"
    header = json.loads(raw)
    names = [k for k in header if k != "__metadata__"]
    assert names == sorted(names), f"header names not sorted: {names}"
    body, out, end = data[8 + n:], {}, 0
    for name in names:
        info = header[name]
        b, e = info["data_offsets"]
        assert b == end, f"{name}: data not contiguous in name order"
        end = e
        dt = TORCH[info["dtype"]]
        buf = bytearray(body[b:e])
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(info["shape"])
    assert end == len(body), "trailing bytes after the data"
    return out


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    want = st_tensors()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([os.path.join(build, "test_safetensors")], check=True,
                       env=dict(os.environ, EMBER_WRITE_INTEROP=d))
        got = read_safetensors(os.path.join(d, "ember.safetensors"))
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for name, w in want.items():
            g = got[name]
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
            assert torch.equal(g, w), (name, g, w)
            if w.dtype == torch.bfloat16:
                continue
            a = np.load(os.path.join(d, name + ".npy"))
            assert a.dtype == w.numpy().dtype and a.shape == tuple(w.shape), (name, a.dtype, a.shape)
            assert np.array_equal(a, w.numpy()), (name, a)
    print(f"interop ok: torch and numpy read Ember's safetensors and .npy files ({len(want)} tensors)")


if __name__ == "__main__":
    main()
