"""How close does the depthwise strategy run to the device's copy bandwidth? For one depthwise layer (by
default MobileNetV2's (8, 144, 56, 56), 3×3, padding 1, groups 144), in one process and in interleaved
rounds (netcl.runtime.timing.compare, the fastest sample): each pass of `depthwise` and of the other
strategies that serve it, and the copy kernel `netcl devices --bench` measures the bandwidth with
(netcl.ops.copy_probe, a buffer beyond the last-level cache). A pass's GB/s counts the bytes it must move
(input + output + weight, read or written once); its share is that rate over the copy's, measured beside
it, so load from other processes slows both alike. With ``--cpu-time`` (CPU drivers, whose kernels run on
this process's threads) each call is timed by the process's CPU time over all its threads instead, the
fastest of interleaved rounds, and GB/s counts that time spread over the device's compute units: what
the call would take alone on the device, which other processes' load on a shared machine barely moves.

    python benchmarks/depthwise.py [--layer 8,144,56,56,3,1,1] [--passes forward,backward_data,backward_weight]
        [--strategies depthwise,im2col,direct] [--cpu-time] [--json out.json]

``--layer`` is N,C,H,W,kernel,stride,padding[,multiplier].
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from netcl.ops import conv2d_planner as planner  # noqa: E402
from netcl.ops.conv_common import ConvLayer, tensor_bytes  # noqa: E402
from netcl.ops.conv_registry import strategies  # noqa: E402
from netcl.ops.copy_probe import CopyProbe  # noqa: E402
from netcl.runtime.device import resolve_device  # noqa: E402
from netcl.runtime.timing import compare  # noqa: E402

TIMING = dict(warmup=2, min_runs=7, max_runs=40, time_budget_s=3.0, min_time_s=1.0, statistic="min")


def parse_layer(text: str) -> ConvLayer:
    n, c, h, w, kernel, stride, padding, *rest = (int(v) for v in text.split(","))
    multiplier = rest[0] if rest else 1
    return ConvLayer.from_shapes((n, c, h, w), (c * multiplier, 1, kernel, kernel), stride, padding, 1, c)


def cpu_seconds(runners: dict, device, rounds: int = 9) -> dict:
    """{name: the fewest CPU seconds of this process one call took, over the device's compute units},
    in interleaved rounds after two untimed ones."""
    best = {name: float("inf") for name in runners}
    for round_ in range(rounds + 2):
        for name, call in runners.items():
            device.synchronize()
            start = time.process_time()
            call()
            device.synchronize()
            if round_ >= 2:
                best[name] = min(best[name], (time.process_time() - start) / device.compute_units)
    return best


def run(layer: ConvLayer, passes, names, device, cpu_time: bool = False) -> dict:
    registry = strategies()
    probe = CopyProbe(device, max(64 << 20, 4 * device.cache_bytes))
    rng = np.random.default_rng(0)
    rows = []
    for pass_ in passes:
        impls = {name: registry[name] for name in names
                 if name in registry and registry[name].why_not(layer, pass_, device) is None}
        runners = planner.pass_runners(impls, layer, pass_, device, rng)
        runners["copy"] = probe
        if cpu_time:
            timed = cpu_seconds(runners, device)
        else:
            timed = {name: t if isinstance(t, Exception) else t.seconds
                     for name, t in compare(runners, device, **TIMING).items()}
        copy_gbs = probe.gbps(timed.pop("copy"))
        for name, seconds in timed.items():
            if isinstance(seconds, Exception):
                rows.append({"pass": pass_, "strategy": name, "error": str(seconds).splitlines()[0]})
                continue
            gbs = tensor_bytes(layer) / seconds / 1e9
            rows.append({"pass": pass_, "strategy": name, "ms": round(seconds * 1e3, 3), "gb_s": round(gbs, 1),
                         "copy_gb_s": round(copy_gbs, 1), "share_of_copy": round(gbs / copy_gbs, 3)})
    return {"device": device.describe(), "layer": layer.describe(), "bytes": tensor_bytes(layer),
            "timing": "process CPU time / compute units" if cpu_time else "wall clock", "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", default="8,144,56,56,3,1,1")
    parser.add_argument("--passes", default="forward,backward_data,backward_weight")
    parser.add_argument("--strategies", default="depthwise,im2col,direct")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by this process's CPU time over the compute units (CPU drivers)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    device = resolve_device(None)
    result = run(parse_layer(args.layer), args.passes.split(","), args.strategies.split(","), device, args.cpu_time)
    print(f"{result['device']}, timed by {result['timing']}\n{result['layer']}: {result['bytes'] / 1e6:.1f} MB "
          f"moved at least")
    for row in result["rows"]:
        if "error" in row:
            print(f"  {row['pass']:<16} {row['strategy']:<14} failed: {row['error']}")
        else:
            print(f"  {row['pass']:<16} {row['strategy']:<14} {row['ms']:8.3f} ms {row['gb_s']:7.1f} GB/s "
                  f"{100 * row['share_of_copy']:5.1f} % of the copy's {row['copy_gb_s']:.1f} GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
