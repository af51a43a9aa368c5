"""The `mec` conv2d strategy: Cho & Brand's memory-efficient convolution (Algorithm 2).

x (NCHW) is lowered once into the compact L (in·ow·ih·kw·ic elements, NHWC inside: see kernels/mec.cl),
about kh/sh times smaller than im2col's matrix, and the products run on shifted partitions of L whose
leading dimension is ih·kw·ic, as batched GEMMs (netcl.ops.gemm):

  Solution A (ow ≤ T and |O| ≤ |L|)  oh GEMMs, each (in·ow × kh·kw·ic)·(kh·kw·ic × kc), giving O in
                                     h-n-w-c inside y's own buffer; O is copied into L (free by then)
                                     and permuted from there into y (NCHW).
  Solution B (otherwise)             in·oh GEMMs (batched over the output rows of one sample, or over
                                     the samples for one output row, whichever makes fewer launches),
                                     each writing its output row straight into y (NCHW).
  T is the threshold of line 8, tuned per device (:func:`tune_threshold`, stored in the tuning
  database under family "mec"); without a tuned entry it is the paper's 100.

backward_data    grad_L[n] partition p += grad_y[n, :, p, :]ᵀ·Kᵀ for every output row p (oh sequential
                 batched calls, overlapping partitions accumulate in order), then the compact grad_L is
                 folded back onto grad_x (mec_scatter, the MEC analogue of col2im).
backward_weight  grad_w = Σ over output rows p of grad_y row p × partition p of L: one batched GEMM per
                 group (its inner dimension runs over the whole batch) writes one partial gradient per
                 output row, then mec_weight_sum adds them up and transposes the sum into grad_w (more
                 calls, accumulating, only where the partials and packed partitions would outgrow the
                 cache: weight_partials).

Groups are served (each group is a contiguous block of every row of L); dilation along the width too;
dilation along the height is refused (a partition must be consecutive rows of L).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor
from ..runtime import tuning_db as db
from .conv_common import ConvLayer, ConvStrategy, CostTerms, Product, tensor_bytes
from .conv_implicit_gemm import geometry
from .conv_winograd import gemm_packing_bytes
from .elementwise import copy_into, fill
from .gemm import gemm_batched
from .kept import derived_from_weight
from .transpose import transpose_into

DEFAULT_T = 100  # the paper's threshold ("T around 100 ... for latest GPUs")


def threshold(device) -> int:
    """T of Algorithm 2, line 8, for a device: the tuned value, else the paper's default."""
    entry = db.lookup(device, "mec", default=None)
    return int(entry["T"]) if entry and "T" in entry else DEFAULT_T


def lowered_elements(layer: ConvLayer) -> int:
    """|L| = in·ow·ih·kw·ic with ih the padded input height (Eq. 3 of the paper)."""
    return layer.n * layer.out_w * (layer.h + 2 * layer.pad_h) * layer.s * layer.c


def output_elements(layer: ConvLayer) -> int:
    return layer.n * layer.k * layer.out_h * layer.out_w


def uses_solution_a(layer: ConvLayer, t: int) -> bool:
    return layer.out_w <= t and output_elements(layer) <= lowered_elements(layer)


def weight_partials(layer: ConvLayer, device) -> int:
    """How many output rows each batched product of backward_weight covers, that is how many partial
    weight gradients (K·C/groups·R·S elements each) it keeps: all the rows, in one call per group, unless
    the partials plus the operands a call's GEMM packs outgrow half the cache the device reports; then
    the rows are spread evenly over as few calls as fit, each accumulating into the same partials (one
    row a call: the old accumulating path). Both are written by one launch and read by the next (packs
    by the product, partials by mec_weight_sum): within the cache that costs little next to the two
    launches a row saves; past it they go through memory (on PoCL, which packs B, the partitions
    together as large as im2col's matrix, a layer whose rows pack to tens of MB runs faster split over a
    few calls, and a small one in one call). The bound also keeps the partials' memory small."""
    p = max(layer.out_h, 1)
    budget = device.cache_bytes // 2
    partial = layer.k * (layer.c // layer.groups) * layer.r * layer.s * layer.itemsize
    calls = 1
    while True:
        rows = -(-p // calls)  # the rows spread evenly over the calls
        packed = gemm_packing_bytes(device, layer.dtype, [_weight_product(layer, rows)])
        if rows == 1 or rows * partial + packed <= budget:
            return rows
        calls = -(-p // (rows - 1))  # the fewest calls with fewer rows each


def _weight_product(layer: ConvLayer, rows: int) -> tuple:
    """backward_weight's gemm_batched call over ``rows`` output rows, as gemm_packing_bytes takes it."""
    cg, kg, ih, ld, block, shift, width = _dims(layer)
    return (kg, width, layer.n * layer.out_w, rows, rows, 1, 1, ld)


def _row_chunks(rows: int, parts: int) -> list[tuple[int, int]]:
    """(first output row, rows) of each batched call of backward_weight, ``parts`` rows a call."""
    return [(h0, min(parts, rows - h0)) for h0 in range(0, rows, parts)]


def _dims(layer: ConvLayer):
    cg, kg = layer.c // layer.groups, layer.k // layer.groups
    ih = layer.h + 2 * layer.pad_h
    ld = ih * layer.s * layer.c             # leading dimension of L
    block = ih * layer.s * cg               # one group's share of a row of L
    shift = layer.stride_h * layer.s * cg   # column shift between consecutive output rows
    width = layer.r * layer.s * cg          # columns of a partition
    return cg, kg, ih, ld, block, shift, width


def _run(name: str, src: Tensor, dst: Tensor, layer: ConvLayer, count: int, *scalars) -> None:
    kernel = get_kernel(src.device, "mec.cl", name, T=dtypes.c_type(src.dtype))
    launch(src.device, kernel, (count,), local_size_1d(src.device, count),
           src.buffer, np.int64(src.offset), dst.buffer, np.int64(dst.offset), *scalars,
           geometry(src.device, layer))


def _view(t: Tensor, shape, strides, offset: int = 0) -> Tensor:
    return Tensor(t.buffer, shape, t.dtype, t.device, strides, t.offset + offset)


SLAB_ELEMENTS = 8192  # mec_lower's local-memory chunk of input rows (at most half the device's local memory)


def _lower(x: Tensor, layer: ConvLayer) -> Tensor:
    L = Tensor.empty((lowered_elements(layer),), x.dtype, x.device)
    cg = layer.c // layer.groups
    slab = min(SLAB_ELEMENTS, x.device.local_mem_bytes // 2 // layer.itemsize)
    chunks = -(-cg // max(1, slab // layer.w))
    local = 64 if x.device.kind == "cpu" else 256
    kernel = get_kernel(x.device, "mec.cl", "mec_lower", T=dtypes.c_type(x.dtype), LOCAL=local,
                        CT=-(-cg // chunks), N=layer.n, C=layer.c, H=layer.h, W=layer.w, G=layer.groups,
                        Q=layer.out_w, S=layer.s, SW=layer.stride_w, PW=layer.pad_w, DW=layer.dil_w,
                        PH=layer.pad_h)
    launch(x.device, kernel, (local, layer.h + 2 * layer.pad_h, layer.n * layer.groups), (local, 1, 1),
           x.buffer, np.int64(x.offset), L.buffer, np.int64(L.offset))
    return L


def _pack_weight(w: Tensor, layer: ConvLayer, into: Tensor | None = None) -> Tensor:
    """w (K, CG, R, S) -> the paper's (R*S*CG) x K matrix: Wt[rs][c][k] = w[k][c][rs], the transpose of
    w as a K x (CG*RS) matrix with its column (c, rs) sent to row rs*CG + c; into ``into`` when given."""
    cg, rs = layer.c // layer.groups, layer.r * layer.s
    wt = into if into is not None else Tensor.empty((rs * cg, layer.k), w.dtype, w.device)
    return transpose_into(wt, w, rows=layer.k, cols=cg * rs, src_row_stride=cg * rs,
                          col_split=(rs, layer.k, cg * layer.k))


class MecStrategy(ConvStrategy):
    name = "mec"
    keeps_weight_derivatives = True  # the rearranged weight

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if layer.dil_h != 1:
            return (f"needs dilation 1 along the height, got {layer.dil_h} (a partition of L must be "
                    f"consecutive rows)")
        from ..runtime.device import resolve_device
        device = resolve_device(device)
        if layer.w * layer.itemsize > device.local_mem_bytes:
            return (f"its lowering kernel stages whole input rows in local memory: a row of {layer.w} "
                    f"elements needs {layer.w * layer.itemsize:,} bytes, {device.name} has "
                    f"{device.local_mem_bytes:,}")
        nbytes = lowered_elements(layer) * layer.itemsize
        if nbytes > device.max_alloc_bytes:
            return (f"its lowering L (in·ow·ih·kw·ic) needs {nbytes:,} bytes, more than the largest single "
                    f"allocation {device.name} allows ({device.max_alloc_bytes:,})")
        return None

    def solution(self, layer: ConvLayer, device=None) -> str:
        """"A" or "B": which branch of line 8 the forward pass takes on a device."""
        from ..runtime.device import resolve_device
        return "A" if uses_solution_a(layer, threshold(resolve_device(device))) else "B"

    def workspace_breakdown(self, layer: ConvLayer, pass_: str, device=None) -> dict:
        """Every byte a pass allocates besides its result, by purpose:
          lowering      L (or grad_L): in·ow·ih·kw·ic elements (ih = H + 2·pad_h), every pass
          filter        forward: the filter as the paper's (kh·kw·ic) × kc matrix; backward_data: its
                        transpose (K·C/groups·R·S elements each)
          partials      backward_weight: the partial gradients, weight_partials of K·C/groups·R·S each
          grad_rows     backward_weight with a batch above 1: grad_y regrouped by output row (N·K·P·Q)
          gemm_packing  the packing buffers netcl.ops.gemm allocates for the products, from an empty
                        GEMM cache (netcl's convention; GEMM keeps them per device)
        Solution A reuses L and y's own buffer for its h-n-w-c detour, so it adds nothing."""
        from ..runtime.device import resolve_device
        device = resolve_device(device)
        cg, kg, ih, ld, block, shift, width = _dims(layer)
        n, k, p, q = layer.output_shape
        g = layer.groups
        size = layer.itemsize
        backward_weight = pass_ == "backward_weight"
        parts = weight_partials(layer, device) if backward_weight else 0
        if pass_ == "forward":
            # (M, N, K, a_batches, b_batches, a_cs, b_cs, b_rs) of every gemm_batched call, in order
            if uses_solution_a(layer, threshold(device)):
                calls = [(n * q, kg, width, p, 1, 1, 1, k)] * g
            elif n <= p:
                calls = [(q, kg, width, p, 1, 1, 1, k)] * (n * g)
            else:
                calls = [(q, kg, width, n, 1, 1, 1, k)] * (p * g)
        elif pass_ == "backward_data":
            calls = [(q, width, kg, n, 1, p * q, 1, width)] * (p * g)
        else:
            calls = [_weight_product(layer, rows) for _, rows in _row_chunks(p, parts)] * g
        weight = layer.k * width * size
        return {"lowering": lowered_elements(layer) * size,
                "filter": 0 if backward_weight else weight,
                "partials": parts * weight,
                "grad_rows": output_elements(layer) * size if backward_weight and n > 1 else 0,
                "gemm_packing": gemm_packing_bytes(device, layer.dtype, calls)}

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """Exact bytes a pass allocates besides its result: the sum of :meth:`workspace_breakdown`."""
        return sum(self.workspace_breakdown(layer, pass_, device).values())

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The compact lowering L (about R/stride times smaller than im2col's), written and read back, and
        products on shifted partitions of it: Solution A oh calls of (n·ow × RSC)·(RSC × K), Solution B
        n·oh of (ow × RSC)·(RSC × K), batched per image. backward_weight: the lowering, the regrouping of
        grad_y (batch above 1), the batched products (one call per group while weight_partials covers
        every output row) and mec_weight_sum, whose partials are written by the products and read back."""
        n, g, q, p = layer.n, layer.groups, layer.out_w, layer.out_h
        cg, kg = layer.c // g, layer.k // g
        width = cg * layer.r * layer.s
        lowered = lowered_elements(layer) * layer.itemsize
        y_bytes = output_elements(layer) * layer.itemsize
        partial_bytes = 0
        if pass_ == "forward" and self.solution(layer, device) == "A":
            product, launches = Product(n * q, kg, width, batch=p * g), 3
        elif pass_ == "forward":
            product, launches = Product(q, kg, width, batch=n * p * g), n * g + 2
        elif pass_ == "backward_data":
            product, launches = Product(width, q, kg, batch=n * p * g), p * g + 2
        else:
            from ..runtime.device import resolve_device
            parts = weight_partials(layer, resolve_device(device))
            product = Product(kg, width, n * q, batch=p * g)
            # mec_lower, the regrouping copy, g·⌈p/parts⌉ batched products, mec_weight_sum
            launches = 1 + int(n > 1) + g * -(-p // parts) + 1
            partial_bytes = 2 * parts * layer.k * width * layer.itemsize
        return CostTerms(products=[product], launches=launches,
                         bytes_moved=tensor_bytes(layer) + 3 * lowered + y_bytes + partial_bytes)

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, solution: str | None = None,
                keep: bool = False) -> Tensor:
        y = Tensor.empty(layer.output_shape, x.dtype, x.device)
        if y.size == 0:
            return y
        cg, kg, ih, ld, block, shift, width = _dims(layer)
        n, k, p, q = layer.output_shape
        L = _lower(x, layer)
        wt = derived_from_weight(w, ("mec weight", layer.k, layer.c, layer.groups, layer.r, layer.s),
                                 lambda weight, into: _pack_weight(weight, layer, into), keep)
        if solution is None:
            solution = "A" if uses_solution_a(layer, threshold(x.device)) else "B"
        for g in range(layer.groups):
            w_g = _view(wt, (1, width, kg), (0, layer.k, 1), g * kg)
            if solution == "A":
                # O[h] (in·ow × kc) = L[0:in·ow, shift·h : shift·h + width] × K, O in h-n-w-c inside y
                part = _view(L, (p, n * q, width), (shift, ld, 1), g * block)
                o_hnwc = _view(y, (p, n * q, kg), (n * q * k, k, 1), g * kg)
                gemm_batched(part, w_g, c=o_hnwc)
            elif n <= p:
                for i in range(n):  # one batched call per sample over its oh output rows
                    part = _view(L, (p, q, width), (shift, ld, 1), i * q * ld + g * block)
                    rows = _view(y, (p, q, kg), (q, 1, p * q), (i * k + g * kg) * p * q)
                    gemm_batched(part, w_g, c=rows)
            else:
                for h in range(p):  # the same in·oh products, one batched call per output row
                    part = _view(L, (n, q, width), (q * ld, ld, 1), h * shift + g * block)
                    rows = _view(y, (n, q, kg), (k * p * q, 1, p * q), g * kg * p * q + h * q)
                    gemm_batched(part, w_g, c=rows)
        if solution == "A":
            # lines 14-19: O (h-n-w-c, inside y) is permuted into L (|O| ≤ |L|, free by now) as n-c-h-w,
            # then copied back into y: y[i][:][h][:] is the transpose of O[h][i] (ow × kc)
            transpose_into(L, y, rows=n * q, cols=k, src_row_stride=k, row_split=(q, k * p * q),
                           col_split=(k, 0, p * q), batches=p, batch_strides=(n * q * k, q))
            copy_into(_view(y, (y.size,), (1,)), _view(L, (y.size,), (1,)))
        return y

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        gx = Tensor.empty(layer.input_shape, w.dtype, w.device)
        if gx.size == 0:
            return gx
        cg, kg, ih, ld, block, shift, width = _dims(layer)
        n, k, p, q = layer.output_shape
        w2 = Tensor.empty((layer.k, width), w.dtype, w.device)
        rs = layer.r * layer.s
        # W2[k][rs*CG + c] = w[k][c][rs]: per output channel k, the (CG x RS) block transposed
        transpose_into(w2, w, rows=cg, cols=rs, src_row_stride=rs, batches=layer.k, batch_strides=(width, width))
        grad_l = fill(Tensor.empty((lowered_elements(layer),), w.dtype, w.device), 0.0)
        for g in range(layer.groups):
            w_g = _view(w2, (1, kg, width), (0, width, 1), g * kg * width)
            for h in range(p):
                # partition h of every sample: (ow × width) += grad_y row h, transposed (ow × kg) · K_gᵀ
                rows = _view(grad_y, (n, q, kg), (k * p * q, 1, p * q), g * kg * p * q + h * q)
                part = _view(grad_l, (n, q, width), (q * ld, ld, 1), g * block + h * shift)
                gemm_batched(rows, w_g, c=part, beta=1.0)
        _run("mec_scatter", grad_l, gx, layer, gx.size)
        return gx

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        gw = Tensor.empty(layer.weight_shape, x.dtype, x.device)
        if gw.size == 0:
            return gw
        cg, kg, ih, ld, block, shift, width = _dims(layer)
        n, k, p, q = layer.output_shape
        L = _lower(x, layer)
        if n > 1:
            # grad_y regrouped as [p][k][n][q] so that one output row of the whole batch is a matrix
            grad_rows = Tensor.empty((p, k, n, q), x.dtype, x.device)
            copy_into(grad_rows, _view(grad_y, (p, k, n, q), (q, p * q, k * p * q, 1)))
            row_stride, channel_stride = k * n * q, n * q
        else:  # grad_y itself: row h of channel k starts at k·P·Q + h·Q
            grad_rows, row_stride, channel_stride = grad_y, q, p * q
        parts = weight_partials(layer, x.device)
        # partials[j] (K x width): gW2 of output row h0 + j, summed over the calls (first rows h0)
        partials = Tensor.empty((parts, k, width), x.dtype, x.device)
        for g in range(layer.groups):
            for h0, rows in _row_chunks(p, parts):
                a = _view(grad_rows, (rows, kg, n * q), (row_stride, channel_stride, 1),
                          h0 * row_stride + g * kg * channel_stride)
                b = _view(L, (rows, n * q, width), (shift, ld, 1), g * block + h0 * shift)
                c = _view(partials, (rows, kg, width), (k * width, width, 1), g * kg * width)
                gemm_batched(a, b, c=c, beta=0.0 if h0 == 0 else 1.0)
        # grad_w[k][c][rs] = Σ_j partials[j][k][rs*CG + c]
        _run("mec_weight_sum", partials, gw, layer, gw.size, np.int64(parts))
        return gw


STRATEGY = MecStrategy()
