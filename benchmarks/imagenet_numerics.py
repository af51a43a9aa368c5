"""Numerics of nc.models.resnet18/34/50 and mobilenet_v2 at real sizes against PyTorch float64: eval logits
within 1e-4 relative, and a training step's loss and every parameter's gradient within 5× the error of
PyTorch's own float32 run (issue 46's targets), 1000 classes, synthetic weights and data
(tests/torchvision_reference.py).

PyTorch runs in its own process and environment (netcl never imports it), through
tests/fixtures/make_torchvision_fixtures.py --reference:

    python3 benchmarks/imagenet_numerics.py --torch-python /path/to/venv/bin/python
        [--models resnet18,resnet50,mobilenet_v2] [--batch 2] [--size 224] [--json out.json]

Prints, per model, the eval error, the loss error and the worst gradient's error as multiples of PyTorch
float32's (a ratio ≤ 5 meets the target; a few gradients are zero but for rounding and are judged against
a floor of 1e-6 of the model's largest gradient norm).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import netcl as nc  # noqa: E402
from torchvision_reference import model_seed, synthetic_batch, synthetic_state  # noqa: E402


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def torch_reference(python: str, model: str, batch: int, size: int, workdir: Path) -> dict:
    out = workdir / f"{model}.npz"
    subprocess.run([python, str(REPO / "tests" / "fixtures" / "make_torchvision_fixtures.py"), "--reference", model,
                    "--batch", str(batch), "--size", str(size), "--out", str(out)], check=True)
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def netcl_step(model_name: str, batch: int, size: int):
    kwargs = {"num_classes": 1000}
    if model_name == "mobilenet_v2":
        model = nc.models.MobileNetV2(**kwargs, dropout=0.0)
    else:
        model = getattr(nc.models, model_name)(**kwargs)
    shapes = [[key, list(value.shape)] for key, value in model.state_dict().items()]
    model.load_state_dict(synthetic_state(shapes, model_seed(model_name)))
    images, targets = synthetic_batch((batch, 3, size, size), 1000)
    model.eval()
    with nc.no_grad():
        logits = model(nc.tensor(images)).to_host()
    model.train()
    loss = nc.nn.functional.cross_entropy(model(nc.tensor(images)), targets)
    loss.backward()
    grads = {key: p.grad.to_host() for key, p in model.named_parameters()}
    return logits, float(loss.to_host()), grads


def compare(model_name: str, ref: dict, batch: int, size: int) -> dict:
    logits, loss, grads = netcl_step(model_name, batch, size)
    norms = {key: float(ref[f"grad_norm/{key}"]) for key in grads}
    floor = 1e-6 * max(norms.values())
    ratios = {}
    for key, grad in grads.items():
        torch_error = float(ref[f"grad_f32_error/{key}"]) * norms[key]
        ours = float(np.linalg.norm(grad.astype(np.float64) - ref[f"grad/{key}"]))
        ratios[key] = ours / max(torch_error, floor)
    worst = max(ratios, key=ratios.get)
    return {"model": model_name, "batch": batch, "size": size,
            "eval_error": _rel(logits, ref["eval_logits"]), "eval_error_torch_f32": float(ref["eval_logits/f32_error"]),
            "loss_ratio": _rel(loss, ref["train_loss"]) / max(float(ref["train_loss/f32_error"]), 1e-12),
            "worst_gradient": worst, "worst_gradient_ratio": ratios[worst],
            "median_gradient_ratio": float(np.median(list(ratios.values()))),
            "gradients_within_5x": sum(r <= 5 for r in ratios.values()), "gradients": len(ratios)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torch and numpy (not netcl's)")
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("NETCL_CONV_PLAN_MODE", "heuristic")  # numerics, not the plan's trials
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models.split(","):
            ref = torch_reference(args.torch_python, model_name, args.batch, args.size, Path(tmp))
            rows.append(compare(model_name, ref, args.batch, args.size))
            row = rows[-1]
            print(f"{model_name} ({nc.default_device().name}, batch {args.batch}, {args.size}×{args.size}): "
                  f"eval {row['eval_error']:.1e} (PyTorch float32 {row['eval_error_torch_f32']:.1e}); loss "
                  f"{row['loss_ratio']:.2f}× PyTorch float32's error; gradients {row['gradients_within_5x']}/"
                  f"{row['gradients']} within 5×, median {row['median_gradient_ratio']:.2f}×, worst "
                  f"{row['worst_gradient_ratio']:.2f}× ({row['worst_gradient']})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
