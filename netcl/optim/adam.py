"""Adam and AdamW (torch.optim.Adam / AdamW without amsgrad): bias-corrected first and second moments."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ops.elementwise import fill
from ..tensor import Tensor
from .optimizer import Optimizer


class Adam(Optimizer):
    """m = b1·m + (1−b1)·g, v = b2·v + (1−b2)·g², p -= lr/(1−b1^t) · m / (√v/√(1−b2^t) + eps),
    with g = grad + weight_decay·p (L2 penalty, as torch.optim.Adam)."""

    decoupled_weight_decay = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        b1, b2 = betas
        # written as positive range checks so that NaN (which fails every comparison) is rejected too
        if not (0 <= lr < math.inf and 0 <= eps < math.inf and 0 <= weight_decay < math.inf
                and 0 <= b1 < 1 and 0 <= b2 < 1):
            raise ShapeError(f"{type(self).__name__} needs lr ≥ 0, eps ≥ 0, weight_decay ≥ 0 and betas in "
                             f"[0, 1): got lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=float(lr), betas=(float(b1), float(b2)), eps=float(eps),
                                      weight_decay=float(weight_decay)))

    def _update_many(self, group, items):
        b1, b2 = group["betas"]
        T = items[0][0].dtype.type
        per_tensor = []
        for p, g, state in items:
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = fill(Tensor.empty(p.shape, p.dtype, p.device), 0)
                state["exp_avg_sq"] = fill(Tensor.empty(p.shape, p.dtype, p.device), 0)
            state["step"] += 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            per_tensor += [p.buffer, np.int64(p.offset), g.buffer, np.int64(g.offset), m.buffer, np.int64(m.offset),
                           v.buffer, np.int64(v.offset), np.int64(p.size), T(group["lr"] / (1.0 - b1 ** t)),
                           T(math.sqrt(1.0 - b2 ** t))]
        decay = group["weight_decay"]
        if self.decoupled_weight_decay:
            decay = 1.0 - group["lr"] * decay  # the kernel scales p by it before the step
        scalars = (T(b1), T(1.0 - b1), T(b2), T(1.0 - b2), T(group["eps"]), T(decay))
        self._launch(items, "adam_step", per_tensor + [scalars], WD=group["weight_decay"] != 0,
                     DECOUPLED=self.decoupled_weight_decay and group["weight_decay"] != 0)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter; torch.optim.AdamW): the gradient is not
    penalized; instead p ← p·(1 − lr·weight_decay) before each Adam step. Default weight_decay 1e-2."""

    decoupled_weight_decay = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
