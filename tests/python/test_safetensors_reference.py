"""Ember's safetensors reader and writer against the reference implementation, Python's
`safetensors` package (where /usr/bin/python3 has it: `pip install safetensors`; exit 77,
skipped, where it has not). Files each side writes load on the other with the same names,
metadata and bytes (UTF-8 names included), and on hand-made hostile files (a hidden gap between
tensors, a name that is not UTF-8, overlaps, trailing bytes, misplaced empty tensors) both
readers agree on what they refuse. tests/test_safetensors.c checks the same rules without it."""
import ctypes
import os
import struct
import sys
import tempfile
import unittest
from ctypes import POINTER, c_char_p, c_int, c_int64, c_size_t, c_void_p

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import safetensors
    import safetensors.numpy
except ImportError as e:
    print(f"SKIP safetensors: Python's safetensors package is not installed for {sys.executable} ({e})")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(77)
import ember_dlpack as em

lib = em.lib
for name, (res, args) in {
    "em_safetensors_save_meta": (c_int, [c_char_p, POINTER(c_char_p), POINTER(c_void_p), c_int,
                                         POINTER(c_char_p), POINTER(c_char_p), c_int]),
    "em_safetensors_load": (c_void_p, [c_char_p, em.em_device]),
    "em_safetensors_count": (c_int, [c_void_p]),
    "em_safetensors_name": (c_char_p, [c_void_p, c_int]),
    "em_safetensors_get": (c_void_p, [c_void_p, c_char_p]),
    "em_safetensors_metadata": (c_char_p, [c_void_p, c_char_p]),
    "em_safetensors_free": (None, [c_void_p]),
    "em_nbytes": (c_size_t, [c_void_p]),
    "em_numel": (c_int64, [c_void_p]),
}.items():
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args

CPU = em.em_device(0, 0)
NP_TO_EMBER = {np.dtype("float32"): "float32", np.dtype("float64"): "float64", np.dtype("float16"): "float16",
               np.dtype("int64"): "int64", np.dtype("int32"): "int32", np.dtype("uint8"): "uint8",
               np.dtype("bool"): "bool"}


def ember_save(path, tensors, metadata=None):
    """Saves {name: numpy array} with Ember; returns Ember's status (0 = EM_OK)."""
    names = list(tensors)
    made = []
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        buf = ctypes.create_string_buffer(a.tobytes(), max(1, a.nbytes))
        made.append(em.from_data(buf, NP_TO_EMBER[a.dtype], a.shape))
    c_names = (c_char_p * len(names))(*[n.encode() if isinstance(n, str) else n for n in names])
    c_ts = (c_void_p * len(names))(*[t.h for t in made])
    meta = metadata or {}
    keys = (c_char_p * max(1, len(meta)))(*[k.encode() for k in meta])
    vals = (c_char_p * max(1, len(meta)))(*[v.encode() for v in meta.values()])
    status = lib.em_safetensors_save_meta(path.encode(), c_names, c_ts, len(names), keys, vals, len(meta))
    lib.em_clear_error()
    return status


def ember_load(path):
    """{name: raw bytes}, {metadata} of a file Ember reads; raises em.EmberError if it refuses."""
    st = lib.em_safetensors_load(path.encode(), CPU)
    if not st:
        em.check(None)
        raise em.EmberError("em_safetensors_load failed without a message")
    try:
        out = {}
        for i in range(lib.em_safetensors_count(st)):
            name = lib.em_safetensors_name(st, i)
            t = lib.em_safetensors_get(st, name)
            buf = ctypes.create_string_buffer(max(1, lib.em_nbytes(t)))
            em.check(lib.em_copy_to_host(t, buf, lib.em_nbytes(t)))
            out[name.decode()] = buf.raw[:lib.em_nbytes(t)]
            lib.em_release(t)
        return out
    finally:
        lib.em_safetensors_free(st)


def raw_file(header: bytes, data: bytes) -> bytes:
    header += b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header)) + header + data


NAMES = ["plain", "caf\u00e9", "\u65e5\u672c\u8a9e", "emoji \U0001F600", "quote \" and \\ back"]


class BothWays(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def arrays(self):
        rng = np.random.default_rng(7)
        return {
            NAMES[0]: rng.standard_normal((3, 4)).astype(np.float32),
            NAMES[1]: rng.standard_normal(5).astype(np.float64),
            NAMES[2]: np.arange(6, dtype=np.int64).reshape(2, 3) - 3,
            NAMES[3]: np.array([True, False, True]),
            NAMES[4]: np.zeros((0, 2), dtype=np.float16),
        }

    def test_ember_writes_reference_reads(self):
        path = os.path.join(self.dir.name, "ember.safetensors")
        arrays = self.arrays()
        self.assertEqual(ember_save(path, arrays, {"note": "caf\u00e9", "epoch": "3"}), 0)
        back = safetensors.numpy.load_file(path)
        self.assertEqual(sorted(back), sorted(arrays))
        for n, a in arrays.items():
            self.assertEqual(back[n].dtype, a.dtype, n)
            self.assertEqual(back[n].shape, a.shape, n)
            self.assertTrue(np.array_equal(back[n], a), n)
        with safetensors.safe_open(path, framework="numpy") as f:
            self.assertEqual(f.metadata(), {"note": "caf\u00e9", "epoch": "3"})

    def test_reference_writes_ember_reads(self):
        path = os.path.join(self.dir.name, "reference.safetensors")
        arrays = self.arrays()
        safetensors.numpy.save_file(arrays, path, metadata={"k": "\u00e9"})
        back = ember_load(path)
        self.assertEqual(sorted(back), sorted(arrays))
        for n, a in arrays.items():
            self.assertEqual(back[n], a.tobytes(), n)

    def test_ember_refuses_to_write_what_the_reference_cannot_read(self):
        path = os.path.join(self.dir.name, "bad.safetensors")
        arr = {b"w\xff": np.ones(2, dtype=np.float32)}
        self.assertNotEqual(ember_save(path, arr), 0)
        self.assertFalse(os.path.exists(path))


# (file bytes, why) of hand-made files: both readers must refuse each, or accept each.
HOSTILE = {
    "gap": (raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                     b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', bytes(12)), False),
    "gap_first": (raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)), False),
    "overlap": (raw_file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                         b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12)), False),
    "trailing": (raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(5)), False),
    "name_not_utf8": (raw_file(b'{"w\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"), False),
    "metadata_not_utf8": (raw_file(b'{"__metadata__":{"k":"\xc0\xaf"}}', b""), False),
    "surrogate_utf8": (raw_file(b'{"\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"), False),
    "empty_inside": (raw_file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                              b'"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}', bytes(8)), False),
    "empty_at_end": (raw_file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                              b'"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}', bytes(8)), True),
    "utf8_name": (raw_file('{"\u00e9\U0001F600":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'.encode(), b"\x01"),
                  True),
}


class Hostile(unittest.TestCase):
    def test_both_readers_agree(self):
        with tempfile.TemporaryDirectory() as d:
            for name, (data, good) in HOSTILE.items():
                path = os.path.join(d, name + ".safetensors")
                with open(path, "wb") as f:
                    f.write(data)
                try:
                    safetensors.numpy.load_file(path)
                    reference_ok = True
                except Exception:
                    reference_ok = False
                try:
                    ember_load(path)
                    ember_ok = True
                except em.EmberError:
                    ember_ok = False
                self.assertEqual(reference_ok, good, f"{name}: the reference reader")
                self.assertEqual(ember_ok, reference_ok, f"{name}: Ember and the reference reader disagree")


if __name__ == "__main__":
    unittest.main(verbosity=2)
