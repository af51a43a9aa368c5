"""`netcl bench NAME [--json]`: each benchmark is a module netcl.bench.NAME with add_arguments/run;
`netcl bench MODEL.onnx [--batch N]` is netcl.bench.onnx_model (an ONNX model against onnxruntime)."""
from __future__ import annotations

import importlib

BENCHMARKS = ("gemm", "im2col", "conv", "lenet", "resnet", "dense", "imagenet")


def add_arguments(p) -> None:
    p.add_argument("name", metavar="|".join(BENCHMARKS + ("MODEL.onnx",)),
                   help=f"which benchmark ({', '.join(BENCHMARKS)}), or a MODEL.onnx file")
    p.add_argument("--json", action="store_true", help="end with one JSON object")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shapes (a smoke run)")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--repeat", type=int, default=None, help="timed repetitions per case")
    from ..bench import imagenet
    imagenet.add_arguments(p)


def run(args):
    from .main import ArgumentError
    onnx_model = args.name.lower().endswith(".onnx")
    if not onnx_model and args.name not in BENCHMARKS:
        raise ArgumentError(f"netcl bench: unknown benchmark {args.name!r}; choose one of {', '.join(BENCHMARKS)} "
                            f"or give a MODEL.onnx file")
    if args.batch is not None and not (onnx_model or args.name == "imagenet"):
        raise ArgumentError("netcl bench: --batch is for `netcl bench imagenet` and `netcl bench MODEL.onnx`")
    if args.batch is not None and onnx_model and len(args.batch) != 1:
        raise ArgumentError(f"netcl bench MODEL.onnx takes one batch size, got {','.join(map(str, args.batch))}")
    if args.device is not None:
        import netcl as nc
        nc.set_default_device(args.device)
    return importlib.import_module(f"netcl.bench.{'onnx_model' if onnx_model else args.name}").run(args)
