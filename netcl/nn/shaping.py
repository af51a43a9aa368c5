"""Layers that move data without arithmetic: Reshape, Permute, Concat, ConstantPad2d (an imported ONNX
graph's Reshape, Transpose, Concat and Pad nodes become these). None holds parameters."""
from __future__ import annotations

import numbers

from ..autograd.rules_tensor import cat
from ..errors import ShapeError
from . import functional as F
from ..module import Module


def _ints(values, what: str) -> tuple[int, ...]:
    values = (values,) if isinstance(values, numbers.Integral) else tuple(values)
    if any(not isinstance(v, numbers.Integral) or isinstance(v, bool) for v in values):
        raise ShapeError(f"{what} takes ints, got {values!r}")
    return tuple(int(v) for v in values)


class Reshape(Module):
    """x.reshape(shape): one entry may be −1 (inferred). With ``copy_zeros`` (ONNX's Reshape) a 0 keeps the
    input's size along that axis, so a shape such as (0, −1) flattens any batch."""

    def __init__(self, shape, copy_zeros: bool = False):
        super().__init__()
        self.shape = _ints(shape, "Reshape shape")
        self.copy_zeros = bool(copy_zeros)
        if sum(1 for d in self.shape if d == -1) > 1 or any(d < -1 for d in self.shape):
            raise ShapeError(f"Reshape shape {self.shape} may hold one −1 and no other negative size")

    def forward(self, x):
        shape = self.shape
        if self.copy_zeros and 0 in shape:
            if any(d == 0 and i >= x.ndim for i, d in enumerate(shape)):
                raise ShapeError(f"Reshape {shape}: a 0 copies an axis the input of shape {x.shape} does not have")
            shape = tuple(x.shape[i] if d == 0 else d for i, d in enumerate(shape))
        return x.reshape(shape)

    def extra_repr(self):
        return f"shape={self.shape}" + (", copy_zeros=True" if self.copy_zeros else "")


class Permute(Module):
    """x.permute(dims): output axis i is input axis dims[i]."""

    def __init__(self, dims):
        super().__init__()
        self.dims = _ints(dims, "Permute dims")
        if sorted(self.dims) != list(range(len(self.dims))):
            raise ShapeError(f"Permute dims {self.dims} must be a permutation of 0..{len(self.dims) - 1}")

    def forward(self, x):
        if x.ndim != len(self.dims):
            raise ShapeError(f"Permute{self.dims} takes {len(self.dims)}-D input, got shape {x.shape}")
        return x.permute(*self.dims)

    def extra_repr(self):
        return f"dims={self.dims}"


class Concat(Module):
    """nc.cat(inputs, dim) of its arguments: Concat(1)(a, b, c) joins feature maps along channels
    (DenseNet's and Inception's joins)."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = _ints(dim, "Concat dim")[0]

    def forward(self, *tensors):
        return cat(list(tensors), self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class ConstantPad2d(Module):
    """Pads the last two dims with ``value``: ``padding`` is an int or (left, right, top, bottom), as
    PyTorch's; negative widths crop. Any even number of widths pads that many trailing dims (from the last
    backwards, as F.pad)."""

    def __init__(self, padding, value: float = 0.0):
        super().__init__()
        padding = _ints(padding, "ConstantPad2d padding")
        self.padding = padding * 4 if len(padding) == 1 else padding
        if len(self.padding) % 2:
            raise ShapeError(f"ConstantPad2d padding {padding} needs (before, after) pairs")
        self.value = float(value)

    def forward(self, x):
        return F.pad(x, self.padding, value=self.value)

    def extra_repr(self):
        return f"padding={self.padding}, value={self.value}"
