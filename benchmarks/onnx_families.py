"""Do torchvision's classification families, exported by PyTorch, run in netcl as onnxruntime runs them?

Reads the directory benchmarks/torchvision_onnx/export_families.py writes (each family's .onnx, inputs at
batch 1 and 4 and onnxruntime's outputs for them; PyTorch is not imported here), loads each model with
nc.onnx.load, runs it in eval mode and prints the largest error relative to the largest output:

    python3 benchmarks/onnx_families.py /work/onnx-families [--families resnet18,vgg11] [--tolerance 1e-4]
        [--device SEL] [--json out.json]

A family that fails to load or run is reported with the error (for nc.OnnxError: the operator, the node
and the opset). The exit status is 1 when any family fails or misses the tolerance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import netcl as nc  # noqa: E402


def max_relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """max |ours − reference| / max |reference| (the issue's "relative" for a whole output)."""
    return float(np.abs(ours.astype(np.float64) - reference).max() / max(float(np.abs(reference).max()), 1e-30))


def check_family(directory: str, entry: dict, device) -> dict:
    row = {"name": entry["name"], "opset": entry.get("opset"), "batches": {}}
    start = time.perf_counter()
    try:
        model = nc.onnx.load(os.path.join(directory, entry["file"]), device=device)
    except Exception as exc:  # reported per family: the point is the table of what fails
        return {**row, "error": _describe(exc)}
    row["load_s"] = round(time.perf_counter() - start, 3)
    model.eval()
    for batch, files in sorted(entry["batches"].items(), key=lambda item: int(item[0])):
        x = np.load(os.path.join(directory, files["input"]))
        reference = np.load(os.path.join(directory, files["ort"]))
        try:
            with nc.no_grad():
                y = model(nc.tensor(x, device=device)).to_host()
        except Exception as exc:
            return {**row, "error": _describe(exc)}
        if y.shape != reference.shape:
            return {**row, "error": f"output shape {y.shape} at batch {batch}, onnxruntime's {reference.shape}"}
        row["batches"][batch] = max_relative_error(y, reference)
    return row


def _describe(exc: Exception) -> str:
    details = [f"{k}={getattr(exc, k)}" for k in ("op_type", "node", "opset") if getattr(exc, k, None) is not None]
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first_line}" + (f" ({', '.join(details)})" if details else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="what export_families.py wrote (manifest.json, .onnx, .npy)")
    parser.add_argument("--families", default="", help="comma-separated names (default: every one exported)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default=None, help="a device selector (default: netcl's default device)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    with open(os.path.join(args.directory, "manifest.json")) as f:
        manifest = json.load(f)
    families = manifest["families"]
    names = [n for n in args.families.split(",") if n] or list(families)
    missing = [n for n in names if n not in families]
    if missing:
        raise SystemExit(f"not exported in {args.directory}: {missing}")
    device = nc.default_device() if args.device is None else nc.set_default_device(args.device)
    print(f"{device.describe()}; exported by torch {manifest.get('torch')}; tolerance {args.tolerance:g}")
    print(f"{'family':22s} {'load s':>7s} {'batch 1':>9s} {'batch 4':>9s}  result")
    rows, failed = [], 0
    for name in names:
        row = check_family(args.directory, families[name], device)
        rows.append(row)
        errors = row["batches"]
        ok = "error" not in row and all(e <= args.tolerance for e in errors.values())
        failed += not ok
        cells = " ".join(f"{errors[b]:9.2e}" if b in errors else f"{'-':>9s}" for b in ("1", "4"))
        load = f"{row['load_s']:7.2f}" if "load_s" in row else f"{'-':>7s}"
        print(f"{name:22s} {load} {cells}  {'ok' if ok else row.get('error', 'above tolerance')}", flush=True)
    print(f"{len(names) - failed} of {len(names)} families within {args.tolerance:g}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"device": device.describe(), "tolerance": args.tolerance, "families": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
