"""A small ctypes shim over libember.so for the DLPack tests: Ember tensors as Python objects
with __dlpack__ / __dlpack_device__ (so numpy.from_dlpack and torch.from_dlpack take them),
and from_dlpack(obj or capsule) for the other way. Capsules follow DLPack's Python rules: a
"dltensor" / "dltensor_versioned" capsule is renamed "used_..." once consumed, and its
destructor calls the deleter only if nobody consumed it.

The library: $EMBER_LIBRARY (ctest sets it), else build/libember.so."""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, PYFUNCTYPE, Structure, c_bool, c_char_p, c_double, c_int,
                    c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, py_object)

EM_MAX_DIMS = 8
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int64": 4, "int32": 5, "uint8": 6,
          "bool": 7}
kDLCPU = 1


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p),
                            ("deleter", CFUNCTYPE(None, POINTER(DLManagedTensor)))]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    pass


DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p),
                                     ("deleter", CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))),
                                     ("flags", c_uint64), ("dl_tensor", DLTensor)]


class em_shape(Structure):
    _fields_ = [("ndim", c_int), ("d", c_int64 * EM_MAX_DIMS)]


class em_device(Structure):
    _fields_ = [("type", c_int), ("index", c_int)]


class em_opts(Structure):
    _fields_ = [("dtype", c_int), ("device", em_device), ("requires_grad", c_bool), ("pin_memory", c_bool)]


def _load():
    path = os.environ.get("EMBER_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "libember.so")
    lib = ctypes.CDLL(path)
    sig = {
        "em_to_dlpack": (c_void_p, [c_void_p]),
        "em_to_dlpack_legacy": (c_void_p, [c_void_p]),
        "em_from_dlpack": (c_void_p, [c_void_p]),
        "em_from_dlpack_legacy": (c_void_p, [c_void_p]),
        "em_release": (None, [c_void_p]),
        "em_last_error": (c_char_p, []),
        "em_clear_error": (None, []),
        "em_failed": (c_bool, []),
        "em_data_ptr": (c_void_p, [c_void_p]),
        "em_ndim": (c_int, [c_void_p]),
        "em_size": (c_int64, [c_void_p, c_int]),
        "em_stride": (c_int64, [c_void_p, c_int]),
        "em_dtype_of": (c_int, [c_void_p]),
        "em_from_data": (c_void_p, [c_void_p, c_int, em_shape, em_opts]),
        "em_transpose": (c_void_p, [c_void_p, c_int, c_int]),
        "em_fill_": (c_int, [c_void_p, c_double]),
        "em_is_read_only": (c_bool, [c_void_p]),
        "em_copy_to_host": (c_int, [c_void_p, c_void_p, ctypes.c_size_t]),
        "em_memory_allocated": (c_int64, [em_device]),
        "em_version": (c_char_p, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


lib = _load()


class EmberError(Exception):
    pass


def check(result):
    """Raise EmberError with Ember's message when the last call failed."""
    if lib.em_failed():
        msg = lib.em_last_error().decode()
        lib.em_clear_error()
        raise EmberError(msg)
    return result


# ---- capsules (the C API, through ctypes.pythonapi) -------------------------------------------
_capsule_new = PYFUNCTYPE(py_object, c_void_p, c_char_p, c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_valid = PYFUNCTYPE(c_int, py_object, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_ptr = PYFUNCTYPE(c_void_p, py_object, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_set_name = PYFUNCTYPE(c_int, py_object, c_char_p)(("PyCapsule_SetName", ctypes.pythonapi))
# in the destructor the capsule is dying: raw pointers, never a new reference to it
_raw_valid = PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_raw_ptr = PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
# PyCapsule_SetName keeps the pointer: these bytes objects live as long as the module
NAME, USED = b"dltensor", b"used_dltensor"
NAME_V, USED_V = b"dltensor_versioned", b"used_dltensor_versioned"


@PYFUNCTYPE(None, c_void_p)
def _destructor(cap):
    # an unconsumed capsule still owns its managed tensor: delete it, once
    if _raw_valid(cap, NAME):
        m = ctypes.cast(_raw_ptr(cap, NAME), POINTER(DLManagedTensor))
        if m.contents.deleter:
            m.contents.deleter(m)
    elif _raw_valid(cap, NAME_V):
        m = ctypes.cast(_raw_ptr(cap, NAME_V), POINTER(DLManagedTensorVersioned))
        if m.contents.deleter:
            m.contents.deleter(m)


_DESTRUCTOR = ctypes.cast(_destructor, c_void_p)


class Tensor:
    """An Ember tensor (one reference, released when this object goes)."""

    def __init__(self, handle):
        self.h = handle

    def __del__(self):
        if getattr(self, "h", None):
            lib.em_release(self.h)
            self.h = None

    @property
    def data_ptr(self):
        return check(lib.em_data_ptr(self.h))

    @property
    def shape(self):
        return tuple(lib.em_size(self.h, i) for i in range(lib.em_ndim(self.h)))

    @property
    def strides(self):
        """In elements, as Ember keeps them."""
        return tuple(lib.em_stride(self.h, i) for i in range(lib.em_ndim(self.h)))

    def transpose(self, d0, d1):
        return Tensor(check(lib.em_transpose(self.h, d0, d1)))

    def fill_(self, value):
        check(lib.em_fill_(self.h, value))

    @property
    def read_only(self):
        return lib.em_is_read_only(self.h)

    def tobytes(self, nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        check(lib.em_copy_to_host(self.h, buf, nbytes))
        return buf.raw

    def __dlpack__(self, stream=None, max_version=None, **_):
        """DLPack 1.x when the consumer asks for it (max_version >= (1, 0)), else 0.x."""
        if max_version is not None and max_version[0] >= 1:
            return _capsule_new(check(lib.em_to_dlpack(self.h)), NAME_V, _DESTRUCTOR)
        return _capsule_new(check(lib.em_to_dlpack_legacy(self.h)), NAME, _DESTRUCTOR)

    def __dlpack_device__(self):
        m = check(lib.em_to_dlpack_legacy(self.h))  # the device as DLPack names it
        dl = ctypes.cast(m, POINTER(DLManagedTensor))
        dev = (dl.contents.dl_tensor.device.device_type, dl.contents.dl_tensor.device.device_id)
        dl.contents.deleter(dl)
        return dev


def from_data(buf, dtype, shape):
    """A new CPU tensor copied from a ctypes buffer."""
    s = em_shape(len(shape), (c_int64 * EM_MAX_DIMS)(*shape))
    return Tensor(check(lib.em_from_data(buf, DTYPES[dtype], s, em_opts(DTYPES[dtype]))))


def from_dlpack(obj):
    """An Ember tensor over obj's memory: obj has __dlpack__, or is a DLPack capsule."""
    cap = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
    if _capsule_valid(cap, USED) or _capsule_valid(cap, USED_V):
        raise ValueError("this DLPack capsule was already consumed (its name is used_dltensor)")
    if _capsule_valid(cap, NAME_V):
        h = check(lib.em_from_dlpack(_capsule_ptr(cap, NAME_V)))
        _capsule_set_name(cap, USED_V)
    elif _capsule_valid(cap, NAME):
        h = check(lib.em_from_dlpack_legacy(_capsule_ptr(cap, NAME)))
        _capsule_set_name(cap, USED)
    else:
        raise TypeError("expected a DLPack capsule named dltensor or dltensor_versioned")
    return Tensor(h)


def cpu_allocated():
    return lib.em_memory_allocated(em_device(0, 0))
