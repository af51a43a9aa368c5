"""The `direct` conv2d strategy: one plain kernel per pass that serves every layer (the universal fallback
and the reference the other strategies are checked against). No workspace, no atomics."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime import memory
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, tensor_bytes


def geometry(device, layer: ConvLayer):
    """The int64 geometry array the conv kernels read (see the header of kernels/conv_direct.cl)."""
    return memory.meta_buffer(device, (layer.n, layer.c, layer.h, layer.w, layer.k, layer.r, layer.s,
                                       layer.out_h, layer.out_w, layer.stride_h, layer.stride_w,
                                       layer.pad_h, layer.pad_w, layer.dil_h, layer.dil_w, layer.groups))


def _run(kernel_name: str, a: Tensor, b: Tensor, out_shape, layer: ConvLayer) -> Tensor:
    out = Tensor.empty(out_shape, a.dtype, a.device)
    if out.size == 0:
        return out
    kernel = get_kernel(a.device, "conv_direct.cl", kernel_name, T=dtypes.c_type(a.dtype))
    launch(a.device, kernel, (out.size,), local_size_1d(a.device, out.size),
           a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), out.buffer, np.int64(out.offset),
           geometry(a.device, layer))
    return out


class DirectStrategy(ConvStrategy):
    """Serves every layer and pass with no workspace (why_not and workspace_bytes: the defaults)."""

    name = "direct"

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The definition's flops, one work-item per output element (too few of them leave compute units
        idle), and each multiply-add loads both operands: no register tile reuses them."""
        from ..runtime.device import resolve_device
        units = resolve_device(device).compute_units
        cg, rs = layer.c // layer.groups, layer.r * layer.s
        outputs = {"forward": layer.n * layer.k * layer.out_h * layer.out_w,
                   "backward_data": layer.n * layer.c * layer.h * layer.w,
                   "backward_weight": layer.k * cg * rs}[pass_]
        busy = min(1.0, outputs / (256 * units))
        return CostTerms(kernel_flops=layer.flops / busy, launches=1,
                         bytes_moved=tensor_bytes(layer) + layer.flops * layer.itemsize)

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        return _run("conv_direct_forward", x, w, layer.output_shape, layer)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        return _run("conv_direct_backward_data", grad_y, w, layer.input_shape, layer)

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        return _run("conv_direct_backward_weight", x, grad_y, layer.weight_shape, layer)


STRATEGY = DirectStrategy()
