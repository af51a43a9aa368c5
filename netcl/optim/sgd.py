"""Stochastic gradient descent with momentum, dampening, weight decay and Nesterov (torch.optim.SGD).

The arguments come in PyTorch's positional order, (params, lr, momentum, dampening, weight_decay, nesterov),
so a call copied from PyTorch code means the same here."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from .optimizer import Optimizer


class SGD(Optimizer):
    """p -= lr * d, where g = grad + weight_decay·p; with momentum, buf = momentum·buf + (1 − dampening)·g
    (buf = g on the first step) and d = g + momentum·buf (Nesterov) or buf; else d = g."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                            ("dampening", dampening)):
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:  # also rejects NaN
                raise ShapeError(f"SGD {name} must be a non-negative number, got {value!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ShapeError("SGD with nesterov=True needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
                                      nesterov=bool(nesterov), dampening=float(dampening)))

    def _update_many(self, group, items):
        momentum = group["momentum"]
        per_tensor = []
        for p, g, state in items:
            first = 0
            if momentum != 0:
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = Tensor.empty(p.shape, p.dtype, p.device)
                    first = 1
                buf = state["momentum_buffer"]
            else:
                buf = p  # not read or written without momentum
            per_tensor += [p.buffer, np.int64(p.offset), g.buffer, np.int64(g.offset), buf.buffer,
                           np.int64(buf.offset), np.int64(p.size), np.int32(first)]
        T = items[0][0].dtype.type
        scalars = (T(group["lr"]), T(momentum), T(1.0 - group["dampening"]), T(group["weight_decay"]))
        # A replayed step reads the group's settings as they are then (a schedule changes lr, OneCycleLR
        # momentum); what picks the kernel is in replay_key.
        refresh = (lambda: T(group["lr"]), lambda: T(group["momentum"]), lambda: T(1.0 - group["dampening"]),
                   lambda: T(group["weight_decay"]))
        self._launch(items, "sgd_step", per_tensor + [scalars], dynamic=refresh, WD=group["weight_decay"] != 0,
                     MOMENTUM=momentum != 0, NESTEROV=bool(group["nesterov"]))

    def replay_key(self):
        """The kernel variants, the parameters and their momentum buffers: a recorded step stays right
        while these stay (the settings' values are read at every replay)."""
        return tuple((g["momentum"] != 0, g["weight_decay"] != 0, bool(g["nesterov"]),
                      tuple((id(p), id(self.state.get(id(p), {}).get("momentum_buffer"))) for p in g["params"]))
                     for g in self.param_groups)
