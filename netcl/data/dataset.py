"""Datasets: ``Dataset`` (PyTorch's map-style protocol) and ``TensorDataset`` over host arrays.

A dataset hands out host (NumPy) samples; the DataLoader batches and uploads them. Besides ``__getitem__``
a dataset may define ``get_batch(indices, rng)``, returning the collated batch at once: TensorDataset does,
gathering the images with one fancy index and running its transform on the whole batch (one NumPy pass
instead of one per image). ``rng`` is the batch's own generator, a function of (loader seed, epoch, batch),
so random augmentation replays exactly on resume whatever thread prepares the batch.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .transforms import apply_transform


class Dataset:
    """Subclass and define ``__len__`` and ``__getitem__(i) -> (x, y, ...)`` of NumPy arrays or numbers."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} does not define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not define __len__")

    def get_batch(self, indices: np.ndarray, rng: np.random.Generator):
        """The samples at ``indices`` stacked field by field (PyTorch's default collation)."""
        return collate([self[int(i)] for i in indices])


def collate(samples: list):
    """[(x0, y0), (x1, y1), ...] -> (stack(x), stack(y)); a bare sample per item gives one stacked array."""
    if not samples:
        raise ShapeError("cannot collate an empty batch")
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(np.stack([np.asarray(s[k]) for s in samples]) for k in range(len(first)))
    return np.stack([np.asarray(s) for s in samples])


def _host(array, what: str) -> np.ndarray:
    if hasattr(array, "to_host"):  # a netcl Tensor: datasets live on the host
        array = array.to_host()
    array = np.asarray(array)
    if array.ndim == 0:
        raise ShapeError(f"TensorDataset {what} must have a leading sample axis, got a scalar")
    return array


class TensorDataset(Dataset):
    """Samples ``(images[i], labels[i])`` of host arrays, with an optional transform of the images.

    images: (N, C, H, W), or (N, H, W), which gets a channel axis (C = 1), so samples are (C, H, W) as
    transforms and convolutions expect. They are handed out as stored: uint8 stays uint8 until a transform
    (such as Normalize) converts it; nothing is scaled unasked.
    labels: (N,). ``transform`` runs on each sample, or on each batch in get_batch.
    """

    def __init__(self, images, labels, transform=None):
        images, labels = _host(images, "images"), _host(labels, "labels")
        if images.ndim == 3:
            images = images[:, None]
        if labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ShapeError(f"TensorDataset needs images (N, [C,] H, W) and labels (N,) with the same N, got "
                             f"images {images.shape} and labels {labels.shape}")
        if transform is not None and not callable(transform):
            raise ShapeError(f"TensorDataset transform must be callable, got {type(transform).__name__}")
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index):
        n = len(self)
        if not -n <= int(index) < n:
            raise IndexError(f"index {index} is out of range for a TensorDataset of {n} samples")
        x = self.images[int(index)]
        if self.transform is not None:
            x = apply_transform(self.transform, x, None)
        return x, self.labels[int(index)]

    def get_batch(self, indices: np.ndarray, rng: np.random.Generator):
        x = self.images[indices]
        if self.transform is not None:
            x = apply_transform(self.transform, x, rng)
        return x, self.labels[indices]
