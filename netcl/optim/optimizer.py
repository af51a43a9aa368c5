"""Optimizer base: parameter groups, per-parameter state, state_dict/load_state_dict (for --resume).

Hyper-parameters live in ``param_groups`` (a list of dicts with "params" and the settings), so a schedule
changes ``group["lr"]`` between steps, as in PyTorch. Updates run as one fused kernel per parameter
(kernels/optim.cl), in place, so modules and optimizers keep sharing the same tensors.
"""
from __future__ import annotations

import itertools

import numpy as np

from .. import dtypes
from ..errors import CheckpointError, DTypeError, ShapeError
from ..runtime import error_flags, first_step, memory, recording
from ..ops.elementwise import fill
from ..runtime.kernels import VARYING, PreparedLaunch, get_kernel, local_size_1d
from ..tensor import Tensor


# Tensors per fused launch: keeps the kernel's arguments well under OpenCL's guaranteed 1024 bytes.
MAX_FUSED = 8


def fused_tensors_per_launch(device) -> int:
    """How many tensors one update launch serves. GPUs: MAX_FUSED (a launch costs more than the update of a
    small tensor). CPU devices: 1, because PoCL runs a multi-tensor update many times slower than one
    launch per tensor, by an amount that depends on where the buffers lie."""
    return 1 if device.kind == "cpu" else MAX_FUSED


class Optimizer:
    defaults: dict = {}

    def __init__(self, params, defaults: dict):
        params = list(params)
        if not params:
            raise ShapeError(f"{type(self).__name__} got an empty parameter list")
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.state: dict[int, dict] = {}  # id(param) -> state
        # (kernel, parameters updated, kernel parameters) -> the prepared launch that updates them: each
        # step's host work is then setting the few arguments that changed (a step's host time is taken
        # from the cores that run the kernels on a CPU device)
        self._launches: dict[tuple, PreparedLaunch] = {}
        for group in params if isinstance(params[0], dict) else [{"params": params}]:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        """Add a group of parameters with its own settings (unset ones take the optimizer's defaults)."""
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for _, p in self._params()}
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise DTypeError(f"{type(self).__name__} optimizes netcl Tensors, got {type(p).__name__}")
            dtypes.require_float(p.dtype, f"{type(self).__name__} parameter")
            if not p.is_contiguous():
                raise ShapeError(f"{type(self).__name__}: parameter of shape {p.shape} is not contiguous")
            if id(p) in seen:
                raise ShapeError(f"{type(self).__name__}: a parameter of shape {p.shape} appears in two groups")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                yield group, p

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (the default, as PyTorch), or with set_to_none=False zero them in place."""
        for _, p in self._params():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                fill(p.grad, 0)

    def step(self) -> None:
        """Update every parameter that has a gradient: one fused launch per group (and dtype/device), at
        most fused_tensors_per_launch(device) tensors each. First, an error a kernel recorded on the
        parameters' device (a class index out of range in the loss) is raised, before any update."""
        for device in {p.device for _, p in self._params() if p.grad is not None}:
            error_flags.check_before_update(device)
        devices = set()
        for group in self.param_groups:
            batches: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.shape != p.shape:
                    raise ShapeError(f"gradient of shape {g.shape} for a parameter of shape {p.shape}")
                if g.dtype != p.dtype:
                    g = g.astype(p.dtype)
                if not g.is_contiguous():
                    g = g.contiguous()
                batches.setdefault((p.dtype, p.device), []).append((p, g, self.state.setdefault(id(p), {})))
                devices.add(p.device)
            for items in batches.values():
                width = fused_tensors_per_launch(items[0][0].device)
                for start in range(0, len(items), width):
                    self._update_many(group, items[start:start + width])
        for device in devices:  # a training step is over: builds deferred past the first one are due
            first_step.end(device)

    def _update_many(self, group, items) -> None:
        """Update [(param, contiguous grad, state dict)] of one group, dtype and device (each optimizer
        class defines its own update; the base class only groups and batches the parameters)."""
        raise NotImplementedError(f"{type(self).__name__} does not define its parameter update")

    def replay_key(self):
        """What a recorded ``step()`` relies on beyond its launches' arguments (netcl.training.replay records
        the step with the backward pass when this is not None, and records again when it changes); None:
        this optimizer's step is not recorded (its host-side state changes each step, as Adam's count)."""
        return None

    def _launch(self, items, name: str, args, dynamic=None, **params) -> None:
        """Update ``items`` with kernel ``name``: ``args`` is the per-tensor arguments followed by one
        tuple of scalars; the work-group ends of each tensor go between them. ``dynamic``: one callable
        per scalar giving its value at a replay of a recorded step (the group's settings then)."""
        # with sizes and dtype: a parameter the groups no longer hold may leave its id to a new tensor
        key = (name, items[0][0].dtype, tuple((id(q), q.size) for q, _, _ in items), tuple(params.items()))
        prepared = self._launches.get(key)
        if prepared is None:
            p = items[0][0]
            total = sum(q.size for q, _, _ in items)
            if total == 0:
                return
            kernel = get_kernel(p.device, "optim.cl", name, T=dtypes.c_type(p.dtype), N=len(items), **params)
            (local,) = local_size_1d(p.device, total)
            group_ends = list(itertools.accumulate(-(-q.size // local) for q, _, _ in items))
            prepared = self._launches[key] = PreparedLaunch(
                p.device, kernel, (group_ends[-1] * local,), (local,),
                [VARYING] * (len(args) - 1) + [np.int64(end) for end in group_ends] + [VARYING] * len(args[-1]))
        if dynamic and recording.active(prepared.device) is not None:  # only a recording reads them
            first_scalar = len(args) - 1
            prepared(*args[:-1], *args[-1], dynamic={first_scalar + k: refresh for k, refresh in enumerate(dynamic)})
        else:
            prepared(*args[:-1], *args[-1])
        for p, _, state in items:  # the parameters and their state were updated in place
            p.mark_written()
            for value in state.values():
                if isinstance(value, Tensor):
                    value.mark_written()

    # ---- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """{"state": {index: {name: ndarray | number}}, "param_groups": [settings + "params": indices]}."""
        index = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {}
        for pid, s in self.state.items():
            if pid in index:
                state[index[pid]] = {k: (v.to_host() if isinstance(v, Tensor) else v) for k, v in s.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        try:
            groups, state = state_dict["param_groups"], state_dict["state"]
        except (KeyError, TypeError):
            raise CheckpointError("optimizer state_dict needs 'state' and 'param_groups'") from None
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(own["params"]) for g, own in zip(groups, self.param_groups)):
            raise CheckpointError("optimizer state_dict has a different number of parameter groups or parameters")
        params = [p for _, p in self._params()]
        for g, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in g.items() if k != "params"})
        self.state = {}
        for key, s in state.items():
            p = params[int(key)]
            entry = {}
            for name, value in s.items():
                if isinstance(value, (np.ndarray, Tensor)):
                    host = value.to_host() if isinstance(value, Tensor) else value
                    if tuple(host.shape) != p.shape:
                        raise CheckpointError(f"optimizer state {name!r} has shape {tuple(host.shape)} for a "
                                              f"parameter of shape {p.shape}")
                    t = Tensor.empty(p.shape, p.dtype, p.device)
                    memory.upload(p.device, t.buffer, np.ascontiguousarray(host, dtype=p.dtype),
                                  t.offset * p.dtype.itemsize)
                    entry[name] = t
                else:
                    entry[name] = value
            self.state[id(p)] = entry
