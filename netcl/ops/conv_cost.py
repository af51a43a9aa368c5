"""The planner's cost model: a strategy's cost terms (netcl.ops.conv_common.CostTerms) turned into time.

    arith_ms = Σ products' flops / the GEMM rate of their shape class + kernel flops / the large-GEMM rate
    other_ms = bytes moved / copy bandwidth + launches · launch time
    predicted = (a · arith_ms + b · other_ms) · local

The device quantities (GEMM rates per shape class, copy bandwidth, launch time) are measured on the
device (netcl.ops.conv_profile). The coefficients (a, b) are per strategy and pass and per device: the
least-squares fit of measured times of that strategy on that device (`netcl tune conv`, and every measured
plan after it). ``local`` corrects what two coefficients cannot explain: the geometric mean of the fit's
residuals on that device's measurements of the same strategy and pass, weighted by how close each
measured case is to this one (in log arith_ms, log other_ms and, at a feature weight, the log of the
layer's batch, groups, kernel taps and stride: what the two terms do not see; a width wide), shrunk
toward 1 by a prior of that many measurements' worth of trust in the fit. Width, prior and feature
weight are the device's too: `netcl tune conv` picks them by leave-one-layer-out over its own
measurements (:func:`select_local`); LOCAL_DEFAULTS serve until it has. A device without measurements uses a = b = 1 and no
local term, the fallback: the strategy as fast as the device's GEMM and copy, and plans say so. No
coefficient is fitted on one machine and shipped.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .conv_common import CostTerms

# A fit needs this many measurements of a (strategy, pass) before it trusts two coefficients; below it,
# one scale for both parts.
TWO_COEFFICIENTS_FROM = 4
COEFFICIENT_BOUNDS = (1e-3, 1e3)
SAMPLES_KEPT = 48  # per strategy and pass: the newest win
# (width: the natural-log distance at which a measured case counts e^-0.5 as much as an equal one; prior:
# measurements' worth of trust in the fit; feature weight: the layer features' share of that distance,
# beside the two terms'). The defaults are the middle of the grid select_local searches.
LOCAL_DEFAULTS = {"width": 1.0, "prior": 0.5, "feature_weight": 0.5}
LOCAL_GRID = {"width": (0.5, 1.0, 2.0), "prior": (0.1, 0.25, 0.5, 1.0), "feature_weight": (0.25, 0.5, 1.0, 2.0)}
HIT_RATIO = 1.25  # a choice within 25 % of the fastest measured counts as right (the planner's target)


@dataclass
class DeviceProfile:
    gemm_gflops: float       # the large-GEMM rate of the dtype
    bandwidth_gbs: float     # sustained copy bandwidth (read + write counted)
    launch_ms: float         # one kernel launch, enqueue to completion of a tiny kernel
    source: str              # where the device quantities come from: "measured", "tuning database", "estimate"
    class_gflops: dict = field(default_factory=dict)  # GEMM rate per netcl.ops.gemm.shape_class
    coefficients: dict = field(default_factory=dict)  # "strategy|pass" -> (a, b, samples)
    samples: dict = field(default_factory=dict)       # "strategy|pass" -> [(arith_ms, other_ms, measured_ms, features, layer signature)]
    calibration: str = "none"  # "netcl tune conv", "measured plans", or "none" (the fallback)
    local: dict = field(default_factory=lambda: dict(LOCAL_DEFAULTS))  # the local correction's parameters
    surface: object = None  # netcl.ops.gemm_surface.RateSurface measured by calibration, when there is one

    def rate(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """GFLOP/s of a (batched) product of this shape: the measured rate surface's, else its shape
        class's measured rate, else the large one."""
        if self.surface is not None:
            return self.surface.gflops(m, n, k, batch)
        from .gemm import shape_class
        return float(self.class_gflops.get(shape_class(m, n, k, batch)) or self.gemm_gflops)

    @property
    def calibrated(self) -> bool:
        return bool(self.coefficients)

    def as_dict(self) -> dict:
        return {"gemm_gflops": round(self.gemm_gflops, 2), "bandwidth_gbs": round(self.bandwidth_gbs, 2),
                "launch_ms": round(self.launch_ms, 4), "source": self.source, "calibration": self.calibration,
                "class_gflops": {k: round(v, 2) for k, v in sorted(self.class_gflops.items())},
                "coefficients": {k: [round(v[0], 4), round(v[1], 4), v[2]] for k, v in sorted(self.coefficients.items())},
                "local": dict(self.local),
                "gemm_surface_points": len(self.surface.measured) if self.surface is not None else 0}


def estimate(device) -> DeviceProfile:
    """The profile before anything was measured on the device: from its description alone, rough on
    purpose (any measurement replaces it; `netcl tune conv` measures all of it)."""
    cu = max(1, int(getattr(device, "compute_units", 1) or 1))
    if getattr(device, "kind", "cpu") == "gpu":
        return DeviceProfile(gemm_gflops=40.0 * cu, bandwidth_gbs=150.0, launch_ms=0.01, source="estimate")
    return DeviceProfile(gemm_gflops=40.0 * cu, bandwidth_gbs=20.0 * min(cu, 10), launch_ms=0.1, source="estimate")


def split_ms(terms: CostTerms, profile: DeviceProfile) -> tuple[float, float]:
    """(arith_ms, other_ms) of a strategy's terms on a device (see the module docstring)."""
    arith = sum(p.flops / (profile.rate(p.m, p.n, p.k, p.batch) * 1e6) for p in terms.products)
    arith += terms.kernel_flops / (profile.gemm_gflops * 1e6)
    other = terms.bytes_moved / (profile.bandwidth_gbs * 1e6) + terms.launches * profile.launch_ms
    return arith, other


def layer_features(layer) -> tuple:
    """What the local correction compares besides the two terms: log batch, groups, taps and stride."""
    return (math.log(layer.n), math.log(layer.groups), math.log(layer.r * layer.s),
            math.log(layer.stride_h * layer.stride_w))


_SIGNATURE = re.compile(r"n(\d+)c\d+h\d+w\d+k\d+r(\d+)s(\d+)st(\d+)x(\d+)p\d+x\d+d\d+x\d+g(\d+)")


def signature_features(signature: str) -> tuple | None:
    """layer_features of a ConvLayer.signature() (what a stored sample keeps)."""
    found = _SIGNATURE.match(str(signature))
    if not found:
        return None
    n, r, s, sh, sw, g = (int(v) for v in found.groups())
    return math.log(n), math.log(g), math.log(r * s), math.log(sh * sw)


def predict_ms(name: str, pass_: str, terms: CostTerms, profile: DeviceProfile, layer=None) -> tuple[float, bool]:
    """(predicted milliseconds, whether the device's calibration for this strategy and pass was used)."""
    arith, other = split_ms(terms, profile)
    key = f"{name}|{pass_}"
    coefficients = profile.coefficients.get(key)
    if not coefficients:
        return arith + other, False
    a, b = coefficients[0], coefficients[1]
    features = layer_features(layer) if layer is not None else None
    correction = local_correction(a, b, arith, other, profile.samples.get(key, ()), features, **profile.local)
    return (a * arith + b * other) * correction, True


def local_correction(a: float, b: float, arith: float, other: float, samples, features=None,
                     width: float = LOCAL_DEFAULTS["width"], prior: float = LOCAL_DEFAULTS["prior"],
                     feature_weight: float = LOCAL_DEFAULTS["feature_weight"]) -> float:
    """The fit's residual near this case: see the module docstring."""
    total = weight_sum = 0.0
    for sample in samples:
        s_arith, s_other, measured = sample[:3]
        fitted = a * s_arith + b * s_other
        if fitted <= 0 or measured <= 0:
            continue
        distance = (math.log(max(arith, 1e-9) / max(s_arith, 1e-9)) ** 2
                    + math.log(max(other, 1e-9) / max(s_other, 1e-9)) ** 2)
        s_features = sample[3] if len(sample) > 3 else None
        if features is not None and s_features is not None:
            distance += feature_weight ** 2 * sum((f - g) ** 2 for f, g in zip(features, s_features))
        weight = math.exp(-distance / (2 * width ** 2))
        total += weight * math.log(measured / fitted)
        weight_sum += weight
    return math.exp(total / (weight_sum + prior)) if weight_sum else 1.0


def _without_batch(signature: str) -> str:
    return re.sub(r"^n\d+", "", signature)


def select_local(samples: dict) -> tuple[dict, dict]:
    """The local correction's (width, prior, feature weight) that choose best on this device's own
    measurements, by leave-one-layer-out: for each measured layer, the coefficients are refitted without
    it and its strategies predicted from the rest; a setting scores its choices within HIT_RATIO of the
    fastest measured, then its geometric-mean slowdown. ``samples``: {"strategy|pass": [(arith_ms,
    other_ms, measured_ms, features, layer signature), ...]}. Returns (the parameters, their score)."""
    import itertools
    cases: dict = {}  # (layer, pass) -> {strategy: (arith, other, measured, features)}
    for key, rows in samples.items():
        name, pass_ = key.split("|", 1)
        for arith, other, measured, features, layer in rows:
            cases.setdefault((layer, pass_), {})[name] = (arith, other, measured, features)
    scored = [(layer, pass_, measured) for (layer, pass_), measured in cases.items() if len(measured) >= 2]
    layers = sorted({layer for layer, _ in cases})
    refits = {}  # layer left out -> {key: ((a, b), rest)}
    for left_out in layers:
        refits[left_out] = {}
        shape = _without_batch(left_out)
        for key, rows in samples.items():
            # the layer goes out with its copies at other batch sizes (LeNet's layers are calibrated at two),
            # which would otherwise predict it almost exactly and reward the narrowest neighbourhoods
            rest = [row[:4] for row in rows if _without_batch(row[4]) != shape]
            fitted = fit([row[:3] for row in rest])
            if fitted:
                refits[left_out][key] = (fitted, rest)
    best, best_score = dict(LOCAL_DEFAULTS), None
    for width, prior, feature_weight in itertools.product(*LOCAL_GRID.values()):
        hits, log_slowdown = 0, 0.0
        for layer, pass_, measured in scored:
            predicted = {}
            for name, (arith, other, _, features) in measured.items():
                (a, b), rest = refits[layer].get(f"{name}|{pass_}", ((1.0, 1.0), ()))
                predicted[name] = (a * arith + b * other) * local_correction(
                    a, b, arith, other, rest, features, width, prior, feature_weight)
            ratio = measured[min(predicted, key=predicted.get)][2] / min(m[2] for m in measured.values())
            hits += ratio <= HIT_RATIO
            log_slowdown += math.log(ratio)
        score = (hits, -log_slowdown)
        if scored and (best_score is None or score > best_score):
            best = {"width": width, "prior": prior, "feature_weight": feature_weight}
            best_score = score
    summary = {"choices": len(scored), "hits": best_score[0] if best_score else 0,
               "geomean_slowdown": round(math.exp(-best_score[1] / len(scored)), 4) if best_score else None}
    return best, summary


def fit(samples) -> tuple[float, float] | None:
    """(a, b) ≥ 0 minimizing the relative error of a·arith + b·other against the measured ms over
    ``samples`` [(arith_ms, other_ms, measured_ms), ...]; one common scale with few samples or when the
    two-term fit is degenerate."""
    rows = [(float(a), float(o), float(t)) for a, o, t in samples
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, o, t)) and t > 0 and a + o > 0]
    if not rows:
        return None
    lo, hi = COEFFICIENT_BOUNDS
    scale = float(np.exp(np.mean([np.log(t / (a + o)) for a, o, t in rows])))
    single = (min(hi, max(lo, scale)),) * 2
    if len(rows) < TWO_COEFFICIENTS_FROM:
        return single
    matrix = np.array([[a / t, o / t] for a, o, t in rows])
    solution, *_ = np.linalg.lstsq(matrix, np.ones(len(rows)), rcond=None)
    a, b = (float(v) for v in solution)
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0 or b < 0:
        # one part explains the times alone (or they contradict each other): fit that part's scale only
        a_only = float(np.exp(np.mean([np.log(t / a) for a, o, t in rows if a > 0]))) if any(r[0] > 0 for r in rows) else None
        return (min(hi, max(lo, a_only)), lo) if a_only else single
    pair = (min(hi, max(lo, a)), min(hi, max(lo, b)) if b > 0 else lo)
    error = lambda c: sum((math.log((c[0] * a_ + c[1] * o_) / t_)) ** 2 for a_, o_, t_ in rows)
    return pair if error(pair) <= error(single) else single
