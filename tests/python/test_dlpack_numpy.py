"""DLPack between Ember and NumPy (Debian's python3-numpy) through tests/python/ember_dlpack.py:
both ways without copying (the same address, writes seen on the other side), strides,
the deleter run once (reference counts and Ember's allocation statistics come back), a
capsule consumed once, unsupported dtypes refused with nothing leaked. Exit 77: skipped."""
import ctypes
import gc
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
except ImportError:
    print("SKIP numpy: numpy is not installed (Debian: python3-numpy)")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(77)
import ember_dlpack as em


def addr(a):
    return a.__array_interface__["data"][0]


class NumpyToEmber(unittest.TestCase):
    def test_same_memory(self):
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        refs = sys.getrefcount(a)
        t = em.from_dlpack(a)
        self.assertEqual(t.data_ptr, addr(a))
        self.assertEqual(t.shape, (3, 4))
        self.assertEqual(t.strides, (4, 1))
        self.assertGreater(sys.getrefcount(a), refs)  # NumPy's manager holds the array
        t.fill_(7.0)  # written by Ember, seen by NumPy
        self.assertTrue((a == 7).all())
        del t
        gc.collect()
        self.assertEqual(sys.getrefcount(a), refs)  # the deleter ran, once

    def test_strided(self):
        base = np.arange(24, dtype=np.float64).reshape(4, 6)
        b = base[1:, ::2].T  # (3, 3), strides (2, 6) elements, offset 6
        t = em.from_dlpack(b)
        self.assertEqual(t.data_ptr, addr(b))
        self.assertEqual(t.shape, b.shape)
        self.assertEqual(t.strides, tuple(s // b.itemsize for s in b.strides))
        got = np.frombuffer(t.tobytes(b.size * 8), dtype=np.float64).reshape(b.shape)
        self.assertTrue((got == b).all())

    def test_dtypes(self):
        for dt in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8):
            a = np.arange(6, dtype=dt).reshape(2, 3)
            t = em.from_dlpack(a)
            self.assertEqual(t.data_ptr, addr(a), dt)
            got = np.frombuffer(t.tobytes(a.nbytes), dtype=dt).reshape(2, 3)
            self.assertTrue((got == a).all(), dt)

    def test_consumed_once(self):
        a = np.ones(4, dtype=np.float32)
        cap = a.__dlpack__()
        t = em.from_dlpack(cap)
        with self.assertRaisesRegex(ValueError, "already consumed"):
            em.from_dlpack(cap)
        del t, cap

    def test_unsupported_dtype_leaks_nothing(self):
        for dt, what in ((np.complex64, "code 5: complex"), (np.int8, "code 0: int, 8 bits"),
                         (np.uint16, "code 1: uint, 16 bits")):
            a = np.zeros(3, dtype=dt)
            refs = sys.getrefcount(a)
            cap = a.__dlpack__()
            with self.assertRaisesRegex(em.EmberError, what):
                em.from_dlpack(cap)
            del cap  # not consumed: the capsule's destructor deletes it
            gc.collect()
            self.assertEqual(sys.getrefcount(a), refs)


    def test_negative_strides_refused(self):
        a = np.arange(6, dtype=np.float32)
        refs = sys.getrefcount(a)
        cap = a[::-1].__dlpack__()
        with self.assertRaisesRegex(em.EmberError, "stride -1 of dim 0 is negative"):
            em.from_dlpack(cap)
        del cap
        gc.collect()
        self.assertEqual(sys.getrefcount(a), refs)


    def test_read_only_producer_and_deleter_once(self):
        # a DLPack 1.x producer of our own over a NumPy buffer, flagged read-only, whose
        # deleter counts its calls
        a = np.arange(6, dtype=np.float32)
        calls = []
        DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(em.DLManagedTensorVersioned))
        deleter = DELETER(lambda m: calls.append(1))
        shape = (ctypes.c_int64 * 1)(6)
        m = em.DLManagedTensorVersioned()
        m.version = em.DLPackVersion(1, 0)
        m.deleter = deleter
        m.flags = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
        m.dl_tensor.data = a.ctypes.data
        m.dl_tensor.device = em.DLDevice(em.kDLCPU, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = em.DLDataType(2, 32, 1)  # float32
        m.dl_tensor.shape = shape
        t = em.Tensor(em.check(em.lib.em_from_dlpack(ctypes.addressof(m))))
        self.assertTrue(t.read_only)
        self.assertEqual(t.data_ptr, a.ctypes.data)
        with self.assertRaisesRegex(em.EmberError, "em_fill_: the tensor is read-only"):
            t.fill_(1.0)
        self.assertEqual(a.tolist(), [0, 1, 2, 3, 4, 5])  # nothing written
        with self.assertRaisesRegex(em.EmberError, "already consumed"):
            em.check(em.lib.em_from_dlpack(ctypes.addressof(m)))
        self.assertEqual(calls, [])
        del t
        gc.collect()
        self.assertEqual(calls, [1])  # once, when Ember let go


class EmberToNumpy(unittest.TestCase):
    def test_same_memory_and_lifetime(self):
        before = em.cpu_allocated()
        src = (np.arange(6, dtype=np.float32) + 1).ctypes
        t = em.from_data(src.data, "float32", (2, 3))
        n = np.from_dlpack(t)
        self.assertEqual(addr(n), t.data_ptr)
        self.assertEqual(n.shape, (2, 3))
        # NumPy 1.x marks DLPack imports read-only: write at the array's address instead
        ctypes.c_float.from_address(addr(n) + 5 * 4).value = 60
        self.assertEqual(np.frombuffer(t.tobytes(24), dtype=np.float32)[5], 60)
        self.assertEqual(n[1, 2], 60)
        del t
        gc.collect()
        self.assertEqual(n.tolist(), [[1, 2, 3], [4, 5, 60]])  # NumPy still holds the memory
        self.assertGreater(em.cpu_allocated(), before)
        del n
        gc.collect()
        self.assertEqual(em.cpu_allocated(), before)  # the deleter ran and freed it

    def test_strided(self):
        src = np.arange(12, dtype=np.int64)
        t = em.from_data(src.ctypes.data, "int64", (3, 4))
        tt = t.transpose(0, 1)
        n = np.from_dlpack(tt)
        self.assertEqual(addr(n), tt.data_ptr)
        self.assertEqual(n.strides, (8, 32))
        self.assertTrue((n == src.reshape(3, 4).T).all())
        t.fill_(5)  # written by Ember through the other view, seen by NumPy
        self.assertTrue((n == 5).all())

    def test_versioned_capsule_round_trip(self):
        src = np.arange(4, dtype=np.float32)
        t = em.from_data(src.ctypes.data, "float32", (4,))
        cap = t.__dlpack__(max_version=(1, 0))
        back = em.from_dlpack(cap)
        self.assertEqual(back.data_ptr, t.data_ptr)
        with self.assertRaisesRegex(ValueError, "already consumed"):
            em.from_dlpack(cap)


if __name__ == "__main__":
    print("libember", em.lib.em_version().decode(), "numpy", np.__version__)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
