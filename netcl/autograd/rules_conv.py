"""Backward rule of conv2d: each pass runs the strategy chosen (or forced) for that pass."""
from __future__ import annotations

from .function import Function


class Conv2dFunction(Function):
    @staticmethod
    def forward(ctx, x, w, layer, strategy):
        from ..ops.conv2d import strategy_for
        ctx.x, ctx.w, ctx.layer, ctx.strategy = x, w, layer, strategy
        return strategy_for(layer, "forward", strategy).forward(x.contiguous(), w.contiguous(), layer)

    @staticmethod
    def backward(ctx, grad_y):
        from ..ops.conv2d import strategy_for
        layer, grad_y = ctx.layer, grad_y.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = strategy_for(layer, "backward_data", ctx.strategy).backward_data(grad_y, ctx.w.contiguous(), layer)
        if ctx.needs_input_grad[1]:
            grad_w = strategy_for(layer, "backward_weight", ctx.strategy).backward_weight(
                ctx.x.contiguous(), grad_y, layer)
        return grad_x, grad_w, None, None
