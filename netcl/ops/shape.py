"""Joining tensors: cat along an existing axis (stack is cat of unsqueezed inputs, in autograd).

Each input goes into its slice of the output with one device copy (a driver memcpy when both sides are
contiguous, else kernels/copy.cl's strided copy): no host round trip.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor
from .elementwise import cast, copy_into


def normalize_dim(dim, ndim: int, what: str) -> int:
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool):
        raise ShapeError(f"{what}: dim must be an int, got {dim!r}")
    if not -ndim <= dim < max(ndim, 1):
        raise ShapeError(f"{what}: dim {dim} is out of range for tensors of rank {ndim}")
    return int(dim) % max(ndim, 1)


def cat_dtype(tensors) -> np.dtype:
    return dtypes.as_dtype(np.result_type(*(t.dtype for t in tensors)))


def check_cat(tensors, dim) -> tuple[list[Tensor], int]:
    """The inputs that take part (PyTorch skips 1-D empty ones) and the normalized dim; typed errors else."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat needs at least one tensor")
    for t in tensors:
        if not isinstance(t, Tensor):
            raise DTypeError(f"cat takes tensors, got {type(t).__name__}")
        tensors[0].same_device(t, "cat")
    joined = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    ref = joined[0]
    if ref.ndim == 0:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated (use stack)")
    d = normalize_dim(dim, ref.ndim, "cat")
    for t in joined:
        if t.ndim != ref.ndim or any(n != m for k, (n, m) in enumerate(zip(t.shape, ref.shape)) if k != d):
            raise ShapeError(f"cat along dim {d}: shapes {' and '.join(str(u.shape) for u in joined)} differ "
                             "outside that dim")
    return joined, d


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenation along ``dim``, promoting dtypes as PyTorch does."""
    joined, d = check_cat(tensors, dim)
    dt = cat_dtype(joined)
    ref = joined[0]
    shape = ref.shape[:d] + (sum(t.shape[d] for t in joined),) + ref.shape[d + 1:]
    out = Tensor.empty(shape, dt, ref.device)
    start = 0
    for t in joined:
        n = t.shape[d]
        if n:
            copy_into(_part(out, d, start, n), t if t.dtype == dt else cast(t, dt))
        start += n
    return out


def _part(out: Tensor, d: int, start: int, n: int) -> Tensor:
    """The view out[..., start:start+n, ...] along dim d."""
    shape = out.shape[:d] + (n,) + out.shape[d + 1:]
    return out._view(shape, out.strides, out.offset + start * out.strides[d])
