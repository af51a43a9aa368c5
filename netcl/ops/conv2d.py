"""conv2d's ops: validate a convolution, choose the strategy of each pass and run it.

The differentiable entry point is netcl.autograd.rules_conv.conv2d (also reached as
``netcl.ops.conv2d.conv2d``, shared/API.md's name, and as ``nn.functional.conv2d``): functional ->
autograd rule -> these ops, as for linear and pooling. Strategies are listed in netcl.ops.conv_registry;
"auto" asks netcl.ops.conv2d_planner per pass and, in training, measures its choices over the first
steps (netcl.ops.conv_online).
"""
from __future__ import annotations

import os

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor
from .conv_common import ConvLayer
from .conv_registry import strategies

CONV2D_DIRECT = "direct"
CONV2D_IM2COL = "im2col"
CONV2D_GEMM = "gemm"
CONV2D_IMPLICIT_GEMM = "implicit_gemm"
CONV2D_WINOGRAD = "winograd"
CONV2D_MEC = "mec"
CONV2D_DEPTHWISE = "depthwise"
CONV2D_AUTO = "auto"
ALL_STRATEGIES = (CONV2D_DIRECT, CONV2D_IM2COL, CONV2D_GEMM, CONV2D_IMPLICIT_GEMM, CONV2D_WINOGRAD, CONV2D_MEC,
                  CONV2D_DEPTHWISE)


def check_conv2d(x: Tensor, w: Tensor, bias: Tensor | None, stride, padding, dilation, groups) -> ConvLayer:
    """The layer of conv2d(x, w, bias, ...), or a typed error naming the offending shapes and dtypes."""
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
    return layer


def resolve_strategy(strategy) -> str:
    """"auto" unless the caller or NETCL_CONV_STRATEGY names one."""
    if strategy in (None, CONV2D_AUTO):
        return os.environ.get("NETCL_CONV_STRATEGY", CONV2D_AUTO).strip() or CONV2D_AUTO
    return strategy


def strategy_for(layer: ConvLayer, pass_: str, strategy: str, device=None) -> object:
    """The strategy object that runs ``pass_`` of ``layer`` on ``device``: the forced one (checked), or
    the planner's choice for that device."""
    from ..runtime.device import resolve_device
    device = resolve_device(device)
    if strategy in (None, CONV2D_AUTO):
        from .conv2d_planner import env_mode, plan_conv2d_layer
        mode = env_mode()
        strategy = plan_conv2d_layer(layer, pass_, "heuristic" if mode == "online" else mode, device=device).strategy
    impl = strategies().get(strategy)
    if impl is None:
        raise ShapeError(f"unknown conv2d strategy {strategy!r}; choose one of {', '.join(strategies())} or 'auto'")
    why = impl.why_not(layer, pass_, device)
    if why:
        raise ShapeError(f"conv2d strategy {strategy!r} cannot run the {pass_} pass of this layer: {why} "
                         f"({layer.describe()})")
    return impl


def run_pass(pass_: str, a: Tensor, b: Tensor, layer: ConvLayer, strategy: str, bias: Tensor | None = None,
             training: bool = False) -> Tensor:
    """One pass of the convolution on the operands' device: forward (x, w [, bias]), backward_data
    (grad_y, w) or backward_weight (x, grad_y). ``training`` with strategy "auto" lets the planner measure
    its choice on these calls (netcl.ops.conv_online) unless NETCL_CONV_PLAN_MODE says otherwise."""
    device = a.device
    a, b = a.contiguous(), b.contiguous()

    def execute(name):
        impl = strategy_for(layer, pass_, name, device)
        if pass_ != "forward" or bias is None:
            return impl.run(pass_, a, b, layer)
        if getattr(impl, "fuses_bias", False):
            return impl.forward(a, b, layer, bias=bias.contiguous())
        from .bias import add_bias_
        return add_bias_(impl.forward(a, b, layer), bias)
    if strategy in (None, CONV2D_AUTO) and training:
        from .conv2d_planner import env_mode
        if env_mode("online") == "online":
            from . import conv_online
            return conv_online.run(pass_, layer, a, b, device, execute)
    return execute(strategy)


def __getattr__(name):
    # shared/API.md names netcl.ops.conv2d.conv2d; the differentiable function is the autograd rule's,
    # resolved at first use so that no module of netcl.ops imports netcl.autograd.
    if name == "conv2d":
        import importlib
        return importlib.import_module("netcl.autograd.rules_conv").conv2d
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
