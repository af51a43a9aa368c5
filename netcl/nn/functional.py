"""Differentiable functions behind the layers; each goes through one rule of netcl.autograd (conv2d:
netcl.ops.conv2d, whose forward and backward sit side by side)."""
from __future__ import annotations

import numpy as np

from ..autograd import rules_nn
from ..autograd.rules_activation import ActivationFunction, AddReLUFunction, SoftmaxFunction
from ..autograd.rules_norm import BatchNormFunction
from ..errors import DTypeError, ShapeError
from ..ops.conv2d import conv2d as _conv2d
from ..ops.loss import LossOptions, check_class_indices
from ..ops.pool import PoolGeometry
from ..tensor import Tensor


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1,
           strategy: str = "auto") -> Tensor:
    """2-D convolution, differentiable in x, weight and bias (netcl.ops.conv2d.conv2d)."""
    return _conv2d(x, weight, bias, stride, padding, dilation, groups, strategy)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in) @ weight.T (out, in) + bias (out,) -> (..., out)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"linear: input must be a netcl Tensor, got {type(x).__name__}")
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: input of shape {x.shape} does not match weight {weight.shape} "
                         f"(expected last dimension {weight.shape[1]})")
    if x.dtype != weight.dtype:
        raise DTypeError(f"linear: input is {x.dtype} but weight is {weight.dtype}")
    lead = x.shape[:-1]
    x2 = x if x.ndim == 2 else x.reshape((-1, x.shape[-1]))
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = rules_nn.LinearFunction.apply(x2, weight, bias)
    return y if x.ndim == 2 else y.reshape(lead + (weight.shape[0],))


def _pool(x: Tensor, op: str, kernel_size, stride, padding, dilation, count_include_pad=True, relu=False,
          ceil_mode=False, padding_end=None) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}_pool2d: input must be a netcl Tensor, got {type(x).__name__}")
    geometry = PoolGeometry.make(x.shape, kernel_size, stride, padding, dilation, padding_end, ceil_mode)
    return rules_nn.Pool2dFunction.apply(x, geometry, op, bool(count_include_pad), bool(relu))


def _unsupported(what: str, **flags) -> None:
    for name, value in flags.items():
        if value:
            raise ShapeError(f"{what}: {name}={value!r} is not supported by netcl")


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False,
               *, fused_relu: bool = False, padding_end=None) -> Tensor:
    """Max pooling (PyTorch's signature, ceil_mode included; return_indices is not supported).
    ``fused_relu`` computes max_pool2d(relu(x)) in one kernel (same values and gradients, without the
    ReLU's passes over the larger input). ``padding_end`` (netcl's): the bottom and right padding where it
    differs from ``padding`` (ONNX's asymmetric pads)."""
    _unsupported("max_pool2d", return_indices=return_indices)
    return _pool(x, "max", kernel_size, stride, padding, dilation, relu=fused_relu, ceil_mode=ceil_mode,
                 padding_end=padding_end)


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, *, dilation=1, padding_end=None) -> Tensor:
    """Average pooling (PyTorch's signature, ceil_mode included; divisor_override is not supported).
    With ``count_include_pad`` the divisor counts the window's taps inside the padded input (all of them
    unless ceil_mode lets a window reach past it), else those inside the input. netcl's keywords:
    ``dilation`` spreads the taps (the d-regularly sparse kernels of netcl.dense), ``padding_end`` as in
    max_pool2d."""
    _unsupported("avg_pool2d", divisor_override=divisor_override is not None)
    return _pool(x, "avg", kernel_size, stride, padding, dilation, count_include_pad, ceil_mode=ceil_mode,
                 padding_end=padding_end)


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """Average over adaptive bins (PyTorch's): output (N, C, *output_size); output_size 1 is the global
    average pool."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"adaptive_avg_pool2d: input must be a netcl Tensor, got {type(x).__name__}")
    return rules_nn.AdaptiveAvgPool2dFunction.apply(x, output_size)


def _as_target(target, x, opts: LossOptions, what: str) -> Tensor:
    """Targets as a device tensor; host targets are checked against the classes before the upload (device
    ones by the loss kernel: netcl.ops.loss)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{what}: input must be a netcl Tensor, got {type(x).__name__}")
    if isinstance(target, Tensor):
        return target
    target = np.asarray(target, dtype=np.int64)
    if x.ndim == 2 and target.ndim == 1:
        check_class_indices(target, x.shape[1], opts.ignore_index, what)
    return Tensor.from_host(target, x.device)


def _loss(x, target, weight, opts: LossOptions, what: str) -> Tensor:
    target = _as_target(target, x, opts, what)
    if weight is not None and not isinstance(weight, Tensor):
        weight = Tensor.from_host(np.asarray(weight, dtype=x.dtype), x.device)
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.astype(x.dtype)
    return rules_nn.LossFunction.apply(x, target, weight, opts)


def cross_entropy(input: Tensor, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """−log softmax(input)[target] per row with PyTorch's options (class ``weight``s, ``ignore_index``,
    ``label_smoothing``), reduced by "mean" (divided by the summed weights of the rows not ignored), "sum"
    or "none". input (N, C) logits, target (N,) int class indices (one outside [0, C) that is not
    ignore_index raises nc.ClassIndexError: see netcl.nn.CrossEntropyLoss for when). size_average/reduce
    are PyTorch's deprecated switches and must stay None."""
    _no_legacy(size_average, reduce, "cross_entropy")
    return _loss(input, target, weight, LossOptions("ce", reduction, int(ignore_index), float(label_smoothing)),
                 "cross_entropy")


def nll_loss(input: Tensor, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean") -> Tensor:
    """−weight[target]·input[n, target] per row (input holds log-probabilities), reduced as cross_entropy."""
    _no_legacy(size_average, reduce, "nll_loss")
    return _loss(input, target, weight, LossOptions("nll", reduction, int(ignore_index)), "nll_loss")


def _no_legacy(size_average, reduce, what: str) -> None:
    if size_average is not None or reduce is not None:
        raise ShapeError(f"{what}: size_average and reduce are deprecated in PyTorch; use reduction=")


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """(input − target)² reduced by "mean", "sum" or "none"; shapes must match (PyTorch warns and
    broadcasts; a mismatch is almost always a bug, so it is an error here)."""
    _no_legacy(size_average, reduce, "mse_loss")
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise DTypeError("mse_loss takes netcl Tensors")
    if input.shape != target.shape:
        raise ShapeError(f"mse_loss: input {input.shape} and target {target.shape} must have the same shape")
    if reduction not in ("mean", "sum", "none"):
        raise ShapeError(f"mse_loss reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    diff = input - target
    squared = diff * diff
    if reduction == "none":
        return squared
    return squared.mean() if reduction == "mean" else squared.sum()


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float | None = 0.1,
               eps: float = 1e-5, *, num_batches_tracked: Tensor | None = None, relu: bool = False,
               residual: Tensor | None = None, relu6: bool = False) -> Tensor:
    """Batch normalization over axis 1 of (N, C, ...), PyTorch's signature.

    ``training``: normalize by the batch's statistics (biased variance) and move running_mean/var (when
    given) by ``momentum`` with the unbiased variance; else normalize by running_mean/var. netcl's
    keyword-only extensions: ``num_batches_tracked`` is incremented in training (and is what momentum=None,
    the cumulative average, divides by); ``residual`` is added and ``relu`` (or ``relu6``, ReLU6) applied in
    the same kernel."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"batch_norm: input must be a netcl Tensor, got {type(input).__name__}")
    if not training and (running_mean is None or running_var is None):
        raise ShapeError("batch_norm: evaluation (training=False) needs running_mean and running_var")
    if momentum is None and training and running_mean is not None and num_batches_tracked is None:
        raise ShapeError("batch_norm: momentum=None (cumulative average) needs num_batches_tracked")
    return BatchNormFunction.apply(input, weight, bias, residual, running_mean, running_var,
                                   num_batches_tracked, bool(training), momentum, float(eps), bool(relu),
                                   bool(relu6))


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, seed=None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1−p); identity when not training.
    ``inplace`` is accepted for PyTorch's signature; the result is always a new tensor. ``seed``: an int,
    None (a fresh seed per call) or a callable returning each call's seed (nc.nn.Dropout's stream)."""
    if not 0.0 <= p <= 1.0:
        raise ShapeError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return rules_nn.DropoutFunction.apply(x, float(p), seed)


def relu(x: Tensor, inplace: bool = False) -> Tensor:
    return x.relu()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return ActivationFunction.apply(x, "leaky_relu", (float(negative_slope),))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x·Φ(x) with the exact erf (PyTorch's default) or approximate="tanh"."""
    if approximate not in ("none", "tanh"):
        raise ShapeError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return ActivationFunction.apply(x, "gelu" if approximate == "none" else "gelu_tanh", ())


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """min(max(x, min_val), max_val); the gradient passes strictly between the bounds only (PyTorch's)."""
    if min_val > max_val:
        raise ShapeError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return ActivationFunction.apply(x, "hardtanh", (float(min_val), float(max_val)))


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6): hardtanh(x, 0, 6), gradient 0 at x = 0 and x = 6 (PyTorch's)."""
    return hardtanh(x, 0.0, 6.0)


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    """x·relu6(x + 3)/6 (Howard et al., Searching for MobileNetV3); the gradient is PyTorch's at the kinks
    too: 0 up to −3, x/3 + 1/2 strictly inside (−3, 3), 1 from 3 on."""
    return ActivationFunction.apply(x, "hardswish", ())


def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3)/6; gradient 1/6 strictly inside (−3, 3), else 0 (PyTorch's)."""
    return ActivationFunction.apply(x, "hardsigmoid", ())


def silu(x: Tensor, inplace: bool = False) -> Tensor:
    """x·sigmoid(x) (Swish with β = 1)."""
    return ActivationFunction.apply(x, "silu", ())


def softmax(x: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    return SoftmaxFunction.apply(_cast(x, dtype), dim, False)


def log_softmax(x: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    return SoftmaxFunction.apply(_cast(x, dtype), dim, True)


def _cast(x: Tensor, dtype) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"softmax: input must be a netcl Tensor, got {type(x).__name__}")
    return x if dtype is None or np.dtype(dtype) == x.dtype else x.astype(dtype)


def add_relu(a: Tensor, b: Tensor) -> Tensor:
    """relu(a + b) in one kernel (a residual block's tail); same shapes."""
    return AddReLUFunction.apply(a, b)


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """PyTorch's F.pad for mode "constant": ``pad`` lists (before, after) widths from the last dim backwards,
    (left, right, top, bottom, ...); negative widths crop. Differentiable; the result is a new tensor."""
    from ..autograd.rules_tensor import constant_pad
    if mode != "constant":
        raise ShapeError(f"pad: mode {mode!r} is not supported by netcl (only 'constant')")
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ShapeError(f"pad: {pad} must hold a (before, after) pair for at most {input.ndim} dims")
    pairs = [(pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]
    widths = [(0, 0)] * (input.ndim - len(pairs)) + pairs[::-1]
    return constant_pad(input, widths, 0.0 if value is None else float(value))
