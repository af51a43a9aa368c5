"""The dtypes netcl tensors may hold and their OpenCL C names."""
from __future__ import annotations

import numpy as np

from .errors import DTypeError

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
           np.dtype(np.int32): "int", np.dtype(np.int64): "long"}
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"not a dtype: {dtype!r}") from exc
    if dt not in C_TYPES:
        raise DTypeError(f"netcl tensors hold float32, float64, int32 or int64, not {dt}")
    return dt


def c_type(dtype) -> str:
    return C_TYPES[as_dtype(dtype)]


def is_float(dtype) -> bool:
    return np.dtype(dtype) in FLOAT_DTYPES


def require_float(dtype, what: str) -> None:
    if not is_float(dtype):
        raise DTypeError(f"{what} needs a float32 or float64 tensor, got {np.dtype(dtype)}")


def host_dtype_for(array: np.ndarray) -> np.dtype:
    """Host arrays of other kinds are converted the way a user expects (bool/uint8 -> float32 etc.)."""
    dt = array.dtype
    if dt in C_TYPES:
        return dt
    if dt.kind == "f":
        return np.dtype(np.float32)
    if dt.kind in "iub":
        return np.dtype(np.int64) if dt.kind == "i" and dt.itemsize == 8 else (
            np.dtype(np.float32) if dt.kind == "b" else np.dtype(np.int64) if dt.kind == "u" and dt.itemsize >= 4
            else np.dtype(np.int32))
    raise DTypeError(f"cannot put a host array of dtype {dt} on a device")
