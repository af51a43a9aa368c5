"""The `im2col` conv2d strategy: lower the input to the memo's (C·R·S, N·P·Q) column matrix, multiply by
the (K, C·R·S) weight with GEMM (one batch entry per group), then transform (K, N·P·Q) -> (N, K, P, Q).

  forward          Y(K, NPQ)      = W(K, CRS) · cols(CRS, NPQ), then the (K, N, PQ) -> (N, K, PQ) transform
  backward_data    gcols(CRS, NPQ) = Wᵀ · gY(K, NPQ), then col2im (gather when deterministic or on CPUs,
                   else atomic scatter; see netcl.ops.im2col.prefers_gather); with one group instead
                   gcols[n](PQ, CRS) = gY[n]ᵀ · W per image, straight from the (N, K, PQ) gradient, folded
                   from the (NPQ, CRS) layout
  backward_weight  gW(K, CRS)     = gY(K, NPQ) · colsᵀ
For N = 1 the (K, PQ) product already is the output layout: no transform and no buffer for it.
Why this layout and not the API's (NPQ, CRS): docs/explanation/convolution.md, "The ten strategies".
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime.device import resolve_device
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, Product
from .conv_gemm import gemm_pack_bytes
from .gemm import gemm_batched
from .im2col import col2im_into, im2col_into


def _view(t: Tensor, shape, strides, offset: int = 0) -> Tensor:
    return Tensor(t.buffer, shape, t.dtype, t.device, strides, t.offset + offset)


def _cols_elems(layer: ConvLayer) -> int:
    return layer.c * layer.r * layer.s * layer.n * layer.out_h * layer.out_w


def _kmat_elems(layer: ConvLayer) -> int:
    """The (K, NPQ) matrix in the GEMM's layout; only a separate buffer when N > 1."""
    return layer.k * layer.n * layer.out_h * layer.out_w if layer.n > 1 else 0


def _grouped(layer: ConvLayer, w: Tensor, cols: Tensor, kmat: Tensor):
    """(G, KG, CGRS) weight, (G, CGRS, NPQ) columns and (G, KG, NPQ) product views."""
    g, npq = layer.groups, layer.n * layer.out_h * layer.out_w
    kg, crs_g = layer.k // g, layer.c // g * layer.r * layer.s
    return (_view(w, (g, kg, crs_g), (kg * crs_g, crs_g, 1)),
            _view(cols, (g, crs_g, npq), (crs_g * npq, npq, 1)),
            _view(kmat, (g, kg, npq), (kg * npq, npq, 1)))


def swap_outer_axes(src: Tensor, dst: Tensor, a: int, b: int, rows: int) -> Tensor:
    """dst (b, a, rows) <- src (a, b, rows), both contiguous: the memo's (K, N, PQ) <-> (N, K, PQ) transform."""
    kernel = get_kernel(src.device, "conv_transform.cl", "swap_outer_axes", T=dtypes.c_type(src.dtype))
    local = (min(64, rows), 1, 1) if src.device.kind == "cpu" else None
    launch(src.device, kernel, (rows, b, a), local, src.buffer, np.int64(src.offset), dst.buffer,
           np.int64(dst.offset), np.int64(a), np.int64(b), np.int64(rows))
    return dst


class Im2colStrategy(ConvStrategy):
    name = "im2col"

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        device = resolve_device(device)
        for what, elems in (("column matrix (C·R·S, N·P·Q)", _cols_elems(layer)),
                            ("(K, N·P·Q) product", _kmat_elems(layer))):
            if elems * layer.itemsize > device.max_alloc_bytes:
                return (f"its {what} needs {elems * layer.itemsize:,} bytes, more than the largest single "
                        f"allocation {device.name} allows ({device.max_alloc_bytes:,})")
        return None

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """The column matrix, the (K, NPQ) matrix when N > 1, and what GEMM allocates to pack operands."""
        device = resolve_device(device)
        g, npq = layer.groups, layer.n * layer.out_h * layer.out_w
        kg, crs_g = layer.k // g, layer.c // g * layer.r * layer.s
        if pass_ == "forward":
            packs = gemm_pack_bytes(layer.dtype, kg, npq, crs_g, g, g, 1, 1, device)
        elif pass_ == "backward_data" and g == 1:  # _backward_data_per_image: no (K, NPQ) matrix
            pq = layer.out_h * layer.out_w
            return _cols_elems(layer) * layer.itemsize + gemm_pack_bytes(layer.dtype, pq, crs_g, kg, layer.n, 1,
                                                                         pq, 1, device)
        elif pass_ == "backward_data":
            packs = gemm_pack_bytes(layer.dtype, crs_g, npq, kg, g, g, crs_g, 1, device)
        else:
            packs = gemm_pack_bytes(layer.dtype, kg, crs_g, npq, g, g, 1, npq, device)
        return (_cols_elems(layer) + _kmat_elems(layer)) * layer.itemsize + packs

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """One product per group on the column matrix; the lowering (im2col, or col2im's read of the
        gradient columns and scatter), the (K, N, PQ) <-> (N, K, PQ) transform when N > 1, and the product
        reading the columns again."""
        b, g = layer.itemsize, layer.groups
        cg, kg, rs, pq = layer.c // g, layer.k // g, layer.r * layer.s, layer.out_h * layer.out_w
        n = layer.n
        x_bytes, y_bytes, w_bytes = n * layer.c * layer.h * layer.w * b, n * layer.k * pq * b, layer.k * cg * rs * b
        cols = _cols_elems(layer) * b
        dims = {"forward": (kg, n * pq, cg * rs), "backward_data": (cg * rs, n * pq, kg),
                "backward_weight": (kg, cg * rs, n * pq)}[pass_]
        transform = 2 * y_bytes if n > 1 else 0
        lowering = x_bytes + cols if pass_ != "backward_data" else 2 * cols + x_bytes
        return CostTerms(products=[Product(*dims, batch=g)], launches=3,
                         bytes_moved=lowering + transform + cols + w_bytes + y_bytes)

    def _columns(self, x: Tensor, layer: ConvLayer) -> Tensor:
        cols = Tensor.empty((layer.c * layer.r * layer.s, layer.n * layer.out_h * layer.out_w), x.dtype, x.device)
        return im2col_into(x, layer, cols, transposed=True)

    def _grad_kmat(self, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        if layer.n == 1:
            return grad_y
        kmat = Tensor.empty((layer.k, layer.n * layer.out_h * layer.out_w), grad_y.dtype, grad_y.device)
        return swap_outer_axes(grad_y, kmat, layer.n, layer.k, layer.out_h * layer.out_w)

    def fuses_epilogue_for(self, layer: ConvLayer) -> bool:
        """One ungrouped image: its product writes the output in place, with the epilogue (netcl.ops.gemm's
        bias, residual, activation); several images' products land in a (K, N·PQ) matrix first."""
        return layer.n == 1 and layer.groups == 1

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none") -> Tensor:
        self.refuse_unfused_epilogue(layer, bias, residual, activation)
        cols = self._columns(x, layer)
        y = Tensor.empty(layer.output_shape, x.dtype, x.device)
        kmat = y if layer.n == 1 else Tensor.empty((layer.k, layer.n * layer.out_h * layer.out_w), x.dtype, x.device)
        wg, cg, kg = _grouped(layer, w, cols, kmat)
        shortcut = None if residual is None else _view(residual, kg.shape, kg.strides)
        gemm_batched(wg, cg, kg, bias=bias, residual=shortcut, activation=activation)
        if layer.n > 1:
            swap_outer_axes(kmat, y, layer.k, layer.n, layer.out_h * layer.out_w)
        return y

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        if layer.groups == 1:
            return self._backward_data_per_image(grad_y, w, layer)
        kmat = self._grad_kmat(grad_y, layer)
        cols = Tensor.empty((layer.c * layer.r * layer.s, layer.n * layer.out_h * layer.out_w), w.dtype, w.device)
        wg, cg, kg = _grouped(layer, w, cols, kmat)
        gemm_batched(wg, kg, cg, trans_a=True)
        grad_x = Tensor.empty(layer.input_shape, w.dtype, w.device)
        return col2im_into(cols, layer, grad_x, transposed=True)

    @staticmethod
    def _backward_data_per_image(grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        """cols[n] (PQ, CRS) = gY[n]ᵀ (PQ, K) · W (K, CRS), one batched GEMM straight from the (N, K, PQ)
        gradient, into the (NPQ, CRS) layout col2im also folds: no (K, N, PQ) copy of the gradient."""
        pq, crs = layer.out_h * layer.out_w, layer.c * layer.r * layer.s
        cols = Tensor.empty((layer.n * pq, crs), w.dtype, w.device)
        gemm_batched(_view(grad_y, (layer.n, layer.k, pq), (layer.k * pq, pq, 1)),
                     _view(w, (1, layer.k, crs), (layer.k * crs, crs, 1)),
                     _view(cols, (layer.n, pq, crs), (pq * crs, crs, 1)), trans_a=True)
        grad_x = Tensor.empty(layer.input_shape, w.dtype, w.device)
        return col2im_into(cols, layer, grad_x, transposed=False)

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        kmat = self._grad_kmat(grad_y, layer)
        cols = self._columns(x, layer)
        grad_w = Tensor.empty(layer.weight_shape, x.dtype, x.device)
        wg, cg, kg = _grouped(layer, grad_w, cols, kmat)
        gemm_batched(kg, cg, wg, trans_b=True)
        return grad_w


STRATEGY = Im2colStrategy()
