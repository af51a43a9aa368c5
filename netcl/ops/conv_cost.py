"""The planner's cost model: a strategy's cost terms (netcl.ops.conv_common.CostTerms) turned into time.

    arith_ms = Σ products' flops / the GEMM rate at their shape + kernel flops / the large-GEMM rate
    other_ms = bytes moved / copy bandwidth + launches · launch time
    predicted = (a · arith_ms + b · other_ms) · residual

The device quantities (the GEMM's rate surface, copy bandwidth, launch time) are measured on the device
(netcl.ops.conv_profile). The coefficients (a, b) are per strategy and pass and per device: the
least-squares fit of measured times of that strategy on that device (`netcl tune conv`, and every measured
plan after it). ``residual`` is what two coefficients cannot explain, learnt from the same measurements:
the fit's log residual as a linear function of the case (log arith_ms, log other_ms and the log of the
layer's batch, channels and output channels per group, output pixels, kernel taps, stride and groups), a
ridge regression on standardized features, plus what that linear part left unexplained of the measured
cases nearest the one predicted (a kernel-weighted mean, shrunk toward zero where none is near), clamped
to the residuals the fit saw. `netcl tune conv` scores
the whole model by leave-one-layer-out over its own measurements (:func:`score_residual`) and stores the
score with the calibration. A device without measurements uses
a = b = 1 and no residual, the fallback: the strategy as fast as the device's GEMM and copy, and plans
say so. No coefficient is fitted on one machine and shipped.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .conv_common import ConvLayer, CostTerms

# A fit needs this many measurements of a (strategy, pass) before it trusts two coefficients; below it,
# one scale for both parts.
TWO_COEFFICIENTS_FROM = 4
COEFFICIENT_BOUNDS = (1e-3, 1e3)
SAMPLES_KEPT = 48  # per strategy and pass: the newest win
# The residual model's ridge strength (on standardized features, in samples' worth), fixed: chosen per
# device by leave-one-layer-out, it follows the calibration's noise and predicts held-out layers worse.
RIDGE = 3.0
HIT_RATIO = 1.25  # a choice within 25 % of the fastest measured counts as right (the planner's target)
# The residual's local part: the linear part's leftovers on the measured cases, weighted by a Gaussian of
# the distance to the case predicted (standardized features; LOCAL_WIDTH standard deviations), their sum
# over the weights plus LOCAL_SHRINK (a case with no measured neighbour gets next to nothing, one measured
# exactly gets two thirds of its leftover). Layers between measured ones keep the linear trend; a layer
# next to a measured one inherits what the trend missed there. The width was chosen by leave-one-layer-out
# on calibrations of both CPU drivers, where the local part improved on the linear trend alone;
# docs/explanation/convolution.md describes the residual.
LOCAL_WIDTH = 0.6
LOCAL_SHRINK = 0.5


@dataclass
class DeviceProfile:
    gemm_gflops: float       # the large-GEMM rate of the dtype
    bandwidth_gbs: float     # sustained copy bandwidth (read + write counted)
    launch_ms: float         # one kernel launch, enqueue to completion of a tiny kernel
    source: str              # where the device quantities come from: "measured", "tuning database", "estimate"
    class_gflops: dict = field(default_factory=dict)  # GEMM rate per netcl.ops.gemm.shape_class
    coefficients: dict = field(default_factory=dict)  # "strategy|pass" -> (a, b, samples)
    residuals: dict = field(default_factory=dict)     # "strategy|pass" -> Residual fitted to its measured samples
    # "strategy|pass" -> (lowest, highest) measured / (arith + other) of its samples: a prediction stays
    # within them, so coefficients fitted where one term was negligible are not extrapolated to layers
    # where it dominates
    ratio_ranges: dict = field(default_factory=dict)
    calibration: str = "none"  # "netcl tune conv", "measured plans", or "none" (the fallback)
    surface: object = None  # netcl.ops.gemm_surface.RateSurface measured by calibration, when there is one

    def rate(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """GFLOP/s of a (batched) product of this shape: the measured rate surface's, else its shape
        class's measured rate (netcl.ops.gemm.class_chain: the first class measured), else the large one."""
        if self.surface is not None:
            return self.surface.gflops(m, n, k, batch)
        from .gemm import class_chain
        return float(next((self.class_gflops[c] for c in class_chain(m, n, k, batch) if self.class_gflops.get(c)),
                          self.gemm_gflops))

    @property
    def calibrated(self) -> bool:
        return bool(self.coefficients)

    def as_dict(self) -> dict:
        return {"gemm_gflops": round(self.gemm_gflops, 2), "bandwidth_gbs": round(self.bandwidth_gbs, 2),
                "launch_ms": round(self.launch_ms, 4), "source": self.source, "calibration": self.calibration,
                "class_gflops": {k: round(v, 2) for k, v in sorted(self.class_gflops.items())},
                "coefficients": {k: [round(v[0], 4), round(v[1], 4), v[2]] for k, v in sorted(self.coefficients.items())},
                "residual_models": sum(1 for r in self.residuals.values() if r is not None),
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
    """What the residual model knows of a layer besides the two terms: the log of its batch, input and
    output channels per group, output pixels, kernel taps, stride and groups."""
    g = layer.groups
    return (math.log(layer.n), math.log(layer.c // g), math.log(layer.k // g), math.log(layer.out_h * layer.out_w),
            math.log(layer.r * layer.s), math.log(layer.stride_h * layer.stride_w), math.log(g))


def signature_features(signature: str) -> tuple | None:
    """layer_features of a ConvLayer.signature() (what a stored sample keeps)."""
    layer = ConvLayer.from_signature(signature)
    return layer_features(layer) if layer is not None else None


def _case(arith: float, other: float, features) -> np.ndarray:
    return np.array((math.log(max(arith, 1e-9)), math.log(max(other, 1e-9)), *features))


@dataclass(frozen=True)
class Residual:
    """log(measured / (a·arith + b·other)) of one strategy and pass as a linear function of the case."""
    mean: float
    low: float
    high: float
    center: np.ndarray
    scale: np.ndarray
    beta: np.ndarray
    case_low: np.ndarray  # the range of the cases the fit saw: a case outside it is priced at its edge
    case_high: np.ndarray
    seen: np.ndarray      # the standardized cases the fit saw, one row each
    leftover: np.ndarray  # what the linear part left unexplained of each (log)

    def correction(self, arith: float, other: float, features) -> float:
        z = (np.clip(_case(arith, other, features), self.case_low, self.case_high) - self.center) / self.scale
        weights = np.exp(-np.sum((self.seen - z) ** 2, axis=1) / (2 * LOCAL_WIDTH ** 2))
        local = float(weights @ self.leftover) / (float(weights.sum()) + LOCAL_SHRINK)
        value = self.mean + float(z @ self.beta) + local
        # never beyond the residuals the fit saw: a layer far outside the measured ones is not extrapolated
        return math.exp(min(max(value, self.low), self.high))


def fit_residual(a: float, b: float, samples, ridge: float = RIDGE) -> Residual | None:
    """The residual model of the fit (a, b) over ``samples`` [(arith_ms, other_ms, measured_ms, features),
    ...] (rows without features are skipped); None without any usable row."""
    rows = [r for r in samples if r[3] is not None and r[2] > 0 and a * r[0] + b * r[1] > 0]
    if not rows:
        return None
    cases = np.array([_case(r[0], r[1], r[3]) for r in rows])
    logs = np.array([math.log(r[2] / (a * r[0] + b * r[1])) for r in rows])
    center, spread = cases.mean(axis=0), cases.std(axis=0)
    varying = spread > 1e-9  # a feature every sample shares says nothing (and must not divide by zero)
    scale = np.where(varying, spread, 1.0)
    z = (cases - center) / scale * varying
    beta = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (logs - logs.mean())) * varying
    return Residual(float(logs.mean()), float(logs.min()), float(logs.max()), center, scale, beta,
                    cases.min(axis=0), cases.max(axis=0), z, logs - logs.mean() - z @ beta)


def predict_ms(name: str, pass_: str, terms: CostTerms, profile: DeviceProfile, layer=None) -> tuple[float, bool]:
    """(predicted milliseconds, whether the device's calibration for this strategy and pass was used)."""
    arith, other = split_ms(terms, profile)
    key = f"{name}|{pass_}"
    coefficients = profile.coefficients.get(key)
    if not coefficients:
        return arith + other, False
    features = layer_features(layer) if layer is not None else None
    return calibrated_ms(coefficients[:2], profile.residuals.get(key), profile.ratio_ranges.get(key),
                         arith, other, features), True


def calibrated_ms(coefficients, residual, ratios, arith: float, other: float, features) -> float:
    """(a·arith + b·other) × the residual's correction (without features, none), kept within ``ratios``
    (lowest, highest measured / (arith + other) of the samples fitted; None: unbounded)."""
    a, b = coefficients
    correction = residual.correction(arith, other, features) if residual and features is not None else 1.0
    predicted = (a * arith + b * other) * correction
    if ratios:
        predicted = min(max(predicted, ratios[0] * (arith + other)), ratios[1] * (arith + other))
    return predicted


def _without_batch(signature: str) -> str:
    return re.sub(r"^n\d+", "", signature)


def score_residual(samples: dict, ridge: float = RIDGE) -> dict:
    """How well the model chooses on this device's own measurements, by leave-one-layer-out: for each
    measured layer, the coefficients and the residual model are refitted without it and its strategies
    predicted from the rest; the count of choices within HIT_RATIO of the fastest measured and their
    geometric-mean slowdown. ``samples``: {"strategy|pass": [(arith_ms, other_ms, measured_ms, features,
    layer signature), ...]}."""
    cases: dict = {}  # (layer, pass) -> {strategy: (arith, other, measured, features)}
    for key, rows in samples.items():
        name, pass_ = key.split("|", 1)
        for arith, other, measured, features, layer in rows:
            cases.setdefault((layer, pass_), {})[name] = (arith, other, measured, features)
    models = {}  # (layer left out, key) -> ((a, b), residual, ratio range)
    for left_out in sorted({layer for layer, _ in cases}):
        shape = _without_batch(left_out)
        for key, rows in samples.items():
            # the layer goes out with its copies at other batch sizes (LeNet's layers are calibrated at two),
            # which would otherwise predict it almost exactly
            rest = [row[:4] for row in rows if _without_batch(row[4]) != shape]
            triples = [row[:3] for row in rest]
            fitted = fit(triples)
            if fitted:
                models[(left_out, key)] = (fitted, fit_residual(*fitted, rest, ridge), ratio_range(triples))
    choices = hits = 0
    log_slowdown = 0.0
    for (layer, pass_), measured in cases.items():
        if len(measured) < 2:
            continue
        predicted = {}
        for name, (arith, other, _, features) in measured.items():
            model = models.get((layer, f"{name}|{pass_}"), ((1.0, 1.0), None, None))
            predicted[name] = calibrated_ms(*model, arith, other, features)
        ratio = measured[min(predicted, key=predicted.get)][2] / min(m[2] for m in measured.values())
        choices += 1
        hits += ratio <= HIT_RATIO
        log_slowdown += math.log(ratio)
    return {"choices": choices, "hits": hits,
            "geomean_slowdown": round(math.exp(log_slowdown / choices), 4) if choices else None}


def ratio_range(samples) -> tuple[float, float] | None:
    """(lowest, highest) measured / (arith + other) over ``samples`` [(arith_ms, other_ms, measured_ms), ...];
    None without a usable row."""
    ratios = [t / (a + o) for a, o, t in samples if a + o > 0 and t > 0 and math.isfinite(t / (a + o))]
    return (min(ratios), max(ratios)) if ratios else None


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
