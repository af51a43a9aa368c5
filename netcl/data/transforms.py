"""Host-side transforms (torchvision's names) on NumPy images: a sample (C, H, W) or a batch (N, C, H, W).

Every transform returns a new array and never writes into its input (a sample may be a view of the
dataset). Random transforms draw from the ``rng`` they are called with — the DataLoader passes each
batch its own generator, a function of (seed, epoch, batch) — or, called without one, from
``netcl.random.host_generator()`` (seeded by ``nc.manual_seed``). On a batch every image gets its own
draw (its own crop offset, its own flip).

Nothing is scaled unasked: ``Normalize`` is the explicit step from pixel values to network inputs; on an
integer image it computes (x − mean)/std in float32 from the raw values (for MNIST's uint8 pixels use
``Normalize(0.1307 * 255, 0.3081 * 255)``, or ``Normalize(0.1307, 0.3081, scale=1/255)``).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import ShapeError


class Transform:
    """Base class: ``__call__(x, rng=None)`` on a (C, H, W) sample or an (N, C, H, W) batch."""

    def __call__(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__")

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({settings})"


def apply_transform(transform, x: np.ndarray, rng) -> np.ndarray:
    """Call a netcl Transform with the generator; a plain callable (a user's function) with the image only."""
    return transform(x, rng) if isinstance(transform, Transform) else transform(x)


def _generator(rng):
    if rng is not None:
        return rng
    from .. import random as nc_random
    return nc_random.host_generator()


def _image(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim not in (3, 4):
        raise ShapeError(f"{what} expects a (C, H, W) image or an (N, C, H, W) batch, got shape {x.shape}")
    return x


def _pair(value, what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in pair):
        raise ShapeError(f"{what} must be a positive int or an (h, w) pair of them, got {value!r}")
    return int(pair[0]), int(pair[1])


class Compose(Transform):
    """Apply transforms in order."""

    def __init__(self, transforms):
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise ShapeError(f"Compose takes callables, got {type(t).__name__}")

    def __call__(self, x, rng=None):
        for t in self.transforms:
            x = apply_transform(t, x, rng)
        return x


class Normalize(Transform):
    """(x·scale − mean) / std per channel (mean and std: a number or one per channel), in float32
    (float64 stays float64)."""

    def __init__(self, mean, std, scale: float = 1.0):
        self.mean = np.atleast_1d(np.asarray(mean, dtype=np.float64))
        self.std = np.atleast_1d(np.asarray(std, dtype=np.float64))
        self.scale = float(scale)
        sizes = (self.mean.size, self.std.size)
        if self.mean.ndim != 1 or self.std.ndim != 1 or (sizes[0] != sizes[1] and 1 not in sizes):
            raise ShapeError(f"Normalize needs mean and std with one value or one per channel, got "
                             f"{self.mean.shape} and {self.std.shape}")
        if not np.all(self.std > 0):
            raise ShapeError(f"Normalize std must be positive, got {std!r}")

    def __call__(self, x, rng=None):
        x = _image(x, "Normalize")
        channels = x.shape[-3]
        if max(self.mean.size, self.std.size) not in (1, channels):
            raise ShapeError(f"Normalize has {max(self.mean.size, self.std.size)} channel values for an image "
                             f"with {channels} channels (shape {x.shape})")
        dtype = np.float64 if x.dtype == np.float64 else np.float32
        # x·a + b with a = scale/std and b = −mean/std, one fused pass per operation in the output dtype
        a = (self.scale / self.std).astype(dtype).reshape(-1, 1, 1)
        b = (-self.mean / self.std).astype(dtype).reshape(-1, 1, 1)
        out = x.astype(dtype)
        out *= a
        out += b
        return out


class Pad(Transform):
    """Pad the borders: ``padding`` is an int (all sides), (left/right, top/bottom) or (left, top, right,
    bottom); ``padding_mode`` "constant" (with ``fill``), "edge", "reflect" or "symmetric"."""

    MODES = ("constant", "edge", "reflect", "symmetric")

    def __init__(self, padding, fill=0, padding_mode: str = "constant"):
        values = (padding,) if isinstance(padding, (int, np.integer)) else tuple(padding)
        if len(values) not in (1, 2, 4) or not all(isinstance(v, (int, np.integer)) and v >= 0 for v in values):
            raise ShapeError(f"Pad padding must be non-negative ints: one, (lr, tb) or (l, t, r, b); got {padding!r}")
        if padding_mode not in self.MODES:
            raise ShapeError(f"Pad padding_mode must be one of {self.MODES}, got {padding_mode!r}")
        if len(values) == 1:
            values = values * 4
        elif len(values) == 2:
            values = (values[0], values[1], values[0], values[1])
        self.padding = tuple(int(v) for v in values)
        self.fill, self.padding_mode = fill, padding_mode

    def __call__(self, x, rng=None):
        x = _image(x, "Pad")
        left, top, right, bottom = self.padding
        widths = [(0, 0)] * (x.ndim - 2) + [(top, bottom), (left, right)]
        if self.padding_mode == "constant":
            return np.pad(x, widths, mode="constant", constant_values=self.fill)
        return np.pad(x, widths, mode=self.padding_mode)


class RandomCrop(Transform):
    """Pad by ``padding`` (as Pad), then cut a ``size`` window at a uniformly random position."""

    def __init__(self, size, padding=0, fill=0, padding_mode: str = "constant"):
        self.size = _pair(size, "RandomCrop size")
        self.pad = Pad(padding, fill, padding_mode) if padding else None

    def __call__(self, x, rng=None):
        x = _image(x, "RandomCrop")
        if self.pad is not None:
            x = self.pad(x)
        h, w = self.size
        H, W = x.shape[-2:]
        if h > H or w > W:
            raise ShapeError(f"RandomCrop of {self.size} from an image of {H}x{W} (after padding)")
        rng = _generator(rng)
        batch = x if x.ndim == 4 else x[None]
        n = batch.shape[0]
        top = rng.integers(0, H - h + 1, size=n)
        left = rng.integers(0, W - w + 1, size=n)
        windows = sliding_window_view(batch, (h, w), axis=(2, 3))  # (N, C, H-h+1, W-w+1, h, w), a view
        out = windows[np.arange(n), :, top, left]  # advanced indices around a slice: (N, C, h, w), a copy
        return out if x.ndim == 4 else out[0]


class RandomHorizontalFlip(Transform):
    """Mirror left-right with probability p (each image of a batch decided on its own)."""

    def __init__(self, p: float = 0.5):
        if not 0 <= p <= 1:
            raise ShapeError(f"RandomHorizontalFlip p must be in [0, 1], got {p}")
        self.p = float(p)

    def __call__(self, x, rng=None):
        x = _image(x, "RandomHorizontalFlip")
        rng = _generator(rng)
        if x.ndim == 3:
            return x[..., ::-1].copy() if rng.random() < self.p else x.copy()
        flip = rng.random(x.shape[0]) < self.p
        return np.where(flip[:, None, None, None], x[..., ::-1], x)


__all__ = ["Transform", "Compose", "Normalize", "Pad", "RandomCrop", "RandomHorizontalFlip"]
