"""Device buffers: allocation with typed out-of-memory errors, uploads and downloads.

Buffers come from a caching pool per device (pyopencl's MemoryPool): a buffer whose last user is gone
returns to the pool and serves the next request of its size class. Fresh buffers cost a CPU device page
faults on first touch, which slow a layer's first runs several times over and would mislead the
planner's measurements. Reuse is safe because every
kernel goes to the device's one in-order queue: a buffer handed out again is only written by commands
queued after the ones that read it. A new buffer therefore holds arbitrary old data; every op writes
its whole output. ``release_cached`` hands the held buffers back to the driver, and so does an allocation
that finds more than ``held_limit`` bytes held: a run over many differently sized large tensors (`netcl
bench conv` at batch 32) would otherwise keep one buffer of every size class it ever used, and on a CPU
device that is host memory (19 GB of a 24 GB machine in one such run).
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.tools as cl_tools

from ..errors import DeviceError, DeviceMemoryError
from . import error_flags, recording
from .device import Device


def held_limit(device: Device) -> int:
    """Bytes the pool may hold for reuse before an allocation releases them: 1/8 of the device's global
    memory, at least 256 MiB (a training loop reuses a fixed set of sizes far below that)."""
    return max(256 << 20, device.global_mem_bytes // 8)


def _held_bytes(pool: cl_tools.MemoryPool) -> int:
    return pool.managed_bytes - pool.active_bytes


def _pool(device: Device) -> cl_tools.MemoryPool:
    pool = device._memory_pool
    if pool is None:
        with device.state.lock:
            if device._memory_pool is None:
                device._memory_pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(device.queue))
            pool = device._memory_pool
    return pool


def allocate(device: Device, nbytes: int):
    """A device buffer of ``nbytes`` (at least 1 byte: OpenCL forbids empty buffers)."""
    nbytes = max(int(nbytes), 1)
    if nbytes > device.max_alloc_bytes:
        raise DeviceMemoryError(
            f"cannot allocate {nbytes:,} bytes on {device.describe()}: the largest single allocation it "
            f"allows is {device.max_alloc_bytes:,} bytes (global memory {device.global_mem_bytes:,})",
            requested_bytes=nbytes, available_bytes=device.max_alloc_bytes)
    arena = recording_arena(device)
    if arena is not None:
        pool = arena.pool
    else:
        pool = _pool(device)
        if _held_bytes(pool) > held_limit(device):
            pool.free_held()
    if pool.alloc_size(pool.bin_number(nbytes)) > device.max_alloc_bytes:
        pool = None  # its size class would round past the largest allocation: ask the driver directly
    for attempt in range(2):
        try:
            if pool is None:
                return cl.Buffer(device.context, cl.mem_flags.READ_WRITE, nbytes)
            buffer = pool.allocate(nbytes)
            return buffer if arena is None else arena.lend(buffer, nbytes)
        except cl.Error as exc:
            if attempt == 0:
                release_cached(device)  # held buffers may be what the driver is missing
                continue
            raise DeviceMemoryError(f"allocating {nbytes:,} bytes on {device.describe()} failed: {exc}",
                                    requested_bytes=nbytes, available_bytes=device.max_alloc_bytes) from None


class Arena:
    """A buffer pool of its own for the steps one owner records (netcl.training.CapturedStep): inside
    ``with Recording(device, arena=arena)`` every allocation comes from it, so a buffer whose tensor dies
    mid-step serves a later tensor of the same step, as in a step run as written. The recording keeps its
    own reference to each arena buffer it saw, not the tensor's, so a dead tensor's buffer returns here;
    nothing outside a recording of this arena's owner allocates from it, so a buffer the replay writes is
    never handed to a tensor that outlives the step.

    The arena also knows each *allocation* (one tensor's buffer, from its allocation to its tensor's
    death; ``sizes[allocation]`` its bytes) and which of them are alive, so a recording can plan where
    the step's dead tensors live (netcl.runtime.recording.Recording.compacted). It frees nothing while
    recordings use it (the buffers it hands out are known by their handles, which therefore cannot be
    reused by the driver); ``release()`` hands its held buffers back to the driver afterwards."""

    def __init__(self, device: Device):
        self.device = device
        self.pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(device.queue))
        self.handles: set[int] = set()  # the OpenCL handle of every buffer it handed out
        self.sizes: list[int] = []  # bytes requested by each allocation, in their order
        self._current: dict[int, int] = {}  # a buffer's OpenCL handle -> the live allocation using it
        self.alignment = max(256, device.base_align_bytes)  # of a sub-buffer's origin in a slab

    def lend(self, buffer, nbytes: int):
        """Register ``buffer`` (from ``pool``) as a new allocation of ``nbytes``; its end is noticed when
        the last reference to the buffer goes."""
        allocation = len(self.sizes)
        self.sizes.append(nbytes)
        self.handles.add(buffer.int_ptr)
        self._current[buffer.int_ptr] = allocation
        buffer.netcl_lease = _Lease(self, buffer.int_ptr, allocation)
        return buffer

    def owns(self, buffer) -> bool:
        return buffer.int_ptr in self.handles

    def allocation_of(self, buffer) -> int | None:
        """The live allocation ``buffer`` holds, if it is one of the arena's."""
        return self._current.get(buffer.int_ptr)

    def live_allocations(self) -> set[int]:
        return set(self._current.values())

    def _ended(self, handle: int, allocation: int) -> None:
        if self._current.get(handle) == allocation:
            del self._current[handle]

    def slab(self, nbytes: int) -> cl.Buffer | None:
        """One buffer of ``nbytes`` for a plan of allocations, outside the pool; None when the device
        allows no single allocation that large or has not the memory (the plan is then not used)."""
        if nbytes > self.device.max_alloc_bytes:
            return None
        try:
            return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 1))
        except cl.Error:
            return None

    def stats(self) -> dict:
        """Buffers in use and held for reuse, as ``pool_stats``."""
        return {"active_blocks": self.pool.active_blocks, "held_blocks": self.pool.held_blocks,
                "active_bytes": self.pool.active_bytes, "held_bytes": _held_bytes(self.pool)}

    def release(self) -> None:
        """Hand the held buffers back to the driver: only once no recording of this arena is made any more
        (their handles may then be reused by the driver)."""
        self.device.queue.finish()  # a driver frees a buffer that queued commands use only once they are done
        self.pool.free_held()
        self.handles.clear()
        _trim_host_heap()


class _Lease:
    """Rides on an arena buffer (as an attribute of the pooled buffer object, which takes no weak
    references) and tells the arena when the last reference to the buffer, and so the allocation, ends."""

    __slots__ = ("arena", "handle", "allocation")

    def __init__(self, arena: Arena, handle: int, allocation: int):
        self.arena, self.handle, self.allocation = arena, handle, allocation

    def __del__(self):
        self.arena._ended(self.handle, self.allocation)


def recording_arena(device: Device) -> Arena | None:
    """The arena the calling thread's recording of ``device`` allocates from, if it is making one with an
    arena (a CapturedStep's): every allocation then comes from it."""
    if not device.state.observers:
        return None
    being_made = recording.active(device)
    return None if being_made is None else being_made.arena


def over_host_array(device: Device, array: np.ndarray) -> cl.Buffer:
    """A buffer whose storage is ``array``'s memory (CL_MEM_USE_HOST_PTR); the buffer keeps the array
    alive. On a device that works in host memory (CPU drivers), kernels read what the host last wrote
    there and the host reads what kernels wrote, without copies; elsewhere the driver may keep a copy
    that only maps synchronize (``netcl.distributed.bucket_reduce`` checks which before relying on it)."""
    if not array.flags.c_contiguous or array.nbytes == 0:
        raise ValueError(f"a buffer over host memory needs a non-empty contiguous array, got shape {array.shape}")
    try:
        return cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=array)
    except cl.Error as exc:
        raise _translate(device, exc, "wrapping host memory of", array.nbytes) from None


def release_cached(device: Device) -> int:
    """Hand the buffers the pool holds for reuse back to the driver; returns how many there were."""
    pool = device._memory_pool
    if pool is None:
        return 0
    held = pool.held_blocks
    if held:
        device.queue.finish()  # a driver frees a buffer that queued commands use only once they are done
        pool.free_held()
        _trim_host_heap()
    return held


def _trim_host_heap() -> None:
    """Ask the C library to give freed heap pages back to the system. A CPU driver takes buffers from
    the process's heap (malloc), where freed blocks below the dynamic mmap threshold stay resident until
    trimmed, so buffers handed back to the driver would otherwise still count as the process's memory."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim():
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to trim, or no way to ask


def pool_stats(device: Device) -> dict:
    """Buffers in use and held for reuse by the device's pool."""
    pool = device._memory_pool
    return {"active_blocks": pool.active_blocks if pool else 0, "held_blocks": pool.held_blocks if pool else 0,
            "active_bytes": pool.active_bytes if pool else 0,
            "held_bytes": _held_bytes(pool) if pool else 0}


def upload(device: Device, buffer: cl.Buffer, array: np.ndarray, offset_bytes: int = 0, wait: bool = True):
    array = np.asarray(array, order="C")
    if array.nbytes == 0:
        return None
    if device.state.observers:
        for observer in device.state.observers_here():
            observer.upload(device, buffer, array, offset_bytes)
    try:
        return cl.enqueue_copy(device.queue, buffer, array, dst_offset=offset_bytes, is_blocking=wait)
    except cl.Error as exc:
        raise _translate(device, exc, "uploading", array.nbytes) from None


def download(device: Device, buffer: cl.Buffer, out: np.ndarray, offset_bytes: int = 0) -> np.ndarray:
    if out.nbytes == 0:
        return out
    if device.state.observers:
        for observer in device.state.observers_here():
            observer.download(device, out.nbytes)
    try:
        cl.enqueue_copy(device.queue, out, buffer, src_offset=offset_bytes, is_blocking=True)
    except cl.Error as exc:
        raise _translate(device, exc, "downloading", out.nbytes) from None
    error_flags.check(device)  # every read-back enqueued before has completed: checking costs no wait
    return out


def fill(device: Device, buffer: cl.Buffer, value: np.generic, nbytes: int, offset_bytes: int = 0):
    if nbytes == 0:
        return None
    if device.state.observers:
        for observer in device.state.observers_here():
            observer.fill(device, buffer, value, nbytes, offset_bytes)
    try:
        return cl.enqueue_fill_buffer(device.queue, buffer, value, offset_bytes, nbytes)
    except cl.Error as exc:
        raise _translate(device, exc, "filling", nbytes) from None


def copy(device: Device, dst: cl.Buffer, src: cl.Buffer, nbytes: int, dst_offset_bytes: int = 0,
         src_offset_bytes: int = 0):
    """Device-side copy of nbytes between (non-overlapping ranges of) buffers: the driver's own copy,
    a memcpy on CPU devices, instead of a kernel launch."""
    if nbytes == 0:
        return None
    if device.state.observers:
        for observer in device.state.observers_here():
            observer.copy(device, dst, src, nbytes, dst_offset_bytes, src_offset_bytes)
    try:
        return cl.enqueue_copy(device.queue, dst, src, byte_count=nbytes, dst_offset=dst_offset_bytes,
                               src_offset=src_offset_bytes)
    except cl.Error as exc:
        raise _translate(device, exc, "copying", nbytes) from None


def meta_buffer(device: Device, values) -> cl.Buffer:
    """A small read-only int64 buffer (shapes/strides for kernels), shared by identical requests."""
    key = tuple(int(v) for v in values) or (0,)
    table = device.state.meta_buffers
    buf = table.get(key)
    if buf is None:
        host = np.asarray(key, dtype=np.int64)
        buf = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        if len(table) > 4096:
            table.clear()
        table[key] = buf
    return buf


def _translate(device: Device, exc: cl.Error, what: str, nbytes: int) -> Exception:
    if isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in (
            cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
            cl.status_code.OUT_OF_HOST_MEMORY):
        return DeviceMemoryError(f"{what} {nbytes:,} bytes on {device.describe()} failed: out of memory",
                                 requested_bytes=nbytes, available_bytes=device.max_alloc_bytes)
    return DeviceError(f"{what} {nbytes:,} bytes on {device.describe()} failed: {exc}")
