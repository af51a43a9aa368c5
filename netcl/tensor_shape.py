"""Tensor's views, copies, conversions and device moves (a mixin of netcl.Tensor, PyTorch's names).

Every method goes through a differentiable rule (netcl.autograd.rules*), so views and copies keep the graph.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import dtypes
from .errors import DTypeError, ShapeError


def _shape_args(args) -> tuple:
    """f(2, 3) and f((2, 3)) both mean the shape (2, 3)."""
    return tuple(args[0]) if len(args) == 1 and not isinstance(args[0], numbers.Integral) else tuple(args)


def _dim(dim, ndim: int, what: str) -> int:
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool):
        raise ShapeError(f"{what}: dim must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ShapeError(f"{what}: dim {dim} is out of range for a tensor of rank {ndim}")
    return int(dim) % max(ndim, 1)


class ShapeMethods:
    """Mixed into Tensor: reshape/view/flatten/squeeze/unsqueeze, indexing, iteration, dtype and device."""

    # ---- views ----------------------------------------------------------------------------------
    def reshape(self, *shape):
        from .autograd import rules
        return rules.reshape(self, _shape_args(shape))

    def view(self, *shape):
        """Same as reshape (a non-contiguous tensor is copied first rather than refused)."""
        return self.reshape(*shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        if self.ndim == 0:
            return self.reshape((1,))
        start = _dim(start_dim, self.ndim, "flatten")
        end = _dim(end_dim, self.ndim, "flatten")
        if start > end:
            raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
        merged = 1
        for n in self.shape[start:end + 1]:
            merged *= n
        return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    def unsqueeze(self, dim: int):
        d = _dim(dim, self.ndim + 1, "unsqueeze")
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim=None):
        """Drop size-1 dims: all of them, or those of ``dim`` (an int or a tuple) that have size 1."""
        if dim is None:
            dims = {d for d, n in enumerate(self.shape) if n == 1}
        else:
            dims = {_dim(d, self.ndim, "squeeze") for d in ((dim,) if isinstance(dim, numbers.Integral) else dim)}
            dims = {d for d in dims if self.ndim and self.shape[d] == 1}
        return self.reshape(tuple(n for d, n in enumerate(self.shape) if d not in dims))

    def permute(self, *axes):
        from .autograd import rules
        return rules.Permute.apply(self, _shape_args(axes))

    def transpose(self, a: int = 0, b: int = 1):
        axes = list(range(self.ndim))
        a, b = _dim(a, self.ndim, "transpose"), _dim(b, self.ndim, "transpose")
        axes[a], axes[b] = axes[b], axes[a]
        return self.permute(*axes)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def contiguous(self):
        if self.is_contiguous():
            return self
        from .autograd import rules
        return rules.Contiguous.apply(self)

    def expand(self, *shape):
        from .autograd import rules
        return rules.Expand.apply(self, _shape_args(shape))

    def __getitem__(self, index):
        from .autograd import rules
        return rules.Slice.apply(self, index)

    def __iter__(self):
        if self.ndim == 0:  # raised by iter() itself, as PyTorch, not at the first next()
            raise TypeError("iteration over a 0-d tensor")
        return (self[k] for k in range(self.shape[0]))

    def numel(self) -> int:
        return self.size

    # ---- dtype conversions ------------------------------------------------------------------------
    def astype(self, dtype):
        from .autograd import rules
        return rules.Cast.apply(self, dtypes.as_dtype(dtype))

    def float(self):
        return self.astype(np.float32)

    def double(self):
        return self.astype(np.float64)

    def int(self):
        return self.astype(np.int32)

    def long(self):
        return self.astype(np.int64)

    def bool(self):
        return self.astype(np.bool_)

    def clone(self):
        from .autograd import rules
        return rules.Cast.apply(self, self.dtype)

    # ---- devices ------------------------------------------------------------------------------------
    def to(self, *args, device=None, dtype=None, copy: bool = False):
        """``t.to(device)``, ``t.to(dtype)``, ``t.to(device, dtype)``, ``t.to(other_tensor)`` or keywords, as
        PyTorch. The device is a Device or a selector string (as NETCL_DEVICE takes); the same device and
        dtype return ``self`` (unless ``copy``), another device gives a copy whose gradient flows back."""
        from .runtime.device import Device, resolve_device
        from .tensor import Tensor
        if len(args) == 1 and isinstance(args[0], Tensor):  # t.to(other): other's device and dtype
            args = (args[0].device, args[0].dtype)
        for arg in args:
            if isinstance(arg, Device) or (isinstance(arg, (str, numbers.Integral)) and not dtypes.is_dtype_like(arg)):
                if device is not None:
                    raise DTypeError(f"to() got two devices: {device!r} and {arg!r}")
                device = arg
            elif dtypes.is_dtype_like(arg):
                if dtype is not None:
                    raise DTypeError(f"to() got two dtypes: {dtype!r} and {arg!r}")
                dtype = arg
            else:
                raise DTypeError(f"to() takes a device or a dtype, got {type(arg).__name__} {arg!r}")
        out = self
        if dtype is not None and dtypes.as_dtype(dtype) != self.dtype:
            out = out.astype(dtype)
        if device is not None:
            target = resolve_device(device)
            if target is not out.device:
                from .autograd import rules_tensor
                out = rules_tensor.to_device(out, target)
        if copy and out is self:
            out = self.clone()
        return out

    def cpu(self) -> np.ndarray:
        """A host copy as a NumPy array (netcl has no host tensors; same as ``to_host``)."""
        return self.to_host()

    def numpy(self) -> np.ndarray:
        return self.to_host()
