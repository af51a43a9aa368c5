"""Which convolution strategy runs each pass of each layer, why, and remembering the answer.

For one layer and pass on one device the planner asks every registered strategy (netcl.ops.conv_registry)
whether it can serve it, its workspace and its cost terms (:func:`answers`), predicts each one's time with
the device's profile (netcl.ops.conv_profile, netcl.ops.conv_cost) and chooses (netcl.ops.conv_plan: pure
functions). Candidates over the workspace budget are excluded.

Modes: ``heuristic`` (no kernel runs, instant), ``measure`` (times the candidates the model does not rule
out by more than ``MEASURE_MARGIN``×), ``exhaustive`` (times every applicable one). Measured plans are
stored per device (family "conv_plans" of the tuning database) and reused by every later process in any
mode; their timings also refine the device's calibration. Training measures its plans over its first
steps instead, and a captured inference over its warm-up calls (netcl.ops.conv_online). Budget:
``budget_bytes``, else ``NETCL_CONV_WORKSPACE_LIMIT`` (bytes, or with a K/M/G suffix), else the smaller
of the device's max allocation and half its global memory. Overrides: a strategy forced by the caller, or ``NETCL_CONV_STRATEGY``. What decided a plan
(netcl.ops.conv_plan.ChoiceInputs) travels with it as ``plan.inputs``. Convolutions reach this module through the
device's chooser (netcl.ops.conv_chooser), which also runs the trials; this module imports
neither.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import time

import numpy as np

from .. import settings
from ..errors import NetclError, ShapeError
from ..runtime.device import resolve_device
from ..runtime import first_step
from ..runtime import tuning_db as db
from . import conv_profile
from .conv_common import PASSES, ConvLayer
from .conv_memory import memory
from .conv_plan import (Answer, Candidate, ChoiceInputs, Plan, assess, choose, forced, mib,  # noqa: F401
                        worth_measuring)
from .conv_profile import calibration_summary, device_profile  # noqa: F401
from .conv_registry import strategies

MODES = ("heuristic", "measure", "exhaustive")
MEASURE_MARGIN = 10.0   # measure mode skips candidates predicted this many times slower than the best
PLAN_FAMILY = "conv_plans"
# Timing rules of measure mode (netcl.runtime.timing.compare): at least 7 interleaved runs, up to 40 for
# candidates within 1.3× of the best while 3 s last, all of them for at least 1 s; two untimed runs first
# (PoCL finishes code generation and GEMM's workspaces reach their size over the first runs, not only the
# first). The fastest sample counts: under load from other processes the medians of the same candidates
# scatter widely while their minimums agree, and what the planner ranks is the device's speed, which load
# only hides.
MEASURE_TIMING = dict(warmup=2, min_runs=7, max_runs=40, time_budget_s=3.0, contention=1.3, settle_below_s=0.05,
                      statistic="min", min_time_s=1.0)
# Independent series of timings per measured plan, the lower result counting: under load the first series
# on a layer in a process can still disagree with later ones, and a stored plan is worth a second series.
MEASURE_SERIES = 2
# Modes of the plans the trials store (netcl.ops.conv_online), each also the source of a plan made from one
TRIAL_MODES = ("training", "inference")


def default_budget(device) -> int:
    return budget_and_source(device)[0]


def budget_and_source(device) -> tuple[int, str]:
    """The workspace budget when the caller names none, and where it comes from."""
    limit = settings.CONV_WORKSPACE_LIMIT.get()
    if limit is not None:
        return limit, settings.CONV_WORKSPACE_LIMIT.name
    return int(min(device.max_alloc_bytes, device.global_mem_bytes // 2)), "the device's memory"


def forced_strategy(strategy: str | None) -> tuple[str | None, str | None]:
    """(the strategy forced, who forced it): the caller's, else NETCL_CONV_STRATEGY's, else (None, None)."""
    if strategy not in (None, "auto"):
        return strategy, "the caller"
    named = settings.CONV_STRATEGY.get()
    if named:
        return named, f"{settings.CONV_STRATEGY.name}={named}"
    return None, None


def planning_mode() -> str:
    """The mode of a plan made when the caller names none: NETCL_CONV_PLAN_MODE, whose "online" (the
    default; training's trials, netcl.ops.conv_online) plans by the heuristic outside the trials."""
    mode = settings.CONV_PLAN_MODE.get()
    return "heuristic" if mode == "online" else mode


# ---------------------------------------------------------------------------------------------------------
# the plan store

def plan_context(device, names: tuple) -> str:
    """What a stored plan is valid for: netcl's version, the sources of the templates a convolution may
    launch, the device's kernel tuning, the strategy set."""
    from .. import __version__
    from ..runtime.kernels import convolution_templates_digest
    blob = "|".join((__version__, convolution_templates_digest(), db.identity(device), ",".join(names)))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def plan_key(layer: ConvLayer, pass_: str, inference: bool = False) -> str:
    """The key of a stored plan: inference's (mode "inference") are kept apart from the others."""
    return f"{layer.signature()}|{pass_}" + ("|inference" if inference else "")


def stored_plan(device, layer: ConvLayer, pass_: str, names: tuple, inference: bool = False) -> dict | None:
    """The valid measured plan stored for this layer and pass: for ``inference``, the one measured in
    inference, else the one measured in training or by the measure modes."""
    for key in ([plan_key(layer, pass_, True)] if inference else []) + [plan_key(layer, pass_)]:
        try:
            entry = db.lookup(device, PLAN_FAMILY, key, default=None)
        except Exception:
            continue
        if (isinstance(entry, dict) and entry.get("context") == plan_context(device, names)
                and isinstance(entry.get("measured_ms"), dict)):
            return entry
    return None


def store_plan(device, layer: ConvLayer, pass_: str, names: tuple, entry: dict) -> None:
    entry = dict(entry, context=plan_context(device, names), layer=layer.describe(), time=round(time.time()))
    try:
        db.store(device, PLAN_FAMILY, entry, key=plan_key(layer, pass_, entry.get("mode") == "inference"))
    except OSError:
        pass  # an unwritable cache costs the next process a measurement only
    forget(device, layer, pass_)


def forget(device, layer: ConvLayer, pass_: str) -> None:
    """Drop this process's memoized plans of one layer and pass (a new measurement replaces them)."""
    plans = memory(device).plans
    for key in [k for k in list(plans) if k[0] == layer.signature() and k[1] == pass_]:
        plans.pop(key, None)


def clear_plans(device) -> None:
    """Forget this process's plans for ``device`` (the store on disk stays)."""
    memory(device).plans.clear()


# ---------------------------------------------------------------------------------------------------------
# asking the strategies

def answers(layer: ConvLayer, pass_: str, device) -> list:
    """Each registered strategy's why_not, workspace and cost terms for this pass on ``device``."""
    out = []
    for name, impl in strategies().items():
        try:
            why = impl.why_not(layer, pass_, device)
        except Exception as exc:  # a strategy that cannot even answer cannot serve the layer
            why = f"its applicability check failed ({type(exc).__name__}: {exc})"
        if why:
            out.append(Answer(name, str(why)))
            continue
        try:
            out.append(Answer(name, None, int(impl.workspace_bytes(layer, pass_, device)),
                              impl.cost_terms(layer, pass_, device)))
        except Exception as exc:
            out.append(Answer(name, f"its workspace or cost is unknown ({type(exc).__name__}: {exc})"))
    return out


def operand_shapes(layer: ConvLayer, pass_: str) -> tuple:
    """The shapes of the two tensors a strategy's ``pass_`` takes (``ConvStrategy.run``)."""
    return {"forward": (layer.input_shape, layer.weight_shape),
            "backward_data": (layer.output_shape, layer.weight_shape),
            "backward_weight": (layer.input_shape, layer.output_shape)}[pass_]


def pass_runners(impls: dict, layer: ConvLayer, pass_: str, device, rng=None) -> dict:
    """{name: a function running that strategy's pass on random data of the layer's shape}."""
    from ..tensor import Tensor
    rng = rng or np.random.default_rng(0)
    dtype = np.dtype(layer.dtype)

    def rand(shape):
        return Tensor.from_host(rng.uniform(-1.0, 1.0, size=shape).astype(dtype), device=device)
    a, b = (rand(shape) for shape in operand_shapes(layer, pass_))
    return {name: (lambda impl=impl: impl.run(pass_, a, b, layer)) for name, impl in impls.items()}


def time_strategies(impls: dict, layer: ConvLayer, pass_: str, device, rng=None, **timing) -> dict:
    """Milliseconds of each strategy's ``pass_`` (MEASURE_TIMING's rules and statistic unless ``timing``
    overrides them), or the error it raised."""
    from ..runtime.timing import compare
    results = compare(pass_runners(impls, layer, pass_, device, rng), device, errors=(NetclError,),
                      **{**MEASURE_TIMING, **timing})
    return {name: (r if isinstance(r, Exception) else r.ms) for name, r in results.items()}


# ---------------------------------------------------------------------------------------------------------
# entry points

def plan_conv2d_layer(layer: ConvLayer, pass_: str, mode: str | None = None, budget_bytes: int | None = None,
                      device=None, strategy: str | None = None, inference: bool = False) -> Plan:
    """The plan for one pass of one layer on ``device`` (the default device when None); ``inference``: for
    a pass run without gradients, which takes a plan measured in inference first."""
    if pass_ not in PASSES:
        raise ShapeError(f"pass_ must be one of {', '.join(PASSES)}, got {pass_!r}")
    mode = planning_mode() if mode is None else mode
    if mode not in MODES:
        raise ShapeError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    device = resolve_device(device)
    if budget_bytes is not None and not (isinstance(budget_bytes, numbers.Real) and 0 <= budget_bytes < math.inf):
        raise ShapeError(f"budget_bytes must be a finite number of bytes ≥ 0, got {budget_bytes!r}")
    budget, budget_from = budget_and_source(device) if budget_bytes is None else (int(budget_bytes), "the caller")
    names = tuple(strategies())
    chosen, how = forced_strategy(strategy)
    key = (layer.signature(), pass_, mode, budget, names, chosen, bool(inference))
    plans = memory(device).plans
    plan = plans.get(key)
    if plan is not None:
        return plan
    profile = device_profile(device, layer.dtype)
    entry = None if chosen else stored_plan(device, layer, pass_, names, inference)
    inputs = ChoiceInputs(mode, budget, budget_from, chosen, how, settings.DETERMINISTIC.get(),
                          first_step.in_progress(device), entry.get("mode") if entry else None, profile.calibration)
    candidates = assess(pass_, profile, answers(layer, pass_, device), budget, layer)
    if chosen:
        plan = forced(layer, pass_, chosen, how, candidates, budget, mode, names, inputs)
    else:
        plan = _free_plan(layer, pass_, mode, budget, device, names, candidates, entry)
        plan.inputs = inputs
    plans[key] = plan
    return plan


def fallback_note(candidates: list) -> str:
    if any(c.calibrated for c in candidates if c.applicable):
        return ""
    return "predicted with the uncalibrated fallback: run `netcl tune conv` to calibrate this device"


def _free_plan(layer, pass_, mode, budget, device, names, candidates, entry) -> Plan:
    calibrated = any(c.calibrated for c in candidates if c.applicable)
    if entry and (mode != "exhaustive" or entry.get("mode") == "exhaustive"):
        for c in candidates:
            value = entry["measured_ms"].get(c.strategy)
            if c.applicable and isinstance(value, (int, float)):
                c.measured_ms = float(value)
        if any(c.measured_ms is not None for c in candidates if c.applicable and c.within_budget):
            name, reason = choose(layer, pass_, candidates, budget, True, True)
            source = entry["mode"] if entry.get("mode") in TRIAL_MODES else "cache"
            return Plan(name, reason, candidates, pass_, mode, budget, layer, source, calibrated)
    note = fallback_note(candidates)
    if mode == "heuristic" or sum(c.applicable and c.within_budget for c in candidates) == 1:
        name, reason = choose(layer, pass_, candidates, budget, False, False, note)
        return Plan(name, reason, candidates, pass_, mode, budget, layer, "model", calibrated)
    conv_profile.ensure_basics(device, layer.dtype)
    chosen = worth_measuring(candidates, MEASURE_MARGIN, mode == "exhaustive")
    registry = strategies()
    started = time.perf_counter()
    impls = {c.strategy: registry[c.strategy] for c in chosen}
    series = [time_strategies(impls, layer, pass_, device) for _ in range(MEASURE_SERIES)]
    timed = {name: next((s[name] for s in series if isinstance(s[name], Exception)), None)
             or min(s[name] for s in series) for name in impls}
    for c in chosen:
        result = timed[c.strategy]
        if isinstance(result, Exception):
            c.applicable, c.within_budget = False, False
            first = str(result).splitlines()[0] if str(result) else ""
            c.why_not = f"it failed when measured ({type(result).__name__}: {first})"
        else:
            c.measured_ms = result
    name, reason = choose(layer, pass_, candidates, budget, True, False)
    measured = {c.strategy: c.measured_ms for c in candidates if c.measured_ms is not None}
    terms = {a.strategy: a.terms for a in answers(layer, pass_, device) if a.terms is not None}
    conv_profile.record(device, layer.dtype, pass_, measured, terms, layer.signature())
    store_plan(device, layer, pass_, names, {"mode": mode, "measured_ms": measured,
                                             "cost_s": round(time.perf_counter() - started, 3)})
    return Plan(name, reason, candidates, pass_, mode, budget, layer, "measured", calibrated)


def plan_conv2d(input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
                device=None, pass_="forward", mode="heuristic", budget_bytes=None, strategy=None) -> Plan:
    """Plan one pass of the convolution of ``input_shape`` (N, C, H, W) by ``weight_shape`` (K, C/g, R, S).

    Returns a :class:`Plan`: ``.strategy``, ``.reason`` (one sentence), ``.candidates`` (each with strategy,
    applicable, why_not, workspace_bytes, predicted_ms, measured_ms). ``strategy`` forces one, as
    ``nn.Conv2d(strategy=...)`` does; ``NETCL_CONV_STRATEGY`` forces one globally.
    """
    layer = ConvLayer.from_shapes(input_shape, weight_shape, stride, padding, dilation, groups, dtype)
    return plan_conv2d_layer(layer, pass_, mode, budget_bytes, device, strategy)
