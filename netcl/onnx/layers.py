"""Modules for ONNX operators with no nc.nn layer of their own: element-wise arithmetic between graph
values, Clip with one bound, HardSigmoid with other parameters than PyTorch's, Gemm's general form, Slice, Split, Gather,
the reductions and ONNX's Flatten/Squeeze/Unsqueeze/Cast. Each is built from differentiable Tensor
operations, so an imported graph trains through them.
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.rules import matmul
from ..autograd.rules_tensor import cat, maximum, minimum
from ..errors import DTypeError, ShapeError
from ..module import Module

BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Div": lambda a, b: a / b,
    "Pow": lambda a, b: a ** b,
}
VARIADIC = {"Max": maximum, "Min": minimum, "Sum": lambda a, b: a + b}
UNARY = {
    "Exp": lambda x: x.exp(), "Log": lambda x: x.log(), "Sqrt": lambda x: x.sqrt(), "Abs": lambda x: x.abs(),
    "Neg": lambda x: -x, "Reciprocal": lambda x: 1.0 / x,
}


class Elementwise(Module):
    """One of ONNX's broadcasting element-wise operators over its inputs (Add, Sub, Mul, Div, Pow; Max, Min
    and Sum of any number of inputs; Exp, Log, Sqrt, Abs, Neg, Reciprocal)."""

    def __init__(self, op_type: str):
        super().__init__()
        if op_type not in BINARY and op_type not in VARIADIC and op_type not in UNARY:
            raise ShapeError(f"Elementwise: unknown operator {op_type!r}")
        self.op_type = op_type

    def forward(self, *xs):
        if self.op_type in UNARY:
            return UNARY[self.op_type](xs[0])
        if self.op_type == "Div" and all(np.issubdtype(x.dtype, np.integer) for x in xs):
            raise DTypeError(f"Div of integer tensors ({xs[0].dtype}, {xs[1].dtype}) truncates in ONNX; netcl "
                             "imports Div of floats only")
        if self.op_type in BINARY:
            return BINARY[self.op_type](xs[0], xs[1])
        out = xs[0]
        for x in xs[1:]:
            out = VARIADIC[self.op_type](out, x)
        return out

    def extra_repr(self):
        return self.op_type


class Clip(Module):
    """min(max(x, low), high); either bound may be None."""

    def __init__(self, low=None, high=None):
        super().__init__()
        self.low = None if low is None else float(low)
        self.high = None if high is None else float(high)

    def forward(self, x):
        return x.clamp(self.low, self.high)

    def extra_repr(self):
        return f"low={self.low}, high={self.high}"


class HardSigmoid(Module):
    """max(0, min(1, alpha·x + beta)) (ONNX's defaults alpha 0.2, beta 0.5; PyTorch's form, alpha 1/6,
    imports as nc.nn.Hardsigmoid)."""

    def __init__(self, alpha: float = 0.2, beta: float = 0.5):
        super().__init__()
        self.alpha, self.beta = float(alpha), float(beta)

    def forward(self, x):
        return (x * self.alpha + self.beta).clamp(0.0, 1.0)

    def extra_repr(self):
        return f"alpha={self.alpha}, beta={self.beta}"


class Gemm(Module):
    """alpha · op(A) @ op(B) + beta · C, op a transpose where asked. ``weight`` (B) and ``bias`` (C) are
    parameters when the graph stores them; absent, they are the node's runtime inputs."""

    def __init__(self, alpha=1.0, beta=1.0, trans_a=False, trans_b=False, weight=None, bias=None):
        super().__init__()
        self.alpha, self.beta = float(alpha), float(beta)
        self.trans_a, self.trans_b = bool(trans_a), bool(trans_b)
        self.weight = weight
        self.bias = bias
        if weight is None:
            self.register_parameter("weight", None)
        if bias is None:
            self.register_parameter("bias", None)

    def forward(self, a, *rest):
        rest = list(rest)
        b = self.weight if self.weight is not None else rest.pop(0)
        c = self.bias if self.bias is not None else (rest.pop(0) if rest else None)
        a = a.transpose(0, 1).contiguous() if self.trans_a else a
        b = b.transpose(0, 1).contiguous() if self.trans_b else b
        y = matmul(a, b)
        if self.alpha != 1.0:
            y = y * self.alpha
        if c is not None:
            y = y + (c * self.beta if self.beta != 1.0 else c)
        return y

    def extra_repr(self):
        return f"alpha={self.alpha}, beta={self.beta}, trans_a={self.trans_a}, trans_b={self.trans_b}"


class MatMulWeight(Module):
    """x @ weight for a weight the graph stores (MatMul's second input)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return matmul(x, self.weight)


class MatMul(Module):
    def forward(self, a, b):
        return matmul(a, b)


class Slice(Module):
    """x[starts:ends:steps] along ``axes``; ends beyond the axis clamp, as ONNX's; steps must be positive."""

    def __init__(self, starts, ends, axes, steps):
        super().__init__()
        self.starts, self.ends = tuple(int(v) for v in starts), tuple(int(v) for v in ends)
        self.axes, self.steps = tuple(int(v) for v in axes), tuple(int(v) for v in steps)

    def forward(self, x):
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(self.starts, self.ends, self.axes, self.steps):
            n = x.shape[a]
            index[a] = slice(max(-n, min(s, n)), max(-n, min(e, n)), st)
        return x[tuple(index)]

    def extra_repr(self):
        return f"starts={self.starts}, ends={self.ends}, axes={self.axes}, steps={self.steps}"


class Split(Module):
    """Consecutive pieces of x along ``axis``: ``sizes`` when given, else ``parts`` equal pieces (the last
    smaller when the axis does not divide)."""

    def __init__(self, axis: int, sizes=None, parts: int | None = None):
        super().__init__()
        self.axis = int(axis)
        self.sizes = None if sizes is None else tuple(int(s) for s in sizes)
        self.parts = parts

    def forward(self, x):
        axis = self.axis % x.ndim
        n = x.shape[axis]
        sizes = self.sizes
        if sizes is None:
            step = math.ceil(n / self.parts)
            sizes = [min(step, n - k * step) for k in range(self.parts)]
        if sum(sizes) != n:
            raise ShapeError(f"Split sizes {tuple(sizes)} do not add up to axis {axis} of the shape {x.shape}")
        pieces, start = [], 0
        for size in sizes:
            pieces.append(x[(slice(None),) * axis + (slice(start, start + size),)])
            start += size
        return tuple(pieces)

    def extra_repr(self):
        return f"axis={self.axis}, sizes={self.sizes}, parts={self.parts}"


class Gather(Module):
    """x indexed along ``axis`` by constant indices: a scalar index drops the axis, a 1-D list keeps it."""

    def __init__(self, axis: int, indices):
        super().__init__()
        self.axis = int(axis)
        self.indices = np.asarray(indices, dtype=np.int64)
        if self.indices.ndim > 1:
            raise ShapeError(f"Gather takes a scalar or 1-D list of indices, got shape {self.indices.shape}")

    def forward(self, x):
        axis = self.axis % x.ndim
        n = x.shape[axis]
        lead = (slice(None),) * axis
        if self.indices.ndim == 0:
            return x[lead + (int(self.indices) % n,)]
        picks = [int(i) % n for i in self.indices]
        if picks == list(range(picks[0], picks[0] + len(picks))):
            return x[lead + (slice(picks[0], picks[0] + len(picks)),)]
        return cat([x[lead + (slice(i, i + 1),)] for i in picks], axis)

    def extra_repr(self):
        return f"axis={self.axis}, indices={self.indices.tolist()}"


class Reduce(Module):
    """mean, sum, max or min over ``axes`` (None: all)."""

    def __init__(self, op: str, axes=None, keepdims: bool = True):
        super().__init__()
        self.op = op
        self.axes = None if axes is None else tuple(int(a) for a in axes)
        self.keepdims = bool(keepdims)

    def forward(self, x):
        axes = None if self.axes is None else tuple(a % x.ndim for a in self.axes)
        return getattr(x, self.op)(axis=axes, keepdims=self.keepdims)

    def extra_repr(self):
        return f"{self.op}, axes={self.axes}, keepdims={self.keepdims}"


class Flatten(Module):
    """ONNX's Flatten: (d0 ... d(axis−1), d(axis) ...) -> (d0·…·d(axis−1), d(axis)·…)."""

    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = int(axis)

    def forward(self, x):
        axis = self.axis % (x.ndim + 1) if self.axis < 0 else self.axis
        return x.reshape((math.prod(x.shape[:axis]), -1))

    def extra_repr(self):
        return f"axis={self.axis}"


class Unsqueeze(Module):
    """Size-1 axes inserted at ``axes`` (positions in the output)."""

    def __init__(self, axes):
        super().__init__()
        self.axes = tuple(int(a) for a in axes)

    def forward(self, x):
        rank = x.ndim + len(self.axes)
        shape = list(x.shape)
        for a in sorted(a % rank for a in self.axes):
            shape.insert(a, 1)
        return x.reshape(tuple(shape))


class Squeeze(Module):
    """Size-1 axes removed: ``axes``, or every size-1 axis when None."""

    def __init__(self, axes=None):
        super().__init__()
        self.axes = None if axes is None else tuple(int(a) for a in axes)

    def forward(self, x):
        drop = {a % x.ndim for a in self.axes} if self.axes is not None else {i for i, d in enumerate(x.shape) if d == 1}
        if any(x.shape[a] != 1 for a in drop):
            raise ShapeError(f"Squeeze axes {sorted(drop)} of the shape {x.shape} are not all of size 1")
        return x.reshape(tuple(d for i, d in enumerate(x.shape) if i not in drop))


class Cast(Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = np.dtype(dtype)

    def forward(self, x):
        return x if x.dtype == self.dtype else x.astype(self.dtype)

    def extra_repr(self):
        return str(self.dtype)


class SymbolicReshape(Module):
    """ONNX's Reshape to a shape that holds the graph's symbolic sizes (graph.Dim), evaluated at each call
    from the sizes the model's inputs bind (OnnxModel passes them as ``sizes``); 0 copies the input's size."""

    def __init__(self, shape):
        super().__init__()
        self.shape = list(shape)

    def forward(self, x, sizes=None):
        from .graph import Dim
        try:
            shape = [d.value(sizes or {}) if isinstance(d, Dim) else int(d) for d in self.shape]
        except KeyError as exc:
            raise ShapeError(f"Reshape to {self.shape}: the size {exc.args[0]} is not bound by the model's inputs") from None
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return x.reshape(tuple(shape))

    def extra_repr(self):
        return f"shape={self.shape}"
