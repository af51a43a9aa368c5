"""The layers with geometry or parameters: Conv2d, Linear, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Dropout,
Flatten (activations: activation.py; BatchNorm: normalization.py; losses: loss.py; containers: containers.py).

Constructors validate their arguments (nc.ShapeError names the bad value); forward delegates to
netcl.nn.functional, so every layer's gradient is defined by one rule in netcl.autograd.
"""
from __future__ import annotations

import numbers
import numpy as np

from .. import dtypes
from ..errors import DeviceMemoryError, ShapeError
from ..ops.conv_common import pair
from ..tensor import Tensor
from . import functional as F
from . import init
from ..module import Module


def _check_fits(shape, dtype, device, what: str) -> None:
    """Refuse a parameter the device cannot hold before its initial values are drawn on the host."""
    from ..runtime.device import resolve_device
    dev = resolve_device(device)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > dev.max_alloc_bytes:
        raise DeviceMemoryError(f"{what} of shape {tuple(shape)} needs {nbytes:,} bytes; {dev.describe()} allows "
                                f"at most {dev.max_alloc_bytes:,} bytes in one allocation",
                                requested_bytes=nbytes, available_bytes=dev.max_alloc_bytes)


def _parameter(initial, shape, dtype, device, what: str, draw) -> Tensor:
    """A parameter from ``initial`` (an array or Tensor of exactly ``shape``) or, when it is None, from
    ``draw()``, the layer's random initialization."""
    if initial is None:
        host = draw()
    else:
        host = initial.to_host() if isinstance(initial, Tensor) else np.asarray(initial)
        if tuple(host.shape) != tuple(shape):
            raise ShapeError(f"{what} must have the shape {tuple(shape)}, got {tuple(host.shape)}")
        host = np.ascontiguousarray(host, dtype=dtype)
    return Tensor.from_host(host, device, requires_grad=True)


def _positive_int(value, name: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _one_of(value, pytorch_value, name: str, pytorch_name: str):
    """Conv2d takes in_ch/out_ch or PyTorch's in_channels/out_channels, once."""
    if value is not None and pytorch_value is not None:
        raise ShapeError(f"Conv2d got both {name}={value!r} and {pytorch_name}={pytorch_value!r}")
    if value is None and pytorch_value is None:
        raise ShapeError(f"Conv2d needs {name} (or {pytorch_name})")
    return value if value is not None else pytorch_value


class Conv2d(Module):
    """2-D convolution through netcl.ops.conv2d (so every strategy trains).

    Shape: input (N, in_ch, H, W) -> output (N, out_ch, Ho, Wo),
    Ho = (H + 2·padding − dilation·(kernel − 1) − 1) // stride + 1.
    ``strategy`` forces one convolution algorithm; "auto" lets the planner choose per pass.
    ``initial_weight`` / ``initial_bias`` (netcl's): arrays to start from instead of the random
    initialization (an imported model's weights).
    """

    def __init__(self, in_ch=None, out_ch=None, kernel_size=None, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, strategy="auto", device=None, dtype=np.float32, *, in_channels=None, out_channels=None,
                 initial_weight=None, initial_bias=None):
        super().__init__()
        in_ch = _one_of(in_ch, in_channels, "in_ch", "in_channels")
        out_ch = _one_of(out_ch, out_channels, "out_ch", "out_channels")
        if kernel_size is None:
            raise ShapeError("Conv2d needs a kernel_size")
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
        self.weight = _parameter(initial_weight, shape, dt, device, "Conv2d initial_weight",
                                 lambda: init.kaiming_uniform(shape, fan_in, dtype=dt))
        if bias:
            self.bias = _parameter(initial_bias, (self.out_channels,), dt, device, "Conv2d initial_bias",
                                   lambda: init.bias_uniform((self.out_channels,), fan_in, dt))
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
    """y = x @ weight.T + bias; input (..., in_features) -> (..., out_features). ``initial_weight`` /
    ``initial_bias`` as Conv2d's."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=np.float32, *, initial_weight=None,
                 initial_bias=None):
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear in_features")
        self.out_features = _positive_int(out_features, "Linear out_features")
        dt = dtypes.as_dtype(dtype)
        shape = (self.out_features, self.in_features)
        _check_fits(shape, dt, device, "Linear weight")
        self.weight = _parameter(initial_weight, shape, dt, device, "Linear initial_weight",
                                 lambda: init.kaiming_uniform(shape, self.in_features, dtype=dt))
        if bias:
            self.bias = _parameter(initial_bias, (self.out_features,), dt, device, "Linear initial_bias",
                                   lambda: init.bias_uniform((self.out_features,), self.in_features, dt))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _Pool2d(Module):
    op = "max"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, padding_end=None):
        super().__init__()
        self.kernel_size = pair(kernel_size, f"{type(self).__name__} kernel_size", 1)
        self.stride = self.kernel_size if stride is None else pair(stride, f"{type(self).__name__} stride", 1)
        self.padding = pair(padding, f"{type(self).__name__} padding", 0)
        self.dilation = pair(dilation, f"{type(self).__name__} dilation", 1)
        self.ceil_mode = bool(ceil_mode)
        self.padding_end = self.padding if padding_end is None else pair(padding_end,
                                                                         f"{type(self).__name__} padding_end", 0)

    def extra_repr(self):
        end = f", padding_end={self.padding_end}" if self.padding_end != self.padding else ""
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}{end}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool2d(_Pool2d):
    """Max over kernel windows (taps ``dilation`` apart); the argmax is kept for backward.

    Shape: (N, C, H, W) -> (N, C, Ho, Wo), Ho = (H + 2·padding − dilation·(kernel − 1) − 1) // stride + 1,
    rounded up with ``ceil_mode`` (a last window starting in the bottom padding is dropped, as PyTorch does);
    stride defaults to kernel_size. netcl's keyword ``padding_end``: the bottom and right padding where it
    differs from ``padding`` (ONNX's asymmetric pads).
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False, *,
                 padding_end=None):
        F._unsupported("MaxPool2d", return_indices=return_indices)
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode, padding_end)

    def forward(self, x, fused_relu=False):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            fused_relu=fused_relu, padding_end=self.padding_end)


class AvgPool2d(_Pool2d):
    """Mean over kernel windows; padding counts as zeros in the mean unless ``count_include_pad=False``.
    PyTorch's signature (divisor_override is not supported); netcl's keywords ``dilation`` (puts the taps
    apart) and ``padding_end`` (as MaxPool2d's). Shapes as MaxPool2d."""

    op = "avg"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None, *, dilation=1, padding_end=None):
        F._unsupported("AvgPool2d", divisor_override=divisor_override is not None)
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode, padding_end)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            dilation=self.dilation, padding_end=self.padding_end)

    def extra_repr(self):
        return f"{super().extra_repr()}, count_include_pad={self.count_include_pad}"


class AdaptiveAvgPool2d(Module):
    """Average over adaptive bins: output (N, C, Ho, Wo) for any input size; bin i of an axis of size H spans
    [floor(i·H/Ho), ceil((i+1)·H/Ho)). ``output_size`` is an int or an (h, w) pair (None keeps that axis);
    1 is the global average pool."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


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
        return F.dropout(x, self.p, True, seed=self._next_seed)

    def _next_seed(self) -> int:
        """The seed of this call; a replayed training step (netcl.runtime.recording) calls it too."""
        seed = (self.seed * 0x9E3779B97F4A7C15 + self.calls) & (2**63 - 1)
        self.calls += 1
        return seed

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
