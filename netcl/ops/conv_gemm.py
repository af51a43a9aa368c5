"""The `gemm` conv2d strategy: a 1×1 convolution without padding is a plain matrix product per image,
Y[n](K, PQ) = W(K, C) · X[n](C, PQ). With stride 1, GEMM's strided operands address the NCHW tensors in
place (no lowering, no workspace); each call is batched over images or over groups (whichever needs
fewer calls), and the weight gradient accumulates over images with beta = 1. With a stride, X[n](C, PQ)
is the input's every stride-th row and column: the forward and weight-gradient passes gather it into an
(N, C, P, Q) workspace first (kernels/conv_transform.cl's subsample), and the data gradient's product
lands in such a workspace from which upsample_zero writes the input gradient, zero between the strided
rows and columns (a 1×1 window touches no other input element).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import dtypes
from ..runtime.device import resolve_device
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, Product
from . import gemm as gemm_module
from .gemm import gemm_batched, params_for


def gemm_pack_bytes(dtype, M: int, N: int, K: int, a_batches: int, b_batches: int, a_cs: int, b_cs: int,
                    device=None, b_rs: int | None = None) -> int:
    """Bytes of the packing buffers gemm_batched needs for op(A) (M, K) times op(B) (K, N) with column
    strides a_cs, b_cs (and row stride b_rs of op(B); by default that of a dense matrix: N when its columns
    are unit stride, else 1, a transposed operand) — netcl.ops.gemm's rule."""
    if b_rs is None:
        b_rs = N if b_cs == 1 else 1
    return sum(gemm_module.packing_bytes(device, dtype, M, N, K, a_batches, b_batches, a_cs, b_rs, b_cs))


def _view(t: Tensor, shape, strides, offset: int = 0) -> Tensor:
    return Tensor(t.buffer, shape, t.dtype, t.device, strides, t.offset + offset)


def _image_views(t: Tensor, channels: int, per_group: int, layer: ConvLayer, *, by_group: bool, index: int):
    """A 3-D view of the NCHW tensor ``t`` as (batch, per_group channels, HW): batched over images for
    group ``index`` (by_group False), or over groups for image ``index`` (by_group True)."""
    hw = layer.h * layer.w
    if by_group:
        return _view(t, (layer.groups, per_group, hw), (per_group * hw, hw, 1), index * channels * hw)
    return _view(t, (layer.n, per_group, hw), (channels * hw, hw, 1), index * per_group * hw)


def _weight_views(w: Tensor, layer: ConvLayer, *, by_group: bool, index: int):
    kg, cg = layer.k // layer.groups, layer.c // layer.groups
    if by_group:
        return _view(w, (layer.groups, kg, cg), (kg * cg, cg, 1))
    return _view(w, (1, kg, cg), (0, cg, 1), index * kg * cg)


def _strided(layer: ConvLayer) -> bool:
    return (layer.stride_h, layer.stride_w) != (1, 1)


def _subsampled(layer: ConvLayer) -> ConvLayer:
    """The stride-1 layer on the (N, C, P, Q) input a strided 1×1 convolution actually reads."""
    return dataclasses.replace(layer, h=layer.out_h, w=layer.out_w, stride_h=1, stride_w=1)


def _subsampled_bytes(layer: ConvLayer) -> int:
    return layer.n * layer.c * layer.out_h * layer.out_w * layer.itemsize


def _resample(kernel_name: str, src: Tensor, dst: Tensor, layer: ConvLayer) -> Tensor:
    """kernels/conv_transform.cl's subsample ((N, C, H, W) -> every stride-th (N, C, P, Q)) or
    upsample_zero (the reverse, zeros between), both contiguous."""
    kernel = get_kernel(src.device, "conv_transform.cl", kernel_name, T=dtypes.c_type(src.dtype))
    rows = layer.out_h if kernel_name == "subsample" else layer.h
    launch(src.device, kernel, (rows, layer.n * layer.c), None, src.buffer, np.int64(src.offset),
           dst.buffer, np.int64(dst.offset), np.int64(layer.n * layer.c), np.int32(layer.h), np.int32(layer.w),
           np.int32(layer.out_h), np.int32(layer.out_w), np.int32(layer.stride_h), np.int32(layer.stride_w))
    return dst


def _gather(x: Tensor, layer: ConvLayer) -> Tensor:
    return _resample("subsample", x, Tensor.empty((layer.n, layer.c, layer.out_h, layer.out_w), x.dtype, x.device),
                     layer)


class GemmStrategy(ConvStrategy):
    name = "gemm"

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if (layer.r, layer.s) != (1, 1):
            return f"the kernel is {layer.r}×{layer.s}; the gemm strategy needs a 1×1 kernel"
        if (layer.pad_h, layer.pad_w) != (0, 0):
            return f"the padding is {(layer.pad_h, layer.pad_w)}; the gemm strategy needs padding 0"
        return None

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """No lowering; GEMM's operand packing (equal-shaped calls share its buffers) and, with a stride,
        the (N, C, P, Q) subsampled input or input gradient."""
        if _strided(layer):
            return _subsampled_bytes(layer) + self.workspace_bytes(_subsampled(layer), pass_, device)
        kg, cg, hw, dt = layer.k // layer.groups, layer.c // layer.groups, layer.h * layer.w, layer.dtype
        by_group = self._plan(layer)[0]
        batch = layer.groups if by_group else layer.n
        a_batches = layer.groups if by_group else 1
        if pass_ == "forward":
            per_call = gemm_pack_bytes(dt, kg, hw, cg, a_batches, batch, 1, 1, device)
        elif pass_ == "backward_data":
            per_call = gemm_pack_bytes(dt, cg, hw, kg, a_batches, batch, cg, 1, device)
        else:
            per_call = gemm_pack_bytes(dt, kg, cg, hw, layer.groups, layer.groups, 1, hw, device)
        return per_call

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The products on the NCHW tensors in place: no lowering, x, w and y each moved once (the weight
        gradient once per image, as it accumulates). A stride adds the gather of the subsampled input
        (every stride-th row read, the subsampled input written), or the writing of the whole input
        gradient from it."""
        if _strided(layer):
            terms = self.cost_terms(_subsampled(layer), pass_, device)
            sub = _subsampled_bytes(layer)
            x_bytes = layer.n * layer.c * layer.h * layer.w * layer.itemsize
            terms.bytes_moved += x_bytes + sub if pass_ == "backward_data" else x_bytes // layer.stride_h + sub
            terms.launches += 1
            return terms
        b, g, n = layer.itemsize, layer.groups, layer.n
        kg, cg, hw = layer.k // g, layer.c // g, layer.h * layer.w
        x_bytes, y_bytes, w_bytes = n * layer.c * hw * b, n * layer.k * hw * b, layer.k * cg * b
        if pass_ == "backward_weight":
            return CostTerms(products=[Product(kg, cg, hw, batch=g, calls=n)], launches=n,
                             bytes_moved=x_bytes + y_bytes + n * w_bytes)
        by_group, calls = self._plan(layer)
        m, k = (kg, cg) if pass_ == "forward" else (cg, kg)
        return CostTerms(products=[Product(m, hw, k, batch=n * g // len(calls), calls=len(calls))],
                         launches=len(calls), bytes_moved=x_bytes + y_bytes + w_bytes)

    def _plan(self, layer: ConvLayer):
        """Batch over images, one call per group; or, when there are more groups than images, batch over
        groups, one call per image."""
        by_group = layer.groups > 1 and layer.n < layer.groups
        return by_group, range(layer.n if by_group else layer.groups)

    def fuses_epilogue_for(self, layer: ConvLayer) -> bool:
        """Ungrouped layers: their one product per call stores the output with the epilogue
        (netcl.ops.gemm.gemm_batched's bias, residual, activation)."""
        return layer.groups == 1

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none") -> Tensor:
        if _strided(layer):
            return self.forward(_gather(x, layer), w, _subsampled(layer), bias=bias, residual=residual,
                                activation=activation)
        self.refuse_unfused_epilogue(layer, bias, residual, activation)
        y = Tensor.empty(layer.output_shape, x.dtype, x.device)
        kg, cg = layer.k // layer.groups, layer.c // layer.groups
        by_group, calls = self._plan(layer)
        for i in calls:
            shortcut = None if residual is None else _image_views(residual, layer.k, kg, layer, by_group=by_group,
                                                                  index=i)
            gemm_batched(_weight_views(w, layer, by_group=by_group, index=i),
                         _image_views(x, layer.c, cg, layer, by_group=by_group, index=i),
                         _image_views(y, layer.k, kg, layer, by_group=by_group, index=i),
                         bias=bias, residual=shortcut, activation=activation)
        return y

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        if _strided(layer):
            grad_sub = self.backward_data(grad_y, w, _subsampled(layer))
            return _resample("upsample_zero", grad_sub, Tensor.empty(layer.input_shape, w.dtype, w.device), layer)
        grad_x = Tensor.empty(layer.input_shape, w.dtype, w.device)
        kg, cg = layer.k // layer.groups, layer.c // layer.groups
        by_group, calls = self._plan(layer)
        for i in calls:
            gemm_batched(_weight_views(w, layer, by_group=by_group, index=i),
                         _image_views(grad_y, layer.k, kg, layer, by_group=by_group, index=i),
                         _image_views(grad_x, layer.c, cg, layer, by_group=by_group, index=i), trans_a=True)
        return grad_x

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        if _strided(layer):
            return self.backward_weight(_gather(x, layer), grad_y, _subsampled(layer))
        grad_w = Tensor.empty(layer.weight_shape, x.dtype, x.device)
        kg, cg = layer.k // layer.groups, layer.c // layer.groups
        gw = _view(grad_w, (layer.groups, kg, cg), (kg * cg, cg, 1))
        for n in range(layer.n):  # the sum over images is a sum of per-image products
            gemm_batched(_image_views(grad_y, layer.k, kg, layer, by_group=True, index=n),
                         _image_views(x, layer.c, cg, layer, by_group=True, index=n),
                         gw, beta=0.0 if n == 0 else 1.0, trans_b=True)
        return grad_w


STRATEGY = GemmStrategy()
