"""Mini-batches on the device: seeded shuffling, normalization, and uploads that overlap compute.

Iterating a :class:`BatchLoader` yields (images float32 [B, 1, H, W], labels int64 [B]) Tensors. Before it
hands out batch i it has already gathered and normalized batch i+1 on the host and enqueued its upload
without waiting, so the copy sits in the device queue behind the kernels of step i and the host goes
straight back to launching work. Epoch e's order is a pure function of (seed, e): a resumed run sees the
same batches as an uninterrupted one.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..runtime import memory
from ..runtime.device import resolve_device
from ..tensor import Tensor


class BatchLoader:
    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, shuffle: bool = True,
                 seed: int = 0, mean: float = 0.0, std: float = 1.0, scale: float = 1.0 / 255.0,
                 drop_last: bool = False, device=None, limit: int | None = None):
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.ndim == 3:
            images = images[:, None]
        if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ShapeError(f"BatchLoader needs images (N, [C,] H, W) and labels (N,), got {images.shape} "
                             f"and {labels.shape}")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ShapeError(f"batch_size must be a positive int, got {batch_size!r}")
        if std <= 0:
            raise ShapeError(f"std must be positive, got {std}")
        self.images, self.labels = images, labels.astype(np.int64)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, int(seed)
        self.drop_last, self.limit = drop_last, limit
        # x_normalized = (x * scale - mean) / std = x * a + b, done once per batch in float32
        self._a = np.float32(scale / std)
        self._b = np.float32(-mean / std)
        self.device = resolve_device(device)
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.labels)
        steps = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return min(steps, self.limit) if self.limit is not None else steps

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.labels))
        return np.random.default_rng([self.seed, int(epoch)]).permutation(len(self.labels))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _host_batch(self, index: np.ndarray):
        x = self.images[index].astype(np.float32)
        x *= self._a
        x += self._b
        return x, self.labels[index]

    def _upload(self, index: np.ndarray):
        x, y = self._host_batch(index)
        tx = Tensor.empty(x.shape, np.float32, self.device)
        ty = Tensor.empty(y.shape, np.int64, self.device)
        # Non-blocking: the host arrays stay referenced by the returned tuple until the batch is consumed.
        memory.upload(self.device, tx.buffer, x, tx.offset * 4, wait=False)
        memory.upload(self.device, ty.buffer, y, ty.offset * 8, wait=False)
        return tx, ty, (x, y)

    def __iter__(self):
        order = self.order(self.epoch)
        steps = len(self)
        bounds = [(i * self.batch_size, min((i + 1) * self.batch_size, len(order))) for i in range(steps)]
        pending = self._upload(order[slice(*bounds[0])]) if steps else None
        for k in range(steps):
            current = pending
            pending = self._upload(order[slice(*bounds[k + 1])]) if k + 1 < steps else None
            yield current[0], current[1]
        self.epoch += 1
