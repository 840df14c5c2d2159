"""TensorBoard's own reader (EventAccumulator, tensorboard from PyPI) on Ember's event files:
every scalar, the histogram and the text written through libember.so's
em_summary_* calls (ctypes), a file left by a writer killed with SIGKILL mid-run, and the
curves of `ember train --logdir`.

TensorBoard lives in the virtual environment scripts/setup.sh makes (.venv-tests): run by
Debian's python3, this script re-runs itself there; without it, it exits 77 (a skip) and
says why. The library: $EMBER_LIBRARY (ctest sets it), else build/libember.so; the command:
$EMBER_TOOL, else build/ember."""
import ctypes
import glob
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VENV_PY = os.path.join(ROOT, ".venv-tests", "bin", "python")

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tests")) and os.access(VENV_PY, os.X_OK):
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__), *sys.argv[1:]])
    print(f"SKIP test_tensorboard: tensorboard is not importable and {VENV_PY} is missing or lacks it "
          "(scripts/setup.sh makes it)")
    sys.exit(77)

LIB = os.environ.get("EMBER_LIBRARY") or os.path.join(ROOT, "build", "libember.so")
EMBER = os.environ.get("EMBER_TOOL") or os.path.join(ROOT, "build", "ember")
EM_F32 = 0


def load():
    lib = ctypes.CDLL(LIB)
    lib.em_summary_writer_open.restype = ctypes.c_void_p
    lib.em_summary_writer_open.argtypes = [ctypes.c_char_p]
    lib.em_summary_writer_path.restype = ctypes.c_char_p
    lib.em_summary_writer_path.argtypes = [ctypes.c_void_p]
    lib.em_summary_add_scalar.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_double, ctypes.c_int64]
    lib.em_summary_add_histogram.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64]
    lib.em_summary_add_text.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
    lib.em_summary_writer_close.argtypes = [ctypes.c_void_p]
    lib.em_summary_writer_flush.argtypes = [ctypes.c_void_p]
    lib.em_last_error.restype = ctypes.c_char_p
    lib.em_release.argtypes = [ctypes.c_void_p]
    return lib


def f32_tensor(lib, values):
    """A 1-d float32 CPU tensor of values (em_from_data with an em_shape and zeroed em_opts)."""
    class Shape(ctypes.Structure):
        _fields_ = [("ndim", ctypes.c_int), ("d", ctypes.c_int64 * 8)]

    class Device(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]

    class Opts(ctypes.Structure):   # em_opts field for field (16 bytes: passed in registers)
        _fields_ = [("dtype", ctypes.c_int), ("device", Device), ("requires_grad", ctypes.c_bool),
                    ("pin_memory", ctypes.c_bool)]

    lib.em_from_data.restype = ctypes.c_void_p
    lib.em_from_data.argtypes = [ctypes.c_void_p, ctypes.c_int, Shape, Opts]
    buf = (ctypes.c_float * len(values))(*values)
    shape = Shape(1, (ctypes.c_int64 * 8)(len(values)))
    t = lib.em_from_data(buf, EM_F32, shape, Opts())
    assert t, lib.em_last_error()
    return t


def accumulate(path):
    acc = EventAccumulator(path, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


class TestTensorBoard(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ember_tb_")
        self.lib = load()

    def tearDown(self):
        self.tmp.cleanup()

    def test_scalars_histogram_text(self):
        lib = self.lib
        d = os.path.join(self.tmp.name, "run")
        w = lib.em_summary_writer_open(d.encode())
        self.assertTrue(w, lib.em_last_error())
        path = lib.em_summary_writer_path(w).decode()
        self.assertRegex(os.path.basename(path), r"^events\.out\.tfevents\.\d+\.[^.].*\.%d$" % os.getpid())
        losses = [2.5 / (s + 1) for s in range(25)]
        for s, v in enumerate(losses):
            self.assertEqual(lib.em_summary_add_scalar(w, b"train/loss", v, s), 0)
        self.assertEqual(lib.em_summary_add_scalar(w, b"lr", 1e-3, 0), 0)
        values = [-2.0, -0.5, 0.0, 0.25, 1.0, 1.0, 3.0, 7.5]
        t = f32_tensor(lib, values)
        self.assertEqual(lib.em_summary_add_histogram(w, b"weights", t, 3), 0, lib.em_last_error())
        lib.em_release(t)
        text = "epoch 1: **loss** 0.5, caf\u00e9"
        self.assertEqual(lib.em_summary_add_text(w, b"notes", text.encode(), 4), 0)
        self.assertEqual(lib.em_summary_writer_close(w), 0)

        acc = accumulate(d)
        self.assertEqual(acc.file_version, 2.0)
        tags = acc.Tags()
        self.assertEqual(sorted(tags["scalars"]), ["lr", "train/loss"])
        got = acc.Scalars("train/loss")
        self.assertEqual([e.step for e in got], list(range(25)))
        for e, v in zip(got, losses):   # simple_value is a float32
            self.assertAlmostEqual(e.value, v, delta=abs(v) * 1e-6)
            self.assertLess(abs(e.wall_time - time.time()), 120)
        self.assertAlmostEqual(acc.Scalars("lr")[0].value, 1e-3, delta=1e-9)

        self.assertEqual(tags["histograms"], ["weights"])
        (h,) = acc.Histograms("weights")
        hv = h.histogram_value
        self.assertEqual(h.step, 3)
        self.assertEqual((hv.min, hv.max, hv.num), (-2.0, 7.5, len(values)))
        self.assertAlmostEqual(hv.sum, sum(values), places=12)
        self.assertAlmostEqual(hv.sum_squares, sum(v * v for v in values), places=12)
        self.assertEqual(len(hv.bucket_limit), len(hv.bucket))
        self.assertEqual(sum(hv.bucket), len(values))
        self.assertEqual(hv.bucket_limit[-1], 7.5)
        # each value in the bucket whose range (previous limit, limit] holds it
        for v in values:
            i = next(k for k, lim in enumerate(hv.bucket_limit) if v <= lim)
            self.assertTrue(i == 0 or v > hv.bucket_limit[i - 1])
        expect = [0] * len(hv.bucket)
        for v in values:
            expect[next(k for k, lim in enumerate(hv.bucket_limit) if v <= lim + 1e-12)] += 1
        self.assertEqual(list(hv.bucket), expect)

        self.assertEqual(tags["tensors"], ["notes"])
        (te,) = acc.Tensors("notes")
        self.assertEqual(te.step, 4)
        self.assertEqual(te.tensor_proto.dtype, 7)   # DT_STRING
        self.assertEqual(te.tensor_proto.string_val[0].decode(), text)
        self.assertEqual(acc.SummaryMetadata("notes").plugin_data.plugin_name, "text")

        # protobuf's own parser, record by record: each Event parses, and re-serializes to the
        # very bytes Ember wrote (fields in order, packed buckets, proto3 defaults left out)
        from tensorboard.compat.proto import event_pb2
        raw = open(path, "rb").read()
        at, events = 0, []
        while at < len(raw):
            n = struct.unpack_from("<Q", raw, at)[0]
            data = raw[at + 12:at + 12 + n]
            ev = event_pb2.Event.FromString(data)
            self.assertEqual(ev.SerializeToString(), data)
            events.append(ev)
            at += 12 + n + 4
        self.assertEqual(at, len(raw))
        self.assertEqual(events[0].file_version, "brain.Event:2")
        self.assertEqual(len(events), 1 + 25 + 1 + 1 + 1)

    def test_writer_killed_mid_run(self):
        d = os.path.join(self.tmp.name, "killed")
        child = (
            "import ctypes, sys, time\n"
            f"lib = ctypes.CDLL({LIB!r})\n"
            "lib.em_summary_writer_open.restype = ctypes.c_void_p\n"
            "lib.em_summary_add_scalar.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_double, ctypes.c_int64]\n"
            f"w = lib.em_summary_writer_open({d.encode()!r})\n"
            "assert w\n"
            "step = 0\n"
            "while True:\n"
            "    assert lib.em_summary_add_scalar(w, b'x', step * 0.5, step) == 0\n"
            "    if step == 200: print('ready', flush=True)\n"
            "    step += 1\n")
        p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
        self.assertEqual(p.returncode, -signal.SIGKILL)
        (path,) = glob.glob(os.path.join(d, "events.out.tfevents.*"))
        acc = accumulate(d)
        got = acc.Scalars("x")
        self.assertGreater(len(got), 200)
        # every record up to the kill, whole and in order: no gap, no damaged value
        self.assertEqual([e.step for e in got], list(range(len(got))))
        self.assertEqual([e.value for e in got], [s * 0.5 for s in range(len(got))])
        # the file ends at a record boundary: TensorBoard's reader consumed it all
        size = os.path.getsize(path)
        self.assertGreater(size, 0)

    def test_bad_folder(self):
        lib = self.lib
        f = os.path.join(self.tmp.name, "file")
        open(f, "w").close()
        self.assertIsNone(lib.em_summary_writer_open(os.path.join(f, "sub").encode()))
        self.assertIn("cannot create the folder", lib.em_last_error().decode())
        lib.em_clear_error()

    def test_ember_train_logdir(self):
        if not os.access(EMBER, os.X_OK):
            self.skipTest(f"{EMBER} is not built")
        d = os.path.join(self.tmp.name, "train")
        r = subprocess.run([EMBER, "train", "--device", "cpu", "--epochs", "2", "--train-samples", "512",
                            "--test-samples", "200", "--batch-size", "64", "--checkpoint", "none",
                            "--logdir", d, "--log-every", "2", "--threads", "2"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 and "Fashion-MNIST" in r.stderr:
            self.skipTest("no Fashion-MNIST data: " + r.stderr.strip()[:200])
        self.assertEqual(r.returncode, 0, r.stderr)
        acc = accumulate(d)
        scalars = acc.Tags()["scalars"]
        loss = acc.Scalars("train/loss")
        self.assertEqual([e.step for e in loss], list(range(2, 17, 2)))   # 8 steps an epoch, every 2nd
        self.assertTrue(all(math.isfinite(e.value) and e.value > 0 for e in loss))
        epochs = re.findall(r"epoch (\d)/2: train loss ([\d.]+), test accuracy ([\d.]+)%, test loss ([\d.]+), "
                            r"(\d+) samples/s", r.stdout)
        self.assertEqual(len(epochs), 2, r.stdout)
        for tag in ("epoch/train_loss", "epoch/test_accuracy", "epoch/test_loss", "epoch/learning_rate",
                    "epoch/samples_per_second", "memory/allocated_bytes", "memory/peak_allocated_bytes",
                    "memory/reserved_bytes"):
            self.assertIn(tag, scalars)
            self.assertEqual([e.step for e in acc.Scalars(tag)], [8, 16], tag)
        for (ep, tl, ta, tel, sps), i in zip(epochs, range(2)):
            # the printed values, rounded as printed
            self.assertAlmostEqual(acc.Scalars("epoch/train_loss")[i].value, float(tl), delta=6e-5)
            self.assertAlmostEqual(100 * acc.Scalars("epoch/test_accuracy")[i].value, float(ta), delta=6e-3)
            self.assertAlmostEqual(acc.Scalars("epoch/test_loss")[i].value, float(tel), delta=6e-5)
            self.assertAlmostEqual(acc.Scalars("epoch/samples_per_second")[i].value, float(sps), delta=1)
            self.assertAlmostEqual(acc.Scalars("epoch/learning_rate")[i].value, 1e-3, delta=1e-9)
            self.assertGreater(acc.Scalars("memory/peak_allocated_bytes")[i].value, 0)
        hist = acc.Tags()["histograms"]
        self.assertTrue(hist and all(t.startswith("parameters/") for t in hist), hist)
        self.assertEqual(len(acc.Histograms(hist[0])), 2)
        (cfg,) = acc.Tensors("config")
        self.assertIn("batch 64", cfg.tensor_proto.string_val[0].decode())

    def test_ember_train_bad_logdir(self):
        if not os.access(EMBER, os.X_OK):
            self.skipTest(f"{EMBER} is not built")
        f = os.path.join(self.tmp.name, "file")
        open(f, "w").close()
        r = subprocess.run([EMBER, "train", "--device", "cpu", "--epochs", "1", "--train-samples", "64",
                            "--test-samples", "64", "--checkpoint", "none", "--logdir", os.path.join(f, "x")],
                           capture_output=True, text=True, timeout=300)
        # checked before training, as --checkpoint is: a usage error, before the data is read
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"--logdir '{f}/x': '{f}' is a file, not a folder", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
