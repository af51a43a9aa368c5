"""Stochastic gradient descent with momentum, dampening, weight decay and Nesterov (torch.optim.SGD)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from .optimizer import Optimizer


class SGD(Optimizer):
    """p -= lr * d, where g = grad + weight_decay·p; with momentum, buf = momentum·buf + (1 − dampening)·g
    (buf = g on the first step) and d = g + momentum·buf (Nesterov) or buf; else d = g."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, nesterov=False, dampening=0.0):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                            ("dampening", dampening)):
            if not isinstance(value, (int, float)) or value < 0:
                raise ShapeError(f"SGD {name} must be a non-negative number, got {value!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ShapeError("SGD with nesterov=True needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
                                      nesterov=bool(nesterov), dampening=float(dampening)))

    def _update(self, group, p, g, state):
        T = p.dtype.type
        momentum = group["momentum"]
        first = 0
        if momentum != 0:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = Tensor.empty(p.shape, p.dtype, p.device)
                first = 1
            buf = state["momentum_buffer"]
        else:
            buf = p
        self._launch(p, "sgd_step",
                     (p.buffer, np.int64(p.offset), g.buffer, np.int64(g.offset), buf.buffer, np.int64(buf.offset),
                      np.int64(p.size), T(group["lr"]), T(momentum), T(group["dampening"]),
                      T(group["weight_decay"]), np.int32(first)),
                     WD=group["weight_decay"] != 0, MOMENTUM=momentum != 0, NESTEROV=bool(group["nesterov"]))
