"""Score today's cost model on the measurements of an earlier planner-accuracy run, without timing anything.

A run of benchmarks/planner_accuracy.py leaves two things: its cache, holding the calibration's samples
(each a strategy's measured milliseconds on a layer, with that layer's signature), and its JSON, holding
every case's true timings. This script re-prices the samples with today's cost terms (from the
signatures), fits the model to them, makes the heuristic choice for every case of the JSON and judges it
against that run's truth, as planner_accuracy.py does (a hit within 25 % of the fastest).

A change to the cost model is then judged paired: the same measurements, scored by the code before and
after the change (a git worktree of each), across every stored run. Run-to-run timing noise moves a
fresh run's score by 3-6 passes a set; paired scores move only with the model.

    NETCL_CACHE_DIR=<the run's cache> python benchmarks/planner_offline.py RUN.json [--ridge 3]
        [--exclude SUBSTRING ...] [--misses] [--json out.json]

``--exclude`` drops samples whose layer signature contains the substring (e.g. ``g32`` or
``n16c32h24``): the paired effect of a calibration layer, measured in the run, without a new run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netcl.ops import conv2d_planner as planner  # noqa: E402
from netcl.ops import conv_cost, conv_profile  # noqa: E402
from netcl.ops.conv_common import ConvLayer  # noqa: E402
from netcl.ops.conv_plan import assess  # noqa: E402
from netcl.ops.conv_registry import strategies  # noqa: E402
from netcl.runtime.device import resolve_device  # noqa: E402

UNLIMITED_WORKSPACE = 1 << 50


def repriced_entry(device, dtype: str, exclude: list[str]) -> dict:
    """The stored calibration entry with every sample re-priced by today's terms (samples without a layer
    signature, of an unregistered strategy, or matching ``exclude`` are dropped)."""
    entry = dict(conv_profile.stored(device, dtype))
    basics = conv_profile.profile_from_entry(device, dtype, {**entry, "samples": {}})
    registry = strategies()
    samples = {}
    for key, rows in conv_profile.valid_samples(entry).items():
        name, pass_ = key.split("|")
        for _, _, measured, _, signature in rows:
            layer = ConvLayer.from_signature(signature)
            if layer is None or name not in registry or any(part in signature for part in exclude):
                continue
            arith, other = conv_cost.split_ms(registry[name].cost_terms(layer, pass_, device), basics)
            samples.setdefault(key, []).append([arith, other, measured, signature])
    entry["samples"] = samples
    return entry


def case_layer(row: dict) -> ConvLayer:
    """The layer of a planner_accuracy row (its signature; runs before it was stored give the shape)."""
    if row.get("signature"):
        return ConvLayer.from_signature(row["signature"])
    sizes = [int(v) for v in re.findall(r"\d+", row["shape"])]
    (n, c, h, w), (k, _, r, s), stride, padding, dilation, groups = (sizes[:4], sizes[4:8], sizes[8:10],
                                                                      sizes[10:12], sizes[12:14], sizes[14])
    return ConvLayer.from_shapes((n, c, h, w), (k, c // groups, r, s), stride=tuple(stride), padding=tuple(padding),
                                 dilation=tuple(dilation), groups=groups)


def score(run: dict, profile, device, show_misses: bool) -> dict:
    sets = {}
    for row in run["rows"]:
        layer, truth = case_layer(row), row["truth_ms"]
        found = planner.answers(layer, row["pass"], device)
        candidates = assess(row["pass"], profile, found, UNLIMITED_WORKSPACE, layer)
        predicted = {c.strategy: c.predicted_ms for c in candidates if c.applicable and c.strategy in truth}
        choice = min(predicted, key=predicted.get)
        ratio = truth[choice] / min(truth.values())
        tally = sets.setdefault(row["set"], {"cases": 0, "heuristic_hits": 0})
        tally["cases"] += 1
        tally["heuristic_hits"] += ratio <= conv_cost.HIT_RATIO
        if show_misses and ratio > conv_cost.HIT_RATIO:
            print(f"  miss {row['set']:8s} {row['layer']:18s} {row['pass']:15s} chose {choice:13s} ×{ratio:.2f} | "
                  + "  ".join(f"{k} {predicted[k]:.2f}/{truth[k]:.2f}" for k in sorted(predicted, key=predicted.get))
                  + " (predicted/true ms)")
    return sets


def hits(sets: dict) -> str:
    return "; ".join(f"{label} {tally['heuristic_hits']}/{tally['cases']}" for label, tally in sets.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a planner_accuracy.py --json file")
    p.add_argument("--ridge", type=float, default=conv_cost.RIDGE, help="the residual model's ridge strength")
    p.add_argument("--exclude", action="append", default=[], help="drop samples whose signature contains this")
    p.add_argument("--misses", action="store_true", help="list the cases the heuristic misses")
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write the scores here")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    if not conv_profile.stored(device).get("samples"):
        print("no calibration samples for this device in NETCL_CACHE_DIR: point it at the run's cache")
        return 2
    run = json.loads(Path(args.run).read_text())
    entry = repriced_entry(device, "float32", args.exclude)
    profile = conv_profile.profile_from_entry(device, "float32", entry, args.ridge)
    sets = score(run, profile, device, args.misses)
    loo = conv_cost.score_residual(conv_profile.valid_samples(entry), args.ridge)
    own = {k: v for k, v in run["summary"].items() if isinstance(v, dict) and "cases" in v}
    print(f"ridge {args.ridge}; {sum(len(v) for v in entry['samples'].values())} samples; leave-one-layer-out "
          f"{loo['hits']}/{loo['choices']}; {hits(sets)}; the run's own heuristic: {hits(own)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ridge": args.ridge, "exclude": args.exclude, "leave_one_out": loo,
                                               "sets": sets}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
