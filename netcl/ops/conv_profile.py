"""What the conv planner knows about a device, measured on it and kept in the tuning database.

One entry per device and dtype (family "conv_calibration" of netcl.runtime.tuning_db, beside the GEMM tuning):
  bandwidth_gbs, launch_ms, class_gflops   the device quantities (measure_basics: a copy kernel, a tiny
                                           kernel and one product per GEMM shape class)
  gemm_surface                             {"grid", "rows": [[m, n, k, batch, gflops], ...]}: the GEMM's
                                           rate over a grid of shapes (netcl.ops.gemm_surface), measured
                                           by `netcl tune conv`; products are priced by it when present
  samples                                  {"strategy|pass": [[arith_ms, other_ms, measured_ms], ...]}:
                                           measured times of each strategy against the model's two parts,
                                           from `netcl tune conv` and from every measured plan
  calibrated_by                            who measured last: "netcl tune conv" or "measured plans"
  residual                                 how well the model chooses on these samples, left out one
                                           layer at a time (conv_cost.score_residual), by `netcl tune conv`
The entry is valid for one context (netcl's version, the GEMM kernel's source, the device's kernel
tuning); another context's entry is ignored. :func:`device_profile` turns it into a DeviceProfile with
the fitted coefficients (netcl.ops.conv_cost.fit).
"""
from __future__ import annotations

import hashlib
import numpy as np

from ..runtime import tuning_db as db
from . import conv_cost, gemm_surface
from .conv_memory import memory

FAMILY = "conv_calibration"
# One representative product per GEMM shape class (netcl.ops.gemm.shape_class), conv-like and quick.
CLASS_SHAPES = {"large": (256, 256, 256), "small_k": (32, 9216, 50), "small_mn": (50, 2048, 500),
                "small_n": (256, 49, 2304), "tiny": (64, 10, 500)}
# Bumped whenever the stored quantities are measured differently, or the cost terms a sample's
# (arith_ms, other_ms) were computed with change meaning (4: implicit GEMM's residue classes and gathering,
# direct_blocked's backward_data; 5: products priced by the measured rate surface; 6: products smaller than
# the surface's grid priced at its smallest product's time, and the residual model; 7: Winograd's products
# per chunk of samples; 8: the small_n shape class).
CALIBRATION_VERSION = 8


def context(device) -> str:
    """What a stored calibration is valid for: netcl's version, the sources of the kernel templates a
    convolution may launch (the GEMM's and every strategy's: the calibration is their measured times)
    and the device's kernel tuning."""
    from .. import __version__
    from ..runtime.kernels import convolution_templates_digest
    blob = "|".join((__version__, str(CALIBRATION_VERSION), db.identity(device), convolution_templates_digest()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stored(device, dtype: str = "float32") -> dict:
    """This device's calibration entry for ``dtype`` ({} when there is none for today's context)."""
    try:
        entry = db.lookup(device, FAMILY, np.dtype(dtype).name, default=None)
    except Exception:  # an unreadable database costs the model its measurements, never a convolution
        entry = None
    if not isinstance(entry, dict) or entry.get("context") != context(device):
        return {}
    return entry


def update(device, dtype: str, mutate) -> None:
    """Read-modify-write of the device's entry (``mutate(entry)`` edits it in place)."""
    with device.state.lock:
        entry = stored(device, dtype) or {"context": context(device)}
        mutate(entry)
        try:
            db.store(device, FAMILY, entry, key=np.dtype(dtype).name)
        except OSError:
            pass  # an unwritable cache costs the next process these measurements only
        memory(device).profiles.pop(np.dtype(dtype).name, None)


def _positive(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tuned_rates(device, dtype: str) -> dict:
    try:
        from .gemm import expected_gflops
    except ImportError:
        return {}
    rates = {}
    for cls, (m, n, k) in CLASS_SHAPES.items():
        try:
            value = expected_gflops(device, dtype, m, n, k)
        except Exception:
            value = None
        if value:
            rates[cls] = float(value)
    return rates


def device_profile(device, dtype: str = "float32") -> conv_cost.DeviceProfile:
    """The cost model's view of the device: measured quantities (else the GEMM tuner's rates, else the
    estimate) and the coefficients fitted to this device's measurements."""
    dtype = np.dtype(dtype).name
    profiles = memory(device).profiles
    profile = profiles.get(dtype)
    if profile is None:
        with device.state.lock:
            profile = profiles.get(dtype)
            if profile is None:
                profile = profiles[dtype] = _build_profile(device, dtype)
    return profile


def _build_profile(device, dtype: str) -> conv_cost.DeviceProfile:
    return profile_from_entry(device, dtype, stored(device, dtype))


def profile_from_entry(device, dtype: str, entry: dict, ridge: float = conv_cost.RIDGE) -> conv_cost.DeviceProfile:
    """The profile a stored calibration entry (``stored``'s dict, possibly edited) gives the device; the
    offline planner benchmark builds one from samples re-priced with today's cost terms."""
    profile = conv_cost.estimate(device)
    tuned = _tuned_rates(device, dtype)
    if tuned:
        profile.class_gflops = dict(tuned)
        profile.gemm_gflops = tuned.get("large", profile.gemm_gflops)
        profile.source = "tuning database"
    basics = [_positive(entry.get(k)) for k in ("bandwidth_gbs", "launch_ms")]
    classes = entry.get("class_gflops") if isinstance(entry.get("class_gflops"), dict) else {}
    classes = {k: _positive(v) for k, v in classes.items() if _positive(v)}
    if all(basics) and classes.get("large"):
        profile.bandwidth_gbs, profile.launch_ms = basics
        profile.class_gflops, profile.gemm_gflops = classes, classes["large"]
        profile.source = "measured"
    surface = entry.get("gemm_surface") if isinstance(entry.get("gemm_surface"), dict) else {}
    if profile.source == "measured" and isinstance(surface.get("grid"), dict) and isinstance(surface.get("rows"), list):
        profile.surface = gemm_surface.RateSurface.from_rows(surface["grid"], surface["rows"])
    for key, rows in valid_samples(entry).items():
        triples = [r[:3] for r in rows]
        fitted = conv_cost.fit(triples)
        if fitted:
            profile.coefficients[key] = (fitted[0], fitted[1], len(rows))
            profile.ratio_ranges[key] = conv_cost.ratio_range(triples)
            profile.residuals[key] = conv_cost.fit_residual(*fitted, [r[:4] for r in rows], ridge)
    if profile.coefficients:
        profile.calibration = str(entry.get("calibrated_by") or "measured plans")
    return profile


def valid_samples(entry: dict) -> dict:
    """{"strategy|pass": [(arith_ms, other_ms, measured_ms, features, layer signature), ...]} of a stored
    entry, whose rows are [arith_ms, other_ms, measured_ms, layer signature]; anything else is skipped."""
    samples = entry.get("samples") if isinstance(entry.get("samples"), dict) else {}
    valid = {}
    for key, rows in samples.items():
        valid[key] = [(float(r[0]), float(r[1]), float(r[2]), conv_cost.signature_features(r[3] if len(r) > 3 else ""),
                       str(r[3]) if len(r) > 3 else "")
                      for r in (rows if isinstance(rows, list) else [])
                      if isinstance(r, list) and len(r) >= 3 and all(_number(v) for v in r[:3]) and r[2] > 0]
    return valid


def score_residual(device, dtype: str = "float32") -> dict:
    """Score the model's choices on this device's stored measurements (leave one layer out,
    conv_cost.score_residual) and store the score with them; returns it."""
    samples = {key: [r for r in rows if r[4]] for key, rows in valid_samples(stored(device, dtype)).items()}
    score = conv_cost.score_residual(samples)
    update(device, dtype, lambda entry: entry.update(residual=score))
    return score


def has_basics(device, dtype: str = "float32") -> bool:
    return device_profile(device, dtype).source == "measured"


def record(device, dtype: str, pass_: str, measured: dict, terms: dict, layer_signature: str,
           by: str = "measured plans") -> None:
    """Add measured milliseconds {strategy: ms} of one layer and pass to the device's samples, each with
    the model's (arith_ms, other_ms) for it under today's profile (``terms``: {strategy: CostTerms})."""
    profile = device_profile(device, dtype)
    rows = {}
    for name, ms in measured.items():
        if name in terms and isinstance(ms, (int, float)) and ms > 0:
            arith, other = conv_cost.split_ms(terms[name], profile)
            rows[f"{name}|{pass_}"] = [round(arith, 6), round(other, 6), round(float(ms), 6), layer_signature]
    if not rows:
        return

    def mutate(entry):
        samples = entry.setdefault("samples", {})
        for key, row in rows.items():
            kept = [r for r in samples.get(key, []) if isinstance(r, list) and r[3:4] != [layer_signature]]
            samples[key] = (kept + [row])[-conv_cost.SAMPLES_KEPT:]
        if by == "netcl tune conv" or not entry.get("calibrated_by"):
            entry["calibrated_by"] = by
    update(device, dtype, mutate)


def measure_basics(device, dtype: str = "float32", surface_grid: dict | None = None,
                   surface_budget_s: float = 30.0, surface_progress=None) -> dict:
    """Measure copy bandwidth, launch time, one GEMM rate per shape class and, given ``surface_grid``
    (calibration does), the GEMM's rate surface over that grid, and store them (the samples recorded
    against other basics are dropped: their model parts were computed with those)."""
    from ..runtime.timing import sample
    from ..tensor import Tensor
    from ..runtime.timing import calls_per_sample
    from .copy_probe import CopyProbe
    from .elementwise import copy_into
    from .gemm import gemm
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    tiny_src, tiny_dst = Tensor.from_host(np.ones(1, dt), device=device), Tensor.empty((1,), dt, device)
    copy = CopyProbe(device, 64 << 20)  # beyond the last-level cache of today's CPUs
    # The fastest sample: a device characteristic, which other processes on a shared CPU only slow down.
    launch_s = sample(lambda: copy_into(tiny_dst, tiny_src), device, repeats=20, statistic="min").seconds
    copy_s = sample(copy, device, repeats=9, statistic="min").seconds
    rates = {}
    for cls, (m, n, k) in CLASS_SHAPES.items():
        a = Tensor.from_host(rng.uniform(-1, 1, (m, k)).astype(dt), device=device)
        b = Tensor.from_host(rng.uniform(-1, 1, (k, n)).astype(dt), device=device)
        c = Tensor.empty((m, n), dt, device)
        flop = 2.0 * m * n * k
        calls = calls_per_sample(flop)
        seconds = sample(lambda: gemm(a, b, c), device, repeats=9, calls=calls, statistic="min").seconds
        rates[cls] = round(flop / max(seconds - launch_s / calls, 1e-7) / 1e9, 3)
    basics = {"bandwidth_gbs": round(copy.gbps(max(copy_s - launch_s, 1e-7)), 3),
              "launch_ms": round(launch_s * 1e3, 5), "class_gflops": rates}
    surface = None
    if surface_grid is not None:
        measured = gemm_surface.measure(device, dt, surface_grid, launch_s, surface_budget_s, surface_progress)
        surface = {"grid": {k: list(v) for k, v in surface_grid.items()}, "rows": measured.as_rows()}

    def mutate(entry):
        entry.update(basics)
        if surface is not None:
            entry["gemm_surface"] = surface
        else:
            entry.pop("gemm_surface", None)
        entry["samples"] = {}
        entry.pop("calibrated_by", None)
        entry.pop("residual", None)
    update(device, dtype, mutate)
    return dict(basics, gemm_surface_points=len(surface["rows"]) if surface else 0)


def ensure_basics(device, dtype: str = "float32") -> conv_cost.DeviceProfile:
    if not has_basics(device, dtype):
        measure_basics(device, dtype)
    return device_profile(device, dtype)


def calibration_summary(device, dtype: str = "float32") -> str:
    """One line: whether the device is calibrated and by what (`netcl plan`, `netcl devices`)."""
    profile = device_profile(device, dtype)
    if profile.calibrated:
        pairs = len(profile.coefficients)
        return (f"calibrated ({profile.calibration}; {pairs} strategy-pass pairs, device quantities "
                f"{profile.source})")
    return (f"not calibrated: the model uses the fallback (strategies as fast as the device's GEMM and copy, "
            f"quantities {profile.source}); run `netcl tune conv`")


def clear_memory(device) -> None:
    with device.state.lock:
        memory(device).profiles.clear()
