"""nc.nn.parallel.DistributedDataParallel: gradients averaged over MPI ranks, overlapped with backward.

Each rank runs the same model on its own share of the batch. At wrap time rank 0's parameters (and
buffers) are broadcast so all ranks start equal. The parameters, in reverse order (roughly the order in
which backward produces their gradients), are packed into buckets of about ``bucket_cap_mb`` (or a
``min_buckets``-th of a small model's gradients). During
``loss.backward()`` a gradient hook (autograd's ``register_post_accumulate_grad_hook``) marks a parameter
ready; once a bucket is complete its gradients are copied to a host buffer by non-blocking downloads
queued behind the kernels that compute them, and the bucket's reduction (over shared memory on one node,
else ``MPI_Iallreduce``: netcl.distributed.bucket_reduce) starts as soon as the
copies have landed, while the host goes on queueing the rest of the backward pass. When the pass ends (a
backward callback), the remaining buckets are reduced and divided by the world size, and the averages
written into each ``.grad``: uploaded from the host, or, on a device whose kernels work in host memory
(CPU drivers) with every rank on one node, averaged by the device itself from the shared-memory
window that all ranks' gradients were downloaded into (``ddp.averaging``). So after ``backward()``
every rank holds the averaged gradients and the optimizer step is the one a single process takes with
the whole global batch.

Buckets start strictly in their order, the same on every rank, as MPI requires of collectives on one
communicator. BatchNorm normalizes each rank's batch with that batch's own statistics (PyTorch's default,
not SyncBatchNorm); with ``broadcast_buffers=True`` (PyTorch's default) rank 0's buffers, the running
statistics among them, are broadcast at every training forward, so all ranks evaluate alike.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from ..autograd import function as autograd_engine
from ..errors import ShapeError
from ..runtime import recording
from ..tensor import Tensor
from .module import Module

MEBIBYTE = 1 << 20


class _Bucket:
    """A run of parameters of one dtype whose gradients travel in one allreduce."""

    def __init__(self, index: int, params: list):
        self.index = index
        self.params = params
        self.dtype = params[0].dtype
        self.offsets = np.cumsum([0] + [p.size for p in params]).tolist()
        self.size = self.offsets[-1]
        self.reset()

    def reset(self) -> None:
        self.waiting = {id(p) for p in self.params}
        self.events = None  # the downloads' events once the bucket is complete

    def download(self, reduce) -> None:
        """Queue the gradients' copies into the transport's contribution (``reduce``: netcl.distributed.
        bucket_reduce). Their events are kept: pyopencl waits for a copy into host memory when its event
        is dropped."""
        self.events = []
        host = reduce.contribution(self.index)
        for p, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            if p.grad is None:
                host[start:stop].fill(0)  # unused on this rank this pass: it adds nothing to the sum
                continue
            grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
            self.events.append(reduce.copy_in(self.index, start, grad))

    def landed(self, done) -> bool:
        """Whether every copy has landed: the last one has (one in-order queue)."""
        return not self.events or done(self.events[-1])


class DistributedDataParallel(Module):
    """Wrap ``module`` so that ``backward()`` leaves every rank with the gradients averaged over ranks.

    Args:
        module: the model (its parameters on this rank's device); ``self.module`` is it, and the wrapper's
            ``state_dict`` keys carry PyTorch's ``module.`` prefix (save ``ddp.module.state_dict()`` for a
            checkpoint that loads without the wrapper).
        bucket_cap_mb: the size of a gradient bucket, in MiB (PyTorch's default, 25).
        min_buckets: a model whose gradients are smaller than ``min_buckets`` caps is split into buckets of
            1/min_buckets of its gradients instead (1: PyTorch's rule). One bucket can only be reduced
            once the whole backward pass is over; with several, the large gradients of the last layers
            are reduced while the device still computes the first layers' (two LeNet ranks on two cores,
            through MPI: wait at the end of backward 0.2 ms instead of 0.6, efficiency 0.88 instead of
            0.87; over shared memory the split made no difference beyond the noise).
        broadcast_buffers: broadcast rank 0's buffers (BatchNorm running statistics) at every training
            forward, as PyTorch does by default.

    Needs ``nc.distributed.init_process_group()`` first. ``with ddp.no_sync():`` skips the averaging
    (gradient accumulation over several backward passes; the first pass outside it averages the sum).
    """

    def __init__(self, module: Module, bucket_cap_mb: float = 25, broadcast_buffers: bool = True,
                 min_buckets: int = 4):
        super().__init__()
        from .. import distributed
        from ..distributed import bucket_reduce, collectives, process_group
        if not isinstance(module, Module):
            raise ShapeError(f"DistributedDataParallel wraps an nc.nn.Module, got {type(module).__name__}")
        if not isinstance(bucket_cap_mb, (int, float)) or not 0 < bucket_cap_mb < float("inf"):
            raise ShapeError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        if isinstance(min_buckets, bool) or not isinstance(min_buckets, int) or min_buckets < 1:
            raise ShapeError(f"min_buckets must be a positive int, got {min_buckets!r}")
        self.module = module
        object.__setattr__(self, "_group", process_group.group())
        object.__setattr__(self, "_collectives", collectives)
        object.__setattr__(self, "_comm", self._group.comm.Dup())  # never interleaves with user collectives
        self.bucket_cap_mb = bucket_cap_mb
        self.min_buckets = min_buckets
        self.broadcast_buffers = bool(broadcast_buffers)
        self.require_sync = True
        distributed.barrier()
        collectives.broadcast_many([p.detach() for p in module.parameters()] +
                                   [b for _, b in module.named_buffers()], src=0)
        gradient_bytes = sum(p.nbytes for p in module.parameters() if p.requires_grad)
        cap_bytes = min(bucket_cap_mb * MEBIBYTE, gradient_bytes / min_buckets)
        object.__setattr__(self, "_buckets", self._make_buckets(module.parameters(), cap_bytes))
        object.__setattr__(self, "_bucket_of", {id(p): b for b in self._buckets for p in b.params})
        devices = {p.device for b in self._buckets for p in b.params}
        object.__setattr__(self, "_reduce", bucket_reduce.for_group(
            self._group, self._comm, [(b.size, b.dtype) for b in self._buckets],
            next(iter(devices)) if len(devices) == 1 else None))
        object.__setattr__(self, "_hooks", [])
        object.__setattr__(self, "_pass_open", False)
        object.__setattr__(self, "_next_to_start", 0)
        # Seconds the host waited at the ends of backward passes, for the device's last gradients and for
        # the allreduces not finished by then, and how many buckets started while backward still ran.
        self.stats = {"passes": 0, "device_wait_s": 0.0, "mpi_wait_s": 0.0, "buckets_started_early": 0}
        if self._group.size > 1:
            for p in module.parameters():
                if p.requires_grad:
                    self._hooks.append(autograd_engine.register_post_accumulate_grad_hook(p, self._grad_ready))

    @staticmethod
    def _make_buckets(params, cap_bytes: float) -> list:
        buckets, current, current_bytes = [], [], 0
        for p in reversed([p for p in params if p.requires_grad]):
            if current and (current_bytes + p.nbytes > cap_bytes or p.dtype != current[0].dtype):
                buckets.append(_Bucket(len(buckets), current))
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += p.nbytes
        if current:
            buckets.append(_Bucket(len(buckets), current))
        return buckets

    @property
    def bucket_sizes(self) -> list[int]:
        """Elements per bucket, in the order their allreduces start."""
        return [b.size for b in self._buckets]

    @property
    def transport(self) -> str:
        """How buckets are averaged: "shared memory" (every rank on this node) or "mpi"."""
        return self._reduce.name

    @property
    def averaging(self) -> str:
        """Where the buckets' averages are computed: "device" (shared memory that the device's kernels
        read in place: CPU drivers) or "host"."""
        return "device" if self._reduce.averages_on_device else "host"

    # ---- forward -----------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.training and self.broadcast_buffers and self._group.size > 1:
            buffers = [b for _, b in self.module.named_buffers()]
            if buffers:  # host work between kernels: a replayed step (netcl.training.replay) repeats it
                recording.host_call(buffers[0].device, self._collectives.broadcast_many, buffers, src=0)
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> "DistributedDataParallel":
        """As Module.train; switching to eval mode also broadcasts rank 0's buffers, so that ranks sharing
        an evaluation all use the running statistics of the model rank 0 checkpoints."""
        super().train(mode)
        if not mode and self.broadcast_buffers and self._group.size > 1:
            buffers = [b for _, b in self.module.named_buffers()]
            if buffers:
                self._collectives.broadcast_many(buffers, src=0)
        return self

    def no_sync(self):
        """Context manager: backward passes inside it accumulate local gradients without averaging."""
        ddp = self

        class _NoSync:
            def __enter__(self):
                self.previous = ddp.require_sync
                ddp.require_sync = False

            def __exit__(self, *exc):
                ddp.require_sync = self.previous

        return _NoSync()

    # ---- the gradient pipeline ----------------------------------------------------------------------
    def _grad_ready(self, param: Tensor) -> None:
        if not self.require_sync:
            return
        if not self._pass_open:
            object.__setattr__(self, "_pass_open", True)
            autograd_engine.queue_backward_callback(self._finish_pass)
        if not self._reduce.needs_tests:
            return  # shared memory: nothing moves before every contribution is in; the pass's end copies all
        bucket = self._bucket_of[id(param)]
        bucket.waiting.discard(id(param))
        if not bucket.waiting and bucket.events is None:
            bucket.download(self._reduce)
        self._start_ready_buckets(block=False)  # MPI: start what has landed while backward still runs

    def _start_ready_buckets(self, block: bool) -> None:
        """Start, in bucket order, the allreduces whose host copies have landed; with ``block``, all of
        them, waiting for the device meanwhile while testing the running ones, so that a bucket's
        allreduce proceeds while the device still computes the gradients of the next."""
        from ..distributed import process_group
        if block and not self._reduce.needs_tests:
            self._start_all_when_landed()
            return
        done = self._collectives.event_done
        delay = 0.0
        while self._next_to_start < len(self._buckets):
            bucket = self._buckets[self._next_to_start]
            if bucket.events is None:
                if not block:
                    break
                bucket.download(self._reduce)  # never reached
            if not bucket.landed(done):
                if not block:
                    break
                # Sleep in the driver until the copies land, unless MPI needs tests to move the
                # allreduces already started (shared memory does not: a rank's sum waits for flags only).
                if not self._reduce.needs_tests or not self._test_running():
                    bucket.events[-1].wait()  # the others have landed by then (one in-order queue)
                    continue
                process_group.check_failures()
                time.sleep(delay)
                delay = min(2 * delay or 5e-5, 2e-4)
                continue
            self._reduce.start(bucket.index)
            object.__setattr__(self, "_next_to_start", self._next_to_start + 1)
            self.stats["buckets_started_early"] += not block
        if self._reduce.needs_tests:
            self._test_running()

    def _start_all_when_landed(self) -> None:
        """Shared memory: nothing moves before every contribution is in, so queue every bucket's copies
        at the end of the pass, sleep in the driver until the last lands (one in-order queue: all have
        then), and start every bucket."""
        remaining = self._buckets[self._next_to_start:]
        for bucket in remaining:
            if bucket.events is None:  # a parameter that got no gradient this pass kept it waiting
                bucket.download(self._reduce)
        last = next((b.events[-1] for b in reversed(remaining) if b.events), None)
        if last is not None:
            last.wait()
        for bucket in remaining:
            self._reduce.start(bucket.index)
        object.__setattr__(self, "_next_to_start", len(self._buckets))

    def _test_running(self) -> bool:
        """Test the started allreduces (MPI progresses non-blocking collectives only inside MPI calls);
        whether any is still running."""
        running = False
        for bucket in self._buckets[:self._next_to_start]:  # the started ones
            if not self._reduce.test(bucket.index):
                running = True
        return running

    def _finish_pass(self) -> None:
        from ..distributed import process_group
        try:
            started = time.perf_counter()
            self._start_ready_buckets(block=True)
            device_done = time.perf_counter()
            # Every gradient has landed, so this rank's device is idle until the averages come back: on
            # cores of its own the wait tests without sleeping (MPI moves a non-blocking allreduce only
            # inside MPI_Test: sleeps between tests stretched LeNet's 0.4 ms allreduce to 1.3 ms).
            for bucket in self._buckets:
                process_group.wait_until(functools.partial(self._reduce.test, bucket.index),
                                         spin=self._group.owns_cores)
            self.stats["passes"] += 1
            self.stats["device_wait_s"] += device_done - started
            self.stats["mpi_wait_s"] += time.perf_counter() - device_done
            for bucket in self._buckets:
                self._write_back(bucket)
        finally:
            for bucket in self._buckets:
                bucket.reset()
            object.__setattr__(self, "_pass_open", False)
            object.__setattr__(self, "_next_to_start", 0)

    def _write_back(self, bucket: _Bucket) -> None:
        from ..runtime import memory
        for p in bucket.params:
            if p.grad is None or not p.grad.is_contiguous():
                p.grad = Tensor.empty(p.shape, p.dtype, p.device)
        if self._reduce.averages_on_device:
            self._reduce.average_into(bucket.index, bucket.offsets, [p.grad for p in bucket.params])
            return
        result = self._reduce.result(bucket.index)
        for p, start, stop in zip(bucket.params, bucket.offsets, bucket.offsets[1:]):
            # asynchronous: the next pass downloads into this host buffer only behind this upload
            memory.upload(p.device, p.grad.buffer, result[start:stop], p.grad.offset * p.dtype.itemsize, wait=False)

    def extra_repr(self) -> str:
        return (f"world_size={self._group.size}, buckets={len(self._buckets)}, "
                f"bucket_cap_mb={self.bucket_cap_mb}")
