"""Measured plans for training and captured inference, without holding up the first step.

With strategy="auto", the first call of a (device, layer, pass, dtype) that has no measured plan runs the
model's choice (in a process's first step, a candidate whose kernels the process already holds, if any:
netcl.runtime.first_step). The calls after the first step run, one per call, the candidates the model
cannot rule out (predicted within ``MARGIN``× of its best, at most ``MAX_CANDIDATES``), each ``RUNS``
times on the real data (the first run warms its kernels up; the rest are its samples). Once every candidate has its
samples, the fastest becomes the plan: stored per device (netcl.ops.conv2d_planner's plan store, mode
"training"), used by every later call and process, and its timings refine the device's calibration.
The cost of measuring (the trial runs' time beyond what the winner would have taken) is in the stored
plan and in :func:`stats`.

Inference measures the same way where the caller asks it to (``purpose="inference"``: the forward pass
of a captured inference's warm-up calls, netcl.training.CapturedInference), storing plans of mode
"inference", apart from training's: inference keeps what a strategy derives from the weight alone (a
packed or transformed filter) from call to call and times the epilogue fused into the layer, so each
purpose measures its own plan (a plan of the measure modes serves both). An inference trial's timings
of the strategies that keep weight derivatives leave that work out, so only the others refine the
calibration.

The binaries of the programs only losing candidates ran are not written
(netcl.runtime.loser_binaries). The trials are reached through the device's convolution chooser
(netcl.ops.conv_chooser), which decides when training and inference measure.
"""
from __future__ import annotations

import time

from ..runtime import first_step
from ..runtime.loser_binaries import LoserBinaries
from . import conv2d_planner as planner
from . import conv_profile
from .conv_common import ConvLayer
from .conv_memory import memory
from .conv_registry import strategies

PURPOSES = planner.TRIAL_MODES  # what a trial measures for, and the mode of the plan it stores
# the stored plans each purpose takes as final (a plan source, netcl.ops.conv_plan.Plan.source)
FINAL_SOURCES = {"training": ("cache", "training", "override"),
                 "inference": ("cache", "inference", "override")}
MARGIN = 3.0
MAX_CANDIDATES = 4
RUNS = 3  # per candidate: one warm-up, then the samples


class _Online:
    """What the training-time trials keep for one device (its convolution memory's ``trials``)."""

    def __init__(self, device):
        self.trials: dict = {}  # (layer signature, pass, purpose) -> Trial
        self.ran: dict = {}  # (pass, dtype) -> names of the strategies run untimed
        self.totals = {"trials_done": 0, "cost_s": 0.0, "runs": 0, "calls_measuring": 0}
        self.losers = LoserBinaries(device.state)

    def close(self) -> None:
        self.losers.reset()


def _online(device) -> _Online:
    remembered = memory(device)
    if remembered.trials is None:
        with device.state.lock:
            if remembered.trials is None:
                remembered.trials = _Online(device)
    return remembered.trials


class Trial:
    """The measuring of one layer and pass: which candidate runs next, and its results."""

    def __init__(self, heuristic: str, candidates: list):
        self.heuristic = heuristic
        self.order = [heuristic] + [c for c in candidates if c != heuristic]
        self.samples: dict[str, list] = {name: [] for name in self.order}
        self.done = len(self.order) < 2
        self.calls = 0
        self.spent_s = 0.0
        self.winner: str | None = None

    def next_strategy(self, device) -> str | None:
        """The candidate this call should run and time, or None (run the heuristic, untimed)."""
        self.calls += 1
        if self.done or self.calls == 1 or (first_step.in_progress(device) and self.calls <= first_step.PATIENCE):
            return None  # the cold step is not timed: no extra synchronizations, no stand-in kernels timed
        for name in self.order:
            if len(self.samples[name]) < RUNS:
                return name
        return None

    def add(self, name: str, seconds: float) -> None:
        self.samples[name].append(seconds)
        self.spent_s += seconds

    def complete(self) -> bool:
        return all(len(v) >= RUNS for v in self.samples.values())

    def lost(self, name: str) -> bool | None:
        """Whether candidate ``name`` lost this trial; None while it is not finished."""
        return None if self.winner is None else self.winner != name

    def results_ms(self) -> dict:
        """Each candidate's fastest sample after its warm-up run."""
        return {name: min(v[1:]) * 1e3 for name, v in self.samples.items() if len(v) > 1}


def _trial_for(layer: ConvLayer, pass_: str, device, purpose: str):
    key = (layer.signature(), pass_, purpose)
    online = _online(device)
    trial = online.trials.get(key)
    if trial is None:
        plan = planner.plan_conv2d_layer(layer, pass_, "heuristic", device=device,
                                         inference=purpose == "inference")
        if plan.source in FINAL_SOURCES[purpose]:
            return plan, None
        candidates = [c.strategy for c in planner.worth_measuring(plan.candidates, MARGIN)]
        best_first = sorted(candidates, key=lambda n: plan.candidate(n).predicted_ms)[:MAX_CANDIDATES]
        trial = online.trials[key] = Trial(plan.strategy, best_first)
        if not trial.done:
            online.losers.opened()
    if trial.done:
        return planner.plan_conv2d_layer(layer, pass_, "heuristic", device=device,
                                         inference=purpose == "inference"), None
    return None, trial


def run(pass_: str, layer: ConvLayer, device, execute, purpose: str = "training"):
    """Run ``pass_`` with the strategy training (or inference, ``purpose``) should use now:
    ``execute(name)`` runs it and returns the result. Measures a candidate on this call when one is due."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    plan, trial = _trial_for(layer, pass_, device, purpose)
    if trial is None:
        return execute(plan.strategy)
    online = _online(device)
    with device.state.lock:
        online.totals["calls_measuring"] += 1
        name = trial.next_strategy(device)
    if name is None:
        return online.losers.run(trial, _untimed_choice(trial, pass_, layer, device), execute)
    device.synchronize()
    start = time.perf_counter()
    out = online.losers.run(trial, name, execute)
    device.synchronize()
    trial.add(name, time.perf_counter() - start)
    if trial.complete() and not trial.done:
        _finish(trial, layer, pass_, device, purpose)
    return out


def _untimed_choice(trial: Trial, pass_: str, layer: ConvLayer, device) -> str:
    """The model's choice; during the first step, a candidate whose kernels this process already holds
    instead (a strategy whose kernels serve any layer, run before for this pass): LeNet's first conv1
    weight gradient then reuses conv2's implicit-GEMM kernel instead of building the blocked direct
    kernel, whose compile on PoCL takes hundreds of times as long as the pass."""
    key = (pass_, layer.dtype)
    ran = _online(device).ran
    if first_step.in_progress(device):
        held = [n for n in trial.order if n in ran.get(key, ())
                and getattr(strategies().get(n), "kernels_serve_any_layer", False)]
        if held:  # the model's choice first, when it is one of them
            return held[0]
    ran.setdefault(key, set()).add(trial.heuristic)
    return trial.heuristic


def _finish(trial: Trial, layer: ConvLayer, pass_: str, device, purpose: str) -> None:
    trial.done = True
    measured = trial.results_ms()
    best_ms = min(measured.values())
    trial.winner = min(measured, key=measured.get)
    online = _online(device)
    online.losers.finished()
    runs = sum(len(v) for v in trial.samples.values())
    cost_s = max(0.0, trial.spent_s - runs * best_ms / 1e3)
    names = tuple(planner.strategies())
    terms = {a.strategy: a.terms for a in planner.answers(layer, pass_, device) if a.terms is not None}
    registry = strategies()
    calibrating = {name: ms for name, ms in measured.items()
                   if purpose == "training" or not getattr(registry.get(name), "keeps_weight_derivatives", False)}
    conv_profile.record(device, layer.dtype, pass_, calibrating, terms, layer.signature())
    planner.store_plan(device, layer, pass_, names, {"mode": purpose, "measured_ms": measured,
                                                      "cost_s": round(cost_s, 4), "runs": runs})
    with device.state.lock:
        online.totals["trials_done"] += 1
        online.totals["cost_s"] += cost_s
        online.totals["runs"] += runs


def trial_state(layer: ConvLayer, pass_: str, device, purpose: str = "training") -> str:
    """"measuring" while this layer and pass's candidates are being measured, "done" once they were,
    "not started" before its first call in training (or in a measuring inference, ``purpose``)."""
    trial = _online(device).trials.get((layer.signature(), pass_, purpose))
    if trial is None:
        return "not started"
    return "done" if trial.done else "measuring"


def measuring(device) -> int:
    """How many layer-passes (of training or inference) on ``device`` have begun measuring their candidates
    and not finished (a benchmark warms up until none has: trial runs in its timed rounds cost LeNet a
    third of its speed)."""
    return sum(1 for trial in list(_online(device).trials.values()) if not trial.done and trial.calls > 0)


def calls_measuring(device) -> int:
    """How many conv calls on ``device`` went to a layer-pass whose candidates were still being measured
    (timed or not): a training step (or a captured inference's warm-up call) that made none has nothing
    left to measure for its layers, so it can be recorded and replayed (netcl.training.CapturedStep,
    CapturedInference)."""
    return _online(device).totals["calls_measuring"]


def stats(device) -> dict:
    """{trials_done, cost_s, runs} on ``device``: layer-passes measured in training or a captured
    inference's warm-up, the time it cost beyond the winners' and the trial runs made (the training loop
    reports them with its metrics)."""
    with device.state.lock:
        totals = _online(device).totals
        return {"trials_done": totals["trials_done"], "cost_s": round(totals["cost_s"], 4), "runs": totals["runs"]}


def clear(device) -> None:
    """Forget the trials on ``device`` (the plans they stored stay on disk)."""
    remembered = memory(device)
    with device.state.lock:
        trials, remembered.trials = remembered.trials, None
    if trials is not None:
        trials.close()
