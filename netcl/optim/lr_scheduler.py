"""Learning-rate schedules with torch.optim.lr_scheduler's semantics.

The constructor applies the schedule's first rate (step 0) to the optimizer; call ``scheduler.step()`` after
``optimizer.step()``, once per epoch or once per batch as the schedule is meant. Each ``step()`` advances
``last_epoch`` and writes the new rate into every ``optimizer.param_groups[i]["lr"]``. The rates follow
PyTorch's chainable (recursive) forms, so a schedule stacked on another one, or an ``lr`` changed by hand
between steps, evolves as it would in PyTorch. ``state_dict()`` holds plain numbers only (nc.save writes it);
a LambdaLR's functions are not saved, as in PyTorch.
"""
from __future__ import annotations

import math
from collections import Counter

from ..errors import CheckpointError, ShapeError


class LRScheduler:
    def __init__(self, optimizer, last_epoch: int = -1):
        if not hasattr(optimizer, "param_groups"):
            raise ShapeError(f"{type(self).__name__} needs an optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            missing = [i for i, g in enumerate(optimizer.param_groups) if "initial_lr" not in g]
            if missing:
                raise ShapeError(f"param_groups {missing} have no 'initial_lr': resuming a schedule "
                                 f"(last_epoch={last_epoch}) needs the optimizer state it was saved with")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = int(last_epoch)
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} does not define get_lr()")

    def step(self) -> None:
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = float(lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The rates the last step() (or the constructor) set, one per parameter group."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {key: (list(value) if isinstance(value, tuple) else value) for key, value in self.__dict__.items()
                if key != "optimizer" and not key.startswith("_lambda")}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or "last_epoch" not in state_dict:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict needs a scheduler state_dict")
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = initial_lr · lr_lambda(epoch); one function, or one per parameter group."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        groups = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(lambdas) != groups or not all(callable(f) for f in lambdas):
            raise ShapeError(f"LambdaLR needs one callable or {groups} callables (one per group), got {lr_lambda!r}")
        self._lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self._lambdas)]


class StepLR(LRScheduler):
    """Multiplies the rate by gamma every step_size epochs."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if not isinstance(step_size, int) or step_size < 1:
            raise ShapeError(f"StepLR step_size must be a positive int, got {step_size!r}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma for g in groups]


class MultiStepLR(LRScheduler):
    """Multiplies the rate by gamma at each milestone epoch (a milestone listed twice counts twice)."""

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        milestones = [int(m) for m in milestones]
        if milestones != sorted(milestones):
            raise ShapeError(f"MultiStepLR milestones must be increasing, got {milestones}")
        self.milestones, self.gamma = milestones, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups = self.optimizer.param_groups
        hits = Counter(self.milestones)[self.last_epoch]
        if not hits:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma ** hits for g in groups]


class CosineAnnealingLR(LRScheduler):
    """lr_t = eta_min + (initial_lr − eta_min)·(1 + cos(π·t/T_max))/2, in PyTorch's recursive form (past
    T_max the rate rises again, as in PyTorch)."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if not isinstance(T_max, int) or T_max < 1:
            raise ShapeError(f"CosineAnnealingLR T_max must be a positive int, got {T_max!r}")
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups, t, T, low = self.optimizer.param_groups, self.last_epoch, self.T_max, self.eta_min
        if t == 0:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and t > 0:
            return [low + (base - low) * (1 + math.cos(t * math.pi / T)) / 2 for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (base - low) * (1 - math.cos(math.pi / T)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (g["lr"] - low) + low
                for g in groups]


def _anneal_cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _anneal_linear(start: float, end: float, pct: float) -> float:
    return (end - start) * pct + start


class OneCycleLR(LRScheduler):
    """Smith's 1cycle policy, stepped once per batch: the rate rises from max_lr/div_factor to max_lr over
    pct_start of the steps, then falls to max_lr/(div_factor·final_div_factor) (three_phase: back to the
    start, then down to the minimum); momentum (SGD's, or Adam's beta1) moves inversely between
    max_momentum and base_momentum when cycle_momentum."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ShapeError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
            total_steps = int(epochs) * int(steps_per_epoch)
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ShapeError(f"OneCycleLR total_steps must be a positive int, got {total_steps!r}")
        if not 0 <= pct_start <= 1:
            raise ShapeError(f"OneCycleLR pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ShapeError(f"OneCycleLR anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
        self.cycle_momentum = bool(cycle_momentum)
        up = float(pct_start * total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * total_steps) - 2, "start_lr": "max_lr", "end_lr": "initial_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": total_steps - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"}]
        else:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": total_steps - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"}]
        groups = optimizer.param_groups
        max_lrs = self._per_group(max_lr, len(groups), "max_lr")
        if last_epoch == -1:
            for lr, group in zip(max_lrs, groups):
                group["initial_lr"] = lr / div_factor
                group["max_lr"] = lr
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if self.cycle_momentum:
            defaults = getattr(optimizer, "defaults", {})
            if "momentum" not in defaults and "betas" not in defaults:
                raise ShapeError("OneCycleLR with cycle_momentum needs an optimizer with momentum or betas")
            self.use_beta1 = "betas" in defaults
            if last_epoch == -1:
                for top, low, group in zip(self._per_group(max_momentum, len(groups), "max_momentum"),
                                           self._per_group(base_momentum, len(groups), "base_momentum"), groups):
                    if self.use_beta1:
                        group["betas"] = (top, *group["betas"][1:])
                    else:
                        group["momentum"] = top
                    group["max_momentum"], group["base_momentum"] = top, low
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _per_group(value, groups: int, name: str) -> list[float]:
        if isinstance(value, (list, tuple)):
            if len(value) != groups:
                raise ShapeError(f"OneCycleLR {name}: {len(value)} values for {groups} parameter groups")
            return [float(v) for v in value]
        return [float(value)] * groups

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ShapeError(f"OneCycleLR stepped {step} times, past its total_steps {self.total_steps}")
        anneal = _anneal_cos if self.anneal_strategy == "cos" else _anneal_linear
        rates = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    # PyTorch divides by zero here when a phase is empty; such a phase is simply over
                    pct = (step - start) / (end - start) if end != start else 1.0
                    rate = anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = end
            rates.append(rate)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return rates


__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "CosineAnnealingLR", "OneCycleLR"]
