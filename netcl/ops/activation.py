"""LeakyReLU, GELU, Hardtanh (ReLU6), Hardswish, Hardsigmoid, SiLU, the residual add + ReLU, and softmax /
log-softmax along an axis (kernels/activation.cl).

Raw ops, forward and backward; the differentiable versions are in netcl.nn.functional (rules in
netcl.autograd.rules_activation).
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor
from .elementwise import as_contiguous

# each activation with the names of its scalar parameters (the kernel's p0, p1)
ACTIVATIONS = {"leaky_relu": ("negative_slope",), "gelu": (), "gelu_tanh": (), "hardtanh": ("min_val", "max_val"),
               "hardswish": (), "hardsigmoid": (), "silu": ()}


def _float_input(x: Tensor, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{what}: input must be a netcl Tensor, got {type(x).__name__}")
    dtypes.require_float(x.dtype, what)
    return as_contiguous(x)


def _same(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ShapeError(f"{what}: operands must have the same shape and dtype, got {a.shape} {a.dtype} and "
                         f"{b.shape} {b.dtype}")
    a.same_device(b, what)


def _flat_launch(kernel, like: Tensor, *args) -> None:
    launch(like.device, kernel, (like.size,), local_size_1d(like.device, like.size), *args)


def _scalars(act: str, params: tuple, dtype) -> tuple:
    """The kernel's (p0, p1) for ``act``'s parameters, checked against ACTIVATIONS."""
    if act not in ACTIVATIONS:
        raise ShapeError(f"unknown activation {act!r}; expected one of {tuple(ACTIVATIONS)}")
    names = ACTIVATIONS[act]
    if len(params) != len(names):
        raise ShapeError(f"{act} takes the parameters {names}, got {params!r}")
    padded = tuple(params) + (0.0,) * (2 - len(params))
    return tuple(dtype.type(p) for p in padded)


def activation_forward(x: Tensor, act: str, params: tuple = ()) -> Tensor:
    """y = act(x) for act in ACTIVATIONS, ``params`` the values of its named parameters in order
    (("leaky_relu", (0.01,)), ("hardtanh", (0.0, 6.0)) for ReLU6)."""
    x = _float_input(x, act)
    p0, p1 = _scalars(act, params, x.dtype)
    y = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size:
        kernel = get_kernel(x.device, "activation.cl", "act_forward", T=dtypes.c_type(x.dtype), ACT=act)
        _flat_launch(kernel, x, x.buffer, np.int64(x.offset), y.buffer, np.int64(y.offset), np.int64(x.size), p0, p1)
    return y


def activation_backward(grad_y: Tensor, x: Tensor, act: str, params: tuple = ()) -> Tensor:
    """grad_y · act'(x), with PyTorch's values at the kinks (see kernels/activation.cl)."""
    x, grad_y = _float_input(x, act), _float_input(grad_y, f"{act} backward")
    _same(x, grad_y, f"{act} backward")
    p0, p1 = _scalars(act, params, x.dtype)
    gx = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size:
        kernel = get_kernel(x.device, "activation.cl", "act_backward", T=dtypes.c_type(x.dtype), ACT=act)
        _flat_launch(kernel, x, x.buffer, np.int64(x.offset), grad_y.buffer, np.int64(grad_y.offset), gx.buffer,
                     np.int64(gx.offset), np.int64(x.size), p0, p1)
    return gx


def add_relu(a: Tensor, b: Tensor) -> Tensor:
    """max(a + b, 0) in one pass (same shapes, no broadcasting): a residual block's tail."""
    a, b = _float_input(a, "add_relu"), _float_input(b, "add_relu")
    _same(a, b, "add_relu")
    y = Tensor.empty(a.shape, a.dtype, a.device)
    if a.size:
        kernel = get_kernel(a.device, "activation.cl", "add_relu", T=dtypes.c_type(a.dtype))
        _flat_launch(kernel, a, a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), y.buffer,
                     np.int64(y.offset), np.int64(a.size))
    return y


def relu_backward(grad_y: Tensor, y: Tensor) -> Tensor:
    """grad_y where the ReLU's output y is positive, else 0."""
    y, grad_y = _float_input(y, "relu backward"), _float_input(grad_y, "relu backward")
    _same(y, grad_y, "relu backward")
    gx = Tensor.empty(y.shape, y.dtype, y.device)
    if y.size:
        kernel = get_kernel(y.device, "activation.cl", "relu_backward", T=dtypes.c_type(y.dtype))
        _flat_launch(kernel, y, y.buffer, np.int64(y.offset), grad_y.buffer, np.int64(grad_y.offset), gx.buffer,
                     np.int64(gx.offset), np.int64(y.size))
    return gx


def normalize_dim(dim, ndim: int, what: str) -> int:
    if dim is None:
        raise ShapeError(f"{what}: dim must be given (PyTorch's implicit dim choice is deprecated)")
    d = int(dim)
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise ShapeError(f"{what}: dim {dim} is out of range for a {ndim}-D tensor")
    return d % max(ndim, 1)


def _softmax_geometry(shape, dim: int):
    if not shape:
        return 1, 1, 1
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def softmax_forward(x: Tensor, dim: int, log: bool = False) -> Tensor:
    what = "log_softmax" if log else "softmax"
    x = _float_input(x, what)
    d = normalize_dim(dim, x.ndim, what)
    outer, length, inner = _softmax_geometry(x.shape, d)
    y = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size:
        kernel = get_kernel(x.device, "activation.cl", "softmax_forward", T=dtypes.c_type(x.dtype), LOG=bool(log))
        launch(x.device, kernel, (inner, outer), (min(inner, 64), 1) if inner > 1 else (1, 64), x.buffer,
               np.int64(x.offset), y.buffer, np.int64(y.offset), np.int32(outer), np.int32(length), np.int32(inner))
    return y


def softmax_backward(grad_y: Tensor, y: Tensor, dim: int, log: bool = False) -> Tensor:
    what = "log_softmax backward" if log else "softmax backward"
    y, grad_y = _float_input(y, what), _float_input(grad_y, what)
    _same(y, grad_y, what)
    d = normalize_dim(dim, y.ndim, what)
    outer, length, inner = _softmax_geometry(y.shape, d)
    gx = Tensor.empty(y.shape, y.dtype, y.device)
    if y.size:
        kernel = get_kernel(y.device, "activation.cl", "softmax_backward", T=dtypes.c_type(y.dtype), LOG=bool(log))
        launch(y.device, kernel, (inner, outer), (min(inner, 64), 1) if inner > 1 else (1, 64), y.buffer,
               np.int64(y.offset), grad_y.buffer, np.int64(grad_y.offset), gx.buffer, np.int64(gx.offset),
               np.int32(outer), np.int32(length), np.int32(inner))
    return gx
