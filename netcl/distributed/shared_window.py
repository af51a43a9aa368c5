"""One shared-memory window of a node's ranks (``MPI_Win_allocate_shared``): the memory that
DistributedDataParallel's shared-memory transports (netcl.distributed.bucket_reduce) put gradients in."""
from __future__ import annotations

import weakref

import numpy as np

ALIGN = 64  # bytes: each array in the window starts on its own cache line


class SharedWindow:
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


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _free(mpi, win, device) -> None:
    if mpi.Is_finalized():  # MPI_Finalize has freed the window already
        return
    if device is not None:
        device.queue.finish()  # kernels may still read the window through its device buffers
    win.Unlock_all()
    win.Free()
