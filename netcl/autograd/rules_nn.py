"""Backward rules of the layer-level operations: linear, pooling, losses, dropout (batch norm: rules_norm.py;
activations and softmax: rules_activation.py).

Each rule keeps from forward exactly what its backward needs (the argmax of max pooling, the per-row
log-sum-exp of the loss, the dropout mask) so backward never recomputes forward.
"""
from __future__ import annotations

from ..ops import elementwise as ew
from .function import Function


class LinearFunction(Function):
    """y = x @ w.T (+ b) for a 2-D x (N, in), w (out, in), b (out,); the gradients come out contiguous."""

    @staticmethod
    def forward(ctx, x, w, b):
        from ..ops.gemm import gemm
        ctx.x, ctx.w, ctx.has_bias = x, w, b is not None
        from ..ops.bias import add_bias_
        y = gemm(x, w, trans_b=True)
        return add_bias_(y, b) if b is not None else y

    @staticmethod
    def backward(ctx, g):
        from ..ops.gemm import gemm
        g = g if g.is_contiguous() else g.contiguous()
        gx = gemm(g, ctx.w) if ctx.needs_input_grad[0] else None
        gw = gemm(g, ctx.x, trans_a=True) if ctx.needs_input_grad[1] else None
        gb = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            from ..ops.bias import bias_grad
            gb = bias_grad(g)
        return gx, gw, gb


class Pool2dFunction(Function):
    """Max or average pooling; max keeps the int32 argmax of every window for backward (-1 where a fused
    ReLU zeroed the window, which then receives no gradient), and computes none where no graph is recorded."""

    @staticmethod
    def forward(ctx, x, geometry, op, count_include_pad, relu=False):
        from ..ops.pool import pool_forward
        y, arg = pool_forward(x, geometry, op, count_include_pad, relu, argmax=ctx.records_graph)
        ctx.geometry, ctx.op, ctx.count_include_pad, ctx.arg, ctx.relu = geometry, op, count_include_pad, arg, relu
        return y

    @staticmethod
    def backward(ctx, g):
        from ..ops.pool import pool_backward
        return (pool_backward(g, ctx.geometry, ctx.op, ctx.arg, ctx.count_include_pad, ctx.relu),
                None, None, None, None)


class LossFunction(Function):
    """Fused cross-entropy (over logits) or negative log-likelihood (over log-probabilities) with class
    weights, ignore_index, label smoothing and any reduction (netcl.ops.loss.LossOptions)."""

    @staticmethod
    def forward(ctx, x, target, weight, opts):
        from ..ops.loss import loss_forward
        loss, saved = loss_forward(x, target, weight, opts)
        ctx.x, ctx.target, ctx.weight, ctx.saved, ctx.opts = x, target, weight, saved, opts
        return loss

    @staticmethod
    def backward(ctx, g):
        from ..ops.loss import loss_backward
        return loss_backward(g, ctx.x, ctx.target, ctx.weight, ctx.saved, ctx.opts), None, None, None


class AdaptiveAvgPool2dFunction(Function):
    @staticmethod
    def forward(ctx, x, output_size):
        from ..ops.pool import adaptive_avg_pool2d_forward
        ctx.input_shape = x.shape
        return adaptive_avg_pool2d_forward(x, output_size)

    @staticmethod
    def backward(ctx, g):
        from ..ops.pool import adaptive_avg_pool2d_backward
        return adaptive_avg_pool2d_backward(g, ctx.input_shape), None


class DropoutFunction(Function):
    """y = x * mask with mask = 1/(1-p) (kept, probability 1-p) or 0, drawn from a counter-based stream, so a
    given seed always drops the same elements."""

    @staticmethod
    def forward(ctx, x, p, seed):
        from ..factories import random_fill
        from ..tensor import Tensor
        mask = random_fill(Tensor.empty(x.shape, x.dtype, x.device), "bernoulli_keep", seed, p)
        ctx.mask = mask
        return ew.binary("mul", x, mask)

    @staticmethod
    def backward(ctx, g):
        return ew.binary("mul", g, ctx.mask), None, None
