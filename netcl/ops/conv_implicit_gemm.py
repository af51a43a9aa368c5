"""The `implicit_gemm` conv2d strategy: each pass is one tiled GEMM whose tiles gather their operands
straight from the input / gradient tensors into local memory (kernels/implicit_gemm.cl). No lowered
matrix exists anywhere, so the workspace is 0 bytes for every pass; every stride, padding, dilation and
group count is served.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime import first_step, memory
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, epilogue_operands, tensor_bytes

# (TM, TN, TK): a work-item (= work-group, see kernels/implicit_gemm.cl) multiplies a TM-row slice of A
# into one vector of TN columns; TM follows the row count (small layers waste little, large ones reuse
# each gathered B element TM times: every further row tile gathers the whole B again, which costs the
# 512- to 2048-channel layers of ImageNet networks more than the multiply-adds a tile shares). TK is the
# B panel gathered per step, over which four rows' accumulators stay in registers: 512 measured best on
# PoCL (cv5-cv12 at batch 32: 0.91-1.08x im2col against 0.64-0.86x with the earlier 16-deep staging of
# both operands).
ROW_TILES = (16, 32, 64, 128, 256, 512)
SPLIT_ROW_TILE = 256  # a larger tile is halved, down to this, while work-groups are fewer than compute units
TILE_K = 512
ROW_BLOCK = 4  # rows multiplied together in registers


def padding_granularity(tile) -> tuple[int, int, int]:
    """What the kernel pads each GEMM dimension to: rows to ROW_BLOCK (a partial row tile runs only its
    rows), columns to the TN-wide vector, the inner dimension not at all (a partial panel is shorter)."""
    return ROW_BLOCK, tile[1], 1


def geometry(device, layer: ConvLayer):
    """The int64 geometry array kernels/implicit_gemm.cl (and winograd.cl, mec.cl) read."""
    return memory.meta_buffer(device, (layer.n, layer.c, layer.h, layer.w, layer.k, layer.r, layer.s,
                                       layer.out_h, layer.out_w, layer.stride_h, layer.stride_w,
                                       layer.pad_h, layer.pad_w, layer.dil_h, layer.dil_w, layer.groups))


def gemm_dims(layer: ConvLayer, pass_: str) -> tuple[int, int, int]:
    """(rows, columns, inner) of one group's GEMM for a pass; for backward_data, of its largest residue
    class (the launch grid covers that one; see kernels/implicit_gemm.cl)."""
    cg, kg, rs = layer.c // layer.groups, layer.k // layer.groups, layer.r * layer.s
    pq = layer.out_h * layer.out_w
    if pass_ == "forward":
        return kg, layer.n * pq, cg * rs
    if pass_ == "backward_data":
        classes = residue_classes(layer)
        return cg, layer.n * max(c[0] for c in classes), kg * max(c[1] for c in classes)
    return kg, cg * rs, layer.n * pq


def _residues(size: int, pad: int, dilation: int, stride: int, taps: int) -> list[tuple[int, int]]:
    """Per residue a = position mod stride along one axis: (positions in it, kernel taps that reach an
    output from it), the kernel's HC and RV."""
    out = []
    for a in range(stride):
        positions = -(-(size - a) // stride) if a < size else 0
        out.append((positions, sum((a + pad - t * dilation) % stride == 0 for t in range(taps))))
    return out


def residue_classes(layer: ConvLayer) -> list[tuple[int, int]]:
    """backward_data's residue classes: (input positions per image, valid taps) of each. A stride skips
    taps, so a class's inner dimension holds only its own (a 1x1 kernel at stride 2 leaves three of four
    classes with none), and the pass does about 1/(stride_h*stride_w) of the taps' flops."""
    rows = _residues(layer.h, layer.pad_h, layer.dil_h, layer.stride_h, layer.r)
    cols = _residues(layer.w, layer.pad_w, layer.dil_w, layer.stride_w, layer.s)
    return [(hc * wc, rv * sv) for hc, rv in rows for wc, sv in cols]


def _columns_by_inner(layer: ConvLayer, pass_: str) -> int:
    """Σ columns × inner of one group's GEMMs (backward_data: of every residue class): the B elements
    a row tile gathers, each multiplied with every row."""
    if pass_ == "backward_data":
        taps_per_image = sum(positions * taps for positions, taps in residue_classes(layer))
        return taps_per_image * layer.n * (layer.k // layer.groups)
    _, cols, inner = gemm_dims(layer, pass_)
    return cols * inner


def useful_flops(layer: ConvLayer, pass_: str) -> float:
    """The multiply-adds the pass's kernel does (x2) over every group (and residue class)."""
    rows = gemm_dims(layer, pass_)[0]
    return 2.0 * rows * _columns_by_inner(layer, pass_) * layer.groups


def _slices(layer: ConvLayer, pass_: str) -> int:
    """The launch's third dimension: groups, times backward_data's residue classes."""
    return layer.groups * (layer.stride_h * layer.stride_w if pass_ == "backward_data" else 1)


def choose_tile(layer: ConvLayer, pass_: str, units: int | None = None) -> tuple[int, int, int]:
    """(TM, TN, TK) for a pass on a device with ``units`` compute units (None: no device to fill): the
    smallest row tile holding every row, at most ROW_TILES[-1]; one above SPLIT_ROW_TILE is halved while
    the launch would have fewer work-groups than the device has units."""
    rows, cols, _ = gemm_dims(layer, pass_)
    tm, tn = next((t for t in ROW_TILES if t >= rows), ROW_TILES[-1]), 16 if layer.dtype == "float32" else 8
    while (units is not None and tm > SPLIT_ROW_TILE
           and -(-rows // tm) * -(-cols // tn) * _slices(layer, pass_) < units):
        tm //= 2
    return tm, tn, TILE_K


def run_pass(pass_: str, a: Tensor, b: Tensor, out: Tensor, layer: ConvLayer, tile=None,
             bias: Tensor | None = None, residual: Tensor | None = None, activation: str = "none") -> Tensor:
    """out = the pass's GEMM of a (weight or grad_y) and b (x or grad_y) for every group; forward only:
    + bias[k] for every output of channel k, + residual (of the output's shape), then the activation."""
    if out.size == 0:
        return out
    tm, tn, tk = tile or choose_tile(layer, pass_, a.device.compute_units)
    rows, cols, _ = gemm_dims(layer, pass_)
    params = dict(T=dtypes.c_type(a.dtype), MODE=pass_, TM=tm, TN=tn, TK=tk, BIAS=bias is not None)
    if pass_ == "forward":
        params.update(RESIDUAL=residual is not None, ACT=activation)
    if tile is None:  # any row tile computes the pass: the cold step takes one already built
        params = first_step.variant(a.device, "implicit_gemm.cl", f"igemm_{pass_}", params, free=("TM",))
        tm = params["TM"]
    kernel = get_kernel(a.device, "implicit_gemm.cl", f"igemm_{pass_}", **params)
    slices = _slices(layer, pass_)
    launch(a.device, kernel, (-(-cols // tn), -(-rows // tm), slices), (1, 1, 1),
           a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), out.buffer, np.int64(out.offset),
           geometry(a.device, layer), *epilogue_operands(out, bias, residual))
    return out


def gathered_bytes(layer: ConvLayer, pass_: str, units: int | None = None) -> float:
    """What the tiles gather into local memory: each row tile gathers its columns' whole inner dimension
    once (an index lookup, a bounds test and a store per element), however few rows then use it. With one
    to three rows (an RGB stem's backward_data, a depthwise layer) the gathering, not the multiply-adds,
    is the pass's time."""
    row_tiles = -(-gemm_dims(layer, pass_)[0] // choose_tile(layer, pass_, units)[0])
    return float(row_tiles * _columns_by_inner(layer, pass_) * layer.groups * layer.itemsize)


WORK_PER_UNIT = 4  # work-groups per compute unit that keep it busy


def tile_efficiency(layer: ConvLayer, pass_: str, units: int) -> float:
    """Useful fraction of the kernel's arithmetic: what padding to its granularity wastes, and
    work-groups too few to fill the device's compute units."""
    (m, n, k), tile = gemm_dims(layer, pass_), choose_tile(layer, pass_, units)
    slices = _slices(layer, pass_)
    padded = 1.0
    for d, g in zip((m, n, k), padding_granularity(tile)):
        padded *= d / (-(-d // g) * g)
    groups = -(-m // tile[0]) * -(-n // tile[1]) * slices
    return padded * min(1.0, groups / (WORK_PER_UNIT * units))


class ImplicitGemmStrategy(ConvStrategy):
    name = "implicit_gemm"
    kernels_serve_any_layer = True  # the geometry is a buffer argument; any row tile serves (run_pass)

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """One tiled product in its own kernel (the padding and idle units it wastes counted as flops),
        every tensor read in place once."""
        from ..runtime.device import resolve_device
        units = resolve_device(device).compute_units
        return CostTerms(kernel_flops=useful_flops(layer, pass_) / tile_efficiency(layer, pass_, units),
                         bytes_moved=tensor_bytes(layer) + gathered_bytes(layer, pass_, units), launches=1)

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        rows, cols, inner = gemm_dims(layer, pass_)
        # the kernel indexes with 32-bit ints
        biggest = max(layer.n * layer.c * layer.h * layer.w, layer.n * layer.k * layer.out_h * layer.out_w,
                      layer.k * (layer.c // layer.groups) * layer.r * layer.s, cols, inner)
        if biggest >= 2 ** 31 - 2 ** 30:
            return f"a tensor or GEMM dimension of {biggest:,} elements exceeds the kernel's 32-bit indexing"
        return None

    fuses_bias = True  # forward(..., bias=) adds the bias as it stores the output
    fuses_epilogue = True  # and forward(..., residual=, activation=) the rest of an inference epilogue

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none") -> Tensor:
        return run_pass("forward", w, x, Tensor.empty(layer.output_shape, x.dtype, x.device), layer, bias=bias,
                        residual=residual, activation=activation)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        return run_pass("backward_data", w, grad_y, Tensor.empty(layer.input_shape, w.dtype, w.device), layer)

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        return run_pass("backward_weight", grad_y, x, Tensor.empty(layer.weight_shape, x.dtype, x.device), layer)


STRATEGY = ImplicitGemmStrategy()
