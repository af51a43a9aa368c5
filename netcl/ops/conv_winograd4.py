"""The `winograd4` conv2d strategy: Winograd F(4×4, 3×3) for 3×3 layers with stride 1 and dilation 1, any
padding, size, channel count, batch and group count.

forward          V = BᵀdB of each 6×6 input patch, U = GgGᵀ of w, 36·groups batched GEMMs M = U·V,
                 y = AᵀmA of each 4×4 output tile (partial tiles at the borders computed and cropped).
backward_data    the same pipeline on grad_y padded by 2 − pad with the rotated, channel-swapped filters.
backward_weight  the transposed algorithm: V = BᵀdB of x, Z = A·dy·Aᵀ of each 4×4 tile of grad_y,
                 36·groups GEMMs Mw = Z·Vᵀ (summing over every tile of the batch), gw = Gᵀ·Mw·G.

Against F(2×2, 3×3) (the `winograd` strategy) it does 4× fewer multiplies than the definition instead of
2.25×, and its transformed tensors hold 2.25 values per output instead of 4, so the transforms move less
memory; its larger tiles waste more on small planes (a 7×7 output is 2×2 tiles of 16), its GEMMs have 36
instead of 16 operands of fewer columns, and the transforms round more (points ±2 scale by up to 8). The
planner weighs both per layer and pass. Transforms are kernels/winograd4.cl; the pipeline around them
(chunks of samples, matrix strides, the GEMMs, the epilogue) is netcl.ops.conv_winograd's.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, epilogue_operands
from .conv_winograd import WinogradStrategy, _filter_local, _grouped, _stack, _tile_local, _tiles
from .gemm import gemm_batched


def tiles_per_item(device) -> int:
    """Adjacent tiles per work-item of the tile transforms (kernels/winograd4.cl VW). On a CPU four, the
    lanes of a 128-bit vector of floats: each tile's four leading columns are one vector load, and the
    lanes regroup by column in one 4×4 transpose; with eight or sixteen tiles the regrouping costs more
    than the wider arithmetic saves. Elsewhere one tile per work-item, neighbouring work-items on
    neighbouring tiles (their loads and stores coalesce)."""
    return 4 if device.kind == "cpu" else 1


def _kernel(device, name: str, dtype, **params):
    return get_kernel(device, "winograd4.cl", name, T=dtypes.c_type(dtype), VW=tiles_per_item(device),
                      **params)


class Winograd4Strategy(WinogradStrategy):
    name = "winograd4"
    tile = 4  # F(4×4, 3×3)

    def weight_product_strides(self, tiles: int, cols: int) -> tuple[int, int]:
        """backward_weight multiplies V transposed (Mw = Z·Vᵀ, V in the data passes' [36][C][tiles])."""
        return tiles, 1

    def transform_filters(self, w: Tensor, layer: ConvLayer, flip: bool, into: Tensor | None = None) -> Tensor:
        """U = G·w·Gᵀ of every filter (flipped and with channels swapped for backward_data)."""
        cg, kg = layer.c // layer.groups, layer.k // layer.groups
        rows, cols = (layer.c, kg) if flip else (layer.k, cg)
        u = into if into is not None else _stack(rows, cols, layer.groups, w.dtype, w.device, self.elements)
        launch(w.device, _kernel(w.device, "wino4_filter_transform", w.dtype, FLIP=int(flip)), (cols, rows),
               _filter_local(cols),
               w.buffer, np.int64(w.offset), np.int32(rows), np.int32(cols), np.int32(cg), np.int32(kg),
               u.buffer, np.int64(u.offset), np.int64(u.strides[0]))
        return u

    def transform_input(self, src: Tensor, pad_h: int, pad_w: int, th: int, tw: int, groups: int,
                        into: Tensor) -> Tensor:
        n, channels, ih, iw = src.shape
        items = -(-tw // tiles_per_item(src.device))
        launch(src.device, _kernel(src.device, "wino4_input_transform", src.dtype), (items, th, n * channels),
               _tile_local(th, items), src.buffer, np.int64(src.offset),
               np.int32(n), np.int32(channels), np.int32(ih), np.int32(iw), np.int32(pad_h), np.int32(pad_w),
               np.int32(th), np.int32(tw), into.buffer, np.int64(into.offset), np.int64(into.strides[0]))
        return into

    def transform_output(self, m: Tensor, out: Tensor, th: int, tw: int, bias: Tensor | None,
                         residual: Tensor | None, activation: str) -> Tensor:
        n, channels, oh, ow = out.shape
        items = -(-tw // tiles_per_item(out.device))
        kernel = _kernel(out.device, "wino4_output_transform", out.dtype, BIAS=bias is not None,
                         RESIDUAL=residual is not None, ACT=activation)
        launch(out.device, kernel, (items, th, n * channels), _tile_local(th, items),
               m.buffer, np.int64(m.offset), np.int64(m.strides[0]),
               np.int32(n), np.int32(channels), np.int32(oh), np.int32(ow), np.int32(th), np.int32(tw),
               out.buffer, np.int64(out.offset), *epilogue_operands(out, bias, residual))
        return out

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        gw = Tensor.empty(layer.weight_shape, x.dtype, x.device)
        if gw.size == 0:
            return gw
        g, cg = layer.groups, layer.c // layer.groups
        th, tw, tiles = _tiles(layer.n, layer.out_h, layer.out_w, self.tile)
        v = _stack(layer.c, tiles, g, x.dtype, x.device, self.elements)
        self.transform_input(x, layer.pad_h, layer.pad_w, th, tw, g, v)
        z = _stack(layer.k, tiles, g, x.dtype, x.device, self.elements)
        items = -(-tw // tiles_per_item(x.device))
        launch(x.device, _kernel(x.device, "wino4_grad_transform", x.dtype), (items, th, layer.n * layer.k),
               _tile_local(th, items), grad_y.buffer, np.int64(grad_y.offset),
               np.int32(layer.n), np.int32(layer.k), np.int32(layer.out_h), np.int32(layer.out_w),
               np.int32(th), np.int32(tw), z.buffer, np.int64(z.offset), np.int64(z.strides[0]))
        mw = _stack(layer.k, cg, g, x.dtype, x.device, self.elements)
        gemm_batched(_grouped(z, g), _grouped(v, g), c=_grouped(mw, g), trans_b=True)
        launch(x.device, _kernel(x.device, "wino4_filter_grad", x.dtype), (cg, layer.k), _filter_local(cg),
               mw.buffer, np.int64(mw.offset), np.int64(mw.strides[0]), np.int32(layer.k), np.int32(cg),
               gw.buffer, np.int64(gw.offset))
        return gw


STRATEGY = Winograd4Strategy()
