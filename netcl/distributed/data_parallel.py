"""DistributedDataParallel's gradient averaging: a model's gradients in buckets, averaged over the ranks
through one transport (netcl.distributed.transports, chosen by bucket_reduce) while backward runs.

The parameters, in reverse order (roughly the order in which backward produces their gradients), are
packed into buckets (``make_buckets``). During ``loss.backward()`` each parameter's gradient hook
(autograd's ``register_post_accumulate_grad_hook``) hands its bucket to the transport, which may start
moving it while the host goes on queueing the rest of the backward pass. When the pass ends (a backward
callback) the transport starts what has not started, every bucket's average is waited for, and the
transport writes the averages into each ``.grad``. The transport decides what happens at each of these
points; ``GradientBuckets`` only keeps the pass's order and its waits.

DistributedDataParallel (ddp.py) is the Module users wrap their model in; this is what it delegates to.
"""
from __future__ import annotations

import functools
import time
import weakref

import numpy as np

from ..autograd import function as autograd_engine
from ..tensor import Tensor
from . import bucket_reduce, collectives, process_group


class Bucket:
    """A run of parameters of one dtype whose gradients travel together, as bucket ``index`` of a
    transport; ``offsets`` are where each parameter's gradient starts in it."""

    def __init__(self, index: int, params: list):
        self.index = index
        self.params = params
        self.dtype = params[0].dtype
        self.offsets = np.cumsum([0] + [p.size for p in params]).tolist()
        self.size = self.offsets[-1]
        self.reset()

    def reset(self) -> None:
        self.waiting = set(range(len(self.params)))  # positions whose gradient this pass has not produced
        self.events = None  # the copies' events once they are queued

    def download(self, transport) -> None:
        """Queue the gradients' copies into the transport's contribution. Their events are kept: pyopencl
        waits for a copy into host memory when its event is dropped."""
        self.events = []
        host = transport.contribution(self.index)
        for p, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            if p.grad is None:
                host[start:stop].fill(0)  # unused on this rank this pass: it adds nothing to the sum
                continue
            grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
            self.events.append(transport.copy_in(self.index, start, grad))

    def landed(self) -> bool:
        """Whether every copy has landed: the last one has (one in-order queue)."""
        return not self.events or collectives.event_done(self.events[-1])


def make_buckets(params, cap_bytes: float) -> list[Bucket]:
    """The parameters that require grad, in reverse order, in runs of one dtype of at most ``cap_bytes``
    (a parameter larger than that alone)."""
    buckets, current, current_bytes = [], [], 0
    for p in reversed([p for p in params if p.requires_grad]):
        if current and (current_bytes + p.nbytes > cap_bytes or p.dtype != current[0].dtype):
            buckets.append(Bucket(len(buckets), current))
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += p.nbytes
    if current:
        buckets.append(Bucket(len(buckets), current))
    return buckets


class GradientBuckets:
    """The gradients of ``params`` averaged over ``group``'s ranks at the end of every backward pass
    while ``syncing`` (a pass outside it averages what passes inside it accumulated).

    ``stats`` counts the passes, the seconds the host waited at their ends for the device's last
    gradients (``device_wait_s``) and for the averages (``mpi_wait_s``), and the buckets that started
    while backward still ran."""

    def __init__(self, params, group, cap_bytes: float):
        self._group = group
        self.buckets = make_buckets(params, cap_bytes)
        devices = {p.device for b in self.buckets for p in b.params}
        comm = group.comm.Dup()  # never interleaves with user collectives
        self.transport = bucket_reduce.for_group(group, comm, [(b.size, b.dtype) for b in self.buckets],
                                                 next(iter(devices)) if len(devices) == 1 else None)
        self.syncing = True
        self.stats = {"passes": 0, "device_wait_s": 0.0, "mpi_wait_s": 0.0, "buckets_started_early": 0}
        self._pass_open = False
        if group.size > 1:
            # The parameters' hooks hold this object weakly, and go with it. Held strongly, they would
            # make a cycle (parameter -> hook -> buckets -> parameter) that only the garbage collector
            # frees, at a moment of its choosing on each rank; freeing a shared window is collective,
            # so a rank freeing one inside a backward pass would wait forever for a rank that waits for
            # its gradients. Released by reference counts, it goes at the same point on every rank.
            this = weakref.ref(self)
            hooks = [autograd_engine.register_post_accumulate_grad_hook(
                         p, functools.partial(_gradient_ready, this, bucket.index, position))
                     for bucket in self.buckets for position, p in enumerate(bucket.params)]
            weakref.finalize(self, _remove_hooks, hooks)

    def gradient_ready(self, index: int, position: int) -> None:
        """The hook of the parameter at ``position`` of bucket ``index``: its gradient is accumulated."""
        if not self.syncing:
            return
        bucket = self.buckets[index]
        if not self._pass_open:
            self._pass_open = True
            autograd_engine.queue_backward_callback(self._finish_pass)
        self.stats["buckets_started_early"] += self.transport.gradient_ready(self.buckets, bucket, position)

    def _finish_pass(self) -> None:
        try:
            started = time.perf_counter()
            self.transport.start_remaining(self.buckets)
            device_done = time.perf_counter()
            # Every gradient has landed, so this rank's device is idle until the averages come back: on
            # cores of its own the wait tests without sleeping (MPI moves a non-blocking allreduce only
            # inside MPI_Test, and sleeps between tests stretch it).
            for bucket in self.buckets:
                process_group.wait_until(functools.partial(self.transport.test, bucket.index),
                                         spin=self._group.owns_cores)
            self.stats["passes"] += 1
            self.stats["device_wait_s"] += device_done - started
            self.stats["mpi_wait_s"] += time.perf_counter() - device_done
            for bucket in self.buckets:
                for p in bucket.params:
                    if p.grad is None or not p.grad.is_contiguous():
                        p.grad = Tensor.empty(p.shape, p.dtype, p.device)
                self.transport.write_back(bucket)
        finally:
            for bucket in self.buckets:
                bucket.reset()
            self.transport.pass_ended()
            self._pass_open = False


def _gradient_ready(gradients: weakref.ref, index: int, position: int, param: Tensor) -> None:
    owner = gradients()
    if owner is not None:
        owner.gradient_ready(index, position)


def _remove_hooks(hooks) -> None:
    for hook in hooks:
        hook.remove()
