"""The `direct_blocked` conv2d strategy: register-blocked direct convolution (kernels/conv_blocked.cl).

A work-item keeps a block of outputs (several output channels × a run of output positions, one vector
per channel) in registers for the whole reduction and builds the shifted input vectors each kernel column
needs from one load of each input row, so every loaded element feeds many multiply-adds and no lowered
matrix or transformed tensor exists. Its workspace: the weight packed so that the channels of a block
lie side by side (kept with the weight in inference, netcl.ops.kept), and backward_weight's partial
sums per chunk of images. It serves undilated, ungrouped layers: the 3×3 and 1×1 convolutions of
residual networks, where the GEMM-based strategies lose most on narrow channels, and strided layers
such as the stems of ImageNet networks (a 7×7 or 3×3 kernel at stride 2 on three channels), whose
lowered matrix would be larger than their input and output together. A strided block loads stride ×
lanes consecutive input columns per row and takes every stride-th. backward_data is the same kernel
on the output gradient with the weight packed flipped, for stride 1.

How large a block is follows the device: as many lanes as its vectors have (4 to 16; on a CPU as the GEMM
tuner measured them, see netcl.ops.gemm.register_lanes) and
as many output channels as fill about half of a CPU's vector register file with accumulators (16 vectors
where the width is 16, as on AVX-512's 32 registers; 8 where it is 8, as on AVX2's 16).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime.kernels import get_kernel, launch, local_size_1d, round_up
from ..tensor import Tensor
from .gemm import register_lanes
from .kept import derived_from_weight
from .reduce import reduce
from .conv_common import ConvLayer, ConvStrategy, CostTerms, epilogue_operands, tensor_bytes

KERNELS = {"output": "conv_blocked_output", "weight": "conv_blocked_weight", "pack": "conv_blocked_pack"}  # by MODE
WORK_PER_UNIT = 4  # work-items per compute unit that keep it busy (as implicit GEMM's work-groups)


def _vector_width(device, dtype: str) -> int:
    """A CPU's vectors as its compiler builds them (netcl.ops.gemm.register_lanes: the tuned GEMM's tile
    width, else the reported one; the PoCL wheel's AVX2 code for a Zen 4 ran these blocks 1.2-1.6x
    faster at 8 lanes than at the 16 it reports), a GPU's as it reports them."""
    if device.kind == "cpu":
        return register_lanes(device, dtype)
    return device.native_vector_width.get(dtype, 1)


def lanes(device, dtype: str) -> int:
    """Vector lanes per work-item: the device's vector width for the dtype, kept within 4..16."""
    native = _vector_width(device, dtype)
    return 4 if native <= 4 else (8 if native <= 8 else 16)


def channel_budget(device, pass_: str, kernel_width: int) -> int:
    """Output channels a work-item may hold: accumulator vectors for half the vector registers of the ISA
    its float width suggests (16 or 8); backward_weight holds S vectors per channel and may use
    three quarters of the registers, as it keeps no weights in flight."""
    half = 16 if _vector_width(device, "float32") >= 16 else 8
    return max(1, (3 * half // 2) // kernel_width) if pass_ == "backward_weight" else half


def _largest_divisor(count: int, limit: int) -> int:
    return max(d for d in range(1, min(count, limit) + 1) if count % d == 0)


def _row_shape(device, dtype: str, out_h: int, out_w: int) -> tuple[int, int]:
    """(QW, ROWS): lanes along a row, rows per work-item. A narrow row shares the vector with the next rows.
    Where a row is narrower than the vector but at least half as wide, half the vector over two rows
    is taken instead if it computes no more lanes (a 12-wide row: 8 lanes x 2 rows rather than 16 x 1):
    its last block shifts back onto the output (_edges), and without the stores' lane tests Intel's
    CPU compiler runs the whole kernel faster (PoCL's a little)."""
    width = lanes(device, dtype)
    qw = width
    while qw > 2 and qw // 2 >= out_w:
        qw //= 2
    rows = width // qw
    while rows > 1 and rows // 2 >= out_h:
        rows //= 2
        qw = width // rows

    def computed(qw, rows):  # lanes the blocks cover, the output and the part past it
        return -(-out_w // qw) * qw * -(-out_h // rows) * rows

    half = width // 2
    if ((out_w % qw or out_h % rows) and (qw > out_w or rows > out_h) and qw == width
            and 2 <= half <= out_w and 2 <= out_h and computed(half, 2) <= computed(qw, rows)):
        qw, rows = half, 2
    return qw, rows


def _edges(qw: int, rows: int, out_h: int, out_w: int, in_w: int, stride: int = 1) -> dict:
    """The template's TAIL and SHIFT for an output of out_h x out_w read from rows in_w wide: where the
    blocks do not tile the output but it is at least one block in size, the last block of a row (of
    the rows) is shifted back onto the output (SHIFT), and only loads past the input still need bounds
    tests (TAIL); otherwise TAIL says whether some block reaches past the output or its row loads past
    the input (a block loads stride x qw input columns)."""
    partial = out_w % qw != 0 or out_h % rows != 0
    shift = partial and out_w >= qw and out_h >= rows
    last_block = out_w - qw if shift else (-(-out_w // qw) - 1) * qw
    return dict(TAIL=stride * (last_block + qw) > in_w or (not shift and partial), SHIFT=shift)


def blocking(layer: ConvLayer, pass_: str, device) -> dict:
    """The template's blocking for one pass on one device (what conv_blocked.cl is compiled with)."""
    budget = channel_budget(device, pass_, layer.s)
    if pass_ == "backward_weight":
        qw, rows = _row_shape(device, layer.dtype, layer.out_h, layer.out_w)
        return dict(MODE="weight", KB=_largest_divisor(layer.k, budget), QW=qw, ROWS=rows, S=layer.s,
                    STRIDE=layer.stride_w, PW=layer.pad_w,
                    **_edges(qw, rows, layer.out_h, layer.out_w, layer.w, layer.stride_w))
    if pass_ == "forward":
        qw, rows = _row_shape(device, layer.dtype, layer.out_h, layer.out_w)
        return dict(MODE="output", FLIP=False, KB=_largest_divisor(layer.k, budget), QW=qw, ROWS=rows,
                    S=layer.s, STRIDE=layer.stride_w, PW=layer.pad_w,
                    **_edges(qw, rows, layer.out_h, layer.out_w, layer.w, layer.stride_w))
    qw, rows = _row_shape(device, layer.dtype, layer.h, layer.w)
    return dict(MODE="output", FLIP=True, KB=_largest_divisor(layer.c, budget), QW=qw, ROWS=rows, S=layer.s,
                PW=layer.s - 1 - layer.pad_w, **_edges(qw, rows, layer.h, layer.w, layer.out_w))


def weight_chunks(layer: ConvLayer, block: dict) -> int:
    """Image chunks of backward_weight. Many small chunks keep each chunk's images in cache for all its
    work-items, but each chunk costs a partial gradient (one weight) to store and sum, and each
    work-item a sum across the lanes of its KB·S accumulators: so no more chunks than keep the partials
    no larger than the tensors they come from, and at least 4·lanes vector steps per work-item, which
    makes the lane sums a small fraction of its multiply-adds. ``block``: backward_weight's blocking."""
    steps_per_image = -(-layer.out_h // block["ROWS"]) * -(-layer.out_w // block["QW"])
    fewest_images = -(-4 * block["QW"] * block["ROWS"] // steps_per_image)
    weight = layer.k * layer.c * layer.r * layer.s
    tensors = layer.n * (layer.c * layer.h * layer.w + layer.k * layer.out_h * layer.out_w)
    return max(1, min(layer.n // fewest_images, tensors // weight))


def _grid(layer: ConvLayer, pass_: str, block: dict) -> tuple[int, int, int]:
    if pass_ == "backward_weight":
        return layer.c, layer.r, layer.k // block["KB"] * weight_chunks(layer, block)
    out_h, out_w, channels = ((layer.out_h, layer.out_w, layer.k) if pass_ == "forward"
                              else (layer.h, layer.w, layer.c))
    return -(-out_w // block["QW"]), -(-out_h // block["ROWS"]), layer.n * channels // block["KB"]


def issued_flops(layer: ConvLayer, pass_: str) -> float:
    """The multiply-adds (x2) the kernel issues: every tap of every output it computes. backward_data
    computes all H x W input positions with all R x S taps, those that land in the padding included (a
    5x5 gradient of a 7x7 input, padding 0: twice the forward pass's)."""
    if pass_ == "backward_data":
        return 2.0 * layer.n * layer.c * (layer.k // layer.groups) * layer.r * layer.s * layer.h * layer.w
    return float(layer.flops)


def efficiency(layer: ConvLayer, pass_: str, device) -> float:
    """Useful fraction of the arithmetic the kernel issues: lanes past the rows' ends, accumulator blocks
    smaller than the register budget (each loaded input feeds fewer multiply-adds), and work-items too
    few to fill the compute units."""
    block = blocking(layer, pass_, device)
    out_h, out_w = (layer.h, layer.w) if pass_ == "backward_data" else (layer.out_h, layer.out_w)
    used = (out_w / (-(-out_w // block["QW"]) * block["QW"])) * (out_h / (-(-out_h // block["ROWS"]) * block["ROWS"]))
    reuse = min(1.0, (block["KB"] / channel_budget(device, pass_, layer.s)) ** 0.5)
    items = int(np.prod(_grid(layer, pass_, block)))
    return used * reuse * min(1.0, items / (WORK_PER_UNIT * device.compute_units))


def _pack(w: Tensor, layer: ConvLayer, block: dict, into: Tensor | None) -> Tensor:
    """The weight as the output kernel reads it: KB output channels side by side for each (input
    channel, kernel row, kernel column) (kernels/conv_blocked.cl, conv_blocked_pack)."""
    flip = block["FLIP"]
    out_channels, in_channels = (layer.c, layer.k) if flip else (layer.k, layer.c)
    packed = into if into is not None else Tensor.empty((w.size,), w.dtype, w.device)
    if w.size:
        kernel = get_kernel(w.device, "conv_blocked.cl", KERNELS["pack"], T=dtypes.c_type(w.dtype), MODE="pack",
                            FLIP=flip, KB=block["KB"], S=layer.s)
        units = w.size // block["KB"]
        (local,) = local_size_1d(w.device, units)
        launch(w.device, kernel, (round_up(units, local),), (local,), w.buffer, np.int64(w.offset),
               packed.buffer, np.int64(packed.offset), np.int32(out_channels), np.int32(in_channels),
               np.int32(layer.r))
    return packed


def packed_weight(w: Tensor, layer: ConvLayer, block: dict, keep: bool = False) -> Tensor:
    """:func:`_pack` of ``w`` for this blocking, kept with the weight in inference (netcl.ops.kept)."""
    return derived_from_weight(w, ("direct_blocked packed", block["FLIP"], block["KB"], layer.k, layer.c,
                                   layer.r, layer.s), lambda weight, into: _pack(weight, layer, block, into), keep)


def _launch(device, pass_: str, layer: ConvLayer, block: dict, a: Tensor, b: Tensor, out: Tensor,
            bias: Tensor | None = None, residual: Tensor | None = None, activation: str = "none") -> Tensor:
    if out.size == 0:
        return out
    params = dict(block, T=dtypes.c_type(a.dtype))
    if block["MODE"] == "output":
        del params["FLIP"]  # the packed weight holds the flip: both data passes share one program
        params["BIAS"] = bias is not None
        if pass_ == "forward":
            params.update(RESIDUAL=residual is not None, ACT=activation)
    kernel = get_kernel(device, "conv_blocked.cl", KERNELS[block["MODE"]], **params)
    if pass_ == "forward":
        sizes = (layer.n, layer.c, layer.h, layer.w, layer.k, layer.out_h, layer.out_w, layer.r, layer.pad_h)
    elif pass_ == "backward_data":
        sizes = (layer.n, layer.k, layer.out_h, layer.out_w, layer.c, layer.h, layer.w, layer.r,
                 layer.r - 1 - layer.pad_h)
    else:
        images = -(-layer.n // weight_chunks(layer, block))
        sizes = (layer.n, layer.c, layer.h, layer.w, layer.k, layer.out_h, layer.out_w, layer.r, layer.pad_h,
                 images)
    args = [a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), out.buffer, np.int64(out.offset),
            *(np.int32(v) for v in sizes)]
    if block["MODE"] == "output":
        args += epilogue_operands(out, bias, residual)
    launch(device, kernel, _grid(layer, pass_, block), (1, 1, 1), *args)
    return out


class DirectBlockedStrategy(ConvStrategy):
    name = "direct_blocked"
    fuses_bias = True  # forward(..., bias=) adds the bias as it stores the output
    fuses_epilogue = True  # and forward(..., residual=, activation=) the rest of an inference epilogue
    keeps_weight_derivatives = True  # the packed weight

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if layer.stride_h != layer.stride_w:
            return (f"stride {(layer.stride_h, layer.stride_w)}: the register-blocked kernels take one "
                    f"stride for rows and columns")
        if pass_ == "backward_data" and layer.stride_h != 1:
            return (f"stride {(layer.stride_h, layer.stride_w)}: backward_data's register-blocked kernel is "
                    f"the transposed convolution of stride 1")
        if (layer.dil_h, layer.dil_w) != (1, 1):
            return f"dilation {(layer.dil_h, layer.dil_w)}: the register-blocked kernels need dilation 1"
        if layer.groups != 1:
            return f"groups={layer.groups}: the register-blocked kernels serve ungrouped layers"
        if layer.s > 16:
            return f"a kernel {layer.s} columns wide: the register-blocked kernels hold at most 16 shifted rows"
        if pass_ == "backward_data" and (layer.pad_h > layer.r - 1 or layer.pad_w > layer.s - 1):
            return (f"padding {(layer.pad_h, layer.pad_w)} exceeds the kernel size minus one, which the "
                    f"transposed convolution of backward_data would need as negative padding")
        biggest = max(layer.n * layer.c * layer.h * layer.w, layer.n * layer.k * layer.out_h * layer.out_w)
        if biggest >= 2 ** 31 - 2 ** 30:
            return f"a tensor of {biggest:,} elements exceeds the kernel's 32-bit indexing"
        return None

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The definition's arithmetic in its own kernel (the lanes, channels and work-items it wastes
        counted as flops), every tensor read once, the weight packed first (read and written once more)."""
        from ..runtime.device import resolve_device
        partials = self.workspace_bytes(layer, pass_, device)
        return CostTerms(kernel_flops=issued_flops(layer, pass_) / efficiency(layer, pass_, resolve_device(device)),
                         bytes_moved=tensor_bytes(layer) + 2 * partials, launches=1 + (partials > 0))

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none", keep: bool = False) -> Tensor:
        block = blocking(layer, "forward", x.device)
        return _launch(x.device, "forward", layer, block, x, packed_weight(w, layer, block, keep),
                       Tensor.empty(layer.output_shape, x.dtype, x.device), bias, residual, activation)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        block = blocking(layer, "backward_data", grad_y.device)
        return _launch(grad_y.device, "backward_data", layer, block, grad_y, packed_weight(w, layer, block),
                       Tensor.empty(layer.input_shape, grad_y.dtype, grad_y.device))

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """The packed weight (forward, backward_data); backward_weight's partial gradients, one weight per
        image chunk, when there is more than one."""
        weight_bytes = layer.k * layer.c * layer.r * layer.s * layer.itemsize
        if pass_ != "backward_weight":
            return weight_bytes
        from ..runtime.device import resolve_device
        chunks = weight_chunks(layer, blocking(layer, pass_, resolve_device(device)))
        return 0 if chunks == 1 else chunks * weight_bytes

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        block = blocking(layer, "backward_weight", x.device)
        chunks = weight_chunks(layer, block)
        shape = layer.weight_shape if chunks == 1 else (chunks,) + layer.weight_shape
        out = _launch(x.device, "backward_weight", layer, block, x, grad_y, Tensor.empty(shape, x.dtype, x.device))
        return out if chunks == 1 else reduce(out, "sum", axis=0)


STRATEGY = DirectBlockedStrategy()
