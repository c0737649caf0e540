"""DLPack capsules made by hand, for tests on a machine without a GPU: a tensor that says it is in CUDA
memory (or anywhere else), with any shape, strides and dtype. Its data pointer is never valid, so only
checks that refuse it before any kernel runs may see it. It records which capsules a consumer took and
whether it handed each back (called the deleter), as the DLPack protocol requires."""
import ctypes

_CAPSULE_NAME = b"dltensor"  # kept alive here: the capsule points at it


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", Deleter)]

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]

# (DLPack type code, bits); the float8 codes are DLPack 1.1's.
DTYPES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64), "int32": (0, 32),
          "uint8": (1, 8), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8)}
KDL_CUDA, KDL_CUDA_MANAGED = 2, 13


class FakeDeviceTensor:
    """Looks like a tensor in device memory to a DLPack consumer. strides None: row-major."""

    def __init__(self, shape, dtype="float32", strides=None, device_type=KDL_CUDA, device_id=0, data=0x10000):
        self.shape, self.strides, self.dtype = tuple(shape), strides, dtype
        self.device_type, self.device_id, self.data = device_type, device_id, data
        self.capsules = []  # every capsule handed out (a capsule nobody took stays the producer's)
        self.returned = 0   # deleter calls
        self._keep = []     # ctypes objects the capsules point into

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None):
        n = len(self.shape)
        shape = (ctypes.c_int64 * n)(*self.shape)
        strides = (ctypes.c_int64 * n)(*self.strides) if self.strides is not None else None
        code, bits = DTYPES[self.dtype]

        def returned(_managed):
            self.returned += 1

        deleter = Deleter(returned)
        managed = DLManagedTensor()
        managed.dl_tensor = DLTensor(self.data, DLDevice(self.device_type, self.device_id), n,
                                     DLDataType(code, bits, 1), shape,
                                     ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None, 0)
        managed.deleter = deleter
        capsule = _new_capsule(ctypes.addressof(managed), _CAPSULE_NAME, None)
        self._keep += [shape, strides, deleter, managed]
        self.capsules.append(capsule)
        return capsule

    def taken(self):
        """How many capsules a consumer took (renamed "used_dltensor"); it must call the deleter of each."""
        return sum(_capsule_name(c) != _CAPSULE_NAME for c in self.capsules)
