"""Averaging DistributedDataParallel's gradient buckets over the ranks: MPI's allreduce, or shared memory
when every rank runs on one node.

Both keep, per bucket, a host array that the rank's gradients are downloaded into (``contribution``),
``start`` it once they have landed, make progress in ``test`` (True once ``result`` holds the average)
and are reused pass after pass. Buckets start in the same order on every rank.

Why shared memory: on one node MPI's non-blocking allreduce moves a bucket through its shared-memory
cells in about five handshakes, each made only when the host calls MPI_Test, and copies every byte in
and out of those cells. LeNet's 1.7 MB of gradients cost 0.45 ms of host CPU a step when tested in a
loop, and 1.9 ms of wall time (0.67 ms of CPU) when tested between short sleeps, which is how a rank must
wait while its device computes. Here the ranks download straight into one window of shared memory
(``MPI_Win_allocate_shared``), each rank sums its own slice of every rank's contribution into the result
and all read the result: two flags to look at instead of handshakes, one pass over the data. On a CPU
device the host CPU it saves is the device's.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from .process_group import DistributedError

ALIGN = 64  # bytes: each array in the window starts on its own cache line

_ARRIVED, _REDUCED, _DONE = 0, 1, 2  # the two flags a rank raises per bucket and pass, and the end


class MpiBuckets:
    """Each bucket reduced in place by ``MPI_Iallreduce`` on the host array, then divided."""

    name = "mpi"
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


class SharedMemoryBuckets:
    """The buckets in one shared-memory window of the node's ranks (all of the job's ranks).

    Bucket i holds N contributions of n_i elements, the result, and per rank two pass counters: "my
    contribution has landed" and "my slice of the result is written". A rank sums its slice once every
    rank's contribution has landed, and the result is complete once every slice is. A contribution is
    overwritten only by the next pass's download, which the rank queues after uploading this pass's
    result, that is after every rank has read it; the result is overwritten only after every rank's next
    contribution has landed, so after every upload of this one."""

    name = "shared memory"
    needs_tests = False  # every rank sums its slice as soon as it sees the flags

    def __init__(self, comm, mpi, specs):
        self._size, self._rank = comm.Get_size(), comm.Get_rank()
        layout, total = [], 0
        for n, dtype in specs:
            contributions, total = total, total + _aligned(self._size * n * np.dtype(dtype).itemsize)
            result, total = total, total + _aligned(n * np.dtype(dtype).itemsize)
            layout.append((n, np.dtype(dtype), contributions, result))
        flags_at, total = total, total + _aligned(len(specs) * 2 * self._size * 8)
        self._win = mpi.Win.Allocate_shared(total if self._rank == 0 else 0, 1, comm=comm)
        self._win.Lock_all(mpi.MODE_NOCHECK)  # one passive epoch: Sync() is then the memory barrier
        weakref.finalize(self, _free, mpi, self._win)
        memory = np.frombuffer(self._win.Shared_query(0)[0], np.uint8)
        self._contributions, self._results, self._slices = [], [], []
        for n, dtype, contributions, result in layout:
            block = memory[contributions:contributions + self._size * n * dtype.itemsize]
            self._contributions.append(block.view(dtype).reshape(self._size, n))
            self._results.append(memory[result:result + n * dtype.itemsize].view(dtype))
            self._slices.append(slice(n * self._rank // self._size, n * (self._rank + 1) // self._size))
        self._flags = memory[flags_at:flags_at + len(specs) * 2 * self._size * 8].view(np.int64).reshape(
            len(specs), 2, self._size)
        if self._rank == 0:
            self._flags[:] = 0
        self._win.Sync()
        comm.Barrier()  # the flags are zero before any rank raises one
        self._passes = [0] * len(specs)
        self._state = [None] * len(specs)

    def contribution(self, i: int) -> np.ndarray:
        return self._contributions[i][self._rank]

    def start(self, i: int) -> None:
        self._passes[i] += 1
        self._raise(i, _ARRIVED)

    def test(self, i: int) -> bool:
        state, count = self._state[i], self._passes[i]
        if state == _ARRIVED and self._all_raised(i, _ARRIVED, count):
            mine = self._slices[i]
            result = self._results[i][mine]
            np.sum(self._contributions[i][:, mine], axis=0, out=result)
            result *= result.dtype.type(1.0 / self._size)
            self._raise(i, _REDUCED)
            state = _REDUCED
        if state == _REDUCED and self._all_raised(i, _REDUCED, count):
            self._state[i] = _DONE
        return self._state[i] == _DONE

    def result(self, i: int) -> np.ndarray:
        return self._results[i]

    def _raise(self, i: int, which: int) -> None:
        self._win.Sync()  # what this rank wrote is visible before the flag that announces it
        self._flags[i, which, self._rank] = self._passes[i]
        self._win.Sync()
        self._state[i] = which

    def _all_raised(self, i: int, which: int, count: int) -> bool:
        self._win.Sync()  # and what the others wrote is read after their flags
        return bool((self._flags[i, which] >= count).all())


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _free(mpi, win) -> None:
    if mpi.Is_finalized():  # MPI_Finalize has freed the window already
        return
    win.Unlock_all()
    win.Free()


def for_group(group, comm, specs):
    """The transport for a DDP over ``comm``: shared memory when all ranks share this node (unless
    ``NETCL_DDP_TRANSPORT=mpi``), else MPI."""
    choice = os.environ.get("NETCL_DDP_TRANSPORT", "auto").strip().lower() or "auto"
    if choice not in ("auto", "mpi", "shared"):
        raise DistributedError(f"NETCL_DDP_TRANSPORT must be auto, mpi or shared, got {choice!r}")
    on_one_node = group.local_size == group.size
    if choice == "shared" and not on_one_node:
        raise DistributedError(f"NETCL_DDP_TRANSPORT=shared needs every rank on one node; {group.local_size} "
                               f"of the {group.size} ranks share this one")
    if choice != "mpi" and on_one_node and group.size > 1:
        return SharedMemoryBuckets(comm, group.mpi, specs)
    return MpiBuckets(comm, group.mpi, specs)
