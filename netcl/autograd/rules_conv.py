"""conv2d, differentiable in x, w and bias: each pass runs the strategy chosen (or forced) for it by
netcl.ops.conv2d.run_pass; the bias is added by the forward pass (fused where the strategy can) and its
gradient is one channel sum (netcl.ops.bias)."""
from __future__ import annotations

from ..ops.conv2d import CONV2D_AUTO, check_conv2d, resolve_strategy, run_pass
from ..tensor import Tensor
from .function import Function, is_grad_enabled


class Conv2dFunction(Function):
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
            from ..ops.bias import bias_grad
            grad_b = bias_grad(grad_y.contiguous())
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
