"""Numerical agreement with PyTorch (issues 46 and 47): imported ONNX models and nc.models against PyTorch
float64 on the same architecture, weights and data.

For each model, a training step's loss and every parameter's gradient, and the eval-mode logits, are
compared with PyTorch float64. The error of a tensor is ||a - b|| / ||b|| (b: float64); in train mode each
tensor's netcl error is set against PyTorch float32's error on the same tensor (the error a float32
framework makes there), and the worst ratio is reported (target: ≤ 5); errors under ERROR_FLOOR count as
rounding level on both sides. Eval logits must be within 1e-4 relative. Imported ONNX models also run SGD
steps on a small synthetic task (a fixed batch of random images and labels), whose loss must fall.

    NETCL_REFERENCE_PYTHON=/path/to/venv-with-torch/bin/python python3 benchmarks/torch_agreement.py
        [--models onnx:resnet18,onnx:mobilenet_v2,resnet18,resnet50,mobilenet_v2] [--batch 2] [--size 96]
        [--classes 10] [--sgd-steps 50] [--sgd-batch 16] [--sgd-size 64] [--quick] [--json out.json]

The images are smaller than ImageNet's (96×96 by default, --size 224 for the real size) so that the whole
set runs in minutes on a small CPU. Below 96×96 the last stage is 2×2 and its BatchNorms normalize 8
values at batch 2, which amplifies rounding until a value lands within float32's error of a ReLU6 kink
(MobileNetV2 at 64×64); such a value passes or stops its gradient by chance in any float32 framework.
The size, batch and device are printed with the table. netcl never imports torch:
benchmarks/torch_agreement_worker.py runs under --torch-python, else NETCL_REFERENCE_PYTHON, else this
interpreter, and exports the ONNX files that the onnx: models load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("torch_agreement_worker.py")
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import netcl as nc  # noqa: E402
from netcl import settings  # noqa: E402
from torchvision_reference import model_seed, synthetic_batch, synthetic_state  # noqa: E402

ALL_MODELS = "onnx:resnet18,onnx:mobilenet_v2,resnet18,resnet50,mobilenet_v2"
QUICK = {"models": "onnx:resnet18,resnet18", "batch": 2, "size": 64, "sgd_steps": 10, "sgd_size": 64}
TRAIN_RATIO_TARGET = 5.0
EVAL_ERROR_TARGET = 1e-4
ERROR_FLOOR = 1e-6  # relative: about eight float32 roundings


def rel_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def reference_python(explicit: str | None = None) -> str:
    return explicit or settings.REFERENCE_PYTHON.get() or sys.executable


def has_torch(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def torch_reference(python: str, model: str, args, workdir: Path, onnx_path: Path | None) -> dict:
    out = workdir / f"{model}.{'onnx' if onnx_path else 'native'}.npz"
    command = [python, str(WORKER), "--model", model, "--batch", str(args.batch), "--size", str(args.size),
               "--classes", str(args.classes), "--out", str(out)]
    if onnx_path is not None:
        command += ["--onnx", str(onnx_path), "--sgd-steps", str(args.sgd_steps), "--sgd-batch", str(args.sgd_batch),
                    "--sgd-size", str(args.sgd_size), "--lr", str(args.lr), "--momentum", str(args.momentum)]
    done = subprocess.run(command, capture_output=True, text=True, env=settings.child_environment(PYTHONPATH=None))
    if done.returncode != 0:
        raise RuntimeError(f"the PyTorch worker ({python}) failed for {model}: {done.stderr[-3000:]}")
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def native_model(name: str, classes: int):
    if name == "mobilenet_v2":
        model = nc.models.MobileNetV2(num_classes=classes, dropout=0.0)
    else:
        model = getattr(nc.models, name)(num_classes=classes)
    shapes = [[key, list(value.shape)] for key, value in model.state_dict().items()]
    model.load_state_dict(synthetic_state(shapes, model_seed(name)))
    return model, {key: key for key, _ in model.named_parameters()}


def onnx_model(path: Path):
    """The imported model and, for each of its parameters, the graph initializer (= PyTorch state_dict key)."""
    model = nc.onnx.load(path)
    return model, {key: model.initializer_names.get(key, key) for key, _ in model.named_parameters()}


def netcl_results(model, torch_keys: dict, images, targets):
    model.eval()
    with nc.no_grad():
        logits = model(nc.tensor(images)).to_host()
    model.train()
    loss = nc.nn.functional.cross_entropy(model(nc.tensor(images)), targets)
    loss.backward()
    grads = {torch_keys[key]: p.grad.to_host() for key, p in model.named_parameters()}
    return logits, float(loss.to_host()), grads


def sgd_losses(model, batch: int, size: int, classes: int, steps: int, lr: float, momentum: float) -> list:
    images, targets = synthetic_batch((batch, 3, size, size), classes)
    x = nc.tensor(images)
    optimizer = nc.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nc.nn.functional.cross_entropy(model(x), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.to_host()))
    return losses


def compare(label: str, ref: dict, logits, loss: float, grads: dict) -> list:
    """Rows of the table: eval logits, then the train step's worst tensor (loss or a gradient)."""
    missing = sorted(set(k[len("grad/"):] for k in ref if k.startswith("grad/")) - set(grads))
    if missing:
        raise RuntimeError(f"{label}: netcl has no gradient for PyTorch's {missing[:5]}")
    eval_error = rel_error(logits, ref["eval_logits"])
    eval_torch = float(ref["eval_logits/f32_error"])
    rows = [{"model": label, "mode": "eval", "tensor": "logits", "netcl_error": eval_error,
             "torch_f32_error": eval_torch, "ratio": max(eval_error, ERROR_FLOOR) / max(eval_torch, ERROR_FLOOR),
             "ok": eval_error <= EVAL_ERROR_TARGET}]
    tensors = {"loss": (rel_error(loss, ref["train_loss"]), float(ref["train_loss/f32_error"]))}
    for key, grad in grads.items():
        tensors[key] = (rel_error(grad, ref[f"grad/{key}"]), float(ref[f"grad_f32_error/{key}"]))
    ratios = {key: max(ours, ERROR_FLOOR) / max(theirs, ERROR_FLOOR) for key, (ours, theirs) in tensors.items()}
    worst = max(ratios, key=ratios.get)
    rows.append({"model": label, "mode": "train", "tensor": worst, "netcl_error": tensors[worst][0],
                 "torch_f32_error": tensors[worst][1], "ratio": ratios[worst],
                 "ok": ratios[worst] <= TRAIN_RATIO_TARGET,
                 "tensors": len(tensors), "within_target": sum(r <= TRAIN_RATIO_TARGET for r in ratios.values()),
                 "median_ratio": float(np.median(list(ratios.values()))),
                 "worst_netcl_error": max(e for e, _ in tensors.values())})
    return rows


def run_model(spec: str, python: str, args, workdir: Path) -> dict:
    imported = spec.startswith("onnx:")
    name = spec.split(":", 1)[1] if imported else spec
    onnx_path = workdir / f"{name}.onnx" if imported else None
    ref = torch_reference(python, name, args, workdir, onnx_path)
    model, keys = onnx_model(onnx_path) if imported else native_model(name, args.classes)
    images, targets = synthetic_batch((args.batch, 3, args.size, args.size), args.classes)
    label = f"{name} (ONNX import)" if imported else f"nc.models.{name}"
    result = {"spec": spec, "rows": compare(label, ref, *netcl_results(model, keys, images, targets))}
    if imported and args.sgd_steps:
        losses = sgd_losses(onnx_model(onnx_path)[0], args.sgd_batch, args.sgd_size, args.classes, args.sgd_steps,
                            args.lr, args.momentum)
        result["sgd"] = {"model": label, "steps": args.sgd_steps, "batch": args.sgd_batch, "size": args.sgd_size,
                         "netcl": losses, "torch_f32": [float(v) for v in ref["sgd_losses"]],
                         "ok": losses[-1] < losses[0]}
    result["torch_version"] = str(ref["torch_version"])
    return result


def format_report(results: list, args, device_name: str) -> str:
    lines = [f"netcl on {device_name} against PyTorch {results[0]['torch_version'] if results else '?'} float64; "
             f"images {args.batch}×3×{args.size}×{args.size} (smaller than ImageNet's 224×224), {args.classes} "
             f"classes, synthetic weights and data",
             "| model | mode | worst tensor | netcl error | torch-f32 error | ratio | target |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for result in results:
        for row in result["rows"]:
            target = (f"≤ {EVAL_ERROR_TARGET:g}" if row["mode"] == "eval" else f"ratio ≤ {TRAIN_RATIO_TARGET:g}")
            extra = (f" ({row['within_target']}/{row['tensors']} tensors within, median ratio "
                     f"{row['median_ratio']:.2f})" if row["mode"] == "train" else "")
            lines.append(f"| {row['model']} | {row['mode']} | {row['tensor']} | {row['netcl_error']:.2e} | "
                         f"{row['torch_f32_error']:.2e} | {row['ratio']:.2f} | {target}: "
                         f"{'met' if row['ok'] else 'MISSED'}{extra} |")
    for result in results:
        sgd = result.get("sgd")
        if sgd:
            lines.append(f"SGD {sgd['model']}, {sgd['steps']} steps on {sgd['batch']} images of "
                         f"{sgd['size']}×{sgd['size']}: loss "
                         f"{sgd['netcl'][0]:.4f} → {sgd['netcl'][-1]:.4f} (PyTorch float32 {sgd['torch_f32'][0]:.4f}"
                         f" → {sgd['torch_f32'][-1]:.4f}): {'falls' if sgd['ok'] else 'DOES NOT FALL'}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=ALL_MODELS, help="comma-separated; onnx:NAME imports PyTorch's export")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--sgd-steps", type=int, default=50)
    parser.add_argument("--sgd-batch", type=int, default=16)
    parser.add_argument("--sgd-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--quick", action="store_true", help=f"the smallest configuration: {QUICK}")
    parser.add_argument("--torch-python", help="a Python with torch and numpy (default: NETCL_REFERENCE_PYTHON)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def run(args) -> list:
    python = reference_python(args.torch_python)
    if not has_torch(python):
        raise SystemExit(f"{python} cannot import torch: pass --torch-python or set NETCL_REFERENCE_PYTHON")
    if not settings.CONV_PLAN_MODE.is_set():
        settings.CONV_PLAN_MODE.choose("heuristic")  # numerics, not the planner's trials
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models.split(","):
            results.append(run_model(spec, python, args, Path(tmp)))
            print(format_report(results[-1:], args, nc.default_device().name).split("\n", 3)[-1], flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    results = run(args)
    print(format_report(results, args, nc.default_device().name))
    if args.json:
        args.json.write_text(json.dumps({"batch": args.batch, "size": args.size, "classes": args.classes,
                                         "device": nc.default_device().name, "results": results}, indent=1) + "\n")
    if not all(row["ok"] for r in results for row in r["rows"]) or not all(r.get("sgd", {}).get("ok", True)
                                                                           for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
