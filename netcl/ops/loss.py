"""Fused cross-entropy and negative log-likelihood (kernels/loss.cl) with PyTorch's options: class weights,
ignore_index, reduction "mean" | "sum" | "none", label smoothing. The autograd rule is in
netcl.autograd.rules_nn; the layers are netcl.nn.CrossEntropyLoss and NLLLoss.

Each call is one forward and one backward launch; options that are off compile out of the kernel, so the
plain case (LeNet's) runs the same code as before they existed.

A target outside [0, C) that is not ``ignore_index`` raises ``nc.ClassIndexError``. Targets on the device
are checked by the forward kernel, which records the first bad one in the device's "class index" error
flag (netcl.runtime.error_flags); the host reads that record back without waiting, and raises at the next
host read on the device (``loss.item()``, ``to_host()``) or the next ``Optimizer.step()``, whichever comes
first, before the step updates a parameter. So no call waits for the device, and a recorded training
step (netcl.training.replay) keeps both its replay and its check. Targets given as host arrays are
checked on the host before they are uploaded (netcl.nn.functional).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..errors import ClassIndexError, DTypeError, ShapeError
from ..runtime.error_flags import error_flag
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor
from .elementwise import as_contiguous

LOCAL = 64
REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class LossOptions:
    mode: str = "ce"               # "ce" over logits, "nll" over log-probabilities
    reduction: str = "mean"
    ignore_index: int = -100
    label_smoothing: float = 0.0

    def check(self) -> "LossOptions":
        if self.reduction not in REDUCTIONS:
            raise ShapeError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ShapeError(f"label_smoothing must be in [0, 1], got {self.label_smoothing}")
        if self.mode == "nll" and self.label_smoothing:
            raise ShapeError("nll_loss has no label smoothing")
        return self


def _check(x: Tensor, target: Tensor, weight: Tensor | None, what: str):
    if not isinstance(x, Tensor) or not isinstance(target, Tensor):
        raise DTypeError(f"{what} takes netcl Tensors (input, target), got {type(x).__name__} and "
                         f"{type(target).__name__}")
    dtypes.require_float(x.dtype, f"{what} input")
    if target.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DTypeError(f"{what} targets must be int32 or int64 class indices, got {target.dtype}")
    if x.ndim != 2 or target.ndim != 1 or target.shape[0] != x.shape[0]:
        raise ShapeError(f"{what} expects input (N, C) and targets (N,), got {x.shape} and {target.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ShapeError(f"{what} needs at least one row and one class, got input {x.shape}")
    x.same_device(target, what)
    if weight is not None:
        if not isinstance(weight, Tensor) or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
            raise ShapeError(f"{what} weight must be a {x.dtype} tensor of shape ({x.shape[1]},), got "
                             f"{getattr(weight, 'shape', type(weight).__name__)} {getattr(weight, 'dtype', '')}")
        x.same_device(weight, what)
        weight = as_contiguous(weight)
    return as_contiguous(x), as_contiguous(target), weight


def _params(x: Tensor, target: Tensor, weight, opts: LossOptions) -> dict:
    return dict(T=dtypes.c_type(x.dtype), TI=dtypes.c_type(target.dtype), LOCAL=LOCAL, MODE=opts.mode,
                WEIGHTED=weight is not None, SMOOTH=opts.label_smoothing > 0, REDUCTION=opts.reduction)


def loss_forward(x: Tensor, target: Tensor, weight: Tensor | None = None, opts: LossOptions = LossOptions()):
    """(loss, saved): loss is 0-d (mean, sum) or (N,) (none); ``saved`` = (lse, aux) for loss_backward."""
    opts = opts.check()
    what = "cross_entropy" if opts.mode == "ce" else "nll_loss"
    x, target, weight = _check(x, target, weight, what)
    n, c = x.shape
    out_shape = (n,) if opts.reduction == "none" else ()
    loss = Tensor.empty(out_shape, x.dtype, x.device)
    lse = Tensor.empty((n,), x.dtype, x.device) if opts.mode == "ce" else None
    aux = Tensor.empty((2,), x.dtype, x.device)
    rows = loss if opts.reduction == "none" else x
    w_buf, w_off = (weight.buffer, weight.offset) if weight is not None else (x.buffer, 0)
    lse_buf, lse_off = (lse.buffer, lse.offset) if lse is not None else (aux.buffer, aux.offset)
    kernel = get_kernel(x.device, "loss.cl", "ce_forward", **_params(x, target, weight, opts))
    flag = error_flag(x.device, "class index", _class_index_error)
    launch(x.device, kernel, (LOCAL,), (LOCAL,), x.buffer, np.int64(x.offset), target.buffer,
           np.int64(target.offset), w_buf, np.int64(w_off), lse_buf, np.int64(lse_off), rows.buffer,
           np.int64(rows.offset if opts.reduction == "none" else 0), aux.buffer, np.int64(aux.offset),
           loss.buffer, np.int64(loss.offset), flag.buffer,
           np.int32(n), np.int32(c), np.int64(opts.ignore_index), x.dtype.type(opts.label_smoothing))
    flag.watch()
    return loss, (lse, aux)


def _class_index_error(record) -> ClassIndexError:
    """The error for the record ce_forward wrote in the device's "class index" flag (kernels/loss.cl)."""
    _, row, index, classes, ignore_index, mode = (int(v) for v in record[:6])
    return ClassIndexError("cross_entropy" if mode == 0 else "nll_loss", index, classes, position=row,
                           ignore_index=ignore_index)


def check_class_indices(target: np.ndarray, num_classes: int, ignore_index: int, what: str) -> None:
    """Raise ClassIndexError for the first host-side target outside [0, num_classes) and not ignore_index."""
    bad = ((target < 0) | (target >= num_classes)) & (target != ignore_index)
    if bad.any():
        row = int(np.argmax(bad))
        raise ClassIndexError(what, int(target[row]), num_classes, position=row, ignore_index=ignore_index)


def loss_backward(grad_loss: Tensor, x: Tensor, target: Tensor, weight: Tensor | None, saved,
                  opts: LossOptions = LossOptions()) -> Tensor:
    """d loss / d x for an upstream gradient of the loss's shape."""
    what = "cross_entropy" if opts.mode == "ce" else "nll_loss"
    x, target, weight = _check(x, target, weight, what)
    lse, aux = saved
    n, c = x.shape
    grad_loss = as_contiguous(grad_loss)
    gx = Tensor.empty((n, c), x.dtype, x.device)
    w_buf, w_off = (weight.buffer, weight.offset) if weight is not None else (x.buffer, 0)
    lse_buf, lse_off = (lse.buffer, lse.offset) if lse is not None else (aux.buffer, aux.offset)
    kernel = get_kernel(x.device, "loss.cl", "ce_backward", **_params(x, target, weight, opts))
    launch(x.device, kernel, (n * c,), local_size_1d(x.device, n * c), x.buffer, np.int64(x.offset),
           target.buffer, np.int64(target.offset), w_buf, np.int64(w_off), lse_buf, np.int64(lse_off), aux.buffer,
           np.int64(aux.offset), grad_loss.buffer, np.int64(grad_loss.offset), gx.buffer, np.int64(gx.offset),
           np.int32(n), np.int32(c), np.int64(opts.ignore_index), x.dtype.type(opts.label_smoothing))
    return gx
