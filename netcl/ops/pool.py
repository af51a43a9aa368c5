"""2-D max and average pooling with kernel, stride, padding and dilation (kernels/pool.cl).

Dilation d spreads the k×k taps d pixels apart: the d-regularly sparse pooling kernel P_{k,d} of
Li, Zhao & Wang, which lets a strided patch classifier run densely over a whole image (netcl.dense).
Output size per axis: (H + pad + pad_end − dil·(k − 1) − 1) // stride + 1 (pad_end, the bottom or right
padding, equals pad unless given: ONNX's asymmetric pads), rounded up instead with ceil_mode, minus a last
window that would start inside the end padding (PyTorch's and onnxruntime's rule).
These are the raw ops; the differentiable versions are netcl.nn.functional.max_pool2d / avg_pool2d.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import pair
from .elementwise import as_contiguous, fill

CPU_GROUP_ITEMS = 32
ROWS_PER_CPU_GROUP = 4  # the scattering backward's rows a work-group on a CPU driver


def vector_width(dtype) -> int:
    """kernels/pool.cl's VW for ``dtype``: 32 bytes of elements (a float8 or a double4, one AVX register),
    at most 8 lanes (LLVM 14 cannot scalarize 16-lane vectors, which the PoCL wheel would need to)."""
    return min(8, 32 // np.dtype(dtype).itemsize)


@dataclass(frozen=True)
class PoolGeometry:
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    ph_end: int = None
    pw_end: int = None
    ceil_mode: bool = False

    def __post_init__(self):
        for name, begin in (("ph_end", "ph"), ("pw_end", "pw")):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self, begin))

    @classmethod
    def make(cls, input_shape, kernel_size, stride=None, padding=0, dilation=1, padding_end=None,
             ceil_mode: bool = False) -> "PoolGeometry":
        """The geometry of one pooling call; ``padding_end`` (bottom, right) defaults to ``padding``."""
        input_shape = tuple(int(d) for d in input_shape)
        if len(input_shape) != 4:
            raise ShapeError(f"pooling expects a 4-D (N, C, H, W) input, got shape {input_shape}")
        if any(d <= 0 for d in input_shape):
            raise ShapeError(f"pooling input shape must be positive, got {input_shape}")
        kh, kw = pair(kernel_size, "pooling kernel_size", 1)
        sh, sw = pair(kernel_size if stride is None else stride, "pooling stride", 1)
        ph, pw = pair(padding, "pooling padding", 0)
        dh, dw = pair(dilation, "pooling dilation", 1)
        ph_end, pw_end = (ph, pw) if padding_end is None else pair(padding_end, "pooling padding_end", 0)
        for p, k, d, axis in ((ph, kh, dh, "height"), (pw, kw, dw, "width"), (ph_end, kh, dh, "height (end)"),
                              (pw_end, kw, dw, "width (end)")):
            effective = d * (k - 1) + 1
            if p > effective // 2:
                raise ShapeError(f"pooling padding {p} along {axis} is more than half the effective kernel size "
                                 f"{effective} (kernel {k}, dilation {d})")
        g = cls(*input_shape, kh, kw, sh, sw, ph, pw, dh, dw, ph_end, pw_end, bool(ceil_mode))
        if g.out_h <= 0 or g.out_w <= 0:
            raise ShapeError(f"pooling kernel {kh}×{kw} (dilation {dh}×{dw}) is larger than the padded input "
                             f"{g.h + ph + ph_end}×{g.w + pw + pw_end} (input {input_shape}, padding "
                             f"{(ph, pw, ph_end, pw_end)})")
        return g

    def _out(self, size, k, s, p, p_end, d) -> int:
        span = size + p + p_end - d * (k - 1) - 1
        if not self.ceil_mode:
            return span // s + 1
        out = -(-span // s) + 1
        return out - 1 if (out - 1) * s >= size + p else out

    @property
    def out_h(self) -> int:
        return self._out(self.h, self.kh, self.sh, self.ph, self.ph_end, self.dh)

    @property
    def out_w(self) -> int:
        return self._out(self.w, self.kw, self.sw, self.pw, self.pw_end, self.dw)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.out_h, self.out_w)

    @property
    def disjoint(self) -> bool:
        """No input pixel belongs to two windows (stride ≥ dilated kernel extent on both axes)."""
        return self.sh >= self.dh * (self.kh - 1) + 1 and self.sw >= self.dw * (self.kw - 1) + 1

    @property
    def covering(self) -> bool:
        """Disjoint windows that tile the whole input: a scattering backward writes every input element."""
        return (self.dh == 1 and self.dw == 1 and self.sh == self.kh and self.sw == self.kw
                and not (self.ph or self.pw or self.ph_end or self.pw_end)
                and self.out_h * self.sh == self.h and self.out_w * self.sw == self.w)

    def _args(self):
        return (np.int32(self.h), np.int32(self.w), np.int32(self.out_h), np.int32(self.out_w))


def _check_input(x: Tensor, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{what}: input must be a netcl Tensor, got {type(x).__name__}")
    dtypes.require_float(x.dtype, what)
    return as_contiguous(x)


def _kernel(x: Tensor, g: PoolGeometry, op: str, name: str, count_include_pad: bool = True, relu: bool = False,
            argmax: bool = True):
    # The geometry is compiled in (see kernels/pool.cl); batch size and image size stay arguments.
    return get_kernel(x.device, "pool.cl", name, T=dtypes.c_type(x.dtype), KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw,
                      PH=g.ph, PW=g.pw, PH_END=g.ph_end, PW_END=g.pw_end, CEIL=g.ceil_mode, DH=g.dh, DW=g.dw, OP=op, COUNT_PAD=bool(count_include_pad) or op == "max",
                      RELU=bool(relu), VW=vector_width(x.dtype), ARGMAX=bool(argmax) and op == "max")


def _interior_columns(g: PoolGeometry, vw: int) -> tuple[int, int] | None:
    """[c0, c1): the output columns whose windows lie inside the input's columns, when there are at least
    ``vw`` of them (the block kernel's vectors); else None."""
    extent = g.dw * (g.kw - 1)
    c0 = -(-g.pw // g.sw)
    c1 = min(g.out_w, (g.w - 1 - extent + g.pw) // g.sw + 1)
    return (c0, c1) if c1 - c0 >= vw else None


def _interior_cells(g: PoolGeometry, vw: int) -> tuple[int, int] | None:
    """[m0, m1): the input cells (columns m*SW .. m*SW + SW - 1) inside the input whose every candidate
    window (m + d, d in the kernel's compile-time range) is an output column, when there are at least
    ``vw`` of them; else None."""
    extent = g.dw * (g.kw - 1)
    d_min, d_max = -((extent - g.pw) // g.sw), (g.sw - 1 + g.pw) // g.sw
    m0, m1 = max(0, -d_min), min(g.out_w - d_max, g.w // g.sw)
    return (m0, m1) if m1 - m0 >= vw else None


def _groups(device, *sizes):
    """Work-groups on a CPU driver: the driver runs a group as a loop over its work-items, and a group of
    a few dozen block work-items along a row amortizes the per-group cost; GPUs keep the driver's choice."""
    if device.kind != "cpu":
        return None
    return tuple(sizes)


def _block_groups(device, blocks: int, rows: int):
    across = min(blocks, 16)
    return _groups(device, across, max(1, min(rows, CPU_GROUP_ITEMS // across)), 1)


def pool_forward(x: Tensor, g: PoolGeometry, op: str, count_include_pad: bool = True, relu: bool = False,
                 argmax: bool = True):
    """(y, argmax) for op "max" (argmax: int32 index ih*W + iw into each input plane), (y, None) for "avg"
    or with ``argmax=False`` (no backward will follow: inference). ``relu`` (max only) fuses a preceding
    ReLU: y = maxpool(relu(x)); backward needs nothing else."""
    if relu and op != "max":
        raise ShapeError("a fused ReLU is only defined for max pooling")
    x = _check_input(x, f"{op}_pool2d")
    if x.shape != g.input_shape:
        raise ShapeError(f"pooling geometry is for input {g.input_shape}, got {x.shape}")
    y = Tensor.empty(g.output_shape, x.dtype, x.device)
    arg = Tensor.empty(g.output_shape, np.int32, x.device) if op == "max" and argmax else None
    arg_buf, arg_off = (arg.buffer, arg.offset) if arg is not None else (y.buffer, 0)
    args = (x.buffer, np.int64(x.offset), y.buffer, np.int64(y.offset), arg_buf, np.int64(arg_off), *g._args())
    vw = vector_width(x.dtype)
    interior = _interior_columns(g, vw)
    planes = g.n * g.c
    if interior:
        # the first and last block of a row also compute the row's edge columns
        c0, c1 = interior
        blocks = -(-(c1 - c0) // vw)
        launch(x.device, _kernel(x, g, op, "pool_forward_blocks", count_include_pad, relu, argmax),
               (blocks, g.out_h, planes),
               _block_groups(x.device, blocks, g.out_h), *args, np.int32(c0), np.int32(c1 - c0))
    else:
        size = g.out_h * g.out_w
        launch(x.device, _kernel(x, g, op, "pool_forward_edges", count_include_pad, relu, argmax), (size, planes),
               _groups(x.device, min(size, CPU_GROUP_ITEMS), 1), *args)
    return y, arg


def backward_path(g: PoolGeometry, op: str, count_include_pad: bool, vw: int) -> tuple[str, tuple | None]:
    """Which backward kernel serves ``g``: ("disjoint", None) when no two windows overlap and a row is too
    narrow for the block kernel, ("blocks", interior cells) where the block kernel applies, else ("edges",
    None)."""
    padded = g.ph or g.pw or g.ph_end or g.pw_end or g.ceil_mode
    # the block kernel divides average pooling's gradient by the whole window's taps
    constant_divisor = op == "max" or not padded or (count_include_pad and not g.ceil_mode)
    interior = _interior_cells(g, vw) if constant_divisor else None
    if g.disjoint and not interior:
        return "disjoint", None
    return ("blocks", interior) if interior else ("edges", None)


def pool_backward(grad_y: Tensor, g: PoolGeometry, op: str, argmax: Tensor | None = None,
                  count_include_pad: bool = True, relu: bool = False) -> Tensor:
    """The input gradient: each element gathered from the windows that can cover it (max: those whose
    saved argmax it is), or, for disjoint windows on rows too narrow for the block kernel, scattered from
    its one window (backward_path); deterministic, without atomics. ``relu`` only selects the same compiled program as
    the forward pass (the argmax already encodes the fused ReLU)."""
    grad_y = _check_input(grad_y, f"{op}_pool2d backward")
    if grad_y.shape != g.output_shape:
        raise ShapeError(f"pooling backward: gradient of shape {grad_y.shape}, expected {g.output_shape}")
    if op == "max" and (argmax is None or argmax.shape != g.output_shape or argmax.dtype != np.int32):
        raise ShapeError(f"max pooling backward needs the int32 argmax of shape {g.output_shape} from forward")
    gx = Tensor.empty(g.input_shape, grad_y.dtype, grad_y.device)
    arg_buf, arg_off = (argmax.buffer, argmax.offset) if argmax is not None else (grad_y.buffer, 0)
    args = (grad_y.buffer, np.int64(grad_y.offset), arg_buf, np.int64(arg_off), gx.buffer, np.int64(gx.offset),
            *g._args())
    planes = g.n * g.c
    vw = vector_width(grad_y.dtype)
    path, interior = backward_path(g, op, count_include_pad, vw)
    if path == "disjoint":
        if not g.covering:
            fill(gx, 0)
        launch(grad_y.device, _kernel(grad_y, g, op, "pool_backward_disjoint", count_include_pad, relu),
               (g.out_h, planes), _groups(grad_y.device, min(g.out_h, ROWS_PER_CPU_GROUP), 1), *args)
    elif path == "blocks":
        # the first and last block of a row also gather the row's edge columns
        m0, m1 = interior
        blocks = -(-(m1 - m0) // vw)
        launch(grad_y.device, _kernel(grad_y, g, op, "pool_backward_blocks", count_include_pad, relu),
               (blocks, g.h, planes), _block_groups(grad_y.device, blocks, g.h), *args, np.int32(m0),
               np.int32(m1 - m0))
    else:
        size = g.h * g.w
        launch(grad_y.device, _kernel(grad_y, g, op, "pool_backward_edges", count_include_pad, relu), (size, planes),
               _groups(grad_y.device, min(size, CPU_GROUP_ITEMS), 1), *args)
    return gx


def adaptive_output_size(input_shape, output_size) -> tuple[int, int]:
    """(Ho, Wo) from AdaptiveAvgPool2d's output_size: an int, or a pair whose None entries keep the input's size."""
    if len(input_shape) != 4 or any(d <= 0 for d in input_shape):
        raise ShapeError(f"adaptive_avg_pool2d expects a non-empty 4-D (N, C, H, W) input, got shape "
                         f"{tuple(input_shape)}")
    pair_ = (output_size, output_size) if not isinstance(output_size, (tuple, list)) else tuple(output_size)
    if len(pair_) != 2:
        raise ShapeError(f"adaptive_avg_pool2d output_size must be an int or a pair, got {output_size!r}")
    out = tuple(int(input_shape[2 + k]) if s is None else s for k, s in enumerate(pair_))
    if any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s <= 0 for s in out):
        raise ShapeError(f"adaptive_avg_pool2d output_size must be positive ints, got {output_size!r}")
    return int(out[0]), int(out[1])


def _adaptive_kernel(x: Tensor, name: str, out_hw):
    return get_kernel(x.device, "adaptive_pool.cl", name, T=dtypes.c_type(x.dtype), GLOBAL=tuple(out_hw) == (1, 1))


def adaptive_avg_pool2d_forward(x: Tensor, output_size) -> Tensor:
    x = _check_input(x, "adaptive_avg_pool2d")
    ho, wo = adaptive_output_size(x.shape, output_size)
    n, c, h, w = x.shape
    y = Tensor.empty((n, c, ho, wo), x.dtype, x.device)
    launch(x.device, _adaptive_kernel(x, "adaptive_avg_forward", (ho, wo)), (ho * wo, n * c),
           (1, 64) if ho * wo == 1 else (min(ho * wo, 64), 1), x.buffer, np.int64(x.offset), y.buffer,
           np.int64(y.offset), np.int32(n * c), np.int32(h), np.int32(w), np.int32(ho), np.int32(wo))
    return y


def adaptive_avg_pool2d_backward(grad_y: Tensor, input_shape) -> Tensor:
    grad_y = _check_input(grad_y, "adaptive_avg_pool2d backward")
    n, c, h, w = input_shape
    if grad_y.ndim != 4 or grad_y.shape[:2] != (n, c):
        raise ShapeError(f"adaptive_avg_pool2d backward: gradient of shape {grad_y.shape} does not fit input "
                         f"{tuple(input_shape)}")
    ho, wo = grad_y.shape[2:]
    gx = Tensor.empty(tuple(input_shape), grad_y.dtype, grad_y.device)
    launch(grad_y.device, _adaptive_kernel(grad_y, "adaptive_avg_backward", (ho, wo)), (h * w, n * c),
           (min(h * w, 64), 1), grad_y.buffer, np.int64(grad_y.offset), gx.buffer, np.int64(gx.offset),
           np.int32(n * c), np.int32(h), np.int32(w), np.int32(ho), np.int32(wo))
    return gx
