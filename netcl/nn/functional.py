"""Differentiable functions behind the layers; each goes through one rule of netcl.autograd."""
from __future__ import annotations

import numpy as np

from ..autograd import rules_nn
from ..errors import DTypeError, ShapeError
from ..ops.pool import PoolGeometry
from ..tensor import Tensor


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1,
           strategy: str = "auto") -> Tensor:
    """netcl.ops.conv2d.conv2d (already differentiable in x, weight and bias)."""
    from ..ops.conv2d import conv2d as _conv2d
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


def _pool(x: Tensor, op: str, kernel_size, stride, padding, dilation, count_include_pad=True, relu=False) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}_pool2d: input must be a netcl Tensor, got {type(x).__name__}")
    geometry = PoolGeometry.make(x.shape, kernel_size, stride, padding, dilation)
    return rules_nn.Pool2dFunction.apply(x, geometry, op, bool(count_include_pad), bool(relu))


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, fused_relu: bool = False) -> Tensor:
    """Max pooling; ``fused_relu`` computes max_pool2d(relu(x)) in one kernel (same values and gradients,
    without the ReLU's passes over the larger input)."""
    return _pool(x, "max", kernel_size, stride, padding, dilation, relu=fused_relu)


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, count_include_pad=True) -> Tensor:
    return _pool(x, "avg", kernel_size, stride, padding, dilation, count_include_pad)


def cross_entropy(logits: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean (or sum) over rows of −log softmax(logits)[target]; targets are int class indices."""
    if not isinstance(target, Tensor):
        if not isinstance(logits, Tensor):
            raise DTypeError(f"cross_entropy: logits must be a netcl Tensor, got {type(logits).__name__}")
        target = Tensor.from_host(np.asarray(target, dtype=np.int64), logits.device)
    return rules_nn.CrossEntropyFunction.apply(logits, target, reduction)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed=None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1−p); identity when not training."""
    if not 0.0 <= p <= 1.0:
        raise ShapeError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return rules_nn.DropoutFunction.apply(x, float(p), seed)


def relu(x: Tensor) -> Tensor:
    return x.relu()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()
