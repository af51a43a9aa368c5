"""Tensor's reductions and bounded elementwise functions (a mixin of netcl.Tensor).

Reductions take NumPy's ``axis``/``keepdims`` or PyTorch's ``dim``/``keepdim``. ``t.max(dim=d)`` and
``t.min(dim=d)`` return PyTorch's ``(values, indices)`` namedtuple; ``t.max()``, ``t.max(axis)`` and
``t.max(axis=a)`` return the values (NumPy's form, and the public API's). Gradients follow PyTorch: a full or
axis-wise max/min shares the gradient among tied extrema, the indexed form sends it to the chosen index.
"""
from __future__ import annotations

import math
import numbers

from . import dtypes
from .errors import ShapeError


def _axis(axis, keepdims, dim, keepdim, what: str):
    """Merge NumPy's and PyTorch's spellings of the reduced axes and of keeping them."""
    if dim is not None and axis is not None:
        raise ShapeError(f"{what}: give axis= or dim=, not both (got axis={axis!r}, dim={dim!r})")
    if keepdim is not None and keepdims not in (None, False) and bool(keepdim) != bool(keepdims):
        raise ShapeError(f"{what}: keepdim={keepdim!r} and keepdims={keepdims!r} disagree")
    return (axis if dim is None else dim), bool(keepdim if keepdim is not None else keepdims)


class MathMethods:
    """Mixed into Tensor: sum/mean/max/min/argmax/argmin/var/std, clamp/maximum/minimum."""

    # ---- reductions -------------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        from .autograd import rules
        axis, keep = _axis(axis, keepdims, dim, keepdim, "sum")
        return rules.reduce("sum", self, axis, keep)

    def mean(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        from .autograd import rules
        axis, keep = _axis(axis, keepdims, dim, keepdim, "mean")
        return rules.reduce("mean", self, axis, keep)

    def _extreme(self, op: str, axis, keepdims, dim, keepdim):
        from .autograd import rules, rules_tensor
        from .tensor import Tensor
        if isinstance(axis, Tensor) or isinstance(dim, Tensor):  # t.max(other) is torch.maximum
            other = axis if isinstance(axis, Tensor) else dim
            return rules_tensor.maximum(self, other) if op == "max" else rules_tensor.minimum(self, other)
        if dim is not None and axis is None:
            if not isinstance(dim, numbers.Integral):
                raise ShapeError(f"{op}(dim=...) takes one int dim, got {dim!r} (use axis= for several)")
            keep = bool(keepdim if keepdim is not None else keepdims)
            return rules_tensor.max_min_with_indices(self, op, int(dim), keep)
        axis, keep = _axis(axis, keepdims, dim, keepdim, op)
        return rules.reduce(op, self, axis, keep)

    def max(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        """Values over ``axis`` (None: all); with ``dim=`` a ``(values, indices)`` namedtuple."""
        return self._extreme("max", axis, keepdims, dim, keepdim)

    def min(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        """Values over ``axis`` (None: all); with ``dim=`` a ``(values, indices)`` namedtuple."""
        return self._extreme("min", axis, keepdims, dim, keepdim)

    def argmax(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        from .ops import reduce as reduce_ops
        axis, keep = _axis(axis, keepdims, dim, keepdim, "argmax")
        return reduce_ops.argmax(self, axis, keep)

    def argmin(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        from .ops import reduce as reduce_ops
        axis, keep = _axis(axis, keepdims, dim, keepdim, "argmin")
        return reduce_ops.argmin(self, axis, keep)

    def var(self, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None, keepdims=None):
        """Variance over ``dim`` (None: all) divided by N - correction (PyTorch: correction=1, i.e.
        unbiased; ``unbiased=False`` means correction=0); N - correction <= 0 gives inf or nan, as PyTorch."""
        from .ops import reduce as reduce_ops
        dtypes.require_float(self.dtype, "var/std")
        axis, keep = _axis(axis, keepdims, dim, keepdim, "var")
        if unbiased is not None and correction is not None:
            raise ShapeError("var: give unbiased= or correction=, not both")
        c = correction if correction is not None else (1 if unbiased is None or unbiased else 0)
        axes = reduce_ops.normalize_axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes) if self.ndim else 1
        centered = self - self.mean(axes, keepdims=True)
        return (centered * centered).sum(axes, keepdims=keep) / float(max(count - c, 0))

    def std(self, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None, keepdims=None):
        """Square root of ``var`` with the same arguments."""
        return self.var(dim, unbiased, keepdim, correction=correction, axis=axis, keepdims=keepdims).sqrt()

    # ---- bounded elementwise -------------------------------------------------------------------------
    def clamp(self, min=None, max=None):  # noqa: A002 — PyTorch's keyword names
        from .autograd import rules_tensor
        return rules_tensor.clamp(self, min, max)

    clip = clamp

    def maximum(self, other):
        from .autograd import rules_tensor
        return rules_tensor.maximum(self, other)

    def minimum(self, other):
        from .autograd import rules_tensor
        return rules_tensor.minimum(self, other)
