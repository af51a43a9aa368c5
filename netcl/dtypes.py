"""The dtypes netcl tensors may hold and their OpenCL C names.

bool is stored as one byte per element (``uchar`` in kernels, always 0 or 1): OpenCL C forbids ``bool`` in
buffers and kernel arguments. Comparisons produce it; ``where`` and masks take it.
"""
from __future__ import annotations

import functools

import numpy as np

from .errors import DTypeError

BOOL = np.dtype(np.bool_)
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
           np.dtype(np.int32): "int", np.dtype(np.int64): "long", BOOL: "uchar"}
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_dtype(dtype) -> np.dtype:
    try:
        return _remembered_dtype(dtype)  # every op asks several times: a cache lookup instead of np.dtype()
    except DTypeError:
        raise
    except TypeError:  # unhashable: checked every time
        return _checked_dtype(dtype)


def _checked_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"not a dtype: {dtype!r}") from exc
    if dt not in C_TYPES:
        raise DTypeError(f"netcl tensors hold float32, float64, int32, int64 or bool, not {dt}")
    return dt


_remembered_dtype = functools.lru_cache(maxsize=256)(_checked_dtype)


def is_dtype_like(value) -> bool:
    """Whether ``value`` names a netcl dtype (np.float32, np.dtype, "float32", "bool", ...)."""
    if isinstance(value, (np.dtype, type)):
        pass
    elif not isinstance(value, str):
        return False
    try:
        return np.dtype(value) in C_TYPES
    except TypeError:
        return False


def c_type(dtype) -> str:
    return C_TYPES[as_dtype(dtype)]


def is_float(dtype) -> bool:
    return np.dtype(dtype) in FLOAT_DTYPES


def require_float(dtype, what: str) -> None:
    if not is_float(dtype):
        raise DTypeError(f"{what} needs a float32 or float64 tensor, got {np.dtype(dtype)}")


def host_dtype_for(array: np.ndarray, from_python: bool = False) -> np.dtype:
    """The tensor dtype for a host array, the way a PyTorch user expects: bool stays bool, uint8 and
    int8/int16 become int32, float16 becomes float32. ``from_python``: the array came from Python
    numbers (lists, floats), whose floats become float32 (PyTorch's default dtype) and ints int64."""
    dt = array.dtype
    if from_python and dt.kind == "f":
        return np.dtype(np.float32)
    if from_python and dt.kind in "iu":
        return np.dtype(np.int64)
    if dt in C_TYPES:
        return dt
    if dt.kind == "f":
        return np.dtype(np.float32)
    if dt.kind in "iu":
        return np.dtype(np.int64) if dt.itemsize == 8 or (dt.kind == "u" and dt.itemsize == 4) else np.dtype(np.int32)
    raise DTypeError(f"cannot put a host array of dtype {dt} on a device")
