"""The planner's decisions as pure functions: no device, no kernel, no cache in here.

assess   (layer, pass, profile, each strategy's answers) -> candidates with predicted times
choose   (candidates, budget, whether measured) -> the winner
explain  (winner, candidates, ...) -> one sentence saying why it won (or why the budget overruled)
The answers are gathered by netcl.ops.conv2d_planner, which asks the strategies. :class:`ChoiceInputs`
is everything besides the layer and pass that decided a choice; each Plan carries its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ShapeError
from . import conv_cost
from .conv_common import ConvLayer


@dataclass
class Answer:
    """What one strategy said about one layer and pass on one device."""
    strategy: str
    why_not: str | None
    workspace_bytes: int | None = None
    terms: object = None          # its CostTerms


@dataclass
class Candidate:
    strategy: str
    applicable: bool
    why_not: str | None
    workspace_bytes: int | None
    predicted_ms: float | None
    measured_ms: float | None = None
    within_budget: bool = True
    calibrated: bool = False      # whether predicted_ms used this device's calibration

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "applicable": self.applicable, "why_not": self.why_not,
                "workspace_bytes": self.workspace_bytes,
                "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 4),
                "measured_ms": None if self.measured_ms is None else round(self.measured_ms, 4),
                "within_budget": self.within_budget, "calibrated": self.calibrated}


@dataclass(frozen=True)
class ChoiceInputs:
    """What decides which strategy runs one pass of one layer, besides the layer and the pass. Gathered
    in one place, the device's convolution chooser (netcl.ops.conv_chooser), and shown by `netcl plan`.

    mode           "heuristic", "measure", "exhaustive" (netcl.ops.conv2d_planner) or "online"
                   (training measures its candidates over its first steps, netcl.ops.conv_online)
    forced         the strategy forced, and ``forced_by`` who forced it (the caller, NETCL_CONV_STRATEGY)
    budget_bytes   the workspace budget, and ``budget_from`` where it comes from
    deterministic  nc.use_deterministic / NETCL_DETERMINISTIC (no stand-in kernels in the first step)
    first_step     whether the device's cold start is in progress (netcl.runtime.first_step)
    stored_plan    the mode of the measured plan stored for this layer and pass, if one is valid
    calibration    who calibrated the device's cost model ("none": the uncalibrated fallback)
    trials         the trials of this layer and pass (training's, or a captured inference's warm-up):
                   "off", "measuring" or "done"
    """
    mode: str
    budget_bytes: int
    budget_from: str
    forced: str | None = None
    forced_by: str | None = None
    deterministic: bool = False
    first_step: bool = False
    stored_plan: str | None = None
    calibration: str = "none"
    trials: str = "off"

    def as_dict(self) -> dict:
        return {"mode": self.mode, "forced": self.forced, "forced_by": self.forced_by,
                "budget_bytes": self.budget_bytes, "budget_from": self.budget_from,
                "deterministic": self.deterministic, "first_step": self.first_step,
                "stored_plan": self.stored_plan, "calibration": self.calibration, "trials": self.trials}

    def describe(self) -> str:
        """One line: every input, in words."""
        return "; ".join((
            f"mode {self.mode}",
            f"{self.forced} forced by {self.forced_by}" if self.forced else "no strategy forced",
            f"budget {mib(self.budget_bytes)} from {self.budget_from}",
            "deterministic" if self.deterministic else "not deterministic",
            "first step in progress" if self.first_step else "first step over",
            f"stored plan ({self.stored_plan})" if self.stored_plan else "no stored plan",
            f"calibration: {self.calibration}",
            f"trials {self.trials}"))


@dataclass
class Plan:
    strategy: str
    reason: str
    candidates: list
    pass_: str
    mode: str
    budget_bytes: int
    layer: ConvLayer = field(repr=False)
    source: str = "model"    # "model", "measured", "cache", "override", "training", "inference"
    calibrated: bool = False  # whether the device's calibration informed the predictions
    inputs: ChoiceInputs | None = None  # what decided it (besides the layer and pass)

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.strategy == name), None)

    def as_dict(self) -> dict:
        return {"pass": self.pass_, "strategy": self.strategy, "reason": self.reason, "mode": self.mode,
                "source": self.source, "budget_bytes": self.budget_bytes, "calibrated": self.calibrated,
                "decided_by": None if self.inputs is None else self.inputs.as_dict(),
                "candidates": [c.as_dict() for c in self.candidates]}


def mib(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1 << 20:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def assess(pass_: str, profile, answers: list, budget: int, layer: ConvLayer | None = None) -> list:
    """Candidates in the answers' order: applicability, workspace, budget and predicted time."""
    out = []
    for a in answers:
        if a.why_not:
            out.append(Candidate(a.strategy, False, a.why_not, None, None))
            continue
        ms, calibrated = conv_cost.predict_ms(a.strategy, pass_, a.terms, profile, layer)
        out.append(Candidate(a.strategy, True, None, a.workspace_bytes, ms, within_budget=a.workspace_bytes <= budget,
                             calibrated=calibrated))
    return out


def worth_measuring(candidates: list, margin: float, exhaustive: bool = False) -> list:
    """The applicable candidates within the budget that the model cannot rule out: predicted within
    ``margin``× of the best prediction (all of them when exhaustive)."""
    runnable = [c for c in candidates if c.applicable and c.within_budget]
    if exhaustive or not runnable:
        return runnable
    best = min(c.predicted_ms for c in runnable)
    return [c for c in runnable if c.predicted_ms <= margin * best]


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3g} ms"


def choose(layer: ConvLayer, pass_: str, candidates: list, budget: int, measured: bool,
           from_cache: bool = False, fallback_note: str = "") -> tuple[str, str]:
    """(strategy, one-sentence reason): the fastest measured (else predicted) candidate within the budget."""
    applicable = [c for c in candidates if c.applicable]
    if not applicable:
        rules = "; ".join(f"{c.strategy}: {c.why_not}" for c in candidates) or "no strategy is registered"
        raise ShapeError(f"no conv2d strategy can run the {pass_} pass of this layer ({layer.describe()}): {rules}")
    order = {c.strategy: i for i, c in enumerate(candidates)}
    fits = [c for c in applicable if c.within_budget]
    if not fits:
        smallest = min(applicable, key=lambda c: (c.workspace_bytes, order[c.strategy]))
        return smallest.strategy, (f"no applicable strategy fits the {mib(budget)} workspace budget, so "
                                   f"{smallest.strategy} runs with the smallest workspace "
                                   f"({mib(smallest.workspace_bytes)}).")
    if measured and not any(c.measured_ms is not None for c in fits):
        measured, from_cache = False, False  # the budget excludes every measured candidate: use the model

    def cost(c):
        if measured:
            return c.measured_ms if c.measured_ms is not None else math.inf
        return c.predicted_ms
    timed = [c for c in fits if not measured or c.measured_ms is not None]
    ranked = sorted(timed, key=lambda c: (cost(c), order[c.strategy]))
    best = ranked[0]
    return best.strategy, explain(best, ranked, applicable, fits, budget, measured, from_cache, cost, fallback_note)


def explain(best, ranked, applicable, fits, budget, measured, from_cache, cost, fallback_note="") -> str:
    """The sentence for a choice: what won and by how much, and what the budget excluded."""
    where = " in an earlier run" if from_cache else ""
    note = "" if measured or not fallback_note else f"; {fallback_note}"
    if len(applicable) == 1:
        sentence = f"{best.strategy} is the only registered strategy that can run this pass"
        if measured and best.measured_ms is not None:
            sentence += f" ({_fmt_ms(best.measured_ms)} measured{where})"
        return sentence + "."
    if len(fits) == 1:
        sentence = (f"{best.strategy} is the only applicable strategy within the {mib(budget)} workspace budget "
                    f"({_fmt_ms(cost(best))} {'measured' + where if measured else 'predicted'}{note})")
    else:
        what = "measured fastest" if measured else "has the lowest predicted time"
        sentence = f"{best.strategy} {what}{where} ({_fmt_ms(cost(best))}"
        if len(ranked) > 1:
            sentence += f"; next {ranked[1].strategy} at {_fmt_ms(cost(ranked[1]))}"
        sentence += note + ")"

    def known(c):
        if measured and c.measured_ms is not None:
            return c.measured_ms, "measured"
        return c.predicted_ms, "predicted"
    faster_over_budget = [c for c in applicable if not c.within_budget and known(c)[0] < cost(best)]
    if faster_over_budget:
        over = min(faster_over_budget, key=lambda c: known(c)[0])
        ms, how = known(over)
        sentence += (f", chosen because the {mib(budget)} workspace budget excludes {over.strategy} "
                     f"({how} {_fmt_ms(ms)}, needs {mib(over.workspace_bytes)})")
    return sentence + "."


def forced(layer: ConvLayer, pass_: str, name: str, how: str, candidates: list, budget: int, mode: str,
           known: tuple, inputs: ChoiceInputs | None = None) -> Plan:
    """The plan when a strategy is forced (by the caller or NETCL_CONV_STRATEGY), checked."""
    if name not in known:
        raise ShapeError(f"unknown conv2d strategy {name!r} ({how}); choose one of {', '.join(known)} or 'auto'")
    c = next(c for c in candidates if c.strategy == name)
    if not c.applicable:
        raise ShapeError(f"conv2d strategy {name!r} ({how}) cannot run the {pass_} pass of this layer: {c.why_not} "
                         f"({layer.describe()})")
    return Plan(name, f"{name} is forced by {how}.", candidates, pass_, mode, budget, layer, "override",
                inputs=inputs)
