"""DLPack between Ember and PyTorch (where /usr/bin/python3 has torch; exit 77, skipped,
where it has not) through tests/python/ember_dlpack.py: both ways without copying (the same
address, writes seen on the other side), strides, bfloat16, and lifetimes (Ember's memory freed only when PyTorch lets go)."""
import gc
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.utils.dlpack
except ImportError as e:
    print(f"SKIP torch: PyTorch is not installed for {sys.executable} ({e})")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(77)
import ember_dlpack as em


class TorchToEmber(unittest.TestCase):
    def test_same_memory_strided(self):
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # (4, 3), strides (1, 4)
        t = em.from_dlpack(torch.utils.dlpack.to_dlpack(x))
        self.assertEqual(t.data_ptr, x.data_ptr())
        self.assertEqual(t.shape, (4, 3))
        self.assertEqual(t.strides, (1, 4))
        t.fill_(3.0)
        self.assertTrue(bool((x == 3).all()))

    def test_bfloat16_and_int64(self):
        for dt, nbytes in ((torch.bfloat16, 2), (torch.int64, 8)):
            x = torch.arange(5).to(dt)
            t = em.from_dlpack(torch.utils.dlpack.to_dlpack(x))
            self.assertEqual(t.data_ptr, x.data_ptr())
            back = torch.frombuffer(bytearray(t.tobytes(5 * nbytes)), dtype=dt)
            self.assertTrue(bool((back == x).all()), dt)

    def test_memory_outlives_the_import(self):
        x = torch.ones(8)
        t = em.from_dlpack(torch.utils.dlpack.to_dlpack(x))
        del t  # Ember's release runs PyTorch's deleter: x is PyTorch's again, intact
        gc.collect()
        self.assertEqual(float(x.sum()), 8.0)


class EmberToTorch(unittest.TestCase):
    def test_same_memory(self):
        before = em.cpu_allocated()
        src = torch.arange(6, dtype=torch.float32)
        t = em.from_data(src.data_ptr(), "float32", (2, 3))
        tt = t.transpose(0, 1)
        y = torch.utils.dlpack.from_dlpack(tt)
        self.assertEqual(y.data_ptr(), tt.data_ptr)
        self.assertEqual(y.stride(), (1, 3))
        self.assertTrue(bool((y == src.reshape(2, 3).t()).all()))
        y[0, 1] = 40  # written by PyTorch, seen by Ember
        self.assertEqual(torch.frombuffer(bytearray(t.tobytes(24)), dtype=torch.float32)[3].item(), 40)
        del t, tt
        gc.collect()
        self.assertGreater(em.cpu_allocated(), before)  # PyTorch holds the storage
        del y
        gc.collect()
        self.assertEqual(em.cpu_allocated(), before)


if __name__ == "__main__":
    print("libember", em.lib.em_version().decode(), "torch", torch.__version__)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
