"""`netcl run MODEL.onnx --input X.npy`: run an imported ONNX model on a NumPy array."""
from __future__ import annotations

import time

from .main import ArgumentError


def add_arguments(p) -> None:
    p.add_argument("model", help="an ONNX file")
    p.add_argument("--input", required=True, help="a .npy file holding the model's (first) input")
    p.add_argument("--output", default=None, help="write the output here (.npy)")
    p.add_argument("--batch", type=int, default=None,
                   help="run the input this many samples at a time (default: all at once, or the graph's fixed batch)")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--json", action="store_true", help="end with one JSON object")


def run(args) -> dict:
    import numpy as np
    from .. import onnx as nc_onnx
    from ..autograd import no_grad
    from ..runtime.device import resolve_device
    if args.batch is not None and args.batch < 1:
        raise ArgumentError(f"--batch must be ≥ 1, got {args.batch}")
    try:
        x = np.load(args.input, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"--input {args.input}: cannot read a .npy array ({exc})") from None
    device = resolve_device(args.device)
    model = nc_onnx.load(args.model, device=device)
    if len(model.input_names) != 1:
        raise ArgumentError(f"{args.model} takes {len(model.input_names)} inputs {model.input_names}; netcl run feeds "
                            "one")
    declared = model.input_shape()
    fixed = declared[0] if declared and isinstance(declared[0], int) else None
    batch = args.batch or fixed or (len(x) if x.ndim else 1)
    chunks = [x] if x.ndim == 0 else [x[k:k + batch] for k in range(0, len(x), batch)]
    start = time.perf_counter()
    outputs = []
    with no_grad():
        for chunk in chunks:
            y = model(chunk)
            outputs.append((y if isinstance(y, tuple) else (y,))[0].to_host())
    seconds = time.perf_counter() - start
    y = outputs[0] if len(outputs) == 1 else np.concatenate(outputs)
    if args.output:
        np.save(args.output, y)
    print(f"{args.model}: input {tuple(x.shape)} -> output {model.output_names[0]} {tuple(y.shape)} in {seconds:.3f} s "
          f"({len(chunks)} batch{'es' if len(chunks) != 1 else ''}) on {device.describe()}"
          + (f"; saved to {args.output}" if args.output else ""))
    return {"model": args.model, "device": device.describe(), "input_shape": list(x.shape),
            "output_shape": list(y.shape), "batches": len(chunks), "seconds": seconds, "output": args.output}
