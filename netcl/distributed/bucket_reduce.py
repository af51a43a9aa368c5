"""Averaging DistributedDataParallel's gradient buckets over the ranks: MPI's allreduce, or shared memory
when every rank runs on one node.

All keep, per bucket, host memory that the rank's gradients are copied into (``contribution``,
``copy_in``), ``start`` it once they have landed, make progress in ``test`` (True once the average is ready: in
``result`` on the host, or for ``average_into`` to write on the device) and are reused pass after pass.
Buckets start in the same order on every rank.

Why shared memory: on one node MPI's non-blocking allreduce moves a bucket through its shared-memory
cells in about five handshakes, each made only when the host calls MPI_Test, and copies every byte in
and out of those cells. LeNet's 1.7 MB of gradients cost 0.45 ms of host CPU a step when tested in a
loop, and 1.9 ms of wall time (0.67 ms of CPU) when tested between short sleeps, which is how a rank must
wait while its device computes. Here the ranks download straight into one window of shared memory
(``MPI_Win_allocate_shared``), each rank sums its own slice of every rank's contribution into the result
and all read the result: two flags to look at instead of handshakes, one pass over the data. On a CPU
device the host CPU it saves is the device's. Better still, on a device whose kernels work in host memory
the window is also a device buffer: each device averages every rank's contribution straight into its
gradients, and the host only raises and watches one flag per bucket.
"""
from __future__ import annotations

import functools
import os
import warnings
import weakref

import numpy as np

from .. import settings
from ..errors import DeviceError, DeviceMemoryError, KernelBuildError
from ..ops.reduce import MeanOfRows
from ..runtime import memory
from ..tensor import Tensor
from . import collectives
from .process_group import DistributedError

ALIGN = 64  # bytes: each array in the window starts on its own cache line

_ARRIVED, _REDUCED, _DONE = 0, 1, 2  # the two flags a rank raises per bucket and pass, and the end


class _HostContributions:
    """Gradients reach a bucket's host array by downloads."""

    def copy_in(self, i: int, start: int, grad):
        """Queue the copy of contiguous ``grad`` into bucket i's contribution from element ``start``;
        returns its event (the caller keeps it: pyopencl waits for a download whose event is dropped)."""
        return collectives.download_async(grad, self.contribution(i)[start:start + grad.size])


class MpiBuckets(_HostContributions):
    """Each bucket reduced in place by ``MPI_Iallreduce`` on the host array, then divided."""

    name = "mpi"
    averages_on_device = False
    needs_tests = True  # MPI moves a non-blocking allreduce only inside MPI calls

    def __init__(self, comm, mpi, specs):
        self._comm, self._mpi, self._size = comm, mpi, comm.Get_size()
        self._hosts = [np.empty(n, dtype) for n, dtype in specs]
        self._requests = [None] * len(specs)
        self._averaged = [False] * len(specs)

    def contribution(self, i: int) -> np.ndarray:
        return self._hosts[i]

    def start(self, i: int) -> None:
        self._averaged[i] = False
        self._requests[i] = self._comm.Iallreduce(self._mpi.IN_PLACE, self._hosts[i], op=self._mpi.SUM)

    def test(self, i: int) -> bool:
        if self._averaged[i]:
            return True
        if not self._requests[i].Test():
            return False
        self._hosts[i] *= self._hosts[i].dtype.type(1.0 / self._size)
        self._averaged[i] = True
        return True

    def result(self, i: int) -> np.ndarray:
        return self._hosts[i]


class _SharedWindow:
    """One shared-memory window of the node's ranks (``MPI_Win_allocate_shared``, allocated by rank 0),
    carved into byte blocks, each on its own cache line, and an int64 flag array that starts at zero."""

    def __init__(self, comm, mpi, block_bytes: list[int], flags_shape: tuple, device=None):
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        starts, total = [], 0
        for nbytes in block_bytes:
            starts.append(total)
            total += _aligned(nbytes)
        flags_at, total = total, total + _aligned(int(np.prod(flags_shape)) * 8)
        self._win = mpi.Win.Allocate_shared(total if self.rank == 0 else 0, 1, comm=comm)
        self._win.Lock_all(mpi.MODE_NOCHECK)  # one passive epoch: Sync() is then the memory barrier
        weakref.finalize(self, _free, mpi, self._win, device)
        memory = np.frombuffer(self._win.Shared_query(0)[0], np.uint8)
        self.blocks = [memory[at:at + nbytes] for at, nbytes in zip(starts, block_bytes)]
        self.flags = memory[flags_at:flags_at + int(np.prod(flags_shape)) * 8].view(np.int64).reshape(flags_shape)
        if self.rank == 0:
            self.flags[:] = 0
        self._win.Sync()
        comm.Barrier()  # the flags are zero before any rank raises one

    def raise_flag(self, index: tuple, value: int) -> None:
        self._win.Sync()  # what this rank wrote is visible before the flag that announces it
        self.flags[index] = value
        self._win.Sync()

    def all_raised(self, index: tuple, count: int) -> bool:
        self._win.Sync()  # and what the others wrote is read after their flags
        return bool((self.flags[index] >= count).all())


class SharedMemoryBuckets(_HostContributions):
    """The buckets in one shared-memory window of the node's ranks (all of the job's ranks), summed on
    the host.

    Bucket i holds N contributions of n_i elements, the result, and per rank two pass counters: "my
    contribution has landed" and "my slice of the result is written". A rank sums its slice once every
    rank's contribution has landed, and the result is complete once every slice is. A contribution is
    overwritten only by the next pass's download, which the rank queues after uploading this pass's
    result, that is after every rank has read it; the result is overwritten only after every rank's next
    contribution has landed, so after every upload of this one."""

    name = "shared memory"
    averages_on_device = False
    needs_tests = False  # every rank sums its slice as soon as it sees the flags

    def __init__(self, comm, mpi, specs):
        size, rank = comm.Get_size(), comm.Get_rank()
        blocks = []
        for n, dtype in specs:
            blocks += [size * n * np.dtype(dtype).itemsize, n * np.dtype(dtype).itemsize]
        self._window = _SharedWindow(comm, mpi, blocks, (len(specs), 2, size))
        self._rank = rank
        self._contributions, self._results, self._slices = [], [], []
        for i, (n, dtype) in enumerate(specs):
            self._contributions.append(self._window.blocks[2 * i].view(dtype).reshape(size, n))
            self._results.append(self._window.blocks[2 * i + 1].view(dtype))
            self._slices.append(slice(n * rank // size, n * (rank + 1) // size))
        self._passes = [0] * len(specs)
        self._state = [None] * len(specs)

    def contribution(self, i: int) -> np.ndarray:
        return self._contributions[i][self._rank]

    def start(self, i: int) -> None:
        self._passes[i] += 1
        self._raise(i, _ARRIVED)

    def test(self, i: int) -> bool:
        state, count = self._state[i], self._passes[i]
        if state == _ARRIVED and self._window.all_raised((i, _ARRIVED), count):
            mine = self._slices[i]
            result = self._results[i][mine]
            np.sum(self._contributions[i][:, mine], axis=0, out=result)
            result *= result.dtype.type(1.0 / self._window.size)
            self._raise(i, _REDUCED)
            state = _REDUCED
        if state == _REDUCED and self._window.all_raised((i, _REDUCED), count):
            self._state[i] = _DONE
        return self._state[i] == _DONE

    def result(self, i: int) -> np.ndarray:
        return self._results[i]

    def _raise(self, i: int, which: int) -> None:
        self._window.raise_flag((i, which, self._rank), self._passes[i])
        self._state[i] = which


class DeviceAveragedBuckets:
    """The buckets in one shared-memory window of the node's ranks, averaged by each rank's device.

    For a device that works in host memory (a CPU driver): the window's contributions are also device
    buffers (``memory.over_host_array``), so once every rank's contribution has landed each rank's device
    averages all of them straight into its parameters' ``.grad`` (``average_into``). Against summing on
    the host (:class:`SharedMemoryBuckets`) this saves the host's sum, the flag round that announces it
    and the uploads: work that on a CPU device takes the cores the kernels run on.

    One flag per rank and bucket ("my contribution has landed"), and two sets of contributions used in
    alternate passes. A rank copies into set p % 2 in pass p only after it has seen every rank's flag
    for pass p - 1; a rank raises that flag once its copies of pass p - 1 have landed, and its
    in-order queue ran its averaging of pass p - 2 (which read set p % 2) before them. So no rank
    overwrites a contribution another still has to read."""

    name = "shared memory"
    averages_on_device = True
    needs_tests = False  # nothing to move: a rank only waits for the others' flags

    def __init__(self, comm, mpi, specs, device):
        self._size, self._rank = comm.Get_size(), comm.Get_rank()
        self._window = _SharedWindow(comm, mpi, [2 * self._size * n * np.dtype(dtype).itemsize for n, dtype in specs],
                                     (len(specs), self._size), device)
        self._contributions, self._on_device = [], []
        for block, (n, dtype) in zip(self._window.blocks, specs):
            self._contributions.append(block.view(dtype).reshape(2, self._size, n))
            self._on_device.append(Tensor(memory.over_host_array(device, block), (2, self._size, n), dtype, device))
        self._averages = {}  # (bucket, set) -> a MeanOfRows per parameter, over its slice of the set
        self._passes = [0] * len(specs)

    def _filling(self, i: int) -> int:
        """The set of bucket i's contributions this pass copies into (it starts with ``start``)."""
        return (self._passes[i] + 1) % 2

    def contribution(self, i: int) -> np.ndarray:
        return self._contributions[i][self._filling(i), self._rank]

    def start(self, i: int) -> None:
        self._passes[i] += 1
        self._window.raise_flag((i, self._rank), self._passes[i])

    def copy_in(self, i: int, start: int, grad):
        """Queue the device-side copy of contiguous ``grad`` into bucket i's contribution from element
        ``start`` (the window is a buffer too); returns its event. On PoCL a copy between buffers cost the
        host 2-4 µs a call, a download into host memory 5-40 µs."""
        contributions = self._on_device[i]
        _, size, n = contributions.shape
        first = contributions.offset + (self._filling(i) * size + self._rank) * n + start
        itemsize = contributions.dtype.itemsize
        return memory.copy(contributions.device, contributions.buffer, grad.buffer, grad.size * itemsize,
                           first * itemsize, grad.offset * itemsize)

    def test(self, i: int) -> bool:
        return self._window.all_raised(i, self._passes[i])

    def average_into(self, i: int, offsets: list[int], outs: list) -> None:
        """Enqueue ``outs[j] <- mean over ranks of elements [offsets[j], offsets[j + 1]) of bucket i``
        (after ``test(i)``): one launch per output, prepared at the first pass of each set."""
        key = (i, self._passes[i] % 2)
        averages = self._averages.get(key)
        if averages is None:
            contributions = self._on_device[i]
            n, first = contributions.shape[2], contributions.offset + key[1] * self._size * contributions.shape[2]
            averages = self._averages[key] = [
                MeanOfRows(contributions._view((self._size, stop - start), (n, 1), first + start))
                for start, stop in zip(offsets, offsets[1:])]
        for average, out in zip(averages, outs):
            average(out)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _free(mpi, win, device) -> None:
    if mpi.Is_finalized():  # MPI_Finalize has freed the window already
        return
    if device is not None:
        device.queue.finish()  # kernels may still read the window through its device buffers
    win.Unlock_all()
    win.Free()


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


@functools.lru_cache(maxsize=None)
def kernels_read_host_memory(device) -> bool:
    """Whether ``device``'s kernels see what the host last wrote into memory that a buffer wraps
    (``memory.over_host_array``), and the host what the device copied into it, with no map in between,
    as device averaging needs (the other side of each is another process, which no map could cover).
    True of CPU drivers, which run kernels in host memory (PoCL, Intel's runtime); a GPU driver may
    keep a copy made at the buffer's creation or first use. Tried here with the averaging kernel and
    the copy the transport uses, twice, on fresh data; a driver that refuses such a buffer, or the
    kernel, has the host average instead."""
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
