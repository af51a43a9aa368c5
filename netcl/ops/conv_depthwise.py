"""The `depthwise` conv2d strategy: groups == input channels, any channel multiplier (kernels/conv_depthwise.cl).

Each output of a depthwise layer is R·S multiply-adds of one input plane, so the passes are bound by
memory, not arithmetic: the kernels read every tensor in place once, with no lowered matrix. A work-group
owns one plane and a run of its rows; a row's interior columns (every tap inside the tensor) go in
strips of vector width with unit-stride loads and no bounds tests, its border columns one by one.

  forward          groups (run of output rows, plane (n, k)), the bias (and an inference epilogue's
                   residual and activation) applied as it stores
  backward_data    stride 1: the forward kernel on the output gradient with the flipped weight, each
                   input-gradient plane summing the M output channels it feeds; other strides: a kernel
                   that takes each row's columns by phase (those a tap serves), groups (run of rows,
                   plane (n, c))
  backward_weight  groups (chunk of the N·P output rows, output channel k): each work-item's partial sum
                   of every tap over its chunk and columns, written to a (K · R · S, chunks · lanes)
                   workspace that one reduction (netcl.ops.reduce) sums: no atomics, deterministic

The geometry follows the device: a CPU runs work-groups of one work-item whose strips are its vector
width (netcl.ops.gemm.register_lanes: its compiler keeps the vectors as written), a GPU strips of one
column with a group of up to four warps sharing a row (coalesced). On a CPU, forward rows no wider than
a vector (MobileNet's 14×14 and 7×7 layers) go whole, one vector a row with the border lanes masked,
instead of a strip or none plus border columns one by one. Groups get whole planes where there are
enough of them to fill the compute units, else runs of rows (or chunks of rows).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import dtypes
from ..runtime.device import resolve_device
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, epilogue_operands, tensor_bytes
from .gemm import register_lanes
from .reduce import reduce

KERNELS = {"forward": "depthwise_forward", "backward_data": "depthwise_backward_data",
           "backward_weight": "depthwise_weight_partial"}
GPU_LANES = 32         # a warp: a GPU group's width is a multiple of it
WARPS_PER_GROUP = 4    # a GPU group: at most this many warps of adjacent strips
# Groups per compute unit a pass aims at before it splits planes into runs of rows (or the weight
# gradient's rows into chunks): a CPU needs a few per core to balance; a GPU many to hide latency.
GROUPS_PER_UNIT = {"cpu": 4, "gpu": 32}
# backward_data of a stride-1 layer holds the flipped weights of an input plane's M output channels in
# registers up to this many taps (beyond, it reads them from memory)
FLIPPED_IN_REGISTERS = 64
# A CPU's forward strips take this many adjacent output rows at once: an input row both read is loaded
# once, and the two rows' accumulator chains interleave (one chain of R·S dependent multiply-adds per
# strip leaves the vector units waiting on latency)
CPU_ROW_BLOCK = 2
MAX_TAPS = 256  # the template unrolls the taps (and backward_weight holds one accumulator per tap)


@dataclass(frozen=True)
class Geometry:
    """How one pass runs: ``vector`` columns per interior strip (the template's VW), ``group`` work-items
    per work-group sharing a row's columns, ``rows`` per group (backward_weight: per chunk), and the
    launch. With ``whole_rows`` (forward on a CPU, rows of at most one vector) a row is one vector,
    borders included; ``row_block`` adjacent output rows share their input rows' loads (forward); with
    ``edge_strips`` (forward on a CPU) strips cover whole rows, the padding masked, where the border
    columns would otherwise go one by one."""
    vector: int
    group: int
    rows: int
    global_size: tuple
    local_size: tuple
    whole_rows: bool = False
    row_block: int = 1
    edge_strips: bool = False


def interior_columns(layer: ConvLayer, pass_: str) -> int:
    """Columns of a row whose every tap reads inside the tensor (the kernel's interior: fewest over
    backward_data's phases)."""
    if pass_ != "backward_data":
        lo = max(0, -(-layer.pad_w // layer.stride_w))
        last = layer.w - 1 + layer.pad_w - (layer.s - 1) * layer.dil_w
        return max(0, min(layer.out_w, last // layer.stride_w + 1 if last >= 0 else 0) - lo)
    fewest = layer.w
    for phase in range(min(layer.stride_w, layer.w)):
        count = -(-(layer.w - phase) // layer.stride_w)
        offsets = [(phase + layer.pad_w - s * layer.dil_w) for s in range(layer.s)]
        served = [o // layer.stride_w for o in offsets if o % layer.stride_w == 0]
        lo = min(count, max([0] + [-o for o in served]))
        hi = min([count] + [layer.out_w - o for o in served])
        fewest = min(fewest, max(0, hi - lo))
    return fewest


def _vector_columns(device, dtype: str, columns: int) -> int:
    """A CPU's vector width (netcl.ops.gemm.register_lanes), narrowed to the widest power of two the
    interior holds; 1 on other devices, whose work-items are the lanes. (A strided strip assembles each
    tap from two loads and a shuffle; at full width that still beats narrower strips.)"""
    if device.kind != "cpu":
        return 1
    width = register_lanes(device, dtype)
    while width > 1 and width > columns:
        width //= 2
    return width


def _group_lanes(device, columns: int) -> int:
    """Work-items per group sharing a row: 1 on a CPU (each work-item a group: its compiler keeps the
    vectors as written), else whole warps covering the row, at most WARPS_PER_GROUP of them."""
    if device.kind == "cpu":
        return 1
    return max(1, min(GPU_LANES * min(WARPS_PER_GROUP, -(-columns // GPU_LANES)), device.max_work_group_size))


def _rows_per_group(rows: int, groups: int, device) -> int:
    """All the rows while ``groups`` groups fill the device, else the run that makes enough groups."""
    wanted = GROUPS_PER_UNIT.get(device.kind, GROUPS_PER_UNIT["gpu"]) * device.compute_units
    splits = min(rows, max(1, -(-wanted // max(groups, 1))))
    return -(-rows // splits)


def _whole_row_columns(layer: ConvLayer, pass_: str, device) -> int:
    """The vector width a forward pass on a CPU takes its rows in whole at: the narrowest power of two
    that holds a row, when the device's vectors (netcl.ops.gemm.register_lanes) do; 0 where the rows go
    as interior strips and border columns."""
    if pass_ != "forward" or device.kind != "cpu":
        return 0
    widest = register_lanes(device, layer.dtype)
    if layer.out_w > widest:
        return 0
    width = 1
    while width < layer.out_w:
        width *= 2
    return width


def _row_block(device, pass_: str, vector: int) -> int:
    """Output rows whose strips go together: CPU_ROW_BLOCK in a CPU's forward strips, else 1."""
    return CPU_ROW_BLOCK if pass_ == "forward" and device.kind == "cpu" and vector > 1 else 1


def _edge_strips(device, pass_: str, vector: int) -> bool:
    """Whether a forward pass's strips cover whole rows, masking the padding (a CPU's vectors), instead
    of leaving the border columns to go one by one (a GPU's work-items are single columns already)."""
    return pass_ == "forward" and device.kind == "cpu" and vector > 1


def geometry(layer: ConvLayer, pass_: str, device) -> Geometry:
    """The geometry of ``pass_``'s kernel on ``device``."""
    whole_row = _whole_row_columns(layer, pass_, device)
    if whole_row:
        planes = layer.n * layer.k
        per_group = _rows_per_group(layer.out_h, planes, device)
        return Geometry(whole_row, 1, per_group, (1, -(-layer.out_h // per_group), planes), (1, 1, 1), True)
    vector = _vector_columns(device, layer.dtype, interior_columns(layer, pass_))
    if pass_ == "backward_weight":
        columns, rows, planes = layer.out_w, layer.n * layer.out_h, layer.k
    elif pass_ == "forward":
        columns, rows, planes = layer.out_w, layer.out_h, layer.n * layer.k
    else:
        columns, rows, planes = layer.w, layer.h, layer.n * layer.c
    group = _group_lanes(device, -(-columns // vector))
    per_group = _rows_per_group(rows, planes, device)
    return Geometry(vector, group, per_group, (group, -(-rows // per_group), planes), (group, 1, 1),
                    row_block=_row_block(device, pass_, vector), edge_strips=_edge_strips(device, pass_, vector))


def kernel_view(layer: ConvLayer, pass_: str) -> tuple[str, ConvLayer, str, bool]:
    """(kernel, the layer as that kernel sees it, the pass whose geometry it runs, FLIP) of ``pass_``.
    backward_data of a stride-1 layer is the forward kernel on the output gradient with the flipped
    weight and padding dilation·(kernel − 1) − padding (negative where the forward padding exceeds
    it), channels swapped: each input-gradient plane sums the M output-gradient planes it feeds."""
    if pass_ == "backward_data" and (layer.stride_h, layer.stride_w) == (1, 1):
        flipped = replace(layer, c=layer.k, h=layer.out_h, w=layer.out_w, k=layer.c,
                          pad_h=layer.dil_h * (layer.r - 1) - layer.pad_h,
                          pad_w=layer.dil_w * (layer.s - 1) - layer.pad_w)
        return KERNELS["forward"], flipped, "forward", True
    return KERNELS[pass_], layer, pass_, False


def issued_flops(layer: ConvLayer, pass_: str, device) -> float:
    """Multiply-adds (×2) the kernel issues: every tap of every column, those a moved-back last strip
    computes twice included (edge strips: as if every plane took them); backward_data's taps that serve
    a column's phase."""
    _, seen, pass_, _ = kernel_view(layer, pass_)
    shape = geometry(seen, pass_, device)
    taps = 2.0 * seen.r * seen.s * (seen.c // seen.groups)  # the forward view's sources per output plane
    if shape.whole_rows:
        return taps * seen.n * seen.k * seen.out_h * shape.vector
    if shape.edge_strips and seen.out_w >= shape.vector:
        return taps * seen.n * seen.k * seen.out_h * -(-seen.out_w // shape.vector) * shape.vector
    inner = interior_columns(seen, pass_)
    strips = -(-inner // shape.vector) if inner >= shape.vector else 0
    columns = seen.w if pass_ == "backward_data" else seen.out_w
    issued = columns - (inner if strips else 0) + strips * shape.vector
    if pass_ == "backward_data":
        return taps * seen.n * seen.k * seen.h * issued / (seen.stride_h * seen.stride_w)
    return taps * seen.n * seen.k * seen.out_h * issued


def _partial_elems(layer: ConvLayer, device) -> int:
    shape = geometry(layer, "backward_weight", device)
    return _partial_rows(shape) * layer.k * layer.r * layer.s


def _partial_rows(shape: Geometry) -> int:
    """backward_weight's partial sums per output channel and tap: one per chunk and lane."""
    return shape.global_size[1] * shape.group * shape.vector


def _run(pass_: str, layer: ConvLayer, a: Tensor, b: Tensor, out: Tensor, extra=(), bias: Tensor | None = None,
         residual: Tensor | None = None, activation: str = "none"):
    device = a.device
    kernel_name, seen, seen_pass, flip = kernel_view(layer, pass_)
    shape = geometry(seen, seen_pass, device)
    params = dict(KERNEL=kernel_name.removeprefix("depthwise_"), T=dtypes.c_type(a.dtype), VW=shape.vector,
                  R=seen.r, S=seen.s, SH=seen.stride_h, SW=seen.stride_w, DH=seen.dil_h, DW=seen.dil_w)
    args = [a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), out.buffer, np.int64(out.offset)]
    if seen_pass == "forward":
        params.update(BIAS=bias is not None, FLIP=flip, WHOLE_ROWS=shape.whole_rows, ROW_BLOCK=shape.row_block,
                      EDGE_STRIPS=shape.edge_strips)
        if flip:
            sources = layer.k // layer.c
            params["MULT"] = sources if sources * layer.r * layer.s <= FLIPPED_IN_REGISTERS else 0
        else:
            params.update(RESIDUAL=residual is not None, ACT=activation)
        args += epilogue_operands(out, bias, residual)
    kernel = get_kernel(device, "conv_depthwise.cl", kernel_name, **params)
    sizes = (seen.c, seen.h, seen.w, seen.k, seen.out_h, seen.out_w, seen.pad_h, seen.pad_w, shape.rows) + extra
    input_elements = (np.int64(seen.n * seen.c * seen.h * seen.w),) if seen_pass == "forward" else ()
    launch(device, kernel, shape.global_size, shape.local_size, *args, *(np.int32(v) for v in sizes),
           *input_elements)
    return out


class DepthwiseStrategy(ConvStrategy):
    name = "depthwise"
    fuses_bias = True  # forward(..., bias=) adds the bias as it stores the output
    fuses_epilogue = True  # and forward(..., residual=, activation=) the rest of an inference epilogue

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if layer.groups != layer.c:
            return (f"groups={layer.groups} with {layer.c} input channels: the depthwise kernels serve "
                    f"groups == input channels")
        if layer.r * layer.s > MAX_TAPS:
            return f"a {layer.r}×{layer.s} kernel: the depthwise kernels unroll at most {MAX_TAPS} taps"
        biggest = max(layer.n * layer.c * layer.h * layer.w, layer.n * layer.k * layer.out_h * layer.out_w)
        if biggest >= 2 ** 31:
            return f"a tensor of {biggest:,} elements exceeds the kernels' 32-bit indexing"
        return None

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """backward_weight's partial sums (chunks · group width per output channel and tap)."""
        if pass_ != "backward_weight":
            return 0
        return _partial_elems(layer, resolve_device(device)) * layer.itemsize

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The arithmetic the kernel issues (idle lanes counted), every tensor read or written in place once,
        and for backward_weight its partial sums written and read back by a second launch."""
        device = resolve_device(device)
        partials = self.workspace_bytes(layer, pass_, device)
        return CostTerms(kernel_flops=issued_flops(layer, pass_, device), bytes_moved=tensor_bytes(layer) + 2 * partials,
                         launches=1 + (pass_ == "backward_weight"))

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none") -> Tensor:
        return _run("forward", layer, x, w, Tensor.empty(layer.output_shape, x.dtype, x.device), bias=bias,
                    residual=residual, activation=activation)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        return _run("backward_data", layer, grad_y, w, Tensor.empty(layer.input_shape, grad_y.dtype, grad_y.device))

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        shape = geometry(layer, "backward_weight", x.device)
        partial = Tensor.empty((layer.k * layer.r * layer.s, _partial_rows(shape)), x.dtype, x.device)
        _run("backward_weight", layer, x, grad_y, partial, extra=(layer.n,))
        summed = reduce(partial, "sum", axis=1)  # contiguous: a view of it has the weight's shape
        return Tensor(summed.buffer, layer.weight_shape, summed.dtype, summed.device, None, summed.offset)


STRATEGY = DepthwiseStrategy()
