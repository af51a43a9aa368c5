"""Which strategy runs one pass of one convolution on one device: the device's :class:`ConvChooser`.

Every convolution asks its device's chooser (``chooser(device)``, held in ``device.state``), and the
chooser is the one place that decides between the three ways of choosing:

- a strategy forced by the caller or ``NETCL_CONV_STRATEGY`` runs as forced (checked);
- in training with ``NETCL_CONV_PLAN_MODE=online`` (the default), the training trials measure the
  candidates over the first steps (netcl.ops.conv_online) unless a measured plan is stored; so do the
  forward passes of inference inside :meth:`ConvChooser.measuring_inference` (the warm-up calls of a
  captured inference, netcl.training.CapturedInference);
- otherwise the planner's plan (netcl.ops.conv2d_planner): a stored measured plan, else the model's
  choice (heuristic: no kernel runs), or a measurement in the measure modes, stored once.

What decides a choice besides the layer and pass is one value, :class:`~netcl.ops.conv_plan.ChoiceInputs`
(:meth:`ConvChooser.inputs`); each plan carries the inputs it was made with and `netcl plan` prints them.
Imports run one way: this module → conv_online → conv2d_planner → conv_plan, conv_profile, conv_cost →
conv_memory, the device's memory of all three (profiles, plans, trials).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

from .. import settings
from ..errors import ShapeError
from ..runtime.device import resolve_device
from . import conv2d_planner as planner
from . import conv_online
from .conv_common import ConvLayer
from .conv_memory import CHOICE
from .conv_plan import ChoiceInputs
from .conv_registry import strategies

CHOOSER = "conv chooser"  # the device state's entry (netcl.runtime.device_state)
forced_strategy = planner.forced_strategy  # (strategy, who forced it): the caller's, else NETCL_CONV_STRATEGY's


def trials_on() -> bool:
    """Whether training measures its "auto" choices over its first steps (NETCL_CONV_PLAN_MODE=online)."""
    return settings.CONV_PLAN_MODE.get() == "online"


class ConvChooser:
    """The convolution choice of one device. What it decides from is the device's convolution memory
    (netcl.ops.conv_memory: the cost model's profiles, the plans, the training trials), which the planner
    and the trials fill; :meth:`clear` forgets it in one call. Methods take the device: the device's state
    refers to no Device."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inference_measuring = 0  # measuring_inference blocks open on the device

    @contextlib.contextmanager
    def measuring_inference(self):
        """Inside this block the forward passes of "auto" convolutions run without a gradient (inference)
        measure their candidates over their calls as training's do, unless a measured plan is stored
        (netcl.ops.conv_online, purpose "inference"). It holds for the device, whichever thread calls."""
        with self._lock:
            self._inference_measuring += 1
        try:
            yield self
        finally:
            with self._lock:
                self._inference_measuring -= 1

    def _trial_purpose(self, pass_: str, strategy: str | None, training: bool) -> str | None:
        """"training" or "inference" where this call may measure its choice, else None. Every convolution
        asks: the settings are read only for calls that could measure."""
        if training:
            purpose = "training"
        elif pass_ == "forward" and self._inference_measuring:
            purpose = "inference"
        else:
            return None
        return purpose if trials_on() and planner.forced_strategy(strategy)[0] is None else None

    def inputs(self, layer: ConvLayer, pass_: str, device, strategy: str | None = None,
               training: bool = False) -> ChoiceInputs:
        """Everything besides the layer and pass that decides which strategy runs this pass."""
        purpose = self._trial_purpose(pass_, strategy, training)
        inference = not training and pass_ == "forward"
        if purpose is not None:
            plan = planner.plan_conv2d_layer(layer, pass_, "heuristic", device=device, inference=inference)
            return dataclasses.replace(plan.inputs, mode="online",
                                       trials=conv_online.trial_state(layer, pass_, device, purpose))
        return planner.plan_conv2d_layer(layer, pass_, None, device=device, strategy=strategy,
                                         inference=inference).inputs

    def strategy_for(self, layer: ConvLayer, pass_: str, strategy: str | None, device,
                     inference: bool = False) -> object:
        """The strategy object that runs ``pass_`` of ``layer`` on ``device``: the forced one (checked),
        or the planner's choice for that device (``inference``: for a pass without gradients)."""
        if strategy in (None, "auto"):
            strategy = planner.plan_conv2d_layer(layer, pass_, device=device, inference=inference).strategy
        impl = strategies().get(strategy)
        if impl is None:
            raise ShapeError(f"unknown conv2d strategy {strategy!r}; choose one of {', '.join(strategies())} "
                             f"or 'auto'")
        why = impl.why_not(layer, pass_, device)
        if why:
            raise ShapeError(f"conv2d strategy {strategy!r} cannot run the {pass_} pass of this layer: {why} "
                             f"({layer.describe()})")
        return impl

    def run(self, pass_: str, layer: ConvLayer, device, strategy: str | None, training: bool, execute):
        """Run ``pass_`` of ``layer``: ``execute(name)`` runs strategy ``name`` and returns its result.
        ``strategy`` is the caller's (None or "auto": choose); ``training`` lets the trials measure, and
        so does an open :meth:`measuring_inference` block for a forward pass."""
        purpose = self._trial_purpose(pass_, strategy, training)
        if purpose is not None:
            return conv_online.run(pass_, layer, device, execute, purpose)
        return execute(strategy)

    def clear(self, device) -> None:
        """Forget the plans, profiles and training trials this process holds for ``device`` (the stores on
        disk stay)."""
        device.state.drop(CHOICE)


def chooser(device=None) -> ConvChooser:
    """``device``'s chooser (the default device's when None)."""
    return resolve_device(device).state.entry(CHOOSER, ConvChooser)


def clear_memory_cache(device=None) -> None:
    """Forget the plans, profiles and training trials this process holds for ``device`` (the default
    device if None; the stores on disk stay). ``device.clear_state()`` forgets these and all else."""
    device = resolve_device(device)
    chooser(device).clear(device)
