"""Backward rules of the PyTorch-style tensor functions: cat, stack, where, maximum/minimum, clamp,
max/min with indices, and copies between devices. Gradient conventions are PyTorch's (ties included).
"""
from __future__ import annotations

import collections
import numbers

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..ops import elementwise as ew
from ..ops import reduce as red
from ..ops import shape as shape_ops
from ..runtime import memory
from ..tensor import Tensor
from .function import Function
from .rules import _unbroadcast

# The (values, indices) pair that max/min along a dim return, like torch.return_types.max.
MaxResult = collections.namedtuple("max", ["values", "indices"])
MinResult = collections.namedtuple("min", ["values", "indices"])


def _as_input_grad(g: Tensor | None, operand) -> Tensor | None:
    """g summed to the operand's shape and in its dtype; None for a number operand."""
    if g is None or not isinstance(operand, Tensor):
        return None
    g = _unbroadcast(g, operand.shape)
    return g if g.dtype == operand.dtype else ew.cast(g, operand.dtype)


def _device_of(*operands):
    return next(o.device for o in operands if isinstance(o, Tensor))


# ---- joining ----------------------------------------------------------------------------------------
class Cat(Function):
    @staticmethod
    def forward(ctx, *tensors, dim):
        joined, d = shape_ops.check_cat(tensors, dim)
        ctx.dim = d
        ctx.parts = [(t.shape[d] if any(t is u for u in joined) else None, t.dtype) for t in tensors]
        return shape_ops.cat(joined, d)

    @staticmethod
    def backward(ctx, g):
        grads, start, d = [], 0, ctx.dim
        for n, dtype in ctx.parts:
            if n is None:  # an empty 1-D input PyTorch skips
                grads.append(None)
                continue
            part = g[(slice(None),) * d + (slice(start, start + n),)].contiguous()
            grads.append(part if part.dtype == dtype else ew.cast(part, dtype))
            start += n
        return tuple(grads)


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along an existing dim (``torch.cat``); differentiable; dtypes promote."""
    return Cat.apply(*tensors, dim=dim)


def stack(tensors, dim: int = 0) -> Tensor:
    """Join equally shaped tensors along a new dim (``torch.stack``); differentiable."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack needs at least one tensor")
    for t in tensors:
        if not isinstance(t, Tensor):
            raise DTypeError(f"stack takes tensors, got {type(t).__name__}")
        if t.shape != tensors[0].shape:
            raise ShapeError(f"stack needs tensors of one shape, got {tensors[0].shape} and {t.shape}")
    d = shape_ops.normalize_dim(dim, tensors[0].ndim + 1, "stack")
    return cat([t.unsqueeze(d) for t in tensors], d)


# ---- selection --------------------------------------------------------------------------------------
class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.cond = cond if cond.dtype == dtypes.BOOL else ew.cast(cond, dtypes.BOOL)
        ctx.a, ctx.b = a, b
        return ew.where(ctx.cond, a, b)

    @staticmethod
    def backward(ctx, g):
        ga = ew.where(ctx.cond, g, 0) if ctx.needs_input_grad[1] else None
        gb = ew.where(ctx.cond, 0, g) if ctx.needs_input_grad[2] else None
        return None, _as_input_grad(ga, ctx.a), _as_input_grad(gb, ctx.b)


def _tensor_or_number(value, device, what: str):
    if isinstance(value, (Tensor, numbers.Number)):
        return value
    if isinstance(value, (np.ndarray, list, tuple)):
        return Tensor.from_host(value, device)
    raise DTypeError(f"{what} takes tensors or numbers, got {type(value).__name__}")


def where(cond, a, b) -> Tensor:
    """``cond ? a : b`` elementwise with broadcasting (``torch.where``); a and b may be numbers."""
    if not isinstance(cond, Tensor):
        raise DTypeError(f"where's condition is a tensor, got {type(cond).__name__}")
    a = _tensor_or_number(a, cond.device, "where")
    b = _tensor_or_number(b, cond.device, "where")
    return Where.apply(cond, a, b)


# The gradient of maximum(a, b) goes to the larger operand and is halved on ties (PyTorch's rule);
# a NaN operand gets the whole gradient on both sides, as PyTorch's masks (comparisons with NaN are false).
_EXTREMUM_GRAD = {
    "maximum": ("{1} < {2} ? ({T})0 : ({1} == {2} ? {0} * ({T})0.5 : {0})",
                "{1} > {2} ? ({T})0 : ({1} == {2} ? {0} * ({T})0.5 : {0})"),
    "minimum": ("{1} > {2} ? ({T})0 : ({1} == {2} ? {0} * ({T})0.5 : {0})",
                "{1} < {2} ? ({T})0 : ({1} == {2} ? {0} * ({T})0.5 : {0})"),
}


class Extremum(Function):
    @staticmethod
    def forward(ctx, a, b, op):
        ctx.a, ctx.b, ctx.op = a, b, op
        return ew.binary(op, a, b)

    @staticmethod
    def backward(ctx, g):
        expr_a, expr_b = _EXTREMUM_GRAD[ctx.op]
        operands = [g, ctx.a, ctx.b]
        ga = ew.map_expr(expr_a, operands, compute_dtype=g.dtype) if ctx.needs_input_grad[0] else None
        gb = ew.map_expr(expr_b, operands, compute_dtype=g.dtype) if ctx.needs_input_grad[1] else None
        return _as_input_grad(ga, ctx.a), _as_input_grad(gb, ctx.b), None


def _extremum(op: str, a, b) -> Tensor:
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise DTypeError(f"{op} needs at least one tensor")
    device = _device_of(a, b)
    return Extremum.apply(_tensor_or_number(a, device, op), _tensor_or_number(b, device, op), op)


def maximum(a, b) -> Tensor:
    """Elementwise max (``torch.maximum``): NaN propagates; ties split the gradient in halves."""
    return _extremum("maximum", a, b)


def minimum(a, b) -> Tensor:
    """Elementwise min (``torch.minimum``): NaN propagates; ties split the gradient in halves."""
    return _extremum("minimum", a, b)


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, low, high):
        ctx.x, ctx.low, ctx.high = x, low, high
        return ew.clamp(x, low, high)

    @staticmethod
    def backward(ctx, g):
        # PyTorch's clamp_backward(_min_max): a boundary value passes the gradient to x, not to the bound
        x, low, high = ctx.x, ctx.low, ctx.high
        gx = glow = ghigh = None
        if ctx.needs_input_grad[0]:
            if low is not None and high is not None:
                gx = ew.map_expr("({1} >= {2} && {1} <= {3}) ? {0} : ({T})0", [g, x, low, high], compute_dtype=g.dtype)
            elif low is not None:
                gx = ew.map_expr("{1} >= {2} ? {0} : ({T})0", [g, x, low], compute_dtype=g.dtype)
            else:
                gx = ew.map_expr("{1} <= {2} ? {0} : ({T})0", [g, x, high], compute_dtype=g.dtype)
        if ctx.needs_input_grad[1]:
            expr = "({1} < {2} && {2} < {3}) ? {0} : ({T})0" if high is not None else "{1} < {2} ? {0} : ({T})0"
            glow = ew.map_expr(expr, [g, x, low] + ([high] if high is not None else []), compute_dtype=g.dtype)
        if ctx.needs_input_grad[2]:
            expr = "({1} > {2} || {2} < {3}) ? {0} : ({T})0" if low is not None else "{1} > {2} ? {0} : ({T})0"
            ghigh = ew.map_expr(expr, [g, x, high] + ([low] if low is not None else []), compute_dtype=g.dtype)
        return _as_input_grad(gx, x), _as_input_grad(glow, low), _as_input_grad(ghigh, high)


def clamp(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 — PyTorch's keyword names
    """``torch.clamp``: bounds are numbers, tensors (broadcast) or None; at least one is given."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"clamp takes a tensor, got {type(x).__name__}")
    low = None if min is None else _tensor_or_number(min, x.device, "clamp")
    high = None if max is None else _tensor_or_number(max, x.device, "clamp")
    return Clamp.apply(x, low, high)


# ---- reductions with indices ----------------------------------------------------------------------
class IndexedReduce(Function):
    """max/min along one dim with the indices; the gradient goes to the chosen index only (PyTorch)."""

    @staticmethod
    def forward(ctx, x, op, dim, keepdim):
        values, indices = red.reduce_with_indices(x, op, dim, keepdim)
        ctx.shape, ctx.dim, ctx.indices = x.shape, (dim % x.ndim if x.ndim else 0), indices
        return values, indices

    @staticmethod
    def backward(ctx, g, _g_indices):
        from ..factories import arange
        if not ctx.shape:
            return g, None, None, None
        d, n = ctx.dim, ctx.shape[ctx.dim]
        kept = red.reduced_shape(ctx.shape, (d,), True)
        positions = arange(n, device=g.device).reshape((n,) + (1,) * (len(ctx.shape) - d - 1))
        chosen = ew.binary("eq", positions, ctx.indices.reshape(kept))  # in int64: exact for any length
        return ew.where(chosen, g.reshape(kept), 0), None, None, None


def max_min_with_indices(x: Tensor, op: str, dim: int, keepdim: bool):
    values, indices = IndexedReduce.apply(x, "argmax" if op == "max" else "argmin", dim, keepdim)
    return (MaxResult if op == "max" else MinResult)(values, indices)


# ---- devices --------------------------------------------------------------------------------------
def _copy_to_device(x: Tensor, device) -> Tensor:
    host = x.to_host()
    out = Tensor.empty(x.shape, x.dtype, device)
    if out.size:
        memory.upload(out.device, out.buffer, np.ascontiguousarray(host), out.offset * out.dtype.itemsize)
    return out


class ToDevice(Function):
    """A copy on another device; its gradient travels back to the source device."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.source = x.device
        return _copy_to_device(x, device)

    @staticmethod
    def backward(ctx, g):
        return _copy_to_device(g, ctx.source), None


def to_device(x: Tensor, device) -> Tensor:
    return ToDevice.apply(x, device)


# ---- padding ----------------------------------------------------------------------------------------
class ConstantPad(Function):
    """x placed inside a tensor filled with ``value``; widths are (before, after) per dim, none negative
    (netcl.nn.functional.pad crops negative widths first, as a view)."""

    @staticmethod
    def forward(ctx, x, widths, value):
        out_shape = tuple(n + b + a for n, (b, a) in zip(x.shape, widths))
        out = ew.fill(Tensor.empty(out_shape, x.dtype, x.device), value)
        ctx.inside = tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths))
        ew.copy_into(out[ctx.inside], x)
        return out

    @staticmethod
    def backward(ctx, g):
        return g[ctx.inside].contiguous(), None, None


def constant_pad(x: Tensor, widths, value=0.0) -> Tensor:
    """Pad (or, for negative widths, crop) each dim of x by ``widths``, a (before, after) pair per dim."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"pad: input must be a netcl Tensor, got {type(x).__name__}")
    widths = [tuple(int(v) for v in w) for w in widths]
    if len(widths) != x.ndim or any(len(w) != 2 for w in widths):
        raise ShapeError(f"pad: need one (before, after) pair per dim of the shape {x.shape}, got {widths}")
    crop = tuple(slice(max(0, -b), n - max(0, -a)) for n, (b, a) in zip(x.shape, widths))
    if any(s.stop - s.start <= 0 for s in crop):
        raise ShapeError(f"pad: widths {widths} crop the shape {x.shape} to nothing")
    if any(s.start or s.stop != n for s, n in zip(crop, x.shape)):
        x = x[crop]
    grow = tuple((max(0, b), max(0, a)) for b, a in widths)
    if not any(b or a for b, a in grow):
        return x
    return ConstantPad.apply(x, grow, value)
