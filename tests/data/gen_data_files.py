#!/usr/bin/python3
"""Generates the small reference files the data tests read, and the fuzz seed corpus.
Run from the repository root with /usr/bin/python3 (torch 1.13 + numpy):
    /usr/bin/python3 tests/data/gen_data_files.py
The `safetensors` Python module is not installed here, so the safetensors file is
written by hand following the format's spec the way the reference (Rust) writer does:
data ordered by dtype then name, header keys in data order, __metadata__ first, compact
JSON padded with spaces to a multiple of 8 bytes."""
import gzip, io, json, os, struct
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gz(data):
    # mtime=0 so the output is reproducible
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as f:
        f.write(data)
    return buf.getvalue()


# ---- safetensors -----------------------------------------------------------------
# Values are formulas the C test recomputes: no answers are copied from here.
def st_tensors():
    t = {}
    t["weight"] = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.25 - 1.0)
    t["bias"] = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    t["half"] = (torch.arange(5, dtype=torch.float32) / 4).to(torch.float16)
    t["brain"] = (torch.arange(4, dtype=torch.float32) * 1.5).to(torch.bfloat16)
    t["steps"] = torch.tensor([[-3, 0], [7, 1 << 40]], dtype=torch.int64)
    t["ids"] = torch.arange(-2, 4, dtype=torch.int32).reshape(2, 3)
    t["pixels"] = torch.arange(250, 256, dtype=torch.uint8)
    t["mask"] = torch.tensor([True, False, True])
    t["empty"] = torch.zeros(0, 3, dtype=torch.float32)
    t["scalar"] = torch.tensor(42.5, dtype=torch.float32)
    return t


ST_NAMES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
            torch.uint8: "U8", torch.bool: "BOOL"}


def tensor_bytes(x):
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().astype("<i2").tobytes()
    return x.numpy().tobytes()


def safetensors_bytes(tensors, metadata=None):
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for n in order:
        b = tensor_bytes(tensors[n])
        header[n] = {"dtype": ST_NAMES[tensors[n].dtype], "shape": list(tensors[n].shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


# ---- IDX ---------------------------------------------------------------------------
def idx_bytes(arr, code):
    fmt = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    head = struct.pack(">BBBB", 0, 0, code, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return head + arr.astype(fmt).tobytes()


def npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def main():
    # the interop file, read by tests/test_safetensors.c
    st = safetensors_bytes(st_tensors(), {"format": "pt", "source": "gen_data_files.py"})
    write(os.path.join(DATA, "reference.safetensors"), st)
    write(os.path.join(CORPUS, "safetensors", "reference.safetensors"), st)
    write(os.path.join(CORPUS, "safetensors", "one.safetensors"),
          safetensors_bytes({"x": torch.arange(3, dtype=torch.float32)}))
    write(os.path.join(CORPUS, "safetensors", "empty_header.safetensors"), struct.pack("<Q", 8) + b"{}      ")

    # IDX: a tiny image set (4 images of 3x2, pixels = 10*i + j) and its labels
    imgs = np.array([[[10 * i + 3 * r + c for c in range(2)] for r in range(3)] for i in range(4)], dtype=np.uint8)
    labels = np.array([3, 1, 4, 1], dtype=np.uint8)
    write(os.path.join(DATA, "tiny-images-idx3-ubyte.gz"), gz(idx_bytes(imgs, 0x08)))
    write(os.path.join(DATA, "tiny-labels-idx1-ubyte"), idx_bytes(labels, 0x08))
    c = os.path.join(CORPUS, "idx")
    write(os.path.join(c, "u8_3d.idx"), idx_bytes(imgs, 0x08))
    write(os.path.join(c, "u8_3d.idx.gz"), gz(idx_bytes(imgs, 0x08)))
    write(os.path.join(c, "i8.idx"), idx_bytes(np.array([-1, 2, -128]), 0x09))
    write(os.path.join(c, "i16.idx"), idx_bytes(np.array([[-300, 2], [5, 32767]]), 0x0B))
    write(os.path.join(c, "i32.idx"), idx_bytes(np.array([-70000, 1]), 0x0C))
    write(os.path.join(c, "f32.idx"), idx_bytes(np.array([0.5, -2.25, 1e30]), 0x0D))
    write(os.path.join(c, "f64.idx"), idx_bytes(np.array([[0.1]]), 0x0E))

    # .npy: every accepted dtype, all three header versions, a rejected fortran file
    c = os.path.join(CORPUS, "npy")
    write(os.path.join(c, "f4.npy"), npy_bytes(np.arange(6, dtype="<f4").reshape(2, 3)))
    write(os.path.join(c, "f8_v2.npy"), npy_bytes(np.array([1.5, -2.0]), (2, 0)))
    write(os.path.join(c, "f2_v3.npy"), npy_bytes(np.array([[0.5]], dtype="<f2"), (3, 0)))
    write(os.path.join(c, "i8.npy"), npy_bytes(np.array([-1, 1 << 40], dtype="<i8")))
    write(os.path.join(c, "i4_scalar.npy"), npy_bytes(np.array(7, dtype="<i4")))
    write(os.path.join(c, "u1_empty.npy"), npy_bytes(np.zeros((0, 4), dtype="u1")))
    write(os.path.join(c, "b1.npy"), npy_bytes(np.array([True, False])))
    write(os.path.join(c, "fortran.npy"), npy_bytes(np.asfortranarray(np.ones((2, 2), dtype="<f4"))))
    # the .npy files the tests read: numpy's own output for each dtype
    write(os.path.join(DATA, "numpy_f4.npy"), npy_bytes(np.arange(6, dtype="<f4").reshape(2, 3) / 4))
    write(os.path.join(DATA, "numpy_f8_v2.npy"), npy_bytes(np.array([1.5, -2.0, 1e-300]), (2, 0)))
    write(os.path.join(DATA, "numpy_i8.npy"), npy_bytes(np.array([[-1], [1 << 40]], dtype="<i8")))
    write(os.path.join(DATA, "numpy_b1_v3.npy"), npy_bytes(np.array([True, False, True]), (3, 0)))
    write(os.path.join(DATA, "numpy_fortran.npy"), npy_bytes(np.asfortranarray(np.ones((2, 2), dtype="<f4"))))

    # CSV: the first byte selects the fuzz target's options (see fuzz/fuzz_csv.c)
    c = os.path.join(CORPUS, "csv")
    write(os.path.join(c, "header_label0.csv"), b"\x01label,a,b\n1,0.5,2\n0,-1e3,3.25\n")
    write(os.path.join(c, "nolabel_crlf.csv"), b"\x06" + b"1,2,3\r\n4,5,6\r\n\r\n")
    write(os.path.join(c, "quoted_semicolon.csv"), b"\x09\"x\";\"y\"\n\"1\";2\n3 ; 4\n")
    write(os.path.join(c, "ragged.csv"), b"\x00" + b"1,2\n3\n")


if __name__ == "__main__":
    main()
