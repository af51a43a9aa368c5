"""Reductions over one or more axes: sum, mean, max, min, argmax, argmin (kernels/reduce.cl)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import VARYING, PreparedLaunch, get_kernel, launch, local_size_1d
from ..tensor import Tensor
from .elementwise import as_contiguous, contiguous_view

CHUNK = 2048
ARG_OPS = ("argmax", "argmin")


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, numbers.Integral) or not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(int(a) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis}")
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce_one(x: Tensor, outer: int, R: int, inner: int, op: str, index: Tensor | None = None):
    """One chunked pass over (outer, R, inner); returns (values, indices, chunks)."""
    chunks = max(1, -(-R // CHUNK))
    acc = "double" if x.dtype == np.float64 else ("long" if x.dtype.kind in "ib" and op == "sum" else None)
    out_dtype = np.dtype(np.int64) if acc == "long" else x.dtype
    values = Tensor.empty((outer, chunks, inner), out_dtype, x.device)
    with_indices = op in ARG_OPS
    indices = Tensor.empty((outer, chunks, inner), np.int64, x.device) if with_indices else values
    kernel = get_kernel(x.device, "reduce.cl", "reduce_axis", IN_TYPE=dtypes.c_type(x.dtype), ACC_TYPE=acc,
                        OUT_TYPE=dtypes.c_type(out_dtype), OP=op, WITH_INDEX=index is not None)
    index = index if index is not None else values
    launch(x.device, kernel, (inner, chunks, outer), None, values.buffer, np.int64(values.offset),
           indices.buffer, np.int64(indices.offset), x.buffer, np.int64(x.offset), index.buffer, np.int64(index.offset),
           np.int64(outer), np.int64(R), np.int64(inner), np.int64(min(CHUNK, max(R, 1))))
    return values, (indices if with_indices else None), chunks


def _reduce_axis(x: Tensor, axis: int, op: str):
    outer = math.prod(x.shape[:axis])
    R = x.shape[axis]
    inner = math.prod(x.shape[axis + 1:])
    values, indices, chunks = _reduce_one(x, outer, R, inner, op)
    while chunks > 1:
        values, indices, chunks = _reduce_one(values, outer, chunks, inner, op, indices)
    shape = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    return contiguous_view(values, shape), (contiguous_view(indices, shape) if indices is not None else None)


def _check_nonempty(x: Tensor, axes, op: str) -> None:
    if any(x.shape[a] == 0 for a in axes) and op != "sum":
        raise ShapeError(f"{op} over an empty axis of a tensor of shape {x.shape}")


def reduce(x: Tensor, op: str, axis=None, keepdims: bool = False) -> Tensor:
    """sum / max / min / mean of x over axis (None: all axes). mean of ints is float32; sum of ints and
    bools is int64."""
    axes = normalize_axes(axis, x.ndim)
    _check_nonempty(x, axes, op)
    base = "sum" if op == "mean" else op
    y = as_contiguous(x)
    if op == "mean" and y.dtype.kind != "f":
        from .elementwise import cast
        y = cast(y, np.float32)
    if y.ndim == 0:
        y = contiguous_view(y, (1,))
        axes = (0,)
    for a in axes:
        y, _ = _reduce_axis(as_contiguous(y), a, base)
    if op == "mean":
        count = math.prod(x.shape[a] for a in axes) if x.ndim else 1
        from .elementwise import map_expr
        y = map_expr("{0} / {1}", [y, float(max(count, 1))], compute_dtype=y.dtype)
    return contiguous_view(y, reduced_shape(x.shape, axes, keepdims) if x.ndim else ())


def arg_reduce(x: Tensor, op: str, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the largest ("argmax") or smallest ("argmin") element (first on ties) along axis, or into
    the flattened tensor when axis is None."""
    if axis is None:
        if x.size == 0:
            raise ShapeError(f"{op} of an empty tensor")
        _, idx = _reduce_axis(contiguous_view(x, (x.size,)), 0, op)
        return contiguous_view(idx, (1,) * x.ndim if keepdims else ())
    return reduce_with_indices(x, op, axis, keepdims)[1]


def reduce_with_indices(x: Tensor, op: str, axis: int, keepdims: bool = False) -> tuple[Tensor, Tensor]:
    """(values, int64 indices) of the max ("argmax") or min ("argmin") along one axis (first on ties)."""
    if op not in ARG_OPS:
        raise ValueError(f"unknown indexed reduction {op!r}")
    if x.ndim == 0:
        if axis not in (0, -1):
            raise ShapeError(f"axis {axis} is out of range for a 0-d tensor")
        values, idx = _reduce_axis(contiguous_view(x, (1,)), 0, op)
        return contiguous_view(values, ()), contiguous_view(idx, ())
    if not isinstance(axis, numbers.Integral):
        raise ShapeError(f"{op} along one axis takes an int axis, got {axis!r}")
    (a,) = normalize_axes(axis, x.ndim)
    _check_nonempty(x, (a,), op)
    values, idx = _reduce_axis(as_contiguous(x), a, op)
    if keepdims:
        return values, idx
    shape = reduced_shape(x.shape, (a,), False)
    return contiguous_view(values, shape), contiguous_view(idx, shape)


def argmax(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    return arg_reduce(x, "argmax", axis, keepdims)


def argmin(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    return arg_reduce(x, "argmin", axis, keepdims)


class MeanOfRows:
    """``out <- rows.mean(axis=0)``, launched again and again over the same ``rows`` (kernels/mean_rows.cl).

    ``rows`` is a 2-D view whose rows are contiguous (any row stride, e.g. one parameter's slice of
    every rank's gradient bucket); each call names the ``out`` it writes, a contiguous tensor of
    ``rows.shape[1]`` elements of the same dtype on the same device (a parameter's ``.grad``, which
    autograd may replace between calls). The rows are summed in order and the sum scaled by
    ``1 / rows.shape[0]``, as ``np.sum(rows, axis=0) * (1 / R)`` computes it. Data-parallel training
    calls it once per parameter and backward pass, so the kernel's arguments are set once
    (:class:`~netcl.runtime.launching.PreparedLaunch`)."""

    def __init__(self, rows: Tensor):
        if rows.ndim != 2 or (rows.shape[1] > 1 and rows.strides[1] != 1):
            raise ShapeError(f"MeanOfRows needs a 2-D view with contiguous rows, got shape {rows.shape} "
                             f"and strides {rows.strides}")
        if not dtypes.is_float(rows.dtype):
            raise DTypeError(f"MeanOfRows averages float32 or float64 rows, got {rows.dtype}")
        if rows.shape[0] < 1:
            raise ShapeError(f"MeanOfRows needs at least one row, got shape {rows.shape}")
        self.rows = rows
        count, n = rows.shape
        kernel = get_kernel(rows.device, "mean_rows.cl", "mean_of_rows", T=dtypes.c_type(rows.dtype), ROWS=count)
        self._launch = PreparedLaunch(rows.device, kernel, (max(n, 1),), local_size_1d(rows.device, n), (
            VARYING, VARYING, rows.buffer, np.int64(rows.offset), np.int64(rows.strides[0]), np.int64(n),
            rows.dtype.type(1.0 / count)))

    def __call__(self, out: Tensor):
        """Enqueue the average into ``out``; returns the launch's event."""
        rows = self.rows
        if out.size != rows.shape[1] or not out.is_contiguous():
            raise ShapeError(f"MeanOfRows of rows {rows.shape} writes a contiguous tensor of {rows.shape[1]} "
                             f"elements, got shape {out.shape} with strides {out.strides}")
        if out.dtype != rows.dtype or out.device is not rows.device:
            raise DTypeError(f"MeanOfRows of {rows.dtype} rows on {rows.device.describe()} writes the same dtype "
                             f"on the same device, got {out.dtype} on {out.device.describe()}")
        return self._launch(out.buffer, np.int64(out.offset))
