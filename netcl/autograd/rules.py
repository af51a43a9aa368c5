"""Backward rules of the Tensor operations: each Function's forward and backward side by side.

Layer-level rules (convolution, pooling, losses, dropout) live beside this file in rules_nn.py; every
gradient netcl computes is defined in this package.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ShapeError
from ..ops import elementwise as ew
from ..ops import reduce as red
from ..tensor import Tensor
from .function import Function


def _unbroadcast(grad: Tensor, shape) -> Tensor:
    """Sum a broadcast gradient back to the operand's shape."""
    if grad.shape == tuple(shape):
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape) if n == 1 and grad.shape[lead + d] != 1)
    g = red.reduce(grad, "sum", axes, keepdims=True) if axes else grad
    return g.reshape(tuple(shape))


# ---- views ----------------------------------------------------------------------------------------
def _resolve_shape(shape, size: int) -> tuple[int, ...]:
    shape = tuple(int(n) for n in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape a tensor of {size} elements into {shape}")
        shape = tuple(size // known if n == -1 else n for n in shape)
    if any(n < 0 for n in shape) or math.prod(shape) != size:
        raise ShapeError(f"cannot reshape a tensor of {size} elements into {shape}")
    return shape


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        src = x if x.is_contiguous() else ew.contiguous_copy(x)
        return src._view(shape, None, src.offset)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.in_shape), None


def reshape(x: Tensor, shape) -> Tensor:
    shape = _resolve_shape(shape, x.size)
    if shape == x.shape:
        return x
    return Reshape.apply(x, shape)


class Permute(Function):
    @staticmethod
    def forward(ctx, x, axes):
        if sorted(int(a) % max(x.ndim, 1) for a in axes) != list(range(x.ndim)) or len(axes) != x.ndim:
            raise ShapeError(f"permute: {tuple(axes)} is not a permutation of the axes of a {x.ndim}-D tensor")
        axes = tuple(int(a) % x.ndim for a in axes)
        ctx.axes = axes
        return x._view(tuple(x.shape[a] for a in axes), tuple(x.strides[a] for a in axes), x.offset)

    @staticmethod
    def backward(ctx, g):
        inverse = tuple(np.argsort(ctx.axes))
        return g.permute(*inverse), None


class Contiguous(Function):
    @staticmethod
    def forward(ctx, x):
        return ew.contiguous_copy(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Expand(Function):
    @staticmethod
    def forward(ctx, x, shape):
        shape = tuple(x.shape[d - len(shape) + x.ndim] if n == -1 else n for d, n in enumerate(shape))
        if ew.broadcast_shapes(x.shape, shape) != shape:
            raise ShapeError(f"expand: cannot expand shape {x.shape} to {shape}")
        ctx.in_shape = x.shape
        return x._view(shape, ew.broadcast_strides(x, shape), x.offset)

    @staticmethod
    def backward(ctx, g):
        return _unbroadcast(g, ctx.in_shape), None


def _slice_view(x: Tensor, index):
    if not isinstance(index, tuple):
        index = (index,)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise ShapeError("an index can only have a single ellipsis")
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(f"too many indices ({n_real}) for a tensor of shape {x.shape}")
    expanded = []
    for i in index:
        if i is Ellipsis:
            expanded += [slice(None)] * (x.ndim - n_real)
        else:
            expanded.append(i)
    expanded += [slice(None)] * (x.ndim - sum(1 for i in expanded if i is not None))
    shape, strides, offset, d = [], [], x.offset, 0
    for i in expanded:
        if i is None:
            shape.append(1)
            strides.append(0)
            continue
        n, s = x.shape[d], x.strides[d]
        if isinstance(i, (numbers.Integral, np.integer)) and not isinstance(i, bool):
            k = int(i)
            if not -n <= k < n:
                raise ShapeError(f"index {k} is out of bounds for axis {d} of size {n} (shape {x.shape})")
            offset += (k % n) * s
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise ShapeError(f"slice step must be positive, got {step}")
            length = max(0, -(-(stop - start) // step))
            offset += start * s if length else 0
            shape.append(length)
            strides.append(s * step)
        else:
            raise ShapeError(f"netcl tensors take basic indices (ints, slices, ..., None), not {type(i).__name__}")
        d += 1
    return tuple(shape), tuple(strides), offset


class Slice(Function):
    @staticmethod
    def forward(ctx, x, index):
        shape, strides, offset = _slice_view(x, index)
        ctx.in_shape, ctx.index, ctx.dtype, ctx.device = x.shape, index, x.dtype, x.device
        return x._view(shape, strides, offset)

    @staticmethod
    def backward(ctx, g):
        grad = ew.fill(Tensor.empty(ctx.in_shape, ctx.dtype, ctx.device), 0)
        shape, strides, offset = _slice_view(grad, ctx.index)
        ew.copy_into(grad._view(shape, strides, offset), g)
        return grad, None


class Cast(Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        return ew.cast(x, dtype)

    @staticmethod
    def backward(ctx, g):
        return (g if g.dtype == ctx.in_dtype else ew.cast(g, ctx.in_dtype)), None


# ---- elementwise arithmetic -------------------------------------------------------------------
def _grad_of(op: str, a, b, out: Tensor, g: Tensor):
    """Gradients of out = a <op> b with respect to a and b (before unbroadcasting)."""
    if op == "add":
        return g, g
    if op == "sub":
        return g, -g
    if op == "mul":
        return g * b, g * a
    if op == "div":
        return g / b, -(g * out) / b
    if op == "pow":
        ga = g * b * (a ** (b - 1)) if isinstance(a, Tensor) else None
        gb = g * out * a.log() if isinstance(a, Tensor) else g * out * math.log(a)
        return ga, gb
    if op == "mod":  # a - floor(a / b) * b, PyTorch's remainder gradient
        return g, (-(g * ew.binary("floordiv", a, b)) if isinstance(b, Tensor) else None)
    return None, None  # comparisons and floor division have no gradient


class Binary(Function):
    @staticmethod
    def forward(ctx, a, b, op):
        out = ew.binary(op, a, b)
        ctx.op, ctx.a, ctx.b, ctx.out = op, a, b, out
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        ga, gb = _grad_of(ctx.op, a, b, ctx.out, g)
        ga = _unbroadcast(ga, a.shape) if isinstance(a, Tensor) and ga is not None and ctx.needs_input_grad[0] else None
        gb = _unbroadcast(gb, b.shape) if isinstance(b, Tensor) and gb is not None and ctx.needs_input_grad[1] else None
        return ga, gb, None


def binary(op: str, a, b) -> Tensor:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        device = a.device if isinstance(a, Tensor) else b.device
        a = Tensor.from_host(a, device) if isinstance(a, np.ndarray) else a
        b = Tensor.from_host(b, device) if isinstance(b, np.ndarray) else b
    if op in ew.COMPARISONS or op in ew.BITWISE or op == "floordiv":  # piecewise constant or not float
        return ew.binary(op, a, b)
    return Binary.apply(a, b, op)


_UNARY_GRAD = {
    "neg": lambda x, y, g: -g,
    "exp": lambda x, y, g: g * y,
    "log": lambda x, y, g: g / x,
    "tanh": lambda x, y, g: ew.map_expr("{0} * (({T})1 - {1} * {1})", [g, y]),
    "sqrt": lambda x, y, g: g / (y * 2.0),
    "abs": lambda x, y, g: g * ew.map_expr("({0} > 0) - ({0} < 0)", [x], compute_dtype=x.dtype),
    "relu": lambda x, y, g: ew.map_expr("{1} > ({T})0 ? {0} : ({T})0", [g, x]),
    "sigmoid": lambda x, y, g: ew.map_expr("{0} * {1} * (({T})1 - {1})", [g, y]),
}


class Unary(Function):
    @staticmethod
    def forward(ctx, x, op):
        y = ew.unary(op, x)
        ctx.op, ctx.x, ctx.y = op, x, y
        return y

    @staticmethod
    def backward(ctx, g):
        return _UNARY_GRAD[ctx.op](ctx.x, ctx.y, g), None


def unary(op: str, x: Tensor) -> Tensor:
    return Unary.apply(x, op)


# ---- reductions -----------------------------------------------------------------------------------
class Reduce(Function):
    @staticmethod
    def forward(ctx, x, op, axis, keepdims):
        out = red.reduce(x, op, axis, keepdims)
        ctx.op, ctx.x, ctx.out = op, x, out
        ctx.axes = red.normalize_axes(axis, x.ndim)
        return out

    @staticmethod
    def backward(ctx, g):
        x = ctx.x
        kept = red.reduced_shape(x.shape, ctx.axes, True)
        g = g.reshape(kept)
        if ctx.op == "sum":
            return g.expand(x.shape).contiguous(), None, None, None
        if ctx.op == "mean":
            count = math.prod(x.shape[a] for a in ctx.axes) if x.ndim else 1
            return (g / float(max(count, 1))).expand(x.shape).contiguous(), None, None, None
        # max/min: the gradient is shared equally among the tied extrema (PyTorch's amax/amin rule)
        mask = ew.binary("eq", x, ctx.out.reshape(kept))
        mask = ew.cast(mask, x.dtype)
        count = red.reduce(mask, "sum", ctx.axes, keepdims=True)
        return mask * (g / count), None, None, None


def reduce(op: str, x: Tensor, axis, keepdims: bool) -> Tensor:
    return Reduce.apply(x, op, axis, keepdims)


# ---- matrix products -------------------------------------------------------------------------------
class MatMul(Function):
    """2-D or batched 3-D products through netcl.ops.gemm (a batch of 1 broadcasts)."""

    @staticmethod
    def forward(ctx, a, b):
        from ..ops.gemm import gemm, gemm_batched
        ctx.a, ctx.b = a, b
        return gemm(a, b) if a.ndim == 2 else gemm_batched(a, b)

    @staticmethod
    def backward(ctx, g):
        from ..ops.gemm import gemm, gemm_batched
        a, b = ctx.a, ctx.b
        ga = gb = None
        if a.ndim == 2:
            if ctx.needs_input_grad[0]:
                ga = gemm(g, b, trans_b=True)
            if ctx.needs_input_grad[1]:
                gb = gemm(a, g, trans_a=True)
            return ga, gb
        if ctx.needs_input_grad[0]:
            ga = _unbroadcast(gemm_batched(g, b, trans_b=True), a.shape)
        if ctx.needs_input_grad[1]:
            gb = _unbroadcast(gemm_batched(a, g, trans_a=True), b.shape)
        return ga, gb


def matmul(a, b) -> Tensor:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        device = a.device if isinstance(a, Tensor) else b.device
        a = a if isinstance(a, Tensor) else Tensor.from_host(np.asarray(a), device)
        b = b if isinstance(b, Tensor) else Tensor.from_host(np.asarray(b), device)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul needs tensors of rank ≥ 1, got shapes {a.shape} and {b.shape}")
    squeeze_front = a.ndim == 1
    squeeze_back = b.ndim == 1
    a2 = a.reshape((1, a.shape[0])) if squeeze_front else a
    b2 = b.reshape((b.shape[0], 1)) if squeeze_back else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not multiply "
                         f"({a2.shape[-1]} != {b2.shape[-2]})")
    if a2.ndim == 2 and b2.ndim == 2:
        out = MatMul.apply(a2, b2)
    else:
        batch = ew.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        nb = math.prod(batch)
        a3 = a2.reshape((-1,) + a2.shape[-2:]) if a2.ndim > 2 else a2.reshape((1,) + a2.shape)
        b3 = b2.reshape((-1,) + b2.shape[-2:]) if b2.ndim > 2 else b2.reshape((1,) + b2.shape)
        if a3.shape[0] not in (1, nb) or b3.shape[0] not in (1, nb):
            raise ShapeError(f"matmul: batch dimensions of {a.shape} and {b.shape} must match or be 1")
        out = MatMul.apply(a3, b3).reshape(batch + (a2.shape[-2], b2.shape[-1]))
    if squeeze_front:
        out = out.reshape(out.shape[:-2] + (out.shape[-1],))
    if squeeze_back:
        out = out.reshape(out.shape[:-1])
    return out
