"""conv2d: validate a convolution, choose the strategy of each pass and run it, differentiably.

:func:`conv2d` (also ``nn.functional.conv2d``) is differentiable in x, w and bias: its forward and
backward passes sit side by side in :class:`Conv2dFunction`, built on the autograd engine
(netcl.autograd.function), which imports nothing from ops. Each pass runs the strategy forced for it or
chosen by the planner: strategies are listed in netcl.ops.conv_registry; "auto" asks
netcl.ops.conv2d_planner per pass and, in training, measures its choices over the first steps
(netcl.ops.conv_online).

:func:`conv2d_inference` is the forward pass alone with an inference epilogue (bias, residual add,
activation) fused into the convolution's store where the chosen strategy can (netcl.nn.fusion runs an
eval-mode Conv2d, BatchNorm2d [, residual] [, activation] through it).
"""
from __future__ import annotations

from .. import dtypes
from ..autograd.function import Function, is_grad_enabled
from ..errors import DTypeError, ShapeError
from ..runtime.cl_activation import ACTIVATIONS
from ..tensor import Tensor
from .conv_chooser import chooser, forced_strategy
from .conv_common import ConvLayer
from .elementwise import as_contiguous

CONV2D_DIRECT = "direct"
CONV2D_IM2COL = "im2col"
CONV2D_GEMM = "gemm"
CONV2D_IMPLICIT_GEMM = "implicit_gemm"
CONV2D_WINOGRAD = "winograd"
CONV2D_WINOGRAD4 = "winograd4"
CONV2D_MEC = "mec"
CONV2D_DEPTHWISE = "depthwise"
CONV2D_POINTWISE = "pointwise"
CONV2D_AUTO = "auto"


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
    return forced_strategy(strategy)[0] or CONV2D_AUTO


def strategy_for(layer: ConvLayer, pass_: str, strategy: str, device=None) -> object:
    """The strategy object that runs ``pass_`` of ``layer`` on ``device``: the forced one (checked), or
    the device's chooser's."""
    from ..runtime.device import resolve_device
    device = resolve_device(device)
    return chooser(device).strategy_for(layer, pass_, strategy, device)


def run_pass(pass_: str, a: Tensor, b: Tensor, layer: ConvLayer, strategy: str, bias: Tensor | None = None,
             training: bool = False) -> Tensor:
    """One pass of the convolution on the operands' device: forward (x, w [, bias]), backward_data
    (grad_y, w) or backward_weight (x, grad_y). ``training`` with strategy "auto" lets the device's chooser
    measure its choice on these calls unless NETCL_CONV_PLAN_MODE says otherwise."""
    device = a.device
    a, b = as_contiguous(a), as_contiguous(b)
    choice = chooser(device)

    def execute(name):
        impl = choice.strategy_for(layer, pass_, name, device, inference=not training)
        if pass_ != "forward":
            return impl.run(pass_, a, b, layer)
        # no gradient will be asked of this call: what the strategy derives from the weight alone is kept
        options = {"keep": True} if not training and impl.keeps_weight_derivatives else {}
        if bias is None:
            return impl.forward(a, b, layer, **options)
        if impl.fuses_bias:
            return impl.forward(a, b, layer, bias=as_contiguous(bias), **options)
        from .bias import add_bias_
        return add_bias_(impl.forward(a, b, layer, **options), bias)
    return choice.run(pass_, layer, device, strategy, training, execute)


class Conv2dFunction(Function):
    """Each pass runs the strategy chosen (or forced) for it by :func:`run_pass`; the bias is added by the
    forward pass (fused where the strategy can) and its gradient is one channel sum (netcl.ops.bias)."""

    @staticmethod
    def forward(ctx, x, w, bias, layer, strategy, training=False):
        ctx.x, ctx.w, ctx.layer, ctx.strategy, ctx.training = x, w, layer, strategy, training
        return run_pass("forward", x, w, layer, strategy, bias=bias, training=training)

    @staticmethod
    def backward(ctx, grad_y):
        layer = ctx.layer
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = run_pass("backward_data", grad_y, ctx.w, layer, ctx.strategy, training=ctx.training)
        if ctx.needs_input_grad[1]:
            grad_w = run_pass("backward_weight", ctx.x, grad_y, layer, ctx.strategy, training=ctx.training)
        if ctx.needs_input_grad[2]:
            from .bias import bias_grad
            grad_b = bias_grad(as_contiguous(grad_y))
        return grad_x, grad_w, grad_b, None, None, None


def conv2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1,
           strategy: str = CONV2D_AUTO) -> Tensor:
    """2-D cross-correlation of an (N, C, H, W) input with a (K, C/groups, R, S) weight.

    Output shape: (N, K, Ho, Wo) with Ho = (H + 2·pad_h − dil_h·(R−1) − 1) // stride_h + 1 (same for Wo).
    ``strategy`` forces one algorithm (a ShapeError says why when it cannot serve the layer); "auto" lets
    the planner choose per pass for the input's device, measuring its choices over the first training
    steps. NETCL_CONV_STRATEGY overrides "auto" globally.
    """
    layer = check_conv2d(x, w, bias, stride, padding, dilation, groups)
    training = is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, bias))
    return Conv2dFunction.apply(x, w, bias, layer, resolve_strategy(strategy), training)


def _check_residual(residual: Tensor, x: Tensor, layer: ConvLayer) -> None:
    if not isinstance(residual, Tensor):
        raise DTypeError(f"conv2d_inference: residual must be a netcl Tensor, got {type(residual).__name__}")
    if residual.shape != layer.output_shape:
        raise ShapeError(f"conv2d_inference: residual of shape {residual.shape} does not match the output "
                         f"{layer.output_shape} ({layer.describe()})")
    if residual.dtype != x.dtype:
        raise DTypeError(f"conv2d_inference: residual is {residual.dtype} but input is {x.dtype}")
    x.same_device(residual, "conv2d_inference")


def _separate_epilogue(y: Tensor, bias: Tensor | None, residual: Tensor | None, activation: str) -> Tensor:
    """The epilogue as passes after a convolution that fuses none: with a bias, BatchNorm's apply kernel in
    its folded form (one pass, the same arithmetic as the fused epilogues); without, the add and the
    activation as they are."""
    from .batchnorm import batch_norm_apply
    if bias is not None:
        return batch_norm_apply(y, None, None, None, bias, residual=residual, relu=activation == "relu",
                                relu6=activation == "relu6", hardswish=activation == "hardswish")
    from .activation import activation_forward
    from .elementwise import binary, unary
    if residual is not None:
        y = binary("add", y, residual)
    if activation == "relu":
        return unary("relu", y)
    if activation == "relu6":
        return activation_forward(y, "hardtanh", (0.0, 6.0))
    return activation_forward(y, "hardswish") if activation == "hardswish" else y


def conv2d_inference(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
                     groups=1, strategy: str = CONV2D_AUTO, *, residual: Tensor | None = None,
                     activation: str | None = None) -> Tensor:
    """activation(conv2d(x, w, bias, ...) + residual): the forward pass alone, for inference (no graph is
    recorded, so the result has no gradient).

    ``residual``: a tensor of the output's shape added after the bias; ``activation``: None (or "none"),
    "relu", "relu6" or "hardswish", applied last. The strategy is chosen for the forward pass as by
    :func:`conv2d`; inside the chooser's ``measuring_inference`` block (a captured inference's warm-up)
    the candidates are measured here, each with its epilogue. Where it fuses an epilogue into the layer
    (``ConvStrategy.fuses_epilogue_for``) the convolution applies them as it stores its output; elsewhere it runs without its bias, and one pass
    after it adds the bias and the residual and applies the activation. With a bias both give the same
    bits: z = conv + bias, z += residual, then the activation as netcl.runtime.cl_activation writes it.
    """
    layer = check_conv2d(x, w, bias, stride, padding, dilation, groups)
    activation = "none" if activation is None else activation
    if activation not in ACTIVATIONS:
        raise ShapeError(f"conv2d_inference: unknown activation {activation!r}; expected None or one of "
                         f"{ACTIVATIONS}")
    if residual is not None:
        _check_residual(residual, x, layer)
        residual = as_contiguous(residual)
    x, w = as_contiguous(x), as_contiguous(w)
    bias = None if bias is None else as_contiguous(bias)
    choice, strategy = chooser(x.device), resolve_strategy(strategy)

    def execute(name):
        impl = choice.strategy_for(layer, "forward", name, x.device, inference=True)
        # inference: what the strategy derives from the weight alone is kept (netcl.ops.kept)
        options = {"keep": True} if impl.keeps_weight_derivatives else {}
        if impl.fuses_epilogue_for(layer):
            return impl.forward(x, w, layer, bias=bias, residual=residual, activation=activation, **options)
        if residual is None and activation == "none" and (bias is None or impl.fuses_bias):
            return impl.forward(x, w, layer, **options) if bias is None else impl.forward(x, w, layer, bias=bias, **options)
        return _separate_epilogue(impl.forward(x, w, layer, **options), bias, residual, activation)
    # a captured inference's warm-up measures the candidates here, the epilogue included
    return choice.run("forward", layer, x.device, strategy, False, execute)
