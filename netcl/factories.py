"""Tensor factories: zeros/ones/empty/full, counter-based rand/randn, and from-host helpers."""
from __future__ import annotations

import numbers

import numpy as np

from . import dtypes
from . import random as _random
from .errors import ShapeError
from .ops.elementwise import fill
from .runtime.kernels import get_kernel, launch, local_size_1d
from .tensor import Tensor


def _shape_of(shape) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return shape


def empty(shape, dtype=np.float32, device=None) -> Tensor:
    return Tensor.empty(shape, dtype, device)


def full(shape, value, dtype=np.float32, device=None) -> Tensor:
    return fill(Tensor.empty(shape, dtype, device), value)


def zeros(shape, dtype=np.float32, device=None) -> Tensor:
    return full(shape, 0, dtype, device)


def ones(shape, dtype=np.float32, device=None) -> Tensor:
    return full(shape, 1, dtype, device)


def zeros_like(t: Tensor) -> Tensor:
    return zeros(t.shape, t.dtype, t.device)


def tensor(array, device=None, requires_grad: bool = False, dtype=None) -> Tensor:
    """Same as Tensor.from_host."""
    return Tensor.from_host(array, device=device, requires_grad=requires_grad, dtype=dtype)


def next_seed(seed=None) -> int:
    """A seed for a random kernel: the given one, or a fresh one for each call."""
    if seed is not None:
        if not isinstance(seed, numbers.Integral) or seed < 0:
            raise ShapeError(f"a seed is a non-negative int, got {seed!r}")
        return int(seed) & (2**64 - 1)
    return _random.next_seed()


def random_fill(t: Tensor, dist: str, seed=None, p: float = 0.0) -> Tensor:
    """Fill ``t`` from the counter-based stream ``seed``: an int, None (a fresh seed per call) or a
    callable returning the seed of each call (a Dropout layer's own stream). Only a fixed int seed is
    repeated by a replay of a recorded step; the others draw anew at every replay."""
    dtypes.require_float(t.dtype, "random numbers")
    if t.size:
        kernel = get_kernel(t.device, "random.cl", "fill_random", T=dtypes.c_type(t.dtype), DIST=dist)
        draw = seed if callable(seed) else (_random.next_seed if seed is None else None)  # None: fixed
        value = np.uint64(next_seed(seed if draw is None else draw()))
        launch(t.device, kernel, (t.size,), local_size_1d(t.device, t.size), t.buffer, np.int64(t.offset),
               value, np.int64(t.size), t.dtype.type(p),
               dynamic=None if draw is None else {2: lambda: np.uint64(next_seed(draw()))})
    return t


def rand(*shape, seed=None, device=None, dtype=np.float32) -> Tensor:
    """Uniform samples in [0, 1)."""
    return random_fill(Tensor.empty(_shape_of(shape), dtype, device), "uniform", seed)


def randn(*shape, seed=None, device=None, dtype=np.float32) -> Tensor:
    """Standard normal samples."""
    return random_fill(Tensor.empty(_shape_of(shape), dtype, device), "normal", seed)


def arange(n: int, dtype=np.int64, device=None) -> Tensor:
    return Tensor.from_host(np.arange(n, dtype=dtypes.as_dtype(dtype)), device)
