"""conv2d: one entry point over every convolution strategy, differentiable in x, w and bias.

Strategies live in their own modules (conv_direct.py, conv_im2col.py, ...) and register themselves in
netcl.ops.conv_common; ``strategy="auto"`` asks netcl.ops.conv2d_planner, separately for each pass.
"""
from __future__ import annotations

import os

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor
from .conv_common import ConvLayer, strategies

CONV2D_DIRECT = "direct"
CONV2D_IM2COL = "im2col"
CONV2D_GEMM = "gemm"
CONV2D_IMPLICIT_GEMM = "implicit_gemm"
CONV2D_WINOGRAD = "winograd"
CONV2D_MEC = "mec"
CONV2D_AUTO = "auto"
ALL_STRATEGIES = (CONV2D_DIRECT, CONV2D_IM2COL, CONV2D_GEMM, CONV2D_IMPLICIT_GEMM, CONV2D_WINOGRAD, CONV2D_MEC)

# Importing a strategy module registers it (order = preference when nothing else decides).
from . import conv_direct  # noqa: E402,F401
from . import conv_im2col  # noqa: E402,F401
from . import conv_gemm  # noqa: E402,F401
from . import conv_implicit_gemm  # noqa: E402,F401
from . import conv_winograd  # noqa: E402,F401
from . import conv_mec  # noqa: E402,F401


def strategy_for(layer: ConvLayer, pass_: str, strategy: str) -> object:
    """The strategy object that runs ``pass_`` of ``layer``: the forced one (checked), or the planner's."""
    registry = strategies()
    if strategy in (None, CONV2D_AUTO):
        from .conv2d_planner import plan_conv2d_layer
        strategy = plan_conv2d_layer(layer, pass_).strategy
    if strategy not in ALL_STRATEGIES:
        raise ShapeError(f"unknown conv2d strategy {strategy!r}; choose one of {', '.join(ALL_STRATEGIES)} or 'auto'")
    impl = registry.get(strategy)
    if impl is None:
        raise ShapeError(f"conv2d strategy {strategy!r} is not available in this build")
    why = impl.why_not(layer, pass_)
    if why:
        raise ShapeError(f"conv2d strategy {strategy!r} cannot run the {pass_} pass of this layer: {why} "
                         f"({layer.describe()})")
    return impl


def conv2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1,
           strategy: str = CONV2D_AUTO) -> Tensor:
    """2-D cross-correlation of an (N, C, H, W) input with a (K, C/groups, R, S) weight.

    Output shape: (N, K, Ho, Wo) with Ho = (H + 2·pad_h − dil_h·(R−1) − 1) // stride_h + 1 (same for Wo).
    ``strategy`` forces one algorithm (a ShapeError says why when it cannot serve the layer);
    "auto" lets the planner choose per pass. NETCL_CONV_STRATEGY overrides "auto" globally.
    """
    for name, t in (("input", x), ("weight", w)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(t, Tensor):
            raise DTypeError(f"conv2d: {name} must be a netcl Tensor, got {type(t).__name__}")
        dtypes.require_float(t.dtype, f"conv2d {name}")
    x.same_device(w, "conv2d")
    if x.dtype != w.dtype:
        raise DTypeError(f"conv2d: input is {x.dtype} but weight is {w.dtype}")
    layer = ConvLayer.from_shapes(x.shape, w.shape, stride, padding, dilation, groups, x.dtype)
    if bias is not None:
        x.same_device(bias, "conv2d")
        if bias.shape != (layer.k,):
            raise ShapeError(f"conv2d: bias must have shape ({layer.k},) for weight {w.shape}, got {bias.shape}")
        if bias.dtype != x.dtype:
            raise DTypeError(f"conv2d: bias is {bias.dtype} but input is {x.dtype}")
    if strategy in (None, CONV2D_AUTO):
        strategy = os.environ.get("NETCL_CONV_STRATEGY", CONV2D_AUTO).strip() or CONV2D_AUTO
    from ..autograd.rules_conv import Conv2dFunction
    return Conv2dFunction.apply(x, w, bias, layer, strategy)
