"""The PyTorch side of benchmarks/torch_agreement.py. Runs in an environment with torch and numpy, never
netcl's (the torchvision architectures come written out in plain PyTorch from
tests/fixtures/make_torchvision_fixtures.py, weights and data from tests/torchvision_reference.py):

    python benchmarks/torch_agreement_worker.py --model resnet18 --batch 2 --size 64 --classes 10 --out REF.npz
        [--onnx MODEL.onnx] [--sgd-steps 50 --sgd-batch 16 --sgd-size 64 --lr 0.01 --momentum 0.9]

Writes to REF.npz PyTorch's float64 results on the synthetic weights and batch (eval logits, a training
step's loss and every parameter's gradient, keyed by state_dict name) with the relative L2 error of its own
float32 run against them; with --onnx, also exports the float32 model (eval mode, BatchNormalization kept as
nodes so the import trains, initializers named as the state_dict); with --sgd-steps, the float32 losses of
that many SGD steps on a batch of --sgd-batch synthetic images of --sgd-size.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
sys.path.insert(0, str(REPO / "tests"))

import make_torchvision_fixtures as tv  # noqa: E402
import torchvision_reference as ref  # noqa: E402


def model_kwargs(model: str, classes: int) -> dict:
    return {"num_classes": classes, **({"dropout": 0.0} if model == "mobilenet_v2" else {})}


def build(model: str, classes: int, dtype=torch.float32):
    kwargs = model_kwargs(model, classes)
    net = tv.BUILDERS[model](**kwargs)
    state = ref.synthetic_state(tv.key_shapes(net), ref.model_seed(model))
    net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return net.to(dtype)


def export_onnx(model: str, classes: int, size: int, path: Path) -> None:
    """Eval mode with TrainingMode.PRESERVE: the exporter then keeps BatchNormalization as nodes instead of
    folding it into the convolutions (as TrainingMode.EVAL does), which a model to fine-tune needs."""
    net = build(model, classes).eval()
    example = torch.zeros(1, 3, size, size)
    torch.onnx.export(net, example, str(path), opset_version=17, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False, dynamo=False)


def sgd_losses(model: str, classes: int, batch: int, size: int, steps: int, lr: float, momentum: float) -> list:
    net = build(model, classes).train()
    images, targets = ref.synthetic_batch((batch, 3, size, size), classes)
    x, y = torch.from_numpy(images), torch.from_numpy(targets)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=sorted(tv.BUILDERS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--onnx", type=Path)
    parser.add_argument("--sgd-steps", type=int, default=0)
    parser.add_argument("--sgd-batch", type=int, default=16)
    parser.add_argument("--sgd-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args(argv)
    images, targets = ref.synthetic_batch((args.batch, 3, args.size, args.size), args.classes)
    results = tv.reference(args.model, model_kwargs(args.model, args.classes), ref.model_seed(args.model),
                           images, targets, None)
    results["torch_version"] = np.array(torch.__version__)
    if args.onnx:
        export_onnx(args.model, args.classes, args.size, args.onnx)
    if args.sgd_steps:
        results["sgd_losses"] = np.array(sgd_losses(args.model, args.classes, args.sgd_batch, args.sgd_size,
                                                    args.sgd_steps, args.lr, args.momentum))
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
