"""DistributedDataParallel: gradients averaged over MPI ranks, overlapped with backward.

Users reach it as ``nc.nn.parallel.DistributedDataParallel`` (PyTorch's name) or
``nc.distributed.DistributedDataParallel``.

Each rank runs the same model on its own share of the batch. At wrap time rank 0's parameters (and
buffers) are broadcast so all ranks start equal. The gradients are averaged in buckets while backward
runs, over shared memory on one node, else MPI's allreduce (data_parallel.py and bucket_reduce.py), so
after ``backward()`` every rank holds the averaged gradients and the optimizer step is the one a single
process takes with the whole global batch.

BatchNorm normalizes each rank's batch with that batch's own statistics (PyTorch's default, not
SyncBatchNorm); with ``broadcast_buffers=True`` (PyTorch's default) rank 0's buffers, the running
statistics among them, are broadcast at every training forward, so all ranks evaluate alike.
"""
from __future__ import annotations

import contextlib

from ..errors import ShapeError
from ..module import Module
from ..runtime import recording
from . import collectives, data_parallel, process_group

MEBIBYTE = 1 << 20


class DistributedDataParallel(Module):
    """Wrap ``module`` so that ``backward()`` leaves every rank with the gradients averaged over ranks.

    Args:
        module: the model (its parameters on this rank's device); ``self.module`` is it, and the wrapper's
            ``state_dict`` keys carry PyTorch's ``module.`` prefix (save ``ddp.module.state_dict()`` for a
            checkpoint that loads without the wrapper).
        bucket_cap_mb: the size of a gradient bucket, in MiB (PyTorch's default, 25).
        min_buckets: a model whose gradients are smaller than ``min_buckets`` caps is split into buckets of
            1/min_buckets of its gradients instead (1: PyTorch's rule). One bucket can only be reduced
            once the whole backward pass is over; with several, MPI reduces the large gradients of the
            last layers while the device still computes the first layers'.
        broadcast_buffers: broadcast rank 0's buffers (BatchNorm running statistics) at every training
            forward, as PyTorch does by default.

    Needs ``nc.distributed.init_process_group()`` first. ``with ddp.no_sync():`` skips the averaging
    (gradient accumulation over several backward passes; the first pass outside it averages the sum).
    """

    def __init__(self, module: Module, bucket_cap_mb: float = 25, broadcast_buffers: bool = True,
                 min_buckets: int = 4):
        super().__init__()
        if not isinstance(module, Module):
            raise ShapeError(f"DistributedDataParallel wraps an nc.nn.Module, got {type(module).__name__}")
        if not isinstance(bucket_cap_mb, (int, float)) or not 0 < bucket_cap_mb < float("inf"):
            raise ShapeError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        if isinstance(min_buckets, bool) or not isinstance(min_buckets, int) or min_buckets < 1:
            raise ShapeError(f"min_buckets must be a positive int, got {min_buckets!r}")
        self.module = module
        self._group = process_group.group()
        self.bucket_cap_mb = bucket_cap_mb
        self.min_buckets = min_buckets
        self.broadcast_buffers = bool(broadcast_buffers)
        collectives.barrier()
        collectives.broadcast_many([p.detach() for p in module.parameters()] +
                                   [b for _, b in module.named_buffers()], src=0)
        gradient_bytes = sum(p.nbytes for p in module.parameters() if p.requires_grad)
        cap_bytes = min(bucket_cap_mb * MEBIBYTE, gradient_bytes / min_buckets)
        self._gradients = data_parallel.GradientBuckets(module.parameters(), self._group, cap_bytes)

    @property
    def bucket_sizes(self) -> list[int]:
        """Elements per bucket, in the order their averages start."""
        return [b.size for b in self._gradients.buckets]

    @property
    def transport(self) -> str:
        """How buckets are averaged: "shared memory" (every rank on this node) or "mpi"."""
        return self._gradients.transport.name

    @property
    def averaging(self) -> str:
        """Where the buckets' averages are computed: "device" (shared memory that the device's kernels
        read in place: CPU drivers) or "host"."""
        return self._gradients.transport.averaging

    @property
    def stats(self) -> dict:
        """Over the backward passes: their count, the seconds the host waited at their ends for the
        device's last gradients and for the averages, and the buckets started while backward still ran."""
        return self._gradients.stats

    # ---- forward -----------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.training and self.broadcast_buffers and self._group.size > 1:
            buffers = [b for _, b in self.module.named_buffers()]
            if buffers:  # host work between kernels: a replayed step (netcl.training.replay) repeats it
                recording.host_call(buffers[0].device, collectives.broadcast_many, buffers, src=0)
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> "DistributedDataParallel":
        """As Module.train; switching to eval mode also broadcasts rank 0's buffers, so that ranks sharing
        an evaluation all use the running statistics of the model rank 0 checkpoints."""
        super().train(mode)
        if not mode and self.broadcast_buffers and self._group.size > 1:
            buffers = [b for _, b in self.module.named_buffers()]
            if buffers:
                collectives.broadcast_many(buffers, src=0)
        return self

    @contextlib.contextmanager
    def no_sync(self):
        """Context manager: backward passes inside it accumulate local gradients without averaging."""
        previous, self._gradients.syncing = self._gradients.syncing, False
        try:
            yield
        finally:
            self._gradients.syncing = previous

    def extra_repr(self) -> str:
        return (f"world_size={self._group.size}, buckets={len(self._gradients.buckets)}, "
                f"bucket_cap_mb={self.bucket_cap_mb}")
