"""Inference-time folding of a BatchNorm into the convolution before it (PyTorch's fuse_conv_bn_eval).

With the running statistics fixed, bn(conv(x)) = conv'(x) where, per output channel k,
  s_k = gamma_k / sqrt(running_var_k + eps),  W'_k = s_k W_k,  b'_k = beta_k + s_k (b_k − running_mean_k)
(gamma = 1, beta = 0 without affine; b = 0 for a convolution without bias). netcl.nn.fusion folds at
inference (eval mode under no_grad) wherever a Conv2d is directly followed by a BatchNorm2d (Sequential,
ResNet blocks), with the one-launch kernel form netcl.ops.batchnorm.fold_into_conv; this module's
fold_conv_bn is the differentiable form (tensor ops) behind fuse_conv_bn_eval.
"""
from __future__ import annotations

import copy

from ..errors import ShapeError


def fold_conv_bn(conv, bn):
    """(weight, bias) of the convolution equivalent to bn(conv(x)) with bn's running statistics;
    built from tensor ops, so gradients still reach conv's and bn's parameters."""
    if bn.running_mean is None or bn.running_var is None:
        raise ShapeError(f"fold_conv_bn: {type(bn).__name__} has no running statistics "
                         "(track_running_stats=False) to fold")
    k = conv.out_channels
    if bn.num_features != k:
        raise ShapeError(f"fold_conv_bn: {type(bn).__name__}({bn.num_features}) cannot follow a convolution "
                         f"with {k} output channels")
    std = (bn.running_var + bn.eps).sqrt()
    scale = bn.weight / std if bn.weight is not None else 1.0 / std
    weight = conv.weight * scale.reshape((k,) + (1,) * (conv.weight.ndim - 1))
    shifted = -bn.running_mean if conv.bias is None else conv.bias - bn.running_mean
    bias = shifted * scale
    if bn.bias is not None:
        bias = bias + bn.bias
    return weight, bias


def fuse_conv_bn_eval(conv, bn):
    """A new Conv2d computing bn(conv(x)) for eval; conv and bn are left unchanged."""
    from ..autograd import no_grad
    if conv.training or bn.training:
        raise ShapeError("fuse_conv_bn_eval: both modules must be in eval mode (fusing uses the running "
                         "statistics, which training would change)")
    with no_grad():
        weight, bias = fold_conv_bn(conv, bn)
    fused = copy.copy(conv)
    object.__setattr__(fused, "_parameters", type(conv._parameters)())
    fused.weight = weight.detach().requires_grad_(True)
    fused.bias = bias.detach().requires_grad_(True)
    return fused
