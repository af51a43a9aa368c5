"""Does an imported model run as fast as the same network built in netcl?

Times eval-mode inference of `nc.models.resnet18` against the same network loaded with `nc.onnx.load`,
in one process, in alternating rounds (the median of the per-round ratios is reported, so drift in the
machine's speed cancels). Two imports are compared:

- ``netcl``: the model exported by `nc.onnx.export` and loaded back (the same layers and weights);
- ``torchvision``: a file written by PyTorch's exporter (benchmarks/torchvision_onnx/export_families.py),
  given with --onnx; PyTorch folds BatchNorm into the convolutions when it exports in eval mode.

    python3 benchmarks/onnx_import_speed.py [--onnx /work/onnx-families/resnet18.onnx] [--batch 1,8]
        [--size 224] [--rounds 5] [--captured] [--device SEL] [--json]

With --captured both sides run through `nc.training.CapturedInference`; by default each call runs the
model's forward as written. Also reported: the seconds `nc.onnx.load` takes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import netcl as nc  # noqa: E402


def _seconds_per_call(run, x, min_seconds: float) -> float:
    run(x).to_host()
    calls, start = 0, time.perf_counter()
    while True:
        y = run(x)
        calls += 1
        if time.perf_counter() - start >= min_seconds and calls >= 2:
            y.to_host()
            return (time.perf_counter() - start) / calls


def _runner(model, captured: bool):
    model.eval()
    if captured:
        return nc.training.CapturedInference(model)

    def forward(x):
        with nc.no_grad():
            return model(x)
    return forward


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--onnx", default=None, help="a torchvision ResNet-18 exported by PyTorch (optional)")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0, help="minimum seconds a timing")
    p.add_argument("--captured", action="store_true")
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    device = nc.default_device() if args.device is None else nc.set_default_device(args.device)
    rng = np.random.default_rng(0)
    built = nc.models.resnet18(seed=0, device=device)
    example = nc.tensor(rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32), device=device)
    built.eval()
    proto = nc.onnx.export(built, example)
    models = {"built": built}
    load_seconds = {}
    start = time.perf_counter()
    models["netcl import"] = nc.onnx.load(proto.SerializeToString(), device=device)
    load_seconds["netcl import"] = time.perf_counter() - start
    if args.onnx:
        start = time.perf_counter()
        models["torchvision import"] = nc.onnx.load(args.onnx, device=device)
        load_seconds["torchvision import"] = time.perf_counter() - start
    result = {"device": device.describe(), "size": args.size, "captured": args.captured,
              "load_seconds": {k: round(v, 3) for k, v in load_seconds.items()}, "batches": {}}
    for batch in (int(b) for b in args.batch.split(",")):
        x = nc.tensor(rng.standard_normal((batch, 3, args.size, args.size)).astype(np.float32), device=device)
        runners = {name: _runner(model, args.captured) for name, model in models.items()}
        for run in runners.values():  # plans, builds and recordings before any timing
            for _ in range(3):
                run(x).to_host()
        times = {name: [] for name in runners}
        for round_index in range(args.rounds):
            order = list(runners) if round_index % 2 == 0 else list(reversed(list(runners)))
            for name in order:
                times[name].append(_seconds_per_call(runners[name], x, args.seconds))
        row = {name: {"ms": round(1e3 * statistics.median(t), 2)} for name, t in times.items()}
        for name in runners:
            if name != "built":
                row[name]["speed_vs_built"] = round(statistics.median(
                    b / t for b, t in zip(times["built"], times[name])), 3)
        result["batches"][batch] = row
        if not args.json:
            print(f"batch {batch}: " + "; ".join(
                f"{n} {r['ms']} ms" + (f" ({r['speed_vs_built']}x the built model's speed)"
                                      if "speed_vs_built" in r else "") for n, r in row.items()), flush=True)
    if not args.json:
        print("load seconds: " + ", ".join(f"{k} {v}" for k, v in result["load_seconds"].items()))
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
