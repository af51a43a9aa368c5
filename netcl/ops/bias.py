"""Per-channel bias: the in-place add behind conv2d and linear, and its gradient (kernels/bias.cl).

A tensor is viewed as (outer, channels, inner): (N, K, P*Q) for a convolution's output, (rows, out, 1)
for a linear layer's. Both ops need a contiguous tensor; the add writes into it, so callers pass a
tensor they have just created and nobody else holds.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor

GRAD_LANES = 64


def _outer_channels_inner(y: Tensor, bias_len: int, channel_axis: int, what: str) -> tuple[int, int, int]:
    if not y.is_contiguous():
        raise ShapeError(f"{what}: needs a contiguous tensor, got shape {y.shape} strides {y.strides}")
    if not 0 <= channel_axis < y.ndim or y.shape[channel_axis] != bias_len:
        raise ShapeError(f"{what}: bias of {bias_len} channels does not match axis {channel_axis} of shape {y.shape}")
    outer, inner = math.prod(y.shape[:channel_axis]), math.prod(y.shape[channel_axis + 1:])
    if y.size >= 2 ** 31:
        raise ShapeError(f"{what}: {y.size:,} elements exceed the kernel's 32-bit indexing")
    return outer, bias_len, inner


def _grad_lanes(device) -> int:
    """bias_grad's work-group size; every bias kernel is rendered with it, so they share one program."""
    return min(GRAD_LANES, 1 << (device.max_work_group_size.bit_length() - 1))


def add_bias_(y: Tensor, bias: Tensor, channel_axis: int = 1) -> Tensor:
    """y += bias broadcast along ``channel_axis``, in place; returns y."""
    outer, ch, inner = _outer_channels_inner(y, bias.size, channel_axis, "add_bias_")
    if y.size == 0:
        return y
    along_ch = inner == 1
    kernel = get_kernel(y.device, "bias.cl", "bias_add_last_axis" if along_ch else "bias_add",
                        T=dtypes.c_type(y.dtype), L=_grad_lanes(y.device))
    (local,) = local_size_1d(y.device, ch if along_ch else inner)
    global_size = (ch, outer) if along_ch else (inner, outer * ch)
    launch(y.device, kernel, global_size, (local, 1), y.buffer, np.int64(y.offset), bias.buffer,
           np.int64(bias.offset), np.int32(outer), np.int32(ch), np.int32(inner))
    y.mark_written()
    return y


def bias_grad(grad_y: Tensor, channel_axis: int = 1) -> Tensor:
    """The bias gradient: grad_y summed over every axis but ``channel_axis`` (a 1-D tensor)."""
    ch = grad_y.shape[channel_axis] if 0 <= channel_axis < grad_y.ndim else -1
    outer, ch, inner = _outer_channels_inner(grad_y, ch, channel_axis, "bias_grad")
    out = Tensor.empty((ch,), grad_y.dtype, grad_y.device)
    if ch == 0:
        return out
    lanes = _grad_lanes(grad_y.device)
    kernel = get_kernel(grad_y.device, "bias.cl", "bias_grad", T=dtypes.c_type(grad_y.dtype), L=lanes)
    launch(grad_y.device, kernel, (ch * lanes,), (lanes,), out.buffer, np.int64(out.offset), grad_y.buffer,
           np.int64(grad_y.offset), np.int32(outer), np.int32(ch), np.int32(inner))
    return out
