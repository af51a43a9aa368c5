"""Backward rules used by dense pixelwise networks (netcl.dense): a zero-filled window of a feature map,
the elementwise maximum of two maps, and the masked per-pixel cross-entropy of Section 4.3 of Li, Zhao &
Wang ("Highly efficient forward and backward propagation of CNNs for pixelwise classification").
"""
from __future__ import annotations

import numpy as np

from ..ops import elementwise as ew
from ..ops import reduce as red
from .function import Function


def _window(x, top: int, left: int, height: int, width: int):
    """out[..., v, u] = x[..., v + top, u + left] where that lies inside x, else 0 (no autograd)."""
    from ..tensor import Tensor
    h, w = x.shape[-2:]
    if (top, left, height, width) == (0, 0, h, w):
        return x if x.is_contiguous() else ew.contiguous_copy(x)
    out = ew.fill(Tensor.empty(x.shape[:-2] + (height, width), x.dtype, x.device), 0)
    r0, r1 = max(0, -top), min(height, h - top)
    c0, c1 = max(0, -left), min(width, w - left)
    if r0 < r1 and c0 < c1:
        ew.copy_into(out[..., r0:r1, c0:c1], x[..., r0 + top:r1 + top, c0 + left:c1 + left])
    return out


class Window(Function):
    """A (height × width) window of the last two axes starting at (top, left), which may lie partly outside
    the input (zero padding) or inside it (cropping). Its gradient is the opposite window of the gradient."""

    @staticmethod
    def forward(ctx, x, top, left, height, width):
        ctx.geometry = (-top, -left) + tuple(x.shape[-2:])
        out = _window(x, top, left, height, width)
        # forward must return a new tensor: returning x itself would overwrite x's place in the graph
        return ew.contiguous_copy(x) if out is x else out

    @staticmethod
    def backward(ctx, g):
        return _window(g, *ctx.geometry), None, None, None, None


class Maximum(Function):
    """max(a, b) elementwise for same-shape tensors; the gradient goes to a where a ≥ b, else to b."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return ew.binary("maximum", a, b)

    @staticmethod
    def backward(ctx, g):
        ga = ew.map_expr("{1} >= {2} ? {0} : ({T})0", [g, ctx.a, ctx.b]) if ctx.needs_input_grad[0] else None
        gb = ew.map_expr("{1} >= {2} ? ({T})0 : {0}", [g, ctx.a, ctx.b]) if ctx.needs_input_grad[1] else None
        return ga, gb


class MaskedCrossEntropy2d(Function):
    """scale · Σ_{n,i,j} weight[n,i,j] · (−log softmax(scores[n, :, i, j])[target[n,i,j]]).

    scores (N, K, H, W) float; target (N, 1, H, W) int; weight (N, 1, H, W) float (the pixel mask);
    classes (1, K, 1, 1) int holding 0..K−1. Every pixel is evaluated whatever the mask holds, so the cost
    does not depend on how many pixels are selected; unselected pixels get an exactly zero gradient.
    """

    @staticmethod
    def forward(ctx, scores, target, weight, classes, scale):
        top = red.reduce(scores, "max", (1,), keepdims=True)
        total = red.reduce(ew.map_expr("exp({0} - {1})", [scores, top]), "sum", (1,), keepdims=True)
        lse = ew.map_expr("{0} + log({1})", [top, total])
        picked = red.reduce(ew.map_expr("{0} == {1} ? {2} : ({T})0", [target, classes, scores],
                                        compute_dtype=scores.dtype), "sum", (1,), keepdims=True)
        per_pixel = ew.map_expr("({0} - {1}) * {2}", [lse, picked, weight])
        loss = red.reduce(per_pixel, "sum", None, keepdims=False)
        ctx.saved = (scores, target, weight, classes, lse, scale)
        return ew.map_expr("{0} * {1}", [loss, scale], compute_dtype=scores.dtype)

    @staticmethod
    def backward(ctx, g):
        scores, target, weight, classes, lse, scale = ctx.saved
        grad = ew.map_expr("{0} * {1} * {2} * (exp({3} - {4}) - ({5} == {6} ? ({T})1 : ({T})0))",
                           [g, scale, weight, scores, lse, target, classes], compute_dtype=scores.dtype)
        return grad, None, None, None, None


def masked_cross_entropy2d(scores, target, weight, scale: float):
    """The differentiable masked per-pixel loss; argument checking is done by netcl.dense.masked_cross_entropy."""
    from ..tensor import Tensor
    k = scores.shape[1]
    classes = Tensor.from_host(np.arange(k, dtype=target.dtype).reshape(1, k, 1, 1), scores.device)
    return MaskedCrossEntropy2d.apply(scores, target, weight, classes, float(scale))
