"""Export torchvision's classification families to ONNX with PyTorch, as outside reference files for
benchmarks/onnx_families.py (which runs them in netcl without importing torch).

Runs in a Python environment with PyTorch, onnx, onnxruntime and Pillow, NOT netcl's:

    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch onnx onnxruntime pillow
    /work/venv-torch/bin/python benchmarks/torchvision_onnx/export_families.py \
        --torchvision-src DIR --out /work/onnx-families [--families resnet18,vgg11] [--opset 17]

DIR is a directory holding torchvision's Python sources (a checkout of pytorch/vision, or the .py files
of a torchvision wheel unpacked: ``unzip torchvision-*.whl 'torchvision/*.py' -d DIR``). Only the model
definitions are used: the compiled extension (torchvision._C) is never loaded, so the sources need not
match the installed PyTorch's build. The repository does not carry torchvision's code.

For each family: the model is built with random weights (a fixed seed), put in eval mode and exported
at the opset asked for with a symbolic batch dimension; random inputs at batch 1 and 4 are saved with
onnxruntime's outputs for them and PyTorch's own outputs:

    OUT/NAME.onnx  OUT/NAME.b1.input.npy  OUT/NAME.b1.ort.npy  OUT/NAME.b1.torch.npy  (and .b4.)
    OUT/manifest.json   the families, their input shapes, the exporter used and the torch version
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types

import numpy as np

# name -> (module file in torchvision/models, constructor, input size)
FAMILIES = {
    "resnet18": ("resnet", "resnet18", 224),
    "resnext50_32x4d": ("resnet", "resnext50_32x4d", 224),
    "wide_resnet50_2": ("resnet", "wide_resnet50_2", 224),
    "mobilenet_v2": ("mobilenetv2", "mobilenet_v2", 224),
    "mobilenet_v3_small": ("mobilenetv3", "mobilenet_v3_small", 224),
    "mobilenet_v3_large": ("mobilenetv3", "mobilenet_v3_large", 224),
    "efficientnet_b0": ("efficientnet", "efficientnet_b0", 224),
    "regnet_y_400mf": ("regnet", "regnet_y_400mf", 224),
    "squeezenet1_1": ("squeezenet", "squeezenet1_1", 224),
    "shufflenet_v2_x1_0": ("shufflenetv2", "shufflenet_v2_x1_0", 224),
    "densenet121": ("densenet", "densenet121", 224),
    "googlenet": ("googlenet", "googlenet", 224),
    "vgg11": ("vgg", "vgg11", 224),
    "alexnet": ("alexnet", "alexnet", 224),
    "mnasnet1_0": ("mnasnet", "mnasnet1_0", 224),
}
BATCHES = (1, 4)


def _package_shell(name: str, path: str) -> types.ModuleType:
    """A package whose submodules import from ``path`` without running its __init__.py (torchvision's
    imports the compiled extension, datasets, io ...)."""
    module = types.ModuleType(name)
    module.__path__ = [path]
    module.__package__ = name
    sys.modules[name] = module
    return module


def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torchvision_models(src: str) -> dict[str, types.ModuleType]:
    """torchvision's model modules loaded from the sources under ``src``, by module file name."""
    root = os.path.join(src, "torchvision")
    if not os.path.isfile(os.path.join(root, "models", "resnet.py")):
        raise SystemExit(f"{src} holds no torchvision/models/resnet.py: pass a torchvision source directory")
    _package_shell("torchvision", root)
    transforms = _package_shell("torchvision.transforms", os.path.join(root, "transforms"))
    ops = _package_shell("torchvision.ops", os.path.join(root, "ops"))
    _package_shell("torchvision.models", os.path.join(root, "models"))
    # the names the model files take from these packages' __init__ files
    functional = _load("torchvision.transforms.functional", os.path.join(root, "transforms", "functional.py"))
    transforms.functional = functional
    transforms.InterpolationMode = functional.InterpolationMode
    ops.StochasticDepth = _load("torchvision.ops.stochastic_depth",
                                os.path.join(root, "ops", "stochastic_depth.py")).StochasticDepth
    files = sorted({module for module, _, _ in FAMILIES.values()})
    return {f: _load(f"torchvision.models.{f}", os.path.join(root, "models", f + ".py")) for f in files}


def export_family(torch, name: str, modules, out: str, opset: int, rng) -> dict:
    module_file, constructor, size = FAMILIES[name]
    torch.manual_seed(0)
    kwargs = {"weights": None}
    if name == "googlenet":  # the auxiliary classifiers only exist in training; init_weights needs scipy
        kwargs.update(aux_logits=False, init_weights=False)
    model = getattr(modules[module_file], constructor)(**kwargs).eval()
    _randomize_batchnorm(torch, model)
    path = os.path.join(out, name + ".onnx")
    example = torch.from_numpy(rng.standard_normal((1, 3, size, size)).astype(np.float32))
    start = time.perf_counter()
    exporter = _export(torch, model, example, path, opset)
    entry = {"name": name, "file": name + ".onnx", "input_shape": [3, size, size], "opset": opset,
             "exporter": exporter, "export_s": round(time.perf_counter() - start, 2), "batches": {}}
    import onnxruntime as ort
    runtime = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    input_name = runtime.get_inputs()[0].name
    for batch in BATCHES:
        x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        (y_ort,) = runtime.run(None, {input_name: x})
        with torch.no_grad():
            y_torch = model(torch.from_numpy(x)).numpy()
        stem = os.path.join(out, f"{name}.b{batch}")
        np.save(stem + ".input.npy", x)
        np.save(stem + ".ort.npy", y_ort)
        np.save(stem + ".torch.npy", y_torch)
        entry["batches"][str(batch)] = {
            "input": os.path.basename(stem + ".input.npy"), "ort": os.path.basename(stem + ".ort.npy"),
            "torch": os.path.basename(stem + ".torch.npy"),
            "ort_vs_torch_max_rel": float(np.abs(y_ort - y_torch).max() / max(np.abs(y_torch).max(), 1e-30))}
    return entry


def _randomize_batchnorm(torch, model) -> None:
    """Running statistics and affine terms away from their initial 0/1, so that an importer which ignored
    them would be caught (a fresh model's BatchNorm is the identity in eval mode)."""
    generator = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(0.1 * torch.randn(c, generator=generator))
                m.running_var.copy_(0.5 + torch.rand(c, generator=generator))
                if m.affine:
                    m.weight.copy_(0.5 + torch.rand(c, generator=generator))
                    m.bias.copy_(0.1 * torch.randn(c, generator=generator))


def _export(torch, model, example, path: str, opset: int) -> str:
    """torch.onnx.export with a symbolic batch through the TorchScript exporter (``dynamo=False``: the
    graphs users have been exporting for years; the dynamo exporter needs onnxscript). Returns its name."""
    torch.onnx.export(model, (example,), path, opset_version=opset, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
    return "torchscript"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchvision-src", required=True, help="directory holding torchvision/models/*.py")
    parser.add_argument("--out", required=True, help="directory for the .onnx and .npy files")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated names")
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    import onnx
    import torch
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    os.makedirs(args.out, exist_ok=True)
    modules = torchvision_models(args.torchvision_src)
    rng = np.random.default_rng(0)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {"torch": torch.__version__, "onnx": onnx.__version__, "families": {}}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest["families"] = json.load(f).get("families", {})
    for name in names:
        entry = export_family(torch, name, modules, args.out, args.opset, rng)
        onnx.checker.check_model(os.path.join(args.out, entry["file"]))
        manifest["families"][name] = entry
        print(f"{name:22s} exported in {entry['export_s']:6.2f} s; onnxruntime vs torch max rel "
              + ", ".join(f"b{b}: {v['ort_vs_torch_max_rel']:.2e}" for b, v in entry["batches"].items()), flush=True)
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
