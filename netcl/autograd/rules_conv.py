"""Backward rule of conv2d: each pass runs the strategy chosen (or forced) for that pass; the bias is added
in place to the fresh output and its gradient is one channel sum (netcl.ops.bias)."""
from __future__ import annotations

from .function import Function


class Conv2dFunction(Function):
    @staticmethod
    def forward(ctx, x, w, bias, layer, strategy):
        from ..ops.bias import add_bias_
        from ..ops.conv2d import strategy_for
        ctx.x, ctx.w, ctx.layer, ctx.strategy = x, w, layer, strategy
        impl = strategy_for(layer, "forward", strategy)
        if bias is not None and getattr(impl, "fuses_bias", False):
            return impl.forward(x.contiguous(), w.contiguous(), layer, bias=bias.contiguous())
        y = impl.forward(x.contiguous(), w.contiguous(), layer)
        return add_bias_(y, bias) if bias is not None else y

    @staticmethod
    def backward(ctx, grad_y):
        from ..ops.conv2d import strategy_for
        layer, grad_y = ctx.layer, grad_y.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = strategy_for(layer, "backward_data", ctx.strategy).backward_data(grad_y, ctx.w.contiguous(), layer)
        if ctx.needs_input_grad[1]:
            grad_w = strategy_for(layer, "backward_weight", ctx.strategy).backward_weight(
                ctx.x.contiguous(), grad_y, layer)
        if ctx.needs_input_grad[2]:
            from ..ops.bias import bias_grad
            grad_b = bias_grad(grad_y)
        return grad_x, grad_w, grad_b, None, None
