"""How good are the planner's choices on a calibrated device? For each layer and pass:

1. heuristic: the plan the cost model makes from the device's calibration alone (`netcl tune conv`; no
   measured plans), made for every case before anything else is measured;
2. measure: the plan measure mode makes in a fresh copy of that calibrated cache;
3. truth: every applicable candidate timed in two independent series (interleaved runs in rotated
   order, warm-up excluded, the statistic measure mode uses: the fastest sample; netcl.runtime.timing);
   the lower of the two counts.

A choice "hits" when its true time is within 25 % (heuristic) or 10 % (measure) of the fastest
candidate. Two sets: the 42 passes of LeNet (batch 64) and the MEC paper's cv1–cv12 (batch 1), and a
held-out set the calibration never saw (ResNet-, VGG-, MobileNet-like: strided, 1×1, depthwise, dilated,
a 7×7 stem; netcl.cli.conv_layers.held_out_layers). Targets: heuristic ≥ 90 %, measure 100 %, on both.
A third set, ``second_held_out`` (not run by default), holds layers the model was never tuned against:
kernels that are not square, grouped, dilated by 4, ResNet-50's bottleneck (second_held_out_layers).
A fourth, ``imagenet`` (not run by default; batch 1 unless --imagenet-batch), holds ResNet-18/50's and
MobileNetV2's layers at 224 pixels: the 7×7 stem, strided 3×3 and 1×1 layers, 1×1 at batch 1 and the
depthwise layers from 112 to 7 pixels (imagenet_layers).

    NETCL_CACHE_DIR=$(mktemp -d) python benchmarks/planner_accuracy.py [--calibrate] [--quick-calibration]
        [--sets main,held_out,second_held_out,imagenet] [--lenet-batch 64] [--mec-batch 1] [--held-out-batch 8]
        [--imagenet-batch 1] [--json out.json]

Without a calibration in the cache (or with --calibrate) the run calibrates first and reports its time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from netcl import settings  # noqa: E402
from netcl.cli.conv_layers import (held_out_layers, imagenet_layers, lenet_layers, mec_layers,  # noqa: E402
                                   second_held_out_layers)
from netcl.ops import conv2d_planner as planner  # noqa: E402
from netcl.ops import conv_chooser  # noqa: E402
from netcl.ops import conv_profile  # noqa: E402
from netcl.ops.conv_common import PASSES  # noqa: E402
from netcl.ops.conv_registry import strategies  # noqa: E402
from netcl.runtime.device import resolve_device  # noqa: E402
from netcl.runtime.kernels import kernels_dir  # noqa: F401,E402  (imported before the cache moves)


def _use_cache(path: Path) -> None:
    settings.CACHE_DIR.choose(str(path))
    conv_chooser.clear_memory_cache()


def _copy_calibrated(calibrated: Path, target: Path) -> None:
    """A fresh cache holding only the calibrated tuning database (compiled kernels are shared by linking)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "tuning").mkdir(exist_ok=True)
    shutil.copy(calibrated / "tuning" / "tuning.json", target / "tuning" / "tuning.json")
    if (calibrated / "kernels").is_dir() and not (target / "kernels").exists():
        (target / "kernels").symlink_to(calibrated / "kernels")
    _use_cache(target)


def run_set(label, layers, device, calibrated: Path, scratch: Path, rng) -> list:
    heuristic = {}
    _copy_calibrated(calibrated, scratch / f"{label}-heuristic")
    for name, layer in layers:
        for pass_ in PASSES:
            heuristic[(name, pass_)] = planner.plan_conv2d_layer(layer, pass_, "heuristic", device=device)
    rows = []
    registry = strategies()
    for name, layer in layers:
        for pass_ in PASSES:
            h = heuristic[(name, pass_)]
            _copy_calibrated(calibrated, scratch / f"{label}-measure-{name}-{pass_}")
            start = time.perf_counter()
            m = planner.plan_conv2d_layer(layer, pass_, "measure", device=device)
            measure_s = time.perf_counter() - start
            impls = {c.strategy: registry[c.strategy] for c in h.candidates if c.applicable and c.within_budget}
            # a candidate over 10x slower than the fastest in warm-up keeps that one sample: it cannot win
            series = [planner.time_strategies(impls, layer, pass_, device, rng, time_isolated=False)
                      for _ in range(2)]
            truth = {k: min(s[k] for s in series) for k in series[0]
                     if all(isinstance(s[k], float) for s in series)}
            best = min(truth, key=truth.get)
            row = {"set": label, "layer": name, "pass": pass_, "shape": layer.describe(),
                   "signature": layer.signature(), "truth_ms": truth,
                   "best": best, "heuristic": h.strategy, "heuristic_ratio": truth[h.strategy] / truth[best],
                   "measure": m.strategy, "measure_ratio": truth[m.strategy] / truth[best],
                   "measure_mode_ms": {c.strategy: c.measured_ms for c in m.candidates if c.measured_ms is not None},
                   "measure_seconds": round(measure_s, 3),
                   "predicted_ms": {c.strategy: c.predicted_ms for c in h.candidates if c.applicable}}
            rows.append(row)
            times = "  ".join(f"{k} {v:.2f}" for k, v in sorted(truth.items(), key=lambda kv: kv[1]))
            print(f"{name:18s} {pass_:15s} best {best:13s} heuristic {h.strategy:13s} ×{row['heuristic_ratio']:.2f}  "
                  f"measure {m.strategy:13s} ×{row['measure_ratio']:.2f}  | {times} ms", flush=True)
    return rows


def summarize(label, rows) -> dict:
    h_hits = sum(r["heuristic_ratio"] <= 1.25 for r in rows)
    m_hits = sum(r["measure_ratio"] <= 1.10 for r in rows)
    out = {"cases": len(rows), "heuristic_hits": h_hits, "measure_hits": m_hits,
           "heuristic_within_25pct": h_hits / len(rows), "measure_within_10pct": m_hits / len(rows),
           "heuristic_geomean_ratio": float(np.exp(np.mean([np.log(r["heuristic_ratio"]) for r in rows]))),
           "worst_heuristic": max(((r["heuristic_ratio"], f"{r['layer']} {r['pass']}") for r in rows))}
    print(f"[{label}] heuristic within 25% of the fastest: {h_hits}/{len(rows)} "
          f"({100 * out['heuristic_within_25pct']:.0f}%); measure within 10%: {m_hits}/{len(rows)} "
          f"({100 * out['measure_within_10pct']:.0f}%); heuristic geomean slowdown ×{out['heuristic_geomean_ratio']:.3f}; "
          f"worst ×{out['worst_heuristic'][0]:.2f} ({out['worst_heuristic'][1]})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="main,held_out",
                   help="comma list of main, held_out, second_held_out, imagenet")
    p.add_argument("--lenet-batch", type=int, default=64)
    p.add_argument("--mec-batch", type=int, default=1)
    p.add_argument("--held-out-batch", type=int, default=8)
    p.add_argument("--imagenet-batch", type=int, default=1)
    p.add_argument("--layers", default="", help="comma list of layer names to keep (default: all)")
    p.add_argument("--calibrate", action="store_true", help="calibrate first even if the cache has one")
    p.add_argument("--quick-calibration", action="store_true", help="calibrate with `netcl tune conv --quick`")
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write every timing and choice here")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    calibrated = settings.CACHE_DIR.get() or Path(tempfile.mkdtemp(prefix="netcl-planner-accuracy-"))
    _use_cache(calibrated)
    started = time.perf_counter()
    calibration = None
    if args.calibrate or not conv_profile.device_profile(device).calibrated:
        from netcl.tuning.conv import calibrate
        calibration = calibrate(device, quick=args.quick_calibration)
        print(f"calibrated in {calibration['seconds']:.1f} s ({calibration['timings']} timings)")
    entry = conv_profile.stored(device)
    print(f"device: {device.describe()}; {conv_profile.calibration_summary(device)}; calibration took "
          f"{entry.get('tune_seconds')} s; load average {os.getloadavg()[0]:.1f} "
          f"(other processes on the CPU make timings noisy)")
    sets = {"main": lenet_layers(args.lenet_batch) + mec_layers(args.mec_batch),
            "held_out": held_out_layers(args.held_out_batch),
            "second_held_out": second_held_out_layers(args.held_out_batch),
            "imagenet": imagenet_layers(args.imagenet_batch)}
    scratch = Path(tempfile.mkdtemp(prefix="netcl-planner-scratch-"))
    rng = np.random.default_rng(0)
    rows, summary = [], {}
    for label in args.sets.split(","):
        layers = [(n, l) for n, l in sets[label] if not args.layers or n in args.layers.split(",")]
        found = run_set(label, layers, device, calibrated, scratch, rng)
        rows += found
        summary[label] = summarize(label, found) if found else {}
    summary.update(device=device.describe(), calibration_seconds=entry.get("tune_seconds"),
                   calibration_quick=entry.get("quick"), load_average_1min=os.getloadavg()[0],
                   seconds=round(time.perf_counter() - started, 1), calibration=calibration)
    _use_cache(calibrated)
    print(f"load average at the end {os.getloadavg()[0]:.1f}; {summary['seconds']:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
