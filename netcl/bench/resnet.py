"""`netcl bench resnet [--json] [--quick]`: ResNet-20 (He et al.'s CIFAR network) on 3x32x32 inputs.

  training:   iterations/s (forward + backward + SGD step with momentum, data already on the device) and
              inference images/s (eval mode, no grad) at batch 32, 64 and 128;
  per layer:  forward and forward+backward milliseconds of every convolution and BatchNorm and of each
              whole residual block at batch 64, run one after the other on real activations;
  reference:  PyTorch's ResNet-20 in a process of its own (netcl.bench.reference), timed in alternating
              rounds with netcl; the median of the per-round ratios is reported. Without PyTorch the
              comparison is skipped with a note (NETCL_REFERENCE_PYTHON may name an interpreter with it).
"""
from __future__ import annotations

import sys

import numpy as np

from .lenet import _timed

BATCHES = (32, 64, 128)
LAYER_BATCH = 64
QUICK_BATCHES = (32,)


def _model(device):
    import netcl as nc
    if not hasattr(nc.models, "resnet20"):
        raise RuntimeError("this netcl has no nc.models.resnet20 yet")
    nc.manual_seed(0)
    return nc.models.resnet20(num_classes=10, in_channels=3).to(device)


def _inputs(batch: int, device):
    import netcl as nc
    rng = np.random.default_rng(0)
    x = nc.tensor(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), device=device)
    y = nc.tensor(rng.integers(0, 10, batch).astype(np.int64), device=device)
    return x, y


def _train_step(batch: int, device):
    import netcl as nc
    model = _model(device)
    model.train()
    opt = nc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nc.nn.CrossEntropyLoss()
    x, y = _inputs(batch, device)

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def _infer(batch: int, device):
    import netcl as nc
    model = _model(device)
    model.eval()
    x, _ = _inputs(batch, device)

    def infer():
        with nc.no_grad():
            model(x)
    return infer


def _units(model):
    """(name, callable) in forward order: the stem, every block's layers and the block itself, the head."""
    import netcl as nc
    F = nc.nn.functional
    units = [("conv1", model.conv1), ("bn1 + relu", lambda h: F.relu(model.bn1(h)))]
    for stage in ("layer1", "layer2", "layer3"):
        for index, block in getattr(model, stage).named_children():
            prefix = f"{stage}.{index}"
            downsample = getattr(block, "downsample", None)
            parts = [(f"{prefix}.conv1", block.conv1), (f"{prefix}.bn1 + relu", lambda h, b=block: F.relu(b.bn1(h))),
                     (f"{prefix}.conv2", block.conv2), (f"{prefix}.bn2", block.bn2)]
            if downsample is not None:
                parts.append((f"{prefix}.downsample", downsample))
            units.append((prefix, block, parts))
    units.append(("avgpool + fc", lambda h: model.fc(F.adaptive_avg_pool2d(h, 1).reshape(h.shape[0], -1))))
    return units


def _forward_backward_ms(fn, inp, device, seconds: float):
    import netcl as nc
    leaf = inp.detach().requires_grad_(True)
    forward = _timed(lambda: fn(leaf), device, seconds, 3, 200)
    out = fn(leaf)
    grad = nc.tensor(np.ones(out.shape, np.float32), device=device)

    def both():
        leaf.grad = None
        fn(leaf).backward(grad)
    total = _timed(both, device, seconds, 3, 200)
    return {"forward": 1e3 * forward, "backward": 1e3 * max(total - forward, 0.0)}, out.detach()


def layer_times(device, batch: int, seconds: float) -> dict:
    """{name: {"forward": ms, "backward": ms}} for every unit of _units, on real activations."""
    model = _model(device)
    model.train()
    h, _ = _inputs(batch, device)
    times = {}
    for unit in _units(model):
        if len(unit) == 2:
            name, fn = unit
            times[name], h = _forward_backward_ms(fn, h, device, seconds)
            continue
        name, block, parts = unit
        inner = h
        for part_name, fn in parts:
            source = h if part_name.endswith("downsample") else inner
            times[part_name], out = _forward_backward_ms(fn, source, device, seconds)
            if not part_name.endswith("downsample"):
                inner = out
        times[name], h = _forward_backward_ms(block, h, device, seconds)
    for model_parameter in model.parameters():
        model_parameter.grad = None
    return times


def run(args):
    import netcl as nc
    from .reference import ReferenceProcess, compare
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    batches = QUICK_BATCHES if quick else BATCHES
    seconds, rounds = (0.3, 2) if quick else (1.5, 5)
    min_reps = getattr(args, "repeat", None) or (1 if quick else 3)
    result = {"benchmark": "resnet", "model": "resnet20", "input": [3, 32, 32], "device": device.describe(),
              "rounds": rounds, "train_iterations_per_second": {}, "inference_images_per_second": {},
              "torch_iterations_per_second": {}, "torch_inference_images_per_second": {}, "ratio_to_torch": {},
              "inference_ratio_to_torch": {}}
    with ReferenceProcess() as ref:
        result["torch_version"] = ref.torch_version
        if not ref.has_torch:
            result["torch_note"] = ref.missing_torch_note()
        for batch in batches:
            for mode, build in (("train", _train_step), ("infer", _infer)):
                call = build(batch, device)
                r = compare(lambda: _timed(call, device, seconds, min_reps, 10_000), ref,
                             {"model": "resnet20", "mode": mode, "batch": batch, "seconds": seconds,
                              "min_reps": min_reps}, rounds)
                if mode == "train":
                    result["train_iterations_per_second"][batch] = 1.0 / r["netcl_seconds"]
                else:
                    result["inference_images_per_second"][batch] = batch / r["netcl_seconds"]
                if "ratio" in r:
                    key = "torch_iterations_per_second" if mode == "train" else "torch_inference_images_per_second"
                    result[key][batch] = (1.0 if mode == "train" else batch) / r["reference_seconds"]
                    result["ratio_to_torch" if mode == "train" else "inference_ratio_to_torch"][batch] = r["ratio"]
                del call
    layer_batch = batches[0] if quick else LAYER_BATCH
    result["layer_batch"] = layer_batch
    result["layers_ms"] = layer_times(device, layer_batch, seconds / 6)
    _print(result, batches)
    return result if getattr(args, "json", False) else None


def _row(label: str, values: dict, batches, fmt: str) -> str:
    return f"  {label:<24}" + "".join(f"{values[b]:>11{fmt}}" if b in values else f"{'-':>11}" for b in batches)


def _print(r, batches) -> None:
    out = sys.stdout
    print(f"ResNet-20 at 3x32x32 on {r['device']}", file=out)
    print(f"  {'batch':<24}" + "".join(f"{b:>11}" for b in batches), file=out)
    print(_row("netcl training it/s", r["train_iterations_per_second"], batches, ".2f"), file=out)
    print(_row("netcl inference images/s", r["inference_images_per_second"], batches, ".0f"), file=out)
    if r["ratio_to_torch"]:
        print(_row("PyTorch training it/s", r["torch_iterations_per_second"], batches, ".2f"), file=out)
        print(_row("PyTorch inference img/s", r["torch_inference_images_per_second"], batches, ".0f"), file=out)
        print(_row("training netcl/PyTorch", r["ratio_to_torch"], batches, ".2f"), file=out)
        print(_row("inference netcl/PyTorch", r["inference_ratio_to_torch"], batches, ".2f"), file=out)
        print(f"  (PyTorch {r['torch_version']} in its own process; ratios are medians over {r['rounds']} "
              "alternating rounds)", file=out)
    else:
        print(f"  ({r['torch_note']})", file=out)
    print(f"per-layer milliseconds at batch {r['layer_batch']} (training mode; backward = forward+backward - forward)",
          file=out)
    print(f"  {'layer':<26}{'forward':>10}{'backward':>10}", file=out)
    for name, t in r["layers_ms"].items():
        print(f"  {name:<26}{t['forward']:>10.2f}{t['backward']:>10.2f}", file=out)
    out.flush()
