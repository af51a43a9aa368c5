"""`netcl bench MODEL.onnx [--batch N] [--json] [--quick]`: an ONNX model's inference in netcl against
onnxruntime's, which runs in a process of its own (netcl.bench.reference: onnxruntime's threads would
otherwise share the cores with the OpenCL driver's), timed in alternating rounds.

Reported: the load time (nc.onnx.load), netcl's and onnxruntime's images/s at the batch asked for (eval
mode, no grad, data on the device), the median over rounds of the per-round ratio, and how far netcl's
output is from onnxruntime's on the same random input (max |difference| / max |onnxruntime's|). Without
onnxruntime for the reference interpreter netcl runs alone, with a note.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np

from .lenet import _timed


def input_shape(path: str, batch: int) -> tuple[int, ...]:
    """The graph's one input's shape with its first dimension ``batch`` (the others must be fixed)."""
    import onnx
    from ..errors import OnnxError
    graph = onnx.load(path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise OnnxError(f"netcl bench takes a model of one input; {path} has {len(inputs)}: "
                        f"{[i.name for i in inputs]}")
    dims = inputs[0].type.tensor_type.shape.dim
    shape = [batch] + [d.dim_value if d.HasField("dim_value") else None for d in dims[1:]]
    if None in shape:
        free = [d.dim_param or "?" for d in dims[1:] if not d.HasField("dim_value")]
        raise OnnxError(f"{path}: input '{inputs[0].name}' has free dimensions besides the batch ({free}); "
                        f"netcl bench needs the others fixed")
    return tuple(shape)


def run(args):
    import netcl as nc
    from .reference import ReferenceProcess, alternate
    path = args.name
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no ONNX file {path}")
    device = nc.default_device()
    batch = (getattr(args, "batch", None) or (1,))[0]  # netcl.cli.bench lets one size through
    quick = bool(getattr(args, "quick", False))
    seconds, rounds = (0.3, 2) if quick else (1.5, 5)
    min_reps = getattr(args, "repeat", None) or (1 if quick else 3)
    start = time.perf_counter()
    model = nc.onnx.load(path, device=device)
    load_s = time.perf_counter() - start
    model.eval()
    shape = input_shape(path, batch)
    x_host = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x = nc.tensor(x_host, device=device)

    def infer():
        with nc.no_grad():
            return model(x)
    ours = infer().to_host()
    result = {"benchmark": "onnx", "model": os.path.abspath(path), "input": list(shape), "batch": batch,
              "device": device.describe(), "load_seconds": load_s, "rounds": rounds}
    with tempfile.TemporaryDirectory() as scratch, ReferenceProcess() as ref:
        result["onnxruntime_version"] = ref.onnxruntime_version
        if ref.onnxruntime_version is None:
            result["onnxruntime_note"] = (f"onnxruntime is not installed for {ref.python}: no comparison "
                                          f"(pip install onnxruntime, or point NETCL_REFERENCE_PYTHON at an "
                                          f"interpreter that has it)")
            times = [_timed(infer, device, seconds, min_reps, 10_000) for _ in range(rounds)]
            result["netcl_images_per_second"] = batch / statistics.median(times)
        else:
            input_path, output_path = os.path.join(scratch, "x.npy"), os.path.join(scratch, "y.npy")
            np.save(input_path, x_host)
            request = {"model": "onnx", "path": os.path.abspath(path), "input": input_path}
            ref.ask(**request, save_output=output_path)
            theirs = np.load(output_path)
            if theirs.shape != ours.shape:
                result["max_relative_error"] = None
                result["output_mismatch"] = f"netcl's output {ours.shape}, onnxruntime's {theirs.shape}"
            else:
                result["max_relative_error"] = float(np.abs(ours.astype(np.float64) - theirs).max()
                                                     / max(float(np.abs(theirs).max()), 1e-30))
            timing = alternate(lambda: _timed(infer, device, seconds, min_reps, 10_000),
                               lambda: ref.seconds(**request, seconds=seconds, min_reps=min_reps), rounds)
            result["netcl_images_per_second"] = batch / timing["netcl_seconds"]
            result["onnxruntime_images_per_second"] = batch / timing["reference_seconds"]
            result["ratio_to_onnxruntime"] = timing["ratio"]
    _print(result)
    return result if getattr(args, "json", False) else None


def _print(r) -> None:
    out = sys.stdout
    print(f"{r['model']} at {'x'.join(map(str, r['input']))} on {r['device']}", file=out)
    print(f"  load (nc.onnx.load)        {r['load_seconds']:.3f} s", file=out)
    print(f"  netcl inference            {r['netcl_images_per_second']:.1f} images/s", file=out)
    if "ratio_to_onnxruntime" in r:
        print(f"  onnxruntime inference      {r['onnxruntime_images_per_second']:.1f} images/s", file=out)
        print(f"  netcl / onnxruntime        {r['ratio_to_onnxruntime']:.2f} (median over {r['rounds']} "
              f"alternating rounds; onnxruntime {r['onnxruntime_version']} in its own process)", file=out)
        agreement = (f"{r['max_relative_error']:.2e} max relative error" if r["max_relative_error"] is not None
                     else r["output_mismatch"])
        print(f"  output vs onnxruntime      {agreement}", file=out)
    else:
        print(f"  ({r['onnxruntime_note']})", file=out)
