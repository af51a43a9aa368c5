"""Activation layers: ReLU, Tanh, Sigmoid, LeakyReLU, GELU, Hardtanh, ReLU6, Hardswish, Hardsigmoid, SiLU,
Softmax, LogSoftmax, and Identity.

Each forward is one call into netcl.nn.functional; none holds parameters.
"""
from __future__ import annotations

import numbers

from ..errors import ShapeError
from . import functional as F
from ..module import Module


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()

    def forward(self, x):
        return x.relu()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class LeakyReLU(Module):
    """y = x for x > 0, negative_slope·x otherwise."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        if not isinstance(negative_slope, numbers.Real):
            raise ShapeError(f"LeakyReLU negative_slope must be a number, got {negative_slope!r}")
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class GELU(Module):
    """x·Φ(x) with the exact erf (approximate="none", PyTorch's default) or the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ShapeError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Hardtanh(Module):
    """min(max(x, min_val), max_val); the gradient passes strictly between the bounds only."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        for value, name in ((min_val, "min_val"), (max_val, "max_val")):
            if not isinstance(value, numbers.Real):
                raise ShapeError(f"{type(self).__name__} {name} must be a number, got {value!r}")
        if not max_val > min_val:
            raise ShapeError(f"{type(self).__name__}: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val = float(min_val), float(max_val)

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6) (MobileNetV2's activation); a Hardtanh(0, 6) as in PyTorch. netcl.nn.fusion fuses
    it into a BatchNorm before it."""

    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0)

    def extra_repr(self):
        return ""


class _Pointwise(Module):
    """A parameterless activation whose forward is the class's ``function``; ``inplace`` is accepted for
    PyTorch's signature (the result is always a new tensor)."""

    function = None

    def __init__(self, inplace: bool = False):
        super().__init__()

    def forward(self, x):
        return type(self).function(x)


class Hardswish(_Pointwise):
    """x·relu6(x + 3)/6 (MobileNetV3's activation)."""

    function = staticmethod(F.hardswish)


class Hardsigmoid(_Pointwise):
    """relu6(x + 3)/6 (MobileNetV3's squeeze-and-excitation gate)."""

    function = staticmethod(F.hardsigmoid)


class SiLU(_Pointwise):
    """x·sigmoid(x) (Swish; EfficientNet's activation)."""

    function = staticmethod(F.silu)


class Softmax(Module):
    """exp(x) / Σ exp(x) along ``dim`` (computed around the maximum, so it never overflows)."""

    log = False

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.log_softmax(x, self.dim) if self.log else F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log(softmax(x)) along ``dim`` in one stable pass: x − max − log Σ exp(x − max)."""

    log = True


class Identity(Module):
    """Returns its input; takes and ignores any constructor arguments, as PyTorch's does."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x
