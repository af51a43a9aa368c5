"""Loss layers: CrossEntropyLoss, NLLLoss, MSELoss (PyTorch's constructor arguments and formulas)."""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from . import functional as F
from ..module import Module

REDUCTIONS = ("mean", "sum", "none")


def _reduction(value, owner: str) -> str:
    if value not in REDUCTIONS:
        raise ShapeError(f"{owner} reduction must be one of {REDUCTIONS}, got {value!r}")
    return value


class _WeightedLoss(Module):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        owner = type(self).__name__
        if isinstance(weight, str):
            raise ShapeError(f"{owner}'s first argument is the class weight (PyTorch's order); pass "
                             f"reduction={weight!r} by keyword")
        if weight is not None and not isinstance(weight, Tensor):
            weight = Tensor.from_host(np.asarray(weight, dtype=np.float32))
        if weight is not None and weight.ndim != 1:
            raise ShapeError(f"{owner} weight must be 1-D (one per class), got shape {weight.shape}")
        self.register_buffer("weight", weight)
        if not isinstance(ignore_index, numbers.Integral):
            raise ShapeError(f"{owner} ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)
        self.reduction = _reduction(reduction, owner)


class CrossEntropyLoss(_WeightedLoss):
    """Fused, numerically stable log-softmax + negative log-likelihood with PyTorch's options.

    Shape: logits (N, C) and integer targets (N,) -> a 0-d loss ("mean", "sum") or (N,) ("none").
    "mean" divides by the summed class weights of the targets that are not ``ignore_index``;
    ``label_smoothing`` ε mixes (1 − ε)·NLL with ε/C·Σ_c w_c·(−log p_c), as PyTorch does.

    A target outside [0, C) other than ``ignore_index`` raises ``nc.ClassIndexError`` (an ``IndexError``
    carrying the index, its row and C). Targets given as host arrays are checked before they are
    uploaded, at the call. Device tensors are checked by the loss kernel, which the call does not wait
    for: the error is raised at the next host read on that device (``loss.item()``, ``to_host()``) or the
    next ``optimizer.step()``, whichever comes first, and that step updates no parameter. The same holds
    for a step recorded and replayed by ``nc.training.CapturedStep``.
    """

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0):
        F._no_legacy(size_average, reduce, "CrossEntropyLoss")
        super().__init__(weight, ignore_index, reduction)
        if not isinstance(label_smoothing, numbers.Real) or not 0.0 <= float(label_smoothing) <= 1.0:
            raise ShapeError(f"CrossEntropyLoss label_smoothing must be in [0, 1], got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)

    def extra_repr(self):
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}"


class NLLLoss(_WeightedLoss):
    """−weight[t]·input[n, t] over log-probabilities (after LogSoftmax); reductions, ``ignore_index`` and
    the ``nc.ClassIndexError`` for a target outside [0, C) as CrossEntropyLoss."""

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean"):
        F._no_legacy(size_average, reduce, "NLLLoss")
        super().__init__(weight, ignore_index, reduction)

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self):
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"


class MSELoss(Module):
    """(input − target)², reduced by "mean", "sum" or "none"."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__()
        F._no_legacy(size_average, reduce, "MSELoss")
        self.reduction = _reduction(reduction, "MSELoss")

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)

    def extra_repr(self):
        return f"reduction={self.reduction!r}"
