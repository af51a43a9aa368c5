"""The layers: Conv2d, Linear, ReLU, Tanh, MaxPool2d, AvgPool2d, Dropout, Flatten, Sequential, CrossEntropyLoss.

Constructors validate their arguments (nc.ShapeError names the bad value); forward delegates to
netcl.nn.functional, so every layer's gradient is defined by one rule in netcl.autograd.
"""
from __future__ import annotations

import numbers
from collections import OrderedDict

import numpy as np

from .. import dtypes
from ..errors import DeviceMemoryError, ShapeError
from ..ops.conv_common import pair
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module


def _check_fits(shape, dtype, device, what: str) -> None:
    """Refuse a parameter the device cannot hold before its initial values are drawn on the host."""
    from ..runtime.device import resolve_device
    dev = resolve_device(device)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > dev.max_alloc_bytes:
        raise DeviceMemoryError(f"{what} of shape {tuple(shape)} needs {nbytes:,} bytes; {dev.describe()} allows "
                                f"at most {dev.max_alloc_bytes:,} bytes in one allocation",
                                requested_bytes=nbytes, available_bytes=dev.max_alloc_bytes)


def _positive_int(value, name: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class Conv2d(Module):
    """2-D convolution through netcl.ops.conv2d (so every strategy trains).

    Shape: input (N, in_ch, H, W) -> output (N, out_ch, Ho, Wo),
    Ho = (H + 2·padding − dilation·(kernel − 1) − 1) // stride + 1.
    ``strategy`` forces one convolution algorithm; "auto" lets the planner choose per pass.
    """

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 strategy="auto", device=None, dtype=np.float32):
        super().__init__()
        self.in_channels = _positive_int(in_ch, "Conv2d in_ch")
        self.out_channels = _positive_int(out_ch, "Conv2d out_ch")
        self.groups = _positive_int(groups, "Conv2d groups")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ShapeError(f"Conv2d groups={groups} must divide in_ch={in_ch} and out_ch={out_ch}")
        self.kernel_size = pair(kernel_size, "Conv2d kernel_size", 1)
        self.stride = pair(stride, "Conv2d stride", 1)
        self.padding = pair(padding, "Conv2d padding", 0)
        self.dilation = pair(dilation, "Conv2d dilation", 1)
        self.strategy = strategy
        dt = dtypes.as_dtype(dtype)
        fan_in = self.in_channels // self.groups * self.kernel_size[0] * self.kernel_size[1]
        shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        _check_fits(shape, dt, device, "Conv2d weight")
        self.weight = Tensor.from_host(init.kaiming_uniform(shape, fan_in, dtype=dt), device, requires_grad=True)
        if bias:
            self.bias = Tensor.from_host(init.bias_uniform((self.out_channels,), fan_in, dt), device,
                                         requires_grad=True)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                        self.strategy)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, strategy={self.strategy!r}")


class Linear(Module):
    """y = x @ weight.T + bias; input (..., in_features) -> (..., out_features)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=np.float32):
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear in_features")
        self.out_features = _positive_int(out_features, "Linear out_features")
        dt = dtypes.as_dtype(dtype)
        _check_fits((self.out_features, self.in_features), dt, device, "Linear weight")
        self.weight = Tensor.from_host(init.kaiming_uniform((self.out_features, self.in_features), self.in_features,
                                                            dtype=dt), device, requires_grad=True)
        if bias:
            self.bias = Tensor.from_host(init.bias_uniform((self.out_features,), self.in_features, dt), device,
                                         requires_grad=True)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class _Pool2d(Module):
    op = "max"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        self.kernel_size = pair(kernel_size, f"{type(self).__name__} kernel_size", 1)
        self.stride = self.kernel_size if stride is None else pair(stride, f"{type(self).__name__} stride", 1)
        self.padding = pair(padding, f"{type(self).__name__} padding", 0)
        self.dilation = pair(dilation, f"{type(self).__name__} dilation", 1)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}")


class MaxPool2d(_Pool2d):
    """Max over kernel windows (taps ``dilation`` apart); the argmax is kept for backward.

    Shape: (N, C, H, W) -> (N, C, Ho, Wo), Ho = (H + 2·padding − dilation·(kernel − 1) − 1) // stride + 1;
    stride defaults to kernel_size.
    """

    def forward(self, x, fused_relu=False):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, fused_relu)


class AvgPool2d(_Pool2d):
    """Mean over kernel windows (taps ``dilation`` apart); padding counts as zeros in the mean unless
    ``count_include_pad=False``. Shapes as MaxPool2d."""

    op = "avg"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, dilation)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.count_include_pad)


class Dropout(Module):
    """Zeroes elements with probability p while training (scaling the rest by 1/(1−p)); identity in eval.

    Each call draws from a counter-based stream: call k of a Dropout with seed s always drops the same
    elements, so a seeded training run replays exactly (``calls`` is the counter; a trainer resuming a
    run restores it).
    """

    def __init__(self, p=0.5, seed=None):
        super().__init__()
        if not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
            raise ShapeError(f"Dropout probability must be in [0, 1], got {p!r}")
        self.p = float(p)
        self.seed = int(seed) if seed is not None else init.seed_value()
        self.calls = 0

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        seed = (self.seed * 0x9E3779B97F4A7C15 + self.calls) & (2**63 - 1)
        self.calls += 1
        return F.dropout(x, self.p, True, seed)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    """(N, d1, d2, ...) -> (N, d1·d2·...) from ``start_dim`` on (a free view for contiguous input)."""

    def __init__(self, start_dim=1):
        super().__init__()
        self.start_dim = int(start_dim)

    def forward(self, x):
        start = self.start_dim % max(x.ndim, 1)
        return x.reshape(x.shape[:start] + (-1,))


class Sequential(Module):
    """Modules applied in order; built from modules (named "0", "1", ...) or from an OrderedDict of names."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (OrderedDict, dict)):
            items = list(modules[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(modules)]
        for name, module in items:
            if not isinstance(module, Module):
                raise TypeError(f"Sequential takes Modules, got {type(module).__name__} for {name!r}")
            setattr(self, name, module)

    def forward(self, x):
        modules = list(self._modules.values())
        k = 0
        while k < len(modules):
            module = modules[k]
            following = modules[k + 1] if k + 1 < len(modules) else None
            if type(module) is ReLU and type(following) is MaxPool2d:
                # relu then max-pool == max-pool of relu in one kernel: the same values and gradients
                # without two passes over the larger activation
                x = following.forward(x, fused_relu=True)
                k += 2
                continue
            x = module(x)
            k += 1
        return x

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        if isinstance(index, str):
            return self._modules[index]
        return items[index][1]

    def named_layers(self):
        return list(self._modules.items())


class CrossEntropyLoss(Module):
    """Fused, numerically stable log-softmax + negative log-likelihood.

    Shape: logits (N, C) and integer targets (N,) -> a 0-d loss (mean over N, or sum).
    """

    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ShapeError(f"CrossEntropyLoss reduction must be 'mean' or 'sum', got {reduction!r}")
        self.reduction = reduction

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, self.reduction)

    def extra_repr(self):
        return f"reduction={self.reduction!r}"
