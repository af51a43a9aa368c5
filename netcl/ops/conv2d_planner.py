"""Which convolution strategy runs each pass of each layer, why, and remembering the answer.

For one layer and one pass the planner asks every registered strategy whether it can serve it (its own
``why_not``) and how much workspace it needs (its own ``workspace_bytes``), predicts its time with the cost
model of :mod:`netcl.ops.conv_cost`, and, in ``measure``/``exhaustive`` mode, times it on random data of the
layer's shape. Candidates over the workspace budget are excluded. The winner comes with one sentence that
says why it won (or who forced it, or that the budget forced a slower one).

Modes: ``heuristic`` (the default: no kernel runs, instant), ``measure`` (times the applicable candidates that
the model does not rule out by more than ``MEASURE_MARGIN``×), ``exhaustive`` (times every applicable one).
Budget: the ``budget_bytes`` argument, else ``NETCL_CONV_WORKSPACE_LIMIT`` (bytes, or with a K/M/G suffix),
else the smaller of the device's max allocation and half its global memory. Overrides: a strategy forced by
the caller (``nn.Conv2d(strategy=...)`` bypasses the planner altogether) or ``NETCL_CONV_STRATEGY``.
``NETCL_CONV_PLAN_MODE`` sets the mode that ``conv2d(strategy="auto")`` plans with.

Plans live in memory per process and, when measured, on disk (``plans/<key>.json`` in the netcl cache),
keyed by netcl's version, the device identity, the tuning database's identity and the set of registered
strategies, then per layer signature and pass; a later process in any mode reuses a measured plan.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import NetclError, ShapeError
from ..runtime import cache
from . import conv_cost
from .conv_common import PASSES, ConvLayer, strategies

MODES = ("heuristic", "measure", "exhaustive")
MEASURE_MARGIN = 10.0        # measure mode skips candidates predicted this many times slower than the best
MEASURE_MIN_RUNS = 7           # a median of 7 interleaved runs: a hiccup must span 4 of them to move it
MEASURE_MAX_RUNS = 40
MEASURE_TIME_S = 3.0         # per layer and pass, after warm-up: no further rounds past this
CONTENTION = 1.3             # candidates this close to the best get the extra rounds
SETTLE_BELOW_S = 0.05        # a candidate faster than this runs once untimed before each timed run: what
                             # ran before it (direct convolution's 70 ms) left caches that slowed cv9's
                             # im2col 1.5x, which decided between candidates 20 % apart
WARMUP_RUNS = 2              # untimed runs per candidate: PoCL finishes code generation and the GEMM
                             # workspaces reach their size over the first runs, not only the first
CORRECTION_BOUNDS = (0.05, 20.0)
CORRECTION_PRIOR = 8         # measurements' worth of trust in the fitted model before corrections take over


@dataclass
class Candidate:
    strategy: str
    applicable: bool
    why_not: str | None
    workspace_bytes: int | None
    predicted_ms: float | None
    measured_ms: float | None = None
    within_budget: bool = True

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "applicable": self.applicable, "why_not": self.why_not,
                "workspace_bytes": self.workspace_bytes,
                "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 4),
                "measured_ms": None if self.measured_ms is None else round(self.measured_ms, 4),
                "within_budget": self.within_budget}


@dataclass
class Plan:
    strategy: str
    reason: str
    candidates: list[Candidate]
    pass_: str
    mode: str
    budget_bytes: int
    layer: ConvLayer = field(repr=False)
    source: str = "model"    # "model", "measured", "cache", "override"

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.strategy == name), None)

    def as_dict(self) -> dict:
        return {"pass": self.pass_, "strategy": self.strategy, "reason": self.reason, "mode": self.mode,
                "source": self.source, "budget_bytes": self.budget_bytes,
                "candidates": [c.as_dict() for c in self.candidates]}


# ---------------------------------------------------------------------------------------------------------
# settings

def _parse_bytes(text: str, what: str) -> int:
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        value = float(digits) * scale
    except ValueError:
        raise NetclError(f"{what} must be a byte count such as 268435456 or 256M, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise NetclError(f"{what} must be ≥ 0, got {text!r}")
    return int(value)


def default_budget(device) -> int:
    env = os.environ.get("NETCL_CONV_WORKSPACE_LIMIT", "").strip()
    if env:
        return _parse_bytes(env, "NETCL_CONV_WORKSPACE_LIMIT")
    return int(min(device.max_alloc_bytes, device.global_mem_bytes // 2))


def _env_strategy() -> str | None:
    value = os.environ.get("NETCL_CONV_STRATEGY", "").strip()
    return None if value in ("", "auto") else value


def _env_mode() -> str:
    mode = os.environ.get("NETCL_CONV_PLAN_MODE", "heuristic").strip() or "heuristic"
    if mode not in MODES:
        raise NetclError(f"NETCL_CONV_PLAN_MODE must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _mib(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1 << 20:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


# ---------------------------------------------------------------------------------------------------------
# device profile, tuning database, corrections

_profiles: dict[str, conv_cost.DeviceProfile] = {}
_lock = threading.RLock()


def _tuning_db():
    try:
        from ..tuning import db
    except ImportError:
        return None
    return db


def tuning_identity(device) -> str:
    """The tuning database's identity for this device ("none" without a database)."""
    db = _tuning_db()
    if db is None or not callable(getattr(db, "identity", None)):
        return "none"
    try:
        return str(db.identity(device))
    except Exception:  # a broken database must not stop convolutions from running
        return "unreadable"


def _tuned_gemm_rates(device, dtype: str) -> dict[str, float]:
    """The GEMM rates per shape class that `netcl tune gemm` measured and stored, where it did."""
    try:
        from ..tuning.gemm import expected_gflops
    except ImportError:
        return {}
    rates = {}
    for cls, (m, n, k) in conv_cost.CLASS_SHAPES.items():
        try:
            value = expected_gflops(device, dtype, m, n, k)
        except Exception:  # an unreadable database only costs the model its tuned numbers
            value = None
        if value:
            rates[cls] = float(value)
    return rates


def _calibration_path(device):
    # The GEMM kernel's source and the tuning database decide the rate the calibration measured.
    from .. import __version__
    from ..runtime.kernels import kernels_dir
    try:
        gemm_source = (kernels_dir() / "gemm.cl").read_bytes()
    except OSError:
        gemm_source = b""
    key = hashlib.sha256(b"|".join((__version__.encode(), str(conv_cost.CALIBRATION_VERSION).encode(),
                                    device.identity.encode(), tuning_identity(device).encode(),
                                    gemm_source))).hexdigest()[:20]
    return cache.cache_path("planner", f"device-{key}.json")


_memory_calibration: dict[str, dict] = {}


def _read_calibration(device) -> dict:
    """This device's calibration and model corrections (read from disk once per process)."""
    key = device.identity
    with _lock:
        if key not in _memory_calibration:
            data = cache.read_json(_calibration_path(device), "planner calibration") if cache.cache_enabled() else None
            _memory_calibration[key] = data if isinstance(data, dict) else {}
        return _memory_calibration[key]


def _write_calibration(device, mutate) -> None:
    with _lock:
        current = _read_calibration(device)
        if cache.cache_enabled():
            try:
                current = cache.update_json(_calibration_path(device), "planner calibration", mutate)
            except OSError:
                mutate(current)
        else:
            mutate(current)
        _memory_calibration[device.identity] = current


def device_profile(device, dtype: str = "float32") -> conv_cost.DeviceProfile:
    """The cost model's numbers for this device: tuning database, then calibration, then estimate."""
    key = f"{device.identity}|{dtype}"
    with _lock:
        if key in _profiles:
            return _profiles[key]
        profile = conv_cost.estimate(device)
        sources = []
        tuned = _tuned_gemm_rates(device, dtype)
        if tuned:
            profile.class_gflops = dict(tuned)
            profile.gemm_gflops = tuned.get("large", profile.gemm_gflops)
            sources.append("tuning database")
        # The calibration measures the GEMM as it runs now, the way the efficiencies were fitted: it wins.
        cal = _read_calibration(device)
        for name, stored in (("bandwidth_gbs", "bandwidth_gbs"), ("launch_ms", "launch_ms"),
                             ("gemm_gflops", f"gemm_gflops_{dtype}")):
            value = cal.get(stored)
            if isinstance(value, (int, float)) and value > 0:
                setattr(profile, name, float(value))
                if "calibration" not in sources:
                    sources.append("calibration")
        classes = cal.get(f"gemm_class_gflops_{dtype}")
        if isinstance(classes, dict):
            profile.class_gflops = {k: float(v) for k, v in classes.items() if isinstance(v, (int, float)) and v > 0}
        if sources:
            profile.source = " + ".join(sources)
        _profiles[key] = profile
        return profile


def calibrate_device(device, dtype: str = "float32") -> conv_cost.DeviceProfile:
    """Measure bandwidth, launch overhead and the GEMM rate once per device and keep them in the cache."""
    cal = _read_calibration(device)
    if all(k in cal for k in ("bandwidth_gbs", "launch_ms", f"gemm_gflops_{dtype}", f"gemm_class_gflops_{dtype}")):
        return device_profile(device, dtype)
    measured = conv_cost.calibrate(device, dtype)

    def mutate(d):
        d.update(measured)
        d["device"] = device.identity
    _write_calibration(device, mutate)
    with _lock:
        _profiles.pop(f"{device.identity}|{dtype}", None)
    return device_profile(device, dtype)


def _correction(cal: dict, name: str, pass_: str) -> float:
    table = cal.get("corrections")
    kept = table.get(f"{name}|{pass_}") if isinstance(table, dict) else None
    ratios = [r for r in kept if isinstance(r, (int, float)) and r > 0] if isinstance(kept, list) else []
    if not ratios:
        return 1.0
    # Shrunk toward 1 until there are several measurements: one layer's ratio says little about the next.
    lo, hi = CORRECTION_BOUNDS
    weight = len(ratios) / (len(ratios) + CORRECTION_PRIOR)
    return float(min(hi, max(lo, math.exp(weight * sum(math.log(r) for r in ratios) / len(ratios)))))


def _record_corrections(device, pass_: str, candidates: list[Candidate], uncorrected: dict[str, float]) -> None:
    ratios = {c.strategy: c.measured_ms / uncorrected[c.strategy] for c in candidates
              if c.measured_ms and uncorrected.get(c.strategy)}
    if not ratios:
        return

    def mutate(d):
        if not isinstance(d.get("corrections"), dict):
            d["corrections"] = {}
        for name, ratio in ratios.items():
            kept = d["corrections"].get(f"{name}|{pass_}")
            kept = kept if isinstance(kept, list) else []
            kept.append(round(ratio, 4))
            d["corrections"][f"{name}|{pass_}"] = kept[-16:]
    _write_calibration(device, mutate)


# ---------------------------------------------------------------------------------------------------------
# plan cache

_memory_plans: dict[tuple, Plan] = {}
_measured: dict[str, dict] = {}   # plan-file key -> {signature|pass: entry}, read from disk once


def _plan_key(device, names: tuple[str, ...]) -> str:
    from .. import __version__
    key = "|".join((__version__, device.identity, tuning_identity(device), ",".join(names)))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _plan_file(device, names: tuple[str, ...]):
    return cache.cache_path("plans", _plan_key(device, names) + ".json")


def _measured_plans(device, names) -> dict:
    """The measured entries for this device and strategy set (disk, then memory when the cache is off)."""
    key = _plan_key(device, names)
    with _lock:
        if key not in _measured:
            data = cache.read_json(_plan_file(device, names), "conv plan cache") if cache.cache_enabled() else None
            _measured[key] = data if isinstance(data, dict) else {}
        return _measured[key]


def _remember(device, names, entry_key: str, entry: dict) -> None:
    key = _plan_key(device, names)
    with _lock:
        current = _measured_plans(device, names)
        current[entry_key] = entry
        if cache.cache_enabled():
            def mutate(d):
                d[entry_key] = entry
            try:
                current = cache.update_json(_plan_file(device, names), "conv plan cache", mutate)
            except OSError:
                pass  # an unwritable cache only costs the next process a measurement
        _measured[key] = current


def clear_memory_cache() -> None:
    """Forget every plan and profile held in this process (the disk cache stays)."""
    with _lock:
        _memory_plans.clear()
        _measured.clear()
        _profiles.clear()
        _memory_calibration.clear()


# ---------------------------------------------------------------------------------------------------------
# candidates

def _assess(layer: ConvLayer, pass_: str, device, budget: int) -> tuple[list[Candidate], dict[str, float]]:
    """Every registered strategy's applicability, workspace and predicted time (corrected, uncorrected)."""
    profile = device_profile(device, layer.dtype)
    cal = _read_calibration(device)
    out, uncorrected = [], {}
    for name, impl in strategies().items():
        try:
            why = impl.why_not(layer, pass_)
        except Exception as exc:  # a strategy that cannot even answer cannot serve the layer
            why = f"its applicability check failed ({type(exc).__name__}: {exc})"
        if why:
            out.append(Candidate(name, False, str(why), None, None))
            continue
        try:
            ws = int(impl.workspace_bytes(layer, pass_))
        except Exception as exc:
            out.append(Candidate(name, False, f"its workspace size is unknown ({type(exc).__name__}: {exc})",
                                 None, None))
            continue
        raw = conv_cost.predict_ms(name, layer, pass_, profile, impl, ws, device.compute_units)
        uncorrected[name] = raw
        out.append(Candidate(name, True, None, ws, raw * _correction(cal, name, pass_), within_budget=ws <= budget))
    return out, uncorrected


def _pass_runner(layer: ConvLayer, pass_: str, device, rng):
    """A function running one strategy's ``pass_`` on random data of the layer's shape."""
    from ..tensor import Tensor
    dtype = np.dtype(layer.dtype)

    def rand(shape):
        return Tensor.from_host(rng.uniform(-1.0, 1.0, size=shape).astype(dtype), device=device)
    if pass_ == "forward":
        a, b = rand(layer.input_shape), rand(layer.weight_shape)
        return lambda impl: impl.forward(a, b, layer)
    if pass_ == "backward_data":
        a, b = rand(layer.output_shape), rand(layer.weight_shape)
        return lambda impl: impl.backward_data(a, b, layer)
    a, b = rand(layer.input_shape), rand(layer.output_shape)
    return lambda impl: impl.backward_weight(a, b, layer)


def time_strategies(impls: dict, layer: ConvLayer, pass_: str, device, rng=None) -> dict:
    """Median milliseconds of each strategy's ``pass_`` (warm-up excluded), or the error it raised.

    The strategies run in interleaved rounds, so a burst of load from another process hits every
    candidate alike, in an order that rotates from round to round; a short candidate's timed run
    follows an untimed one of its own (SETTLE_BELOW_S), so it is timed in its steady state, as it runs
    step after step in training, not in the state the previous candidate left. Each gets at least MEASURE_MIN_RUNS runs, except one whose single run already
    takes over a second and three times the best; those within CONTENTION of the best get more rounds,
    up to MEASURE_MAX_RUNS, while the rounds stay within MEASURE_TIME_S.
    """
    run = _pass_runner(layer, pass_, device, rng or np.random.default_rng(0))
    results: dict[str, object] = {}
    samples: dict[str, list[float]] = {}

    def once(name, settle=False):
        if settle:
            run(impls[name])
            device.synchronize()
        start = time.perf_counter()
        run(impls[name])
        device.synchronize()
        return time.perf_counter() - start
    for name in impls:  # warm-up: kernel builds and first-touch allocations are not the layer's cost
        try:
            for _ in range(WARMUP_RUNS):
                once(name)
            samples[name] = []
        except NetclError as exc:
            results[name] = exc
    spent, rounds = 0.0, 0
    while samples and rounds < MEASURE_MAX_RUNS:
        best = min((float(np.median(v)) for v in samples.values() if v), default=None)
        active = []
        for name, times in samples.items():
            med = float(np.median(times)) if times else None
            if med is None or best is None:
                active.append(name)
            elif rounds < MEASURE_MIN_RUNS and not (med > 1.0 and med > 3 * best):
                active.append(name)
            elif med <= CONTENTION * best and spent < MEASURE_TIME_S:
                active.append(name)
        if not active:
            break
        # Rotate the order each round: a candidate run right after a slow one (direct convolution's
        # 70 ms evicts the caches) ran 1.4x slower, so a fixed order favoured whoever came later.
        shift = rounds % len(active)
        for name in active[shift:] + active[:shift]:
            times = samples[name]
            elapsed = once(name, settle=not times or float(np.median(times)) < SETTLE_BELOW_S)
            samples[name].append(elapsed)
            spent += elapsed
        rounds += 1
    results.update({name: float(np.median(times)) * 1e3 for name, times in samples.items()})
    return results


def _measure(layer, pass_, device, candidates: list[Candidate], exhaustive: bool, uncorrected: dict) -> None:
    registry = strategies()
    runnable = [c for c in candidates if c.applicable and (exhaustive or c.within_budget)]
    if not runnable:
        return

    def optimistic(c):  # a candidate is ruled out only if neither the fitted nor the corrected model likes it
        return min(c.predicted_ms, uncorrected.get(c.strategy, c.predicted_ms))
    best_predicted = min(optimistic(c) for c in runnable)
    chosen = [c for c in runnable if exhaustive or optimistic(c) <= MEASURE_MARGIN * best_predicted]
    timed = time_strategies({c.strategy: registry[c.strategy] for c in chosen}, layer, pass_, device)
    for c in chosen:
        result = timed[c.strategy]
        if isinstance(result, Exception):
            c.applicable, c.within_budget = False, False
            first = str(result).splitlines()[0] if str(result) else ""
            c.why_not = f"it failed when measured ({type(result).__name__}: {first})"
        else:
            c.measured_ms = result


# ---------------------------------------------------------------------------------------------------------
# choice and explanation

def _fmt_ms(ms: float) -> str:
    return f"{ms:.3g} ms"


def _choose(layer, pass_, candidates: list[Candidate], budget: int, measured: bool,
            from_cache: bool) -> tuple[str, str]:
    """(strategy, one-sentence reason): fastest measured (or predicted) within the budget."""
    applicable = [c for c in candidates if c.applicable]
    if not applicable:
        rules = "; ".join(f"{c.strategy}: {c.why_not}" for c in candidates) or "no strategy is registered"
        raise ShapeError(f"no conv2d strategy can run the {pass_} pass of this layer ({layer.describe()}): {rules}")

    def cost(c):
        if measured:
            return c.measured_ms if c.measured_ms is not None else math.inf
        return c.predicted_ms
    order = {c.strategy: i for i, c in enumerate(candidates)}
    fits = [c for c in applicable if c.within_budget]
    if not fits:
        smallest = min(applicable, key=lambda c: (c.workspace_bytes, order[c.strategy]))
        return smallest.strategy, (f"no applicable strategy fits the {_mib(budget)} workspace budget, so "
                                   f"{smallest.strategy} runs with the smallest workspace "
                                   f"({_mib(smallest.workspace_bytes)}).")
    if measured and not any(c.measured_ms is not None for c in fits):
        measured, from_cache = False, False  # the budget excludes every measured candidate: use the model
    timed = [c for c in fits if not measured or c.measured_ms is not None]
    ranked = sorted(timed, key=lambda c: (cost(c), order[c.strategy]))
    best = ranked[0]
    what = "measured fastest" if measured else "has the lowest predicted time"
    where = " in an earlier run" if from_cache else ""
    best_cost = cost(best)
    if len(applicable) == 1:
        sentence = f"{best.strategy} is the only registered strategy that can run this pass"
        if measured and best.measured_ms is not None:
            sentence += f" ({_fmt_ms(best.measured_ms)} measured{where})"
        return best.strategy, sentence + "."
    if len(fits) == 1:
        sentence = (f"{best.strategy} is the only applicable strategy within the {_mib(budget)} workspace budget "
                    f"({_fmt_ms(best_cost)} {'measured' + where if measured else 'predicted'})")
    else:
        sentence = f"{best.strategy} {what}{where} ({_fmt_ms(best_cost)}"
        if len(ranked) > 1:
            sentence += f"; next {ranked[1].strategy} at {_fmt_ms(cost(ranked[1]))}"
        sentence += ")"
    def known(c):
        if measured and c.measured_ms is not None:
            return c.measured_ms, "measured"
        return c.predicted_ms, "predicted"
    faster_over_budget = [c for c in applicable if not c.within_budget and known(c)[0] < best_cost]
    if faster_over_budget:
        over = min(faster_over_budget, key=lambda c: known(c)[0])
        ms, how = known(over)
        sentence += (f", chosen because the {_mib(budget)} workspace budget excludes {over.strategy} "
                     f"({how} {_fmt_ms(ms)}, needs {_mib(over.workspace_bytes)})")
    return best.strategy, sentence + "."


def _forced(layer, pass_, name: str, how: str, candidates, budget, mode) -> Plan:
    registry = strategies()
    from .conv2d import ALL_STRATEGIES
    if name not in ALL_STRATEGIES:
        raise ShapeError(f"unknown conv2d strategy {name!r} ({how}); "
                         f"choose one of {', '.join(ALL_STRATEGIES)} or 'auto'")
    if name not in registry:
        raise ShapeError(f"conv2d strategy {name!r} ({how}) is not available in this build")
    c = next(c for c in candidates if c.strategy == name)
    if not c.applicable:
        raise ShapeError(f"conv2d strategy {name!r} ({how}) cannot run the {pass_} pass of this layer: {c.why_not} "
                         f"({layer.describe()})")
    return Plan(name, f"{name} is forced by {how}.", candidates, pass_, mode, budget, layer, "override")


# ---------------------------------------------------------------------------------------------------------
# entry points

def plan_conv2d_layer(layer: ConvLayer, pass_: str, mode: str | None = None, budget_bytes: int | None = None,
                      device=None, strategy: str | None = None) -> Plan:
    """The plan for one pass of one layer (what ``conv2d(strategy="auto")`` runs)."""
    from ..runtime.device import resolve_device
    if pass_ not in PASSES:
        raise ShapeError(f"pass_ must be one of {', '.join(PASSES)}, got {pass_!r}")
    mode = _env_mode() if mode is None else mode
    if mode not in MODES:
        raise ShapeError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    device = resolve_device(device)
    if budget_bytes is not None and not (isinstance(budget_bytes, numbers.Real) and 0 <= budget_bytes < math.inf):
        raise ShapeError(f"budget_bytes must be a finite number of bytes ≥ 0, got {budget_bytes!r}")
    budget = default_budget(device) if budget_bytes is None else int(budget_bytes)
    names = tuple(strategies())
    forced = strategy if strategy not in (None, "auto") else None
    how = "the caller" if forced else None
    if forced is None and _env_strategy():
        forced, how = _env_strategy(), f"NETCL_CONV_STRATEGY={_env_strategy()}"
    memo_key = (device.identity, layer.signature(), pass_, mode, budget, names, forced)
    with _lock:
        plan = _memory_plans.get(memo_key)
    if plan is not None:
        return plan
    candidates, uncorrected = _assess(layer, pass_, device, budget)
    if forced:
        plan = _forced(layer, pass_, forced, how, candidates, budget, mode)
    else:
        plan = _plan_free(layer, pass_, mode, budget, device, names, candidates, uncorrected)
    with _lock:
        _memory_plans[memo_key] = plan
    return plan


def _plan_free(layer, pass_, mode, budget, device, names, candidates, uncorrected) -> Plan:
    entry_key = f"{layer.signature()}|{pass_}"
    entry = _measured_plans(device, names).get(entry_key)
    if isinstance(entry, dict) and isinstance(entry.get("measured_ms"), dict) and \
            (mode != "exhaustive" or entry.get("mode") == "exhaustive"):
        for c in candidates:
            value = entry["measured_ms"].get(c.strategy)
            if c.applicable and isinstance(value, (int, float)):
                c.measured_ms = float(value)
        if any(c.measured_ms is not None for c in candidates if c.applicable and c.within_budget):
            name, reason = _choose(layer, pass_, candidates, budget, True, True)
            return Plan(name, reason, candidates, pass_, mode, budget, layer, "cache")
    if mode == "heuristic":
        name, reason = _choose(layer, pass_, candidates, budget, False, False)
        return Plan(name, reason, candidates, pass_, mode, budget, layer, "model")
    if mode == "measure" and sum(c.applicable and c.within_budget for c in candidates) == 1:
        name, reason = _choose(layer, pass_, candidates, budget, False, False)
        return Plan(name, reason, candidates, pass_, mode, budget, layer, "model")
    calibrate_device(device, layer.dtype)
    _measure(layer, pass_, device, candidates, mode == "exhaustive", uncorrected)
    name, reason = _choose(layer, pass_, candidates, budget, True, False)
    _record_corrections(device, pass_, candidates, uncorrected)
    _remember(device, names, entry_key, {
        "mode": mode, "measured_ms": {c.strategy: c.measured_ms for c in candidates if c.measured_ms is not None},
        "layer": layer.describe(), "time": time.time()})
    return Plan(name, reason, candidates, pass_, mode, budget, layer, "measured")


def plan_conv2d(input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
                device=None, pass_="forward", mode="heuristic", budget_bytes=None, strategy=None) -> Plan:
    """Plan one pass of the convolution of ``input_shape`` (N, C, H, W) by ``weight_shape`` (K, C/g, R, S).

    Returns a :class:`Plan`: ``.strategy``, ``.reason`` (one sentence), ``.candidates`` (each with strategy,
    applicable, why_not, workspace_bytes, predicted_ms, measured_ms). ``strategy`` forces one, as
    ``nn.Conv2d(strategy=...)`` does; ``NETCL_CONV_STRATEGY`` forces one globally.
    """
    layer = ConvLayer.from_shapes(input_shape, weight_shape, stride, padding, dilation, groups, dtype)
    return plan_conv2d_layer(layer, pass_, mode, budget_bytes, device, strategy)


# ---------------------------------------------------------------------------------------------------------
# `netcl plan`

def lenet_layers(batch: int) -> list[tuple[str, ConvLayer]]:
    """The two convolutions of the modified LeNet (seeds/000, Table 2)."""
    return [("conv1", ConvLayer.from_shapes((batch, 1, 28, 28), (20, 1, 5, 5))),
            ("conv2", ConvLayer.from_shapes((batch, 20, 12, 12), (50, 20, 5, 5)))]


# cv1–cv12 of the MEC paper (seeds/004, Table 2): input ih×iw×ic, kernel kh×kw×oc, stride; no padding.
MEC_LAYERS = (
    ("cv1", 227, 3, 11, 96, 4), ("cv2", 231, 3, 11, 96, 4), ("cv3", 227, 3, 7, 64, 2),
    ("cv4", 224, 64, 7, 64, 2), ("cv5", 24, 96, 5, 256, 1), ("cv6", 12, 256, 3, 512, 1),
    ("cv7", 224, 3, 3, 64, 1), ("cv8", 112, 64, 3, 128, 1), ("cv9", 56, 64, 3, 64, 1),
    ("cv10", 28, 128, 3, 128, 1), ("cv11", 14, 256, 3, 256, 1), ("cv12", 7, 512, 3, 512, 1),
)


def mec_layers(batch: int) -> list[tuple[str, ConvLayer]]:
    return [(name, ConvLayer.from_shapes((batch, c, hw, hw), (k, c, r, r), stride=s))
            for name, hw, c, r, k, s in MEC_LAYERS]


def _parse_dims(text, flag: str, count: int) -> tuple[int, ...]:
    from ..cli.main import ArgumentError
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) not in ((count,) if count == 4 else (1, 2)) or any(d < (1 if count == 4 else 0) for d in dims):
        form = "NxCxHxW" if flag == "--input" else ("KxCxRxS" if flag == "--weight" else "V or HxW")
        raise ArgumentError(f"{flag} must look like {form} with positive integers, got {text!r}")
    return dims


def _command_layers(args) -> list[tuple[str, ConvLayer]]:
    from ..cli.main import ArgumentError
    if args.batch is not None and args.batch < 1:
        raise ArgumentError(f"--batch must be ≥ 1, got {args.batch}")
    if args.network == "lenet":
        return lenet_layers(args.batch)
    if args.network == "mec":
        return mec_layers(args.batch)
    if not args.input or not args.weight:
        raise ArgumentError("netcl plan conv needs --input NxCxHxW and --weight KxCxRxS")
    input_shape = _parse_dims(args.input, "--input", 4)
    weight_shape = _parse_dims(args.weight, "--weight", 4)
    stride = _parse_dims(args.stride, "--stride", 2)
    padding = _parse_dims(args.padding, "--padding", 2)
    dilation = _parse_dims(args.dilation, "--dilation", 2)
    try:
        layer = ConvLayer.from_shapes(input_shape, weight_shape, stride if len(stride) == 2 else stride[0],
                                      padding if len(padding) == 2 else padding[0],
                                      dilation if len(dilation) == 2 else dilation[0], args.groups)
    except ShapeError as exc:
        raise ArgumentError(str(exc)) from None
    return [("conv", layer)]


def _table(name: str, plan: Plan) -> str:
    rows = [("", "strategy", "applicable / why not", "workspace", "predicted ms", "measured ms")]
    for c in plan.candidates:
        status = "yes" if c.applicable and c.within_budget else (
            "over budget" if c.applicable else f"no: {c.why_not}")
        rows.append(("*" if c.strategy == plan.strategy else "", c.strategy, status,
                     "-" if c.workspace_bytes is None else _mib(c.workspace_bytes),
                     "-" if c.predicted_ms is None else f"{c.predicted_ms:.3f}",
                     "-" if c.measured_ms is None else f"{c.measured_ms:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{name} {plan.pass_}: {plan.layer.describe()}"]
    for r in rows:
        lines.append("  " + "  ".join(v.ljust(widths[i]) if i in (0, 1, 2) else v.rjust(widths[i])
                                      for i, v in enumerate(r)).rstrip())
    lines.append(f"  -> {plan.strategy}: {plan.reason}")
    return "\n".join(lines)


def plan_command(args) -> dict:
    from ..cli.main import ArgumentError
    from ..runtime.device import resolve_device
    if args.budget is not None and args.budget < 0:
        raise ArgumentError(f"--budget must be ≥ 0 bytes, got {args.budget}")
    layers = _command_layers(args)
    device = resolve_device(args.device)
    passes = PASSES if args.pass_ == "all" else (args.pass_,)
    out = []
    print(f"device: {device.describe()}; mode {args.mode}; workspace budget "
          f"{_mib(args.budget if args.budget is not None else default_budget(device))}")
    for name, layer in layers:
        for pass_ in passes:
            plan = plan_conv2d_layer(layer, pass_, args.mode, args.budget, device)
            print(_table(name, plan))
            out.append({"name": name, **plan.as_dict(), "layer": layer.describe()})
    return {"device": device.describe(), "mode": args.mode, "profile": device_profile(device).as_dict(),
            "layers": out}
