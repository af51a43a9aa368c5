"""The `pointwise` conv2d strategy: 1×1 kernels at stride 1 without padding, any groups
(kernels/conv_pointwise.cl).

Such a layer is a product per image and group whose operand rows are whole channel planes, so the
kernels read the tensors in place: forward and backward_data give each work-item one vector of adjacent
pixels and a tile of output channels, all their accumulators in registers over the whole (short) inner
dimension; backward_weight gives each work-item a tile of (output, input) channel pairs and sums over
every pixel of every image. Nothing is lowered, gathered or packed, and nothing is launched but the one
kernel, which is what MobileNet's and ResNet's narrow 1×1 layers at batch 1 need: there the gather tables
of implicit GEMM and the packing and tiling of a general GEMM cost as much as the products.

The geometry follows the device: a CPU runs work-groups of one work-item whose pixel vectors are its
register width (netcl.ops.gemm.register_lanes), a GPU single pixels in groups of GPU_GROUP adjacent ones.
Which of pixel vectors and row tiles a CPU runs innermost depends on the product (pixels_first).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..runtime.device import resolve_device
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, epilogue_operands, tensor_bytes
from .gemm import register_lanes

KERNELS = {"forward": "pointwise_forward", "backward_data": "pointwise_backward_data",
           "backward_weight": "pointwise_backward_weight"}
GPU_GROUP = 64  # a GPU's work-items per group: adjacent pixels, so each load is coalesced
# Rows per work-item for forward and backward_data, among which the fewest wasted rows decide (the larger
# on a tie): each is one vector accumulator, and past the register file's size (32 vectors on AVX-512,
# 16 on AVX2) they spill.
ROW_TILES = {16: (4, 8, 12, 16), 8: (4, 8, 12), 4: (4, 8, 12), 2: (4, 8), 1: (4, 8, 16)}
# backward_weight's tile: TM gradient rows by TC input channels, TM·TC vector accumulators
WEIGHT_TILE = (4, 4)


@dataclass(frozen=True)
class Geometry:
    """How one pass runs: ``vector`` pixels per work-item, ``rows`` (and for backward_weight ``cols``)
    channels per work-item, and the launch."""
    vector: int
    rows: int
    cols: int
    global_size: tuple
    local_size: tuple


def _product_dims(layer: ConvLayer, pass_: str) -> tuple[int, int]:
    """(rows of one group's result, its inner dimension) of forward or backward_data."""
    kg, cg = layer.k // layer.groups, layer.c // layer.groups
    return (kg, cg) if pass_ == "forward" else (cg, kg)


def _vector(device, dtype: str, pixels: int) -> int:
    """The CPU's register width narrowed to the widest power of two the plane holds; 1 on a GPU."""
    if device.kind != "cpu":
        return 1
    width = register_lanes(device, dtype)
    while width > 1 and width > pixels:
        width //= 2
    return width


def _row_tile(rows: int, vector: int) -> int:
    tiles = ROW_TILES.get(vector, ROW_TILES[1])
    return min(tiles, key=lambda t: (-(-rows // t) * t, -t))


def geometry(layer: ConvLayer, pass_: str, device) -> Geometry:
    pq = layer.h * layer.w
    vector = _vector(device, layer.dtype, pq)
    if pass_ == "backward_weight":
        tm, tc = WEIGHT_TILE
        kg, cg = layer.k // layer.groups, layer.c // layer.groups
        return Geometry(vector, tm, tc, (-(-cg // tc), -(-kg // tm), layer.groups), (1, 1, 1))
    rows, _ = _product_dims(layer, pass_)
    tm = _row_tile(rows, vector)
    blocks = -(-pq // vector)
    if not pixels_first(device, layer, pass_):
        return Geometry(vector, tm, 1, (-(-rows // tm), blocks, layer.n * layer.groups), (1, 1, 1))
    group = _pixel_group(device)
    return Geometry(vector, tm, 1, (group * -(-blocks // group), -(-rows // tm), layer.n * layer.groups),
                    (group, 1, 1))


def _pixel_group(device) -> int:
    """Work-items per group of a pixels-first launch: one on a CPU, GPU_GROUP adjacent pixels on a GPU."""
    return 1 if device.kind == "cpu" else min(GPU_GROUP, device.max_work_group_size)


def pixels_first(device, layer: ConvLayer, pass_: str) -> bool:
    """Whether forward and backward_data launch pixel vectors along the first dimension. On a GPU, always:
    a group's work-items read adjacent pixels. A CPU runs the first dimension innermost: row tiles first
    keep one vector of pixels' input planes in cache while its row tiles follow each other, but write
    every result plane at once; pixels first write a row tile's planes front to back and read the input
    planes again for each row tile. The first wins where the product has at most as many result rows
    as inner ones (a projection), the second where it has more (an expansion, whose scattered writes
    to many planes miss the cache)."""
    if device.kind != "cpu":
        return True
    rows, inner = _product_dims(layer, pass_)
    return rows > inner


def issued_flops(layer: ConvLayer, pass_: str, device) -> float:
    """Multiply-adds (×2) the kernel issues: padded row (and column) tiles and the moved-back last vector's
    pixels counted."""
    shape = geometry(layer, pass_, device)
    pq = layer.h * layer.w
    pixels = -(-pq // shape.vector) * shape.vector
    if pass_ == "backward_weight":
        return 2.0 * layer.groups * shape.global_size[1] * shape.rows * shape.global_size[0] * shape.cols \
            * layer.n * pixels
    rows, inner = _product_dims(layer, pass_)
    return 2.0 * layer.n * layer.groups * -(-rows // shape.rows) * shape.rows * inner * pixels


def moved_bytes(layer: ConvLayer, pass_: str, device) -> float:
    """Every tensor once, plus the operand planes each further tile of rows (or columns) reads again where
    the tiles run apart (pixels first; with row tiles first the row tiles of a vector of pixels run
    together, so their source is in cache)."""
    shape = geometry(layer, pass_, device)
    itemsize = layer.itemsize
    x_bytes = layer.n * layer.c * layer.h * layer.w * itemsize
    y_bytes = layer.n * layer.k * layer.h * layer.w * itemsize
    if pass_ == "backward_weight":
        return tensor_bytes(layer) + (shape.global_size[1] - 1) * x_bytes + (shape.global_size[0] - 1) * y_bytes
    if not pixels_first(device, layer, pass_):
        return tensor_bytes(layer)
    rows, _ = _product_dims(layer, pass_)
    source = x_bytes if pass_ == "forward" else y_bytes
    return tensor_bytes(layer) + (-(-rows // shape.rows) - 1) * source


def _run(pass_: str, layer: ConvLayer, a: Tensor, b: Tensor, out: Tensor, bias: Tensor | None = None,
         residual: Tensor | None = None, activation: str = "none") -> Tensor:
    device = a.device
    shape = geometry(layer, pass_, device)
    params = dict(KERNEL=pass_, T=dtypes.c_type(a.dtype), VW=shape.vector, TM=shape.rows)
    if pass_ != "backward_weight":
        params["PIXELS_FIRST"] = pixels_first(device, layer, pass_)
    if pass_ == "forward":
        params.update(BIAS=bias is not None, RESIDUAL=residual is not None, ACT=activation)
    if pass_ == "backward_weight":
        params["TC"] = shape.cols
        sizes = (layer.k // layer.groups, layer.c // layer.groups, layer.h * layer.w, layer.n)
    else:
        sizes = (*_product_dims(layer, pass_), layer.h * layer.w, layer.groups)
    kernel = get_kernel(device, "conv_pointwise.cl", KERNELS[pass_], **params)
    launch(device, kernel, shape.global_size, shape.local_size, a.buffer, np.int64(a.offset), b.buffer,
           np.int64(b.offset), out.buffer, np.int64(out.offset), *epilogue_operands(out, bias, residual),
           *(np.int32(v) for v in sizes))
    return out


class PointwiseStrategy(ConvStrategy):
    name = "pointwise"
    fuses_bias = True  # forward(..., bias=) adds the bias as it stores the output
    fuses_epilogue = True  # and forward(..., residual=, activation=) the rest of an inference epilogue

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if (layer.r, layer.s) != (1, 1):
            return f"the kernel is {layer.r}×{layer.s}; the pointwise kernels need a 1×1 kernel"
        if (layer.stride_h, layer.stride_w) != (1, 1):
            return (f"stride {(layer.stride_h, layer.stride_w)}: the pointwise kernels read whole planes "
                    f"(stride 1)")
        if (layer.pad_h, layer.pad_w) != (0, 0):
            return f"padding {(layer.pad_h, layer.pad_w)}: the pointwise kernels need no padding"
        biggest = max(layer.n * layer.c * layer.h * layer.w, layer.n * layer.k * layer.h * layer.w)
        if biggest >= 2 ** 31:
            return f"a tensor of {biggest:,} elements exceeds the kernels' 32-bit indexing"
        return None

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The arithmetic the kernel issues (padded tiles counted), every tensor once plus the planes that
        further tiles read again, one launch."""
        device = resolve_device(device)
        return CostTerms(kernel_flops=issued_flops(layer, pass_, device),
                         bytes_moved=moved_bytes(layer, pass_, device), launches=1)

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none") -> Tensor:
        return _run("forward", layer, w, x, Tensor.empty(layer.output_shape, x.dtype, x.device), bias=bias,
                    residual=residual, activation=activation)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        return _run("backward_data", layer, w, grad_y, Tensor.empty(layer.input_shape, grad_y.dtype,
                                                                      grad_y.device))

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        return _run("backward_weight", layer, grad_y, x, Tensor.empty(layer.weight_shape, x.dtype, x.device))


STRATEGY = PointwiseStrategy()
