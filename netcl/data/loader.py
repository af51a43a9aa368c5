"""DataLoader: batches of a Dataset, prepared on the host in a background thread, uploaded without waiting.

Iterating yields each batch as device tensors (a tuple, e.g. (images, labels)). Three things overlap:
a worker thread gathers and transforms the next batches (a bounded queue of ``prefetch`` batches ahead);
the consumer enqueues batch i+1's upload before it hands out batch i, so the copy waits in the device's
in-order queue behind step i's kernels instead of the host waiting for it; and the device works on step i.

Uploads are non-blocking copies from host arrays that must live until the copy ran. pyopencl keeps the
array alive in the copy's event (a NannyEvent) — and *waits for the copy* when that event is deleted, so
dropping it at once would make every upload synchronous again (measured: deleting the event of a copy
queued behind a 2 s kernel took 2 s). The loader therefore keeps the events and lets go of each only once
its copy has completed.

Order: with ``shuffle``, epoch e visits the permutation drawn from (seed, e); ``seed`` defaults to a draw
from ``netcl.random.host_generator()`` at construction (so ``nc.manual_seed`` fixes it). Random transforms
get one generator per batch from (seed, e, batch index). A run resumed at epoch e therefore sees exactly
the batches the uninterrupted run saw. The epoch advances after each complete pass, or is set by
``set_epoch`` (which also reaches a sampler that has one, such as DistributedSampler).

An exception in the worker is raised again in the consumer; leaving the loop early (break, an exception,
dropping the iterator) stops and joins the worker.
"""
from __future__ import annotations

import queue
import threading

import numpy as np
import pyopencl as cl

from .. import dtypes
from ..errors import ShapeError
from ..runtime import memory
from ..runtime.device import resolve_device
from ..tensor import Tensor
from .dataset import Dataset, TensorDataset

_DONE = object()


class _WorkerFailure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class DataLoader:
    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 sampler=None, seed: int | None = None, device=None, prefetch: int = 2):
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ShapeError(f"DataLoader batch_size must be a positive int, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ShapeError("DataLoader: sampler and shuffle=True exclude each other (the sampler decides the order)")
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ShapeError(f"DataLoader prefetch must be a positive int, got {prefetch!r}")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ShapeError(f"DataLoader needs a dataset with __len__ and __getitem__, got {type(dataset).__name__}")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.drop_last, self.sampler, self.prefetch = bool(shuffle), bool(drop_last), sampler, prefetch
        if seed is None:
            from .. import random as nc_random
            seed = int(nc_random.host_generator().integers(2**62))
        self.seed = int(seed)
        self.device = resolve_device(device)
        self.epoch = 0
        self._uploads_in_flight: list = []

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    def indices(self, epoch: int) -> np.ndarray:
        """The dataset indices epoch ``epoch`` visits, in order (before batching)."""
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, int(epoch)]).permutation(n)

    def __iter__(self):
        return self._iterate()

    # ---- the host side: the worker thread ----------------------------------------------------------------
    def _host_batch(self, epoch: int, k: int, index: np.ndarray):
        rng = np.random.default_rng([self.seed, epoch, k])
        get_batch = getattr(self.dataset, "get_batch", None)
        if get_batch is None:  # a dataset that does not derive from nc.data.Dataset
            get_batch = lambda idx, r: Dataset.get_batch(self.dataset, idx, r)  # noqa: E731
        batch = get_batch(index, rng)
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)

    def _work(self, epoch: int, batches: list, out: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False
        try:
            for k, index in enumerate(batches):
                if not put(self._host_batch(epoch, k, index)):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_WorkerFailure(exc))

    # ---- the device side: uploads -----------------------------------------------------------------------
    def _upload(self, arrays: tuple) -> tuple:
        still = [e for e in self._uploads_in_flight
                 if e.command_execution_status != cl.command_execution_status.COMPLETE]
        tensors = []
        for array in arrays:
            host = np.asarray(array)
            # as nc.tensor would store it (uint8 pixels become int32: OpenCL tensors have no uint8)
            host = np.ascontiguousarray(host, dtype=dtypes.host_dtype_for(host))
            t = Tensor.empty(host.shape, host.dtype, self.device)
            event = memory.upload(self.device, t.buffer, host, t.offset * host.dtype.itemsize, wait=False)
            if event is not None:
                still.append(event)  # holds `host` until the copy completed (see the module docstring)
            tensors.append(t)
        self._uploads_in_flight = still
        return tuple(tensors)

    def _iterate(self):
        epoch = self.epoch
        order = self.indices(epoch)
        steps = len(order) // self.batch_size if self.drop_last else -(-len(order) // self.batch_size)
        batches = [order[k * self.batch_size:(k + 1) * self.batch_size] for k in range(steps)]
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        worker = threading.Thread(target=self._work, args=(epoch, batches, ready, stop), daemon=True,
                                  name="netcl-data-loader")
        worker.start()

        def next_upload():
            item = ready.get()
            if isinstance(item, _WorkerFailure):
                raise item.exc
            return None if item is _DONE else self._upload(item)
        try:
            pending = next_upload()
            while pending is not None:
                current = pending
                pending = next_upload()
                yield current
            self.epoch = epoch + 1
        finally:
            stop.set()
            worker.join()


class BatchLoader(DataLoader):
    """The former MNIST loader, now a thin alias: DataLoader(TensorDataset(images, labels), ...) shuffled by
    default. It no longer scales or normalizes: pass a transform (nc.data.transforms.Normalize) for that."""

    def __init__(self, images, labels, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, device=None, transform=None):
        super().__init__(TensorDataset(images, labels, transform), batch_size=batch_size, shuffle=shuffle,
                         drop_last=drop_last, seed=seed, device=device)
