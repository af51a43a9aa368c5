"""Backward rule of batch normalization (netcl.ops.batchnorm), with its fused ReLU and residual add.

forward: statistics (training) or the running ones (eval), then one apply kernel; backward: one
per-channel reduction and one elementwise kernel, whatever is fused.
"""
from __future__ import annotations

from .function import Function


class BatchNormFunction(Function):
    """y = [relu]((x − mean)/√(var + eps)·weight + bias [+ residual]); ``relu6``: ReLU6 instead of ReLU.

    ``batch_stats``: normalize by this batch's statistics (training, or track_running_stats=False), moving
    running_mean/var when given (momentum None: cumulative average) and counting num_batches_tracked;
    else use running_mean/var as constants."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, num_batches_tracked, batch_stats,
                momentum, eps, relu, relu6=False):
        from ..ops.batchnorm import batch_norm_apply, batch_norm_stats
        if batch_stats:
            mean, var = batch_norm_stats(x, running_mean, running_var, num_batches_tracked, momentum)
            count = num_batches_tracked if running_mean is not None else None
        else:
            mean, var, count = running_mean, running_var, None
        y = batch_norm_apply(x, mean, var, weight, bias, eps, residual, relu, count, relu6=relu6)
        ctx.saved = (x, y, mean, var, weight)
        ctx.flags = (batch_stats, eps, relu, relu6, residual is not None)
        return y

    @staticmethod
    def backward(ctx, g):
        from ..ops.batchnorm import batch_norm_backward
        x, y, mean, var, weight = ctx.saved
        batch_stats, eps, relu, relu6, has_residual = ctx.flags
        gx, gw, gb, gr = batch_norm_backward(g, x, y, mean, var, weight, eps, batch_stats, relu, has_residual,
                                             relu6=relu6)
        need = ctx.needs_input_grad
        return (gx if need[0] else None, gw if need[1] else None, gb if need[2] else None,
                gr if need[3] else None, None, None, None, None, None, None, None, None)
