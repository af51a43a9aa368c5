"""Choosing how DistributedDataParallel's gradient buckets are averaged over the ranks
(``NETCL_DDP_TRANSPORT``): MPI's allreduce, or shared memory when every rank runs on one node, averaged by
the device where its kernels work in host memory (netcl.distributed.transports has the three).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from .. import settings
from ..errors import DeviceError, DeviceMemoryError, KernelBuildError
from ..ops.reduce import MeanOfRows
from ..runtime import memory
from ..tensor import Tensor
from .process_group import DistributedError
from .transports import DeviceAveragedBuckets, MpiBuckets, SharedMemoryBuckets


def for_group(group, comm, specs, device=None):
    """The transport for a DDP over ``comm`` on ``device``. ``NETCL_DDP_TRANSPORT``: ``auto`` (or
    ``shared``): shared memory when all ranks share this node, averaged by the device where its kernels
    work in host memory, else on the host; ``shared-host``: shared memory, averaged on the host; ``mpi``:
    MPI's allreduce."""
    choice = settings.DDP_TRANSPORT.get()
    on_one_node = group.local_size == group.size
    if choice.startswith("shared") and not on_one_node:
        raise DistributedError(f"NETCL_DDP_TRANSPORT={choice} needs every rank on one node; {group.local_size} "
                               f"of the {group.size} ranks share this one")
    if choice == "mpi" or not on_one_node or group.size == 1:
        return MpiBuckets(comm, group.mpi, specs)
    gradient_bytes = sum(n * np.dtype(dtype).itemsize for n, dtype in specs)
    room = shared_memory_room()
    fits_host = room is None or room >= (group.size + 1) * gradient_bytes + WINDOW_MARGIN
    fits_device = room is None or room >= 2 * group.size * gradient_bytes + WINDOW_MARGIN
    on_device = choice != "shared-host" and device is not None and kernels_read_host_memory(device)
    # Every rank must take the same protocol (a rank on a GPU beside ranks on a CPU makes all sum on the
    # host): 2 device averaging, 1 host sums, 0 MPI, the least any rank can take.
    level = comm.allreduce(2 if on_device and fits_device else 1 if fits_host else 0, op=group.mpi.MIN)
    if level == 0:
        free = f"{room:,} bytes" if room is not None else "too little"
        message = (f"the node's shared memory (/dev/shm) has {free} free; a shared window for "
                   f"{group.size} ranks' {gradient_bytes:,} bytes of gradients needs "
                   f"{(group.size + 1) * gradient_bytes:,} (a container's default /dev/shm is 64 MiB: "
                   f"docker run --shm-size)")
        if choice.startswith("shared"):
            raise DistributedError(f"NETCL_DDP_TRANSPORT={choice}: {message}")
        warnings.warn(f"DistributedDataParallel averages through MPI instead of shared memory: {message}",
                      stacklevel=3)
        return MpiBuckets(comm, group.mpi, specs)
    if level == 2:
        return DeviceAveragedBuckets(comm, group.mpi, specs, device)
    return SharedMemoryBuckets(comm, group.mpi, specs)


WINDOW_MARGIN = 1 << 20  # bytes left over for the flags, the alignment and MPI's own shared memory


def shared_memory_room() -> int | None:
    """Bytes free in /dev/shm, where MPICH keeps shared windows; None where there is none to ask. A window
    larger than that is not refused when it is made: its pages fail (SIGBUS) when first written,
    mid-training."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def kernels_read_host_memory(device) -> bool:
    """Whether ``device``'s kernels see what the host last wrote into memory that a buffer wraps
    (``memory.over_host_array``), and the host what the device copied into it, with no map in between,
    as device averaging needs (the other side of each is another process, which no map could cover).
    True of CPU drivers, which run kernels in host memory (PoCL, Intel's runtime); a GPU driver may
    keep a copy made at the buffer's creation or first use. Tried here with the averaging kernel and
    the copy the transport uses, twice, on fresh data; a driver that refuses such a buffer, or the
    kernel, has the host average instead. Probed once per device (its state keeps the answer)."""
    known = device.state.table("distributed")
    if "kernels read host memory" not in known:
        known["kernels read host memory"] = probe_host_memory_sharing(device)
    return known["kernels read host memory"]


def probe_host_memory_sharing(device) -> bool:
    """The probe behind :func:`kernels_read_host_memory`, run anew."""
    rng = np.random.default_rng()
    rows = np.zeros((2, 37), np.float32)
    try:
        average = MeanOfRows(Tensor(memory.over_host_array(device, rows), rows.shape, rows.dtype, device))
        return _averages_host_memory(device, average, rows, rng)
    except (DeviceError, DeviceMemoryError, KernelBuildError):
        return False


def _averages_host_memory(device, average, rows: np.ndarray, rng) -> bool:
    out = Tensor.empty((rows.shape[1],), rows.dtype, device)
    for _ in range(2):
        rows[:] = rng.standard_normal(rows.shape)
        average(out)
        expected = (rows[0] + rows[1]) * np.float32(0.5)
        if not np.array_equal(out.to_host(), expected):
            return False
        memory.copy(device, average.rows.buffer, out.buffer, out.nbytes).wait()
        if not np.array_equal(rows[0], expected):
            return False
    return True
