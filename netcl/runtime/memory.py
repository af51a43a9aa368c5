"""Device buffers: allocation with typed out-of-memory errors, uploads and downloads."""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import DeviceError, DeviceMemoryError
from .device import Device

_meta_cache: dict[tuple, cl.Buffer] = {}


def allocate(device: Device, nbytes: int) -> cl.Buffer:
    """A device buffer of ``nbytes`` (at least 1 byte: OpenCL forbids empty buffers)."""
    nbytes = int(nbytes)
    if nbytes > device.max_alloc_bytes:
        raise DeviceMemoryError(
            f"cannot allocate {nbytes:,} bytes on {device.describe()}: the largest single allocation it "
            f"allows is {device.max_alloc_bytes:,} bytes (global memory {device.global_mem_bytes:,})",
            requested_bytes=nbytes, available_bytes=device.max_alloc_bytes)
    try:
        return cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
    except cl.Error as exc:
        raise DeviceMemoryError(f"allocating {nbytes:,} bytes on {device.describe()} failed: {exc}",
                                requested_bytes=nbytes, available_bytes=device.max_alloc_bytes) from None


def upload(device: Device, buffer: cl.Buffer, array: np.ndarray, offset_bytes: int = 0, wait: bool = True):
    array = np.asarray(array, order="C")
    if array.nbytes == 0:
        return None
    try:
        return cl.enqueue_copy(device.queue, buffer, array, dst_offset=offset_bytes, is_blocking=wait)
    except cl.Error as exc:
        raise _translate(device, exc, "uploading", array.nbytes) from None


def download(device: Device, buffer: cl.Buffer, out: np.ndarray, offset_bytes: int = 0) -> np.ndarray:
    if out.nbytes == 0:
        return out
    try:
        cl.enqueue_copy(device.queue, out, buffer, src_offset=offset_bytes, is_blocking=True)
    except cl.Error as exc:
        raise _translate(device, exc, "downloading", out.nbytes) from None
    return out


def fill(device: Device, buffer: cl.Buffer, value: np.generic, nbytes: int, offset_bytes: int = 0):
    if nbytes == 0:
        return None
    try:
        return cl.enqueue_fill_buffer(device.queue, buffer, value, offset_bytes, nbytes)
    except cl.Error as exc:
        raise _translate(device, exc, "filling", nbytes) from None


def meta_buffer(device: Device, values) -> cl.Buffer:
    """A small read-only int64 buffer (shapes/strides for kernels), shared by identical requests."""
    key = (id(device.context), tuple(int(v) for v in values) or (0,))
    buf = _meta_cache.get(key)
    if buf is None:
        host = np.asarray(key[1], dtype=np.int64)
        buf = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        if len(_meta_cache) > 4096:
            _meta_cache.clear()
        _meta_cache[key] = buf
    return buf


def _translate(device: Device, exc: cl.Error, what: str, nbytes: int) -> Exception:
    if isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in (
            cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
            cl.status_code.OUT_OF_HOST_MEMORY):
        return DeviceMemoryError(f"{what} {nbytes:,} bytes on {device.describe()} failed: out of memory",
                                 requested_bytes=nbytes, available_bytes=device.max_alloc_bytes)
    return DeviceError(f"{what} {nbytes:,} bytes on {device.describe()} failed: {exc}")
