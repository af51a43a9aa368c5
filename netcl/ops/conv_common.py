"""Convolution geometry and the protocol every conv2d strategy implements.

A strategy is an object (a :class:`ConvStrategy`) that states, in its own module:
  name                                              the name conv2d(strategy=...) and the planner use
  fuses_bias                                        True when forward(x, w, layer, bias=b) adds the bias
  keeps_weight_derivatives                          True when forward(x, w, layer, keep=True) keeps what it
                                                    computes from w alone for later inferences (netcl.ops.kept)
  fuses_epilogue                                    True when forward(x, w, layer, bias=, residual=r,
                                                    activation=a) also adds r and applies a (one of
                                                    netcl.runtime.cl_activation.ACTIVATIONS) as it stores
  fuses_epilogue_for(layer) -> bool                 the same for one layer (by default fuses_epilogue): a
                                                    strategy may fuse it for some layers only
  why_not(layer, pass_, device) -> str | None       None when it can serve that pass on that device
  workspace_bytes(layer, pass_, device) -> int      exact extra device memory it allocates for the pass
  cost_terms(layer, pass_, device) -> CostTerms     what the pass does: GEMM products, arithmetic in its
                                                    own kernels, bytes moved, launches (the cost model
                                                    turns these into time with the device's calibration)
  forward(x, w, layer) -> y                         y without bias (unless it fuses it), layer.output_shape
  backward_data(grad_y, w, layer) -> grad_x
  backward_weight(x, grad_y, layer) -> grad_w
``device`` may be None (the default device). The list of strategies is netcl.ops.conv_registry.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import DTypeError, ShapeError

PASSES = ("forward", "backward_data", "backward_weight")


def pair(value, name: str, minimum: int) -> tuple[int, int]:
    """An int or an (h, w) pair, each ≥ minimum."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (int(value), int(value))
    try:
        h, w = value
        h, w = int(h), int(w)
    except (TypeError, ValueError):
        raise ShapeError(f"{name} must be an int or an (h, w) pair, got {value!r}") from None
    if h < minimum or w < minimum:
        raise ShapeError(f"{name} must be ≥ {minimum}, got {value!r}")
    return h, w


_SIGNATURE = re.compile(r"n(\d+)c(\d+)h(\d+)w(\d+)k(\d+)r(\d+)s(\d+)st(\d+)x(\d+)p(\d+)x(\d+)d(\d+)x(\d+)"
                        r"g(\d+)(float32|float64)")


@dataclass(frozen=True)
class ConvLayer:
    """The full geometry of one 2-D convolution (NCHW input, KCRS weight)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0
    dil_h: int = 1
    dil_w: int = 1
    groups: int = 1
    dtype: str = "float32"

    @classmethod
    def from_shapes(cls, input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1,
                    dtype="float32") -> "ConvLayer":
        input_shape, weight_shape = tuple(input_shape), tuple(weight_shape)
        if len(input_shape) != 4:
            raise ShapeError(f"conv2d expects a 4-D (N, C, H, W) input, got shape {input_shape}")
        if len(weight_shape) != 4:
            raise ShapeError(f"conv2d expects a 4-D (K, C/groups, R, S) weight, got shape {weight_shape}")
        if any(int(d) <= 0 for d in input_shape + weight_shape):
            raise ShapeError(f"conv2d shapes must be positive: input {input_shape}, weight {weight_shape}")
        sh, sw = pair(stride, "stride", 1)
        ph, pw = pair(padding, "padding", 0)
        dh, dw = pair(dilation, "dilation", 1)
        if not isinstance(groups, numbers.Integral) or groups < 1:
            raise ShapeError(f"groups must be a positive int, got {groups!r}")
        n, c, h, w = (int(d) for d in input_shape)
        k, cg, r, s = (int(d) for d in weight_shape)
        if c % groups or k % groups:
            raise ShapeError(f"groups={groups} must divide the input channels ({c}) and the output channels ({k})")
        if cg * groups != c:
            raise ShapeError(f"input of shape {input_shape} has {c} channels but weight of shape {weight_shape} "
                             f"expects {cg * groups} (= {cg} per group × {groups} groups)")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise DTypeError(f"conv2d: not a dtype: {dtype!r}") from None
        if dt not in (np.float32, np.float64):
            raise DTypeError(f"conv2d works on float32 or float64, not {dt}")
        dtype = dt.name
        layer = cls(n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw, int(groups), dtype)
        if layer.out_h <= 0 or layer.out_w <= 0:
            raise ShapeError(f"kernel {r}×{s} (dilation {dh}×{dw}) is larger than the padded input "
                             f"{h + 2 * ph}×{w + 2 * pw} (input {input_shape}, padding {(ph, pw)})")
        return layer

    @property
    def out_h(self) -> int:
        return (self.h + 2 * self.pad_h - self.dil_h * (self.r - 1) - 1) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        return (self.w + 2 * self.pad_w - self.dil_w * (self.s - 1) - 1) // self.stride_w + 1

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.k, self.out_h, self.out_w)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def flops(self) -> int:
        """Multiply-adds × 2 of the direct definition (the same for every pass)."""
        return 2 * self.n * self.k * self.out_h * self.out_w * (self.c // self.groups) * self.r * self.s

    def signature(self) -> str:
        return (f"n{self.n}c{self.c}h{self.h}w{self.w}k{self.k}r{self.r}s{self.s}"
                f"st{self.stride_h}x{self.stride_w}p{self.pad_h}x{self.pad_w}d{self.dil_h}x{self.dil_w}"
                f"g{self.groups}{self.dtype}")

    @classmethod
    def from_signature(cls, signature: str) -> "ConvLayer | None":
        """The layer a :meth:`signature` describes; None for anything else."""
        found = _SIGNATURE.fullmatch(str(signature))
        if not found:
            return None
        *sizes, dtype = found.groups()
        return cls(*(int(v) for v in sizes), dtype=dtype)

    def describe(self) -> str:
        return (f"input {self.input_shape}, weight {self.weight_shape}, stride {(self.stride_h, self.stride_w)}, "
                f"padding {(self.pad_h, self.pad_w)}, dilation {(self.dil_h, self.dil_w)}, groups {self.groups}")


@dataclass(frozen=True)
class Product:
    """One (batched) matrix product a pass hands to netcl.ops.gemm: (m × k) · (k × n), ``batch`` of them
    per call, ``calls`` calls."""
    m: int
    n: int
    k: int
    batch: int = 1
    calls: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch * self.calls


@dataclass
class CostTerms:
    """What one pass of one strategy does on a layer, in the units the device profile measures.

    products       GEMM products run by netcl.ops.gemm (timed at the device's rate for their shape class)
    kernel_flops   arithmetic in the strategy's own kernels (timed at the device's large-GEMM rate until
                   the calibration says how fast that strategy's kernels really are)
    bytes_moved    memory traffic outside the products (lowering, transforms, layout changes), read + write
    launches       kernel launches and driver copies
    """
    products: list = field(default_factory=list)
    kernel_flops: float = 0.0
    bytes_moved: float = 0.0
    launches: int = 0

    @property
    def flops(self) -> float:
        return self.kernel_flops + sum(p.flops for p in self.products)


class ConvStrategy:
    """Defaults of the protocol (see the module docstring); a strategy overrides what it needs."""

    name = "?"
    fuses_bias = False
    keeps_weight_derivatives = False
    fuses_epilogue = False
    # Whether kernels built for one layer serve every other (the layer's geometry is a run-time argument,
    # not a template parameter): the cold first step prefers such a strategy once it has run
    # (netcl.ops.conv_online), since it builds nothing more.
    kernels_serve_any_layer = False

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        return None

    def fuses_epilogue_for(self, layer: ConvLayer) -> bool:
        return self.fuses_epilogue

    def refuse_unfused_epilogue(self, layer: ConvLayer, bias, residual, activation: str) -> None:
        """Raise ShapeError when forward is given an epilogue for a layer it does not fuse one into."""
        if (bias is not None or residual is not None or activation != "none") and not self.fuses_epilogue_for(layer):
            raise ShapeError(f"the {self.name} strategy fuses no inference epilogue into this layer "
                             f"({layer.describe()})")

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        return 0

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """The definition's flops in the strategy's own kernel, every tensor read or written once."""
        return CostTerms(kernel_flops=layer.flops, bytes_moved=tensor_bytes(layer), launches=1)

    def run(self, pass_: str, a, b, layer: ConvLayer):
        """One pass by name: (x, w), (grad_y, w) or (x, grad_y) as the pass takes them."""
        return getattr(self, pass_)(a, b, layer)


def epilogue_operands(out, bias=None, residual=None) -> list:
    """A fused inference epilogue's kernel arguments: the bias's and the residual's (buffer, offset), each
    the output's where absent (the kernel compiled without BIAS / RESIDUAL does not read it)."""
    args = []
    for operand in (bias, residual):
        operand = operand if operand is not None else out
        args += [operand.buffer, np.int64(operand.offset)]
    return args


def tensor_bytes(layer: ConvLayer) -> int:
    """Bytes of x, w and y together: what any strategy reads or writes at least once."""
    cg = layer.c // layer.groups
    return (layer.n * layer.c * layer.h * layer.w + layer.k * cg * layer.r * layer.s
            + layer.n * layer.k * layer.out_h * layer.out_w) * layer.itemsize

