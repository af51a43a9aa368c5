"""Backward rules of LeakyReLU / GELU / Hardtanh / Hardswish / Hardsigmoid / SiLU, the residual add + ReLU,
and softmax / log-softmax (netcl.ops.activation)."""
from __future__ import annotations

from .function import Function


class ActivationFunction(Function):
    """y = act(x) (netcl.ops.activation.ACTIVATIONS) with the activation's parameters ``params``."""

    @staticmethod
    def forward(ctx, x, act, params):
        from ..ops.activation import activation_forward
        ctx.x, ctx.act, ctx.params = x, act, params
        return activation_forward(x, act, params)

    @staticmethod
    def backward(ctx, g):
        from ..ops.activation import activation_backward
        return activation_backward(g, ctx.x, ctx.act, ctx.params), None, None


class AddReLUFunction(Function):
    """relu(a + b): both inputs receive the same masked gradient, computed once from the saved output."""

    @staticmethod
    def forward(ctx, a, b):
        from ..ops.activation import add_relu
        ctx.y = add_relu(a, b)
        return ctx.y

    @staticmethod
    def backward(ctx, g):
        from ..ops.activation import relu_backward
        grad = relu_backward(g, ctx.y)
        return (grad if ctx.needs_input_grad[0] else None), (grad if ctx.needs_input_grad[1] else None)


class SoftmaxFunction(Function):
    @staticmethod
    def forward(ctx, x, dim, log):
        from ..ops.activation import softmax_forward
        ctx.y = softmax_forward(x, dim, log)
        ctx.dim, ctx.log = dim, log
        return ctx.y

    @staticmethod
    def backward(ctx, g):
        from ..ops.activation import softmax_backward
        return softmax_backward(g, ctx.y, ctx.dim, ctx.log), None, None
