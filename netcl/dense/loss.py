"""The masked per-pixel loss of Section 4.3: the error map of the last layer is kept at the selected pixels
and zeroed elsewhere, so one backward pass over the whole image gives the gradients of the mini-batch of
the selected pixels' patches. The cost does not depend on how many pixels are selected."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import ClassIndexError, DTypeError, ShapeError
from ..tensor import Tensor

REDUCTIONS = ("sum", "mean")


def _host(a, what: str) -> np.ndarray:
    if isinstance(a, Tensor):
        return a.to_host()
    if isinstance(a, np.ndarray):
        return a
    raise DTypeError(f"masked_cross_entropy: {what} must be a netcl Tensor or NumPy array, got {type(a).__name__}")


def masked_cross_entropy(scores: Tensor, target, mask=None, reduction: str = "sum") -> Tensor:
    """Cross-entropy of (N, K, H, W) scores against (N, H, W) integer labels at the pixels where ``mask``
    (N, H, W; bool or 0/1, None = every pixel) is set, as a 0-d tensor.

    reduction "sum" adds the selected pixels' losses, as CrossEntropyLoss(reduction="sum") does over the
    mini-batch of their patches; "mean" divides by the number of selected pixels. Labels at unselected
    pixels are ignored (any value, e.g. −1 for "unlabelled").
    """
    if not isinstance(scores, Tensor):
        raise DTypeError(f"masked_cross_entropy: scores must be a netcl Tensor, got {type(scores).__name__}")
    dtypes.require_float(scores.dtype, "masked_cross_entropy scores")
    if scores.ndim != 4:
        raise ShapeError(f"masked_cross_entropy expects (N, K, H, W) scores, got shape {scores.shape}")
    if reduction not in REDUCTIONS:
        raise ShapeError(f"masked_cross_entropy reduction must be one of {REDUCTIONS}, got {reduction!r}")
    n, k, h, w = scores.shape
    labels = _host(target, "target")
    if labels.shape != (n, h, w) or labels.dtype.kind not in "iu":
        raise ShapeError(f"masked_cross_entropy: target must be integer labels of shape {(n, h, w)}, "
                         f"got {labels.shape} ({labels.dtype})")
    selected = np.ones((n, h, w), bool) if mask is None else _host(mask, "mask")
    if selected.shape != (n, h, w):
        raise ShapeError(f"masked_cross_entropy: mask must have shape {(n, h, w)}, got {selected.shape}")
    selected = selected.astype(bool)
    count = int(selected.sum())
    if count == 0:
        raise ShapeError("masked_cross_entropy: the mask selects no pixel")
    bad = selected & ((labels < 0) | (labels >= k))
    if bad.any():
        first = int(np.argmax(bad.ravel()))
        raise ClassIndexError("masked_cross_entropy", int(labels.ravel()[first]), k, position=first)
    from ..autograd.rules_dense import masked_cross_entropy2d
    device = scores.device
    labels_t = Tensor.from_host(np.where(selected, labels, 0).astype(np.int32).reshape(n, 1, h, w), device)
    weight = Tensor.from_host(selected.astype(scores.dtype).reshape(n, 1, h, w), device)
    return masked_cross_entropy2d(scores, labels_t, weight, 1.0 if reduction == "sum" else 1.0 / count)
