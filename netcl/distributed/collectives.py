"""Collectives on device tensors: download -> MPI on host -> upload, into host buffers kept for reuse.

Every wait goes through ``process_group.wait``, which polls the request and watches for another rank's
failure notice, so a rank never sits forever in a collective that a failed rank will not join.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..runtime import memory
from ..tensor import Tensor
from . import process_group

REDUCE_OPS = ("sum", "avg", "max", "min")

def host_buffer(device, dtype, count: int) -> np.ndarray:
    """A host array for ``device``'s collectives of ``count`` elements of ``dtype``, reused by every one of
    that size (a training loop calls all_reduce on the same few shapes, and fresh host arrays cost page
    faults on every call). Per device, in its state: an upload from it is queued on that device's queue,
    behind which the next download into it waits."""
    held = device.state.table("collective host buffers")
    key = (np.dtype(dtype).str, int(count))
    buf = held.get(key)
    if buf is None:
        if len(held) > 256:
            held.clear()
        buf = held[key] = np.empty(int(count), dtype=dtype)
    return buf


def mpi_op(mpi, op: str):
    return {"sum": mpi.SUM, "avg": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN}[op]


def _check_tensor(tensor, what: str) -> None:
    if not isinstance(tensor, Tensor):
        raise DTypeError(f"{what} takes an nc.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ShapeError(f"{what} works in place on a contiguous tensor; got shape {tensor.shape} with strides "
                         f"{tensor.strides} (call .contiguous() first and reduce that)")


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduce ``tensor`` over all ranks in place ("sum", "avg", "max" or "min"); returns it."""
    if op not in REDUCE_OPS:
        raise ShapeError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    _check_tensor(tensor, "all_reduce")
    if op == "avg" and tensor.dtype.kind != "f":
        raise DTypeError(f"all_reduce(op='avg') needs a floating-point tensor, got {tensor.dtype}")
    g = process_group.group()
    if tensor.size == 0:
        return tensor
    host = host_buffer(tensor.device, tensor.dtype, tensor.size)
    offset_bytes = tensor.offset * tensor.dtype.itemsize
    memory.download(tensor.device, tensor.buffer, host, offset_bytes)
    process_group.wait(g.comm.Iallreduce(g.mpi.IN_PLACE, host, op=mpi_op(g.mpi, op)))
    if op == "avg":
        host *= host.dtype.type(1.0 / g.size)
    # Asynchronous: a later download into the same host buffer is queued behind this upload.
    memory.upload(tensor.device, tensor.buffer, host, offset_bytes, wait=False)
    tensor.mark_written()
    return tensor


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """Copy rank ``src``'s values of ``tensor`` into every rank's ``tensor`` (in place); returns it."""
    _check_tensor(tensor, "broadcast")
    g = process_group.group()
    if not 0 <= int(src) < g.size:
        raise ShapeError(f"broadcast src {src} is not a rank of a world of {g.size}")
    broadcast_many([tensor], src)
    return tensor


def broadcast_many(tensors, src: int = 0) -> None:
    """Broadcast several tensors in one message per dtype (a model's parameters at wrap time)."""
    g = process_group.group()
    by_dtype: dict[str, list[Tensor]] = {}
    for t in tensors:
        _check_tensor(t, "broadcast")
        if t.size:
            by_dtype.setdefault(t.dtype.str, []).append(t)
    for group_tensors in by_dtype.values():
        dtype = group_tensors[0].dtype
        flat = np.empty(sum(t.size for t in group_tensors), dtype=dtype)
        if g.rank == src:
            _gather(group_tensors, flat)
        process_group.wait(g.comm.Ibcast(flat, root=int(src)))
        if g.rank != src:
            _scatter(flat, group_tensors, wait=True)


def _gather(tensors, flat: np.ndarray) -> None:
    start = 0
    for t in tensors:
        memory.download(t.device, t.buffer, flat[start:start + t.size], t.offset * t.dtype.itemsize)
        start += t.size


def _scatter(flat: np.ndarray, tensors, wait: bool) -> None:
    start = 0
    for t in tensors:
        memory.upload(t.device, t.buffer, flat[start:start + t.size], t.offset * t.dtype.itemsize, wait=wait)
        t.mark_written()
        start += t.size


def download_async(tensor: Tensor, out: np.ndarray):
    """Queue a copy of contiguous ``tensor`` into ``out`` behind the work already queued; returns its event
    (data-parallel buckets poll it so the host keeps queueing the backward pass meanwhile)."""
    try:
        return cl.enqueue_copy(tensor.device.queue, out, tensor.buffer,
                               src_offset=tensor.offset * tensor.dtype.itemsize, is_blocking=False)
    except cl.Error as exc:
        raise memory._translate(tensor.device, exc, "downloading", out.nbytes) from None


def event_done(event) -> bool:
    return event.command_execution_status == cl.command_execution_status.COMPLETE


def barrier() -> None:
    """Return once every rank has called barrier()."""
    g = process_group.group()
    process_group.wait(g.comm.Ibarrier())
