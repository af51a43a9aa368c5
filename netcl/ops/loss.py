"""Fused, numerically stable cross-entropy over logits (kernels/loss.cl); the autograd rule is in
netcl.autograd.rules_nn and the layer is netcl.nn.CrossEntropyLoss."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor

LOCAL = 64
REDUCTIONS = ("mean", "sum")


def _check(logits: Tensor, target: Tensor, reduction: str):
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise DTypeError("cross_entropy takes netcl Tensors (logits, target), got "
                         f"{type(logits).__name__} and {type(target).__name__}")
    dtypes.require_float(logits.dtype, "cross_entropy logits")
    if target.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DTypeError(f"cross_entropy targets must be int32 or int64 class indices, got {target.dtype}")
    if logits.ndim != 2 or target.ndim != 1 or target.shape[0] != logits.shape[0]:
        raise ShapeError(f"cross_entropy expects logits (N, C) and targets (N,), got {logits.shape} and {target.shape}")
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ShapeError(f"cross_entropy needs at least one row and one class, got logits {logits.shape}")
    if reduction not in REDUCTIONS:
        raise ShapeError(f"cross_entropy reduction must be one of {REDUCTIONS}, got {reduction!r}")
    logits.same_device(target, "cross_entropy")
    return (logits if logits.is_contiguous() else logits.contiguous(),
            target if target.is_contiguous() else target.contiguous())


def _scale(n: int, reduction: str) -> float:
    return 1.0 / n if reduction == "mean" else 1.0


def cross_entropy_forward(logits: Tensor, target: Tensor, reduction: str = "mean"):
    """(loss as a 0-d tensor, per-row log-sum-exp kept for backward). Out-of-range targets give NaN."""
    logits, target = _check(logits, target, reduction)
    n, c = logits.shape
    loss = Tensor.empty((), logits.dtype, logits.device)
    lse = Tensor.empty((n,), logits.dtype, logits.device)
    kernel = get_kernel(logits.device, "loss.cl", "ce_forward", T=dtypes.c_type(logits.dtype),
                        TI=dtypes.c_type(target.dtype), LOCAL=LOCAL)
    launch(logits.device, kernel, (LOCAL,), (LOCAL,), logits.buffer, np.int64(logits.offset), target.buffer,
           np.int64(target.offset), lse.buffer, np.int64(lse.offset), loss.buffer, np.int64(loss.offset),
           np.int32(n), np.int32(c), logits.dtype.type(_scale(n, reduction)))
    return loss, lse


def cross_entropy_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, lse: Tensor,
                           reduction: str = "mean") -> Tensor:
    """d loss / d logits = grad_loss * scale * (softmax(logits) - onehot(target))."""
    logits, target = _check(logits, target, reduction)
    n, c = logits.shape
    grad_loss = grad_loss if grad_loss.is_contiguous() else grad_loss.contiguous()
    gx = Tensor.empty((n, c), logits.dtype, logits.device)
    kernel = get_kernel(logits.device, "loss.cl", "ce_backward", T=dtypes.c_type(logits.dtype),
                        TI=dtypes.c_type(target.dtype), LOCAL=LOCAL)
    launch(logits.device, kernel, (n * c,), local_size_1d(logits.device, n * c), logits.buffer,
           np.int64(logits.offset), target.buffer, np.int64(target.offset), lse.buffer, np.int64(lse.offset),
           grad_loss.buffer, np.int64(grad_loss.offset), gx.buffer, np.int64(gx.offset), np.int32(n), np.int32(c),
           logits.dtype.type(_scale(n, reduction)))
    return gx
