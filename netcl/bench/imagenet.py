"""`netcl bench imagenet [--model resnet18|resnet50|mobilenet_v2] [--batch 1,8,32] [--json] [--quick]`.

torchvision's ImageNet networks (nc.models.resnet18/50, mobilenet_v2) on synthetic 3×224×224 inputs:

  inference:  images/s and milliseconds per batch in eval mode, replayed by nc.training.CapturedInference
              (BatchNorm folded, activations fused, no per-layer Python);
  training:   images/s of a step (forward, cross-entropy, backward, SGD with momentum) through
              nc.training.CapturedStep, as `netcl train` runs it;
  memory:     the peak resident memory of a step over the process's resident memory before the model was
              built, in a fresh child process per configuration and framework (CPU drivers allocate device
              buffers in host memory), the peak taken after the warm-up steps; on a CPU device only;
  per layer:  every convolution's forward, backward_data and backward_weight pass with the planner's
              strategy, and every other layer's forward and forward with backward, in milliseconds on the model's own
              shapes, with the rate achieved: GFLOP/s and its share of the device's GEMM rate where the
              layer's arithmetic intensity is above the device's ridge point (GEMM rate / copy bandwidth),
              else GB/s (each tensor read or written once) and its share of the copy bandwidth; the
              backward_data of a convolution on the network's input (the stem) is marked with "*": a
              training step never runs it, as the input needs no gradient;
  references: PyTorch (the same architectures written out in PyTorch, netcl.bench.reference_worker) and
              onnxruntime (the network as an ONNX file: nc.onnx.export where netcl has it, else PyTorch's
              exporter on the same weights) each in a process of its own,
              timed in rounds whose order rotates; ratios are medians of per-round ratios (above 1: netcl
              is faster). Weights move to PyTorch through the state_dict as NumPy arrays, so both run the
              same network ("max_difference_to_torch": the largest difference of the eval-mode outputs on
              one input, relative to the largest output). PyTorch runs on the CPU unless NETCL_REFERENCE_DEVICE names
              another torch device ("cuda": netcl on a GPU against PyTorch on the same GPU). Without PyTorch
              (NETCL_REFERENCE_PYTHON may name an interpreter that has it) or onnxruntime, that comparison is
              skipped with a note.

The device's GEMM rate and copy bandwidth are those `netcl devices --bench` stored; where none are stored
they are measured first (netcl.bench.device_rates) and stored the same way.

Run as ``python -m netcl.bench.imagenet REQUEST_JSON``, this module is the child process that measures
netcl's peak memory for one configuration.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from .. import settings

MODELS = ("resnet18", "resnet50", "mobilenet_v2")
BATCHES = (1, 8, 32)
NUM_CLASSES = 1000
IMAGE_SIZE = 224
PASSES = ("forward", "backward_data", "backward_weight")
MAX_WARMUP_STEPS = 40  # a warm-up's calls at most: the planner's trials, then the recordings
PEAK_STEPS = 3
CHILD_TIMEOUT_S = 1800


def add_arguments(p) -> None:
    """The options `netcl bench imagenet` adds to `netcl bench` (netcl.cli.bench)."""
    import argparse
    p.add_argument("--model", choices=MODELS, default=None, help="imagenet: one model (default: all three)")
    p.add_argument("--batch", type=parse_batches, default=None,
                   help="imagenet: batch sizes, comma-separated (default 1,8,32); MODEL.onnx: one batch size (default 1)")
    p.add_argument("--image-size", type=int, default=IMAGE_SIZE, help=argparse.SUPPRESS)


def parse_batches(text: str) -> tuple[int, ...]:
    """"1,8,32" -> (1, 8, 32); anything else is a bad argument (exit status 2)."""
    import argparse
    try:
        batches = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        batches = ()
    if not batches or any(b <= 0 for b in batches):
        raise argparse.ArgumentTypeError(f"--batch takes positive integers separated by commas, got {text!r}")
    return batches


# ---- netcl's workloads -------------------------------------------------------------------------------

def build_model(name: str, device, num_classes: int = NUM_CLASSES):
    import netcl as nc
    factory = getattr(nc.models, name, None)
    if factory is None:
        raise RuntimeError(f"this netcl has no nc.models.{name}")
    return factory(num_classes=num_classes, seed=0, device=device)


def _inputs(batch: int, image_size: int, device, num_classes: int = NUM_CLASSES):
    import netcl as nc
    rng = np.random.default_rng(0)
    x = nc.tensor(rng.standard_normal((batch, 3, image_size, image_size)).astype(np.float32), device=device)
    y = nc.tensor(rng.integers(0, num_classes, batch).astype(np.int64), device=device)
    return x, y


def inference_call(model, batch: int, image_size: int, device):
    """A warmed-up call running one batch of inference, replayed by CapturedInference (past its
    convolutions' trials and its recordings)."""
    import netcl as nc
    model.eval()
    infer = nc.training.CapturedInference(model)
    x, _ = _inputs(batch, image_size, device)
    for _ in range(MAX_WARMUP_STEPS):
        infer(x)
        if infer.replaying:
            break
    device.synchronize()
    return lambda: infer(x), infer.status


def training_call(model, batch: int, image_size: int, device):
    """A warmed-up training step (CapturedStep), past the planner's trials and the recordings."""
    import netcl as nc
    from ..ops import conv_online
    model.train()
    optimizer = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = nc.training.CapturedStep(model, optimizer, nc.nn.CrossEntropyLoss())
    x, y = _inputs(batch, image_size, device)
    for _ in range(MAX_WARMUP_STEPS):
        step(x, y)
        if step.replaying and not conv_online.measuring(device):
            break
    device.synchronize()
    return lambda: step(x, y), step.status


def _seconds_per_call(fn, device, seconds: float, min_reps: int) -> float:
    fn()
    device.synchronize()
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < seconds:
        fn()
        reps += 1
    device.synchronize()
    return (time.perf_counter() - start) / reps


# ---- rounds against the references --------------------------------------------------------------------

def rotate(sides: dict, rounds: int, quiet_s: float) -> dict:
    """{side: [seconds per call, one per round]}: every side measured once a round, the order rotating
    from round to round, each side starting ``quiet_s`` after the previous one ended (the references'
    thread pools keep spinning for a while after their last call)."""
    names = list(sides)
    samples = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(quiet_s)
            samples[name].append(sides[name]())
    return samples


def summarize(samples: dict, batch: int) -> dict:
    """Images/s of each side (from the median seconds) and each reference's median per-round ratio
    reference seconds / netcl seconds (above 1: netcl is faster)."""
    out = {name: {"images_per_second": batch / statistics.median(s), "seconds": s} for name, s in samples.items()}
    ours = samples["netcl"]
    for name, theirs in samples.items():
        if name != "netcl":
            out[name]["ratio"] = statistics.median(t / o for o, t in zip(ours, theirs))
    return out


# ---- peak memory -------------------------------------------------------------------------------------

def netcl_peak_memory(request: dict) -> dict:
    """Run this module as a child process measuring one configuration's peak memory (see main)."""
    env = settings.child_environment()
    done = subprocess.run([sys.executable, "-m", "netcl.bench.imagenet", json.dumps(request)], capture_output=True,
                          text=True, env=env, timeout=CHILD_TIMEOUT_S)
    for line in done.stdout.splitlines():
        if line.startswith("PEAK_MEMORY "):
            return json.loads(line[len("PEAK_MEMORY "):])
    tail = (done.stderr or done.stdout).strip()[-1500:]
    raise RuntimeError(f"the peak-memory child for {request} failed (exit {done.returncode}): {tail}")


def reference_peak_memory(python: str | None, request: dict) -> dict:
    """The reference's peak memory for one configuration, in a reference process of its own."""
    from .reference import ReferenceProcess
    with ReferenceProcess(python) as ref:
        return ref.ask(**request, peak_memory=True) if ref.has_torch else {}


def main(argv) -> int:
    """Child process: print "PEAK_MEMORY {json}" for the request (model, mode, batch, image_size)."""
    import netcl as nc
    from .reference_worker import peak_over_baseline
    request = json.loads(argv[0])
    device = nc.default_device()
    device.synchronize()  # the context and queue exist before the baseline

    def build():
        model = build_model(request["model"], device)
        make = inference_call if request["mode"] == "infer" else training_call
        call, _ = make(model, int(request["batch"]), int(request["image_size"]), device)
        return call, device.synchronize
    print("PEAK_MEMORY " + json.dumps(peak_over_baseline(build, 0, int(request.get("steps", PEAK_STEPS)))),
          flush=True)
    return 0


# ---- per layer ---------------------------------------------------------------------------------------

class _ShapeTrace:
    """Within, the leaf modules of ``model`` record (name, module, input shape, whether that input is
    ``network_input``) at each call, in call order. Training-mode forward calls every convolution and
    BatchNorm as a module (fusion folds only in inference), so the trace sees each layer's own input."""

    def __init__(self, model, network_input=None):
        self.model, self.network_input, self.calls, self._wrapped = model, network_input, [], []

    def __enter__(self):
        for name, module in self.model.named_modules():
            if next(iter(module.children()), None) is not None:
                continue
            original = module.forward

            def traced(x, *args, _name=name, _module=module, _original=original, **kwargs):
                self.calls.append((_name, _module, tuple(x.shape), x is self.network_input))
                return _original(x, *args, **kwargs)
            object.__setattr__(module, "forward", traced)
            self._wrapped.append(module)
        return self

    def __exit__(self, *exc):
        for module in self._wrapped:
            object.__delattr__(module, "forward")


def _rate(flops: float, nbytes: float, ms: float, rates: dict) -> dict:
    """GFLOP/s against the GEMM rate where the work is compute-bound on this device, else GB/s against the
    copy bandwidth (roofline: the ridge point is GEMM rate / copy bandwidth, in FLOP per byte)."""
    gemm, copy = rates.get("gemm_gflops"), rates.get("copy_gbps")
    seconds = ms / 1e3
    compute_bound = flops > 0 and gemm and copy and flops / nbytes >= gemm / copy
    if compute_bound:
        gflops = flops / seconds / 1e9
        return {"gflops": gflops, "bound": "compute", "share": gflops / gemm}
    gbps = nbytes / seconds / 1e9
    return {"gbps": gbps, "bound": "memory", "share": gbps / copy if copy else None}


def _conv_rows(name, conv, input_shape, device, rates, repeats: int, reads_network_input: bool = False) -> list:
    """The three passes of one convolution. A convolution on the network's input (the stem) needs no
    backward_data in training, as nothing upstream needs a gradient: that row is timed all the same but
    marked ``"in_training": False``."""
    from ..ops.conv2d import strategy_for
    from ..ops.conv2d_planner import pass_runners
    from ..ops.conv_common import ConvLayer
    from ..runtime.timing import sample
    layer = ConvLayer.from_shapes(input_shape, conv.weight.shape, conv.stride, conv.padding, conv.dilation,
                                  conv.groups, str(conv.weight.dtype))
    nbytes = layer.itemsize * sum(int(np.prod(s)) for s in (layer.input_shape, layer.weight_shape,
                                                               layer.output_shape))
    rows = []
    for pass_ in PASSES:
        impl = strategy_for(layer, pass_, conv.strategy, device)
        run = pass_runners({impl.name: impl}, layer, pass_, device)[impl.name]
        ms = sample(run, device, repeats=repeats, warmup=1).ms
        rows.append({"name": name, "pass": pass_, "strategy": impl.name, "ms": ms,
                     "in_training": not (reads_network_input and pass_ == "backward_data"),
                     "shape": f"{layer.input_shape}*{layer.weight_shape}/s{conv.stride[0]}",
                     **_rate(layer.flops, nbytes, ms, rates)})
    return rows


def _module_rows(name, module, input_shape, device, rates, repeats: int) -> list:
    """Forward, and forward with backward, of a non-convolution layer on random data (a difference of
    the two would be noise for layers whose backward costs little more than a launch)."""
    import netcl as nc
    from ..runtime.timing import sample
    rng = np.random.default_rng(0)
    x = nc.tensor(rng.standard_normal(input_shape).astype(np.float32), device=device, requires_grad=True)
    out = module(x)
    grad = nc.tensor(rng.standard_normal(out.shape).astype(np.float32), device=device)

    def both():
        x.grad = None
        module(x).backward(grad)
    weight = getattr(module, "weight", None)
    params = int(np.prod(weight.shape)) if weight is not None else 0
    nbytes = 4 * (x.size + out.size + params)
    flops = 2 * x.shape[0] * params if isinstance(module, nc.nn.Linear) else 0
    kind = "gemm" if flops else type(module).__name__
    rows = []
    for pass_, fn, work in (("forward", lambda: module(x), 1), ("forward+backward", both, 3)):
        ms = sample(fn, device, repeats=repeats, warmup=1).ms
        rows.append({"name": name, "pass": pass_, "strategy": kind, "ms": ms,
                     **_rate(work * flops, work * nbytes, ms, rates)})
    for p in module.parameters():
        p.grad = None
    return rows


def layer_rows(model, batch: int, image_size: int, device, rates: dict, repeats: int) -> list:
    """Every traced layer's passes (see the module docstring), in forward order."""
    import netcl as nc
    model.train()
    x, _ = _inputs(batch, image_size, device)
    with _ShapeTrace(model, x) as trace, nc.no_grad():
        model(x)
    rows, seen = [], set()
    for name, module, shape, reads_network_input in trace.calls:
        if name in seen or type(module).__name__ in ("Flatten", "Dropout", "Identity"):
            continue
        seen.add(name)
        if isinstance(module, nc.nn.Conv2d):
            rows += _conv_rows(name, module, shape, device, rates, repeats, reads_network_input)
        else:
            rows += _module_rows(name, module, shape, device, rates, repeats)
    for p in model.parameters():
        p.grad = None
    return rows


def device_rates(device) -> dict:
    from ..runtime.device_figures import store_figures, stored_figures
    from .device_rates import measure
    figures = stored_figures(device)
    if not figures.get("gemm_gflops") or not figures.get("copy_gbps"):
        figures = store_figures(device, measure(device), "netcl bench imagenet")
    return {k: figures.get(k) for k in ("gemm_gflops", "copy_gbps", "measured_at", "source")}


# ---- the benchmark -----------------------------------------------------------------------------------

def _onnx_file(model, batch: int, image_size: int, device, folder: str, ref, request: dict):
    """(path of the model as an ONNX file, who exported it) or (None, why there is none): nc.onnx.export
    where this netcl has it, else PyTorch's exporter on the same weights in the reference process."""
    path = os.path.join(folder, f"{request['model']}-b{batch}.onnx")
    try:
        from .. import onnx as nc_onnx
    except ImportError:
        nc_onnx = None
    try:
        if nc_onnx is not None:
            model.eval()
            nc_onnx.export(model, _inputs(batch, image_size, device)[0], path, dynamic_batch=False)
            return path, "nc.onnx.export"
        if ref.has_torch:
            ref.ask(**dict(request, export_onnx=path))
            return path, f"torch.onnx.export (PyTorch {ref.torch_version})"
    except Exception as exc:  # the comparison is optional: say why it is missing and go on
        return None, f"onnxruntime not compared: the export failed ({type(exc).__name__}: {exc})"
    return None, "onnxruntime not compared: no ONNX exporter (this netcl has no nc.onnx.export, and no PyTorch)"


def run(args):
    import netcl as nc
    from .reference import QUIET_SECONDS, ReferenceProcess
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    models = (args.model,) if getattr(args, "model", None) else MODELS
    batches = getattr(args, "batch", None) or (BATCHES[:1] if quick else BATCHES)
    image_size = int(getattr(args, "image_size", IMAGE_SIZE) or IMAGE_SIZE)
    rounds = 1 if quick else 3
    seconds, min_reps = (0.0, 1) if quick else (1.0, 2)
    repeats = getattr(args, "repeat", None) or (2 if quick else 5)
    rates = device_rates(device)
    result = {"benchmark": "imagenet", "device": device.describe(), "image_size": image_size, "rounds": rounds,
              "device_rates": rates, "notes": [], "results": []}
    torch_python = settings.REFERENCE_PYTHON.get() or sys.executable
    with ReferenceProcess() as ref, ReferenceProcess(sys.executable) as ort, \
            tempfile.TemporaryDirectory(prefix="netcl-bench-imagenet-") as folder:
        result["torch_version"] = ref.torch_version
        result["torch_device"] = ref.info.get("torch_device")
        if not ref.has_torch:
            result["notes"].append(ref.missing_torch_note())
        measures_memory = device.kind == "cpu"  # a CPU driver's buffers are in the process's memory
        if not measures_memory:
            result["notes"].append(f"peak memory not measured: a {device.kind}'s buffers are not in the process's "
                                   f"resident memory")
        has_ort = bool(ort.info.get("onnxruntime"))
        if not has_ort:
            result["notes"].append("onnxruntime not compared: not installed (pip install onnxruntime)")
        for name in models:
            model = build_model(name, device)
            weights = os.path.join(folder, f"{name}.npz")
            np.savez(weights, **{k: v.to_host() for k, v in model.state_dict().items()})
            agreement = _agreement_with_torch(model, name, image_size, device, ref, weights, folder)
            for batch in batches:
                entry = _measure(name, model, batch, image_size, device, ref, ort if has_ort else None, weights,
                                 folder, rounds, seconds, min_reps, QUIET_SECONDS, result["notes"])
                if measures_memory:
                    entry.update(_peak_memory(name, batch, image_size, torch_python, ref.has_torch, weights))
                entry.update(agreement)
                entry["layers"] = layer_rows(model, batch, image_size, device, rates, repeats)
                result["results"].append(entry)
            del model
    result["notes"] = sorted(set(result["notes"]))
    _print(result)
    return result if getattr(args, "json", False) else None


def _agreement_with_torch(model, name, image_size, device, ref, weights, folder) -> dict:
    """How closely the two frameworks' eval-mode outputs agree on one input ({} without PyTorch): the
    check that the weights moved and both run the same network."""
    import netcl as nc
    if not ref.has_torch:
        return {}
    x = np.random.default_rng(1).standard_normal((2, 3, image_size, image_size)).astype(np.float32)
    path = os.path.join(folder, f"{name}-input.npy")
    np.save(path, x)
    theirs = np.load(ref.ask(model=name, image_size=image_size, num_classes=NUM_CLASSES, weights=weights,
                             predict=path)["output"])
    model.eval()
    with nc.no_grad():
        ours = model(nc.tensor(x, device=device)).to_host()
    scale = float(np.max(np.abs(theirs))) or 1.0
    return {"max_difference_to_torch": float(np.max(np.abs(ours - theirs))) / scale}


def _measure(name, model, batch, image_size, device, ref, ort, weights, folder, rounds, seconds, min_reps,
             quiet_s, notes) -> dict:
    """Inference and training images/s of one configuration against the references, in rotating rounds."""
    entry = {"model": name, "batch": batch, "image_size": image_size}
    request = {"model": name, "batch": batch, "image_size": image_size, "num_classes": NUM_CLASSES,
               "weights": weights, "seconds": seconds, "min_reps": min_reps}
    for mode, make in (("infer", inference_call), ("train", training_call)):
        call, status = make(model, batch, image_size, device)
        sides = {"netcl": lambda: _seconds_per_call(call, device, seconds, min_reps)}
        if ref.has_torch:
            sides["torch"] = lambda: ref.seconds(**dict(request, mode=mode))
        if mode == "infer" and ort is not None:
            path, how = _onnx_file(model, batch, image_size, device, folder, ref, request)
            if path is None:
                notes.append(how)
            else:
                entry["onnx_exported_by"] = how
                sides["onnxruntime"] = lambda: ort.seconds(model="onnx", path=path, mode="infer", batch=batch,
                                                           input_shape=[batch, 3, image_size, image_size],
                                                           seconds=seconds, min_reps=min_reps)
        figures = summarize(rotate(sides, rounds, quiet_s), batch)
        key = "inference" if mode == "infer" else "training"
        entry[f"{key}_images_per_second"] = figures["netcl"]["images_per_second"]
        entry[f"{key}_status"] = status
        if mode == "infer":
            entry["inference_ms_per_batch"] = 1e3 * batch / figures["netcl"]["images_per_second"]
        for reference in ("torch", "onnxruntime"):
            if reference in figures:
                entry[f"{reference}_{key}_images_per_second"] = figures[reference]["images_per_second"]
                entry[f"{key}_ratio_to_{reference}"] = figures[reference]["ratio"]
        del call
    model.eval()
    return entry


def _peak_memory(name, batch, image_size, torch_python, has_torch, weights) -> dict:
    out = {}
    for mode, key in (("train", "peak_memory_bytes"), ("infer", "inference_peak_memory_bytes")):
        request = {"model": name, "mode": mode, "batch": batch, "image_size": image_size}
        ours = netcl_peak_memory(request)
        out[key] = ours["peak_memory_bytes"]
        out.setdefault("peak_memory_after_warmup", ours["peak_reset"])
        if has_torch:
            theirs = reference_peak_memory(torch_python, dict(request, num_classes=NUM_CLASSES, weights=weights))
            if theirs:
                out[f"torch_{key}"] = theirs["peak_memory_bytes"]
                out[f"{key.replace('_bytes', '')}_ratio_to_torch"] = (ours["peak_memory_bytes"]
                                                                      / max(theirs["peak_memory_bytes"], 1))
    return out


# ---- printing ----------------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print(r) -> None:
    out = sys.stdout
    rates = r["device_rates"]
    print(f"ImageNet models at 3x{r['image_size']}x{r['image_size']} on {r['device']} (GEMM "
          f"{_fmt(rates.get('gemm_gflops'), '.0f')} GFLOP/s, copy {_fmt(rates.get('copy_gbps'), '.1f')} GB/s)",
          file=out)
    print(f"  {'model':<14}{'batch':>6}{'infer img/s':>13}{'ms/batch':>10}{'PyTorch':>9}{'ratio':>7}{'ORT':>8}"
          f"{'ratio':>7}{'train img/s':>13}{'PyTorch':>9}{'ratio':>7}{'peak MB':>9}{'PyTorch':>9}", file=out)
    for e in r["results"]:
        mb = lambda key: None if e.get(key) is None else e[key] / 2 ** 20  # noqa: E731
        print(f"  {e['model']:<14}{e['batch']:>6}{e['inference_images_per_second']:>13.1f}"
              f"{e['inference_ms_per_batch']:>10.1f}{_fmt(e.get('torch_inference_images_per_second'), '9.1f')}"
              f"{_fmt(e.get('inference_ratio_to_torch'), '7.2f')}"
              f"{_fmt(e.get('onnxruntime_inference_images_per_second'), '8.1f')}"
              f"{_fmt(e.get('inference_ratio_to_onnxruntime'), '7.2f')}{e['training_images_per_second']:>13.1f}"
              f"{_fmt(e.get('torch_training_images_per_second'), '9.1f')}"
              f"{_fmt(e.get('training_ratio_to_torch'), '7.2f')}{_fmt(mb('peak_memory_bytes'), '9.0f')}"
              f"{_fmt(mb('torch_peak_memory_bytes'), '9.0f')}", file=out)
    where = f"; PyTorch {r['torch_version']} on {r['torch_device']}" if r.get("torch_version") else ""
    print(f"  (ratios: medians over {r['rounds']} rotating rounds, reference time / netcl time; peak memory of "
          f"a training step over the process's baseline{where})", file=out)
    for note in r["notes"]:
        print(f"  ({note})", file=out)
    for model, difference in {e["model"]: e.get("max_difference_to_torch") for e in r["results"]}.items():
        if difference is not None:
            print(f"  ({model}: eval outputs within {difference:.1e} of PyTorch's on the same weights, relative to "
                  f"the largest output)", file=out)
    for e in r["results"]:
        print(f"per layer, {e['model']} at batch {e['batch']} (share: of the GEMM rate where compute-bound, of "
              f"the copy bandwidth where memory-bound)", file=out)
        print(f"  {'layer':<28}{'pass':<17}{'strategy':<16}{'ms':>9}{'rate':>14}{'share':>7}", file=out)
        for row in e["layers"]:
            rate = (f"{row['gflops']:.1f} GFLOP/s" if "gflops" in row else f"{row['gbps']:.1f} GB/s")
            pass_ = row["pass"] + ("*" if row.get("in_training") is False else "")
            print(f"  {row['name']:<28}{pass_:<17}{row['strategy']:<16}{row['ms']:>9.3f}{rate:>14}"
                  f"{_fmt(row['share'], '7.0%')}", file=out)
        forward_ms = sum(row["ms"] for row in e["layers"] if row["pass"] == "forward")
        print(f"  (the layers' forward passes one by one, BatchNorm unfolded: {forward_ms:.1f} ms in all; the "
              f"replayed inference: {e['inference_ms_per_batch']:.1f} ms per batch)", file=out)
        if any(row.get("in_training") is False for row in e["layers"]):
            print("  (*: not run in a training step: the network's input needs no gradient)", file=out)
    out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
