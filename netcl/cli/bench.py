"""`netcl bench NAME [--json]`: each benchmark is a module netcl.bench.NAME with add_arguments/run."""
from __future__ import annotations

import importlib

BENCHMARKS = ("gemm", "im2col", "conv", "lenet", "resnet", "dense", "imagenet")


def add_arguments(p) -> None:
    p.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    p.add_argument("--json", action="store_true", help="end with one JSON object")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shapes (a smoke run)")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--repeat", type=int, default=None, help="timed repetitions per case")
    from ..bench import imagenet
    imagenet.add_arguments(p)


def run(args):
    if args.device is not None:
        import netcl as nc
        nc.set_default_device(args.device)
    return importlib.import_module(f"netcl.bench.{args.name}").run(args)
