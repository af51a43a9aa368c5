"""`netcl bench lenet [--json] [--quick]`: LeNet speed in the layout of Hao Zhang's report.

  Table 3 layout: training iterations/s (forward + backward + SGD step, data already on the device) at
                  batch 32, 64, 128 and 256, as written and replayed (nc.training.CapturedStep, what
                  `netcl train` runs), and inference images/s at batch 256;
  Table 4 layout: forward and backward milliseconds of every layer at batch 128;
  first step:     seconds from `import netcl` to the first finished training step in a fresh process,
                  with a cold kernel cache (empty NETCL_CACHE_DIR, POCL_KERNEL_CACHE=0) and a warm one.
When PyTorch is available the same model runs in a process of its own (netcl.bench.reference), timed in
alternating rounds with netcl, and the median of the per-round ratios netcl / PyTorch is printed for every
batch size (PyTorch is not a dependency of netcl; NETCL_REFERENCE_PYTHON may name an interpreter that has
it). Without it the comparison is skipped with a note.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .. import settings

BATCHES = (32, 64, 128, 256)
LAYER_BATCH = 128
INFER_BATCH = 256

_FIRST_STEP = r"""
import time
t0 = time.perf_counter()
import numpy as np
import netcl as nc
model = nc.models.lenet(seed=0)
opt = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = nc.tensor(np.random.default_rng(0).standard_normal((64, 1, 28, 28)).astype(np.float32))
y = nc.tensor(np.arange(64) % 10)
loss = nc.nn.CrossEntropyLoss()(model(x), y)
loss.backward()
opt.step()
loss.item()
print("FIRST_STEP", time.perf_counter() - t0)
"""


def _sync(device) -> None:
    device.queue.finish()


# Calls a warm-up may take while training's conv plans are still being measured (netcl.ops.conv_online:
# up to four candidates, three runs each, per layer and pass).
MAX_WARMUP_CALLS = 64


def _timed(fn, device, min_seconds: float, min_reps: int, max_reps: int):
    """Mean seconds per call of fn after warming up (one call, then more until no conv plan of this
    device is still being measured), at least min_reps calls or min_seconds."""
    from ..ops import conv_online
    fn()
    for _ in range(MAX_WARMUP_CALLS):
        if not conv_online.measuring(device):
            break
        fn()
    _sync(device)
    reps, start = 0, time.perf_counter()
    while reps < min_reps or (time.perf_counter() - start < min_seconds and reps < max_reps):
        fn()
        reps += 1
    _sync(device)
    return (time.perf_counter() - start) / reps


def _netcl_train_step(batch: int, device, replay: bool = False):
    """The step PyTorch's reference times; with ``replay``, through nc.training.CapturedStep (what
    ``netcl train`` runs), which replays a recorded step from the fifth call on."""
    import netcl as nc
    model = nc.models.lenet(seed=0, device=device)
    opt = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nc.nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = nc.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device=device)
    y = nc.tensor(rng.integers(0, 10, batch), device=device)
    if replay:
        captured = nc.training.CapturedStep(model, opt, loss_fn)
        return (lambda: captured(x, y)), model, x

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step, model, x


def _layer_times(model, x, device, seconds: float):
    """{layer: (forward ms, backward ms)} running the model layer by layer on real activations."""
    import netcl as nc
    out = {}
    h = x
    for name, layer in model.named_layers():
        inp = h.detach().requires_grad_(True) if h.dtype.kind == "f" else h
        fwd = _timed(lambda: layer(inp), device, seconds, 3, 200)
        y = layer(inp)
        gy = nc.tensor(np.ones(y.shape, np.float32), device=device)

        def both():
            inp.grad = None
            for p in layer.parameters():
                p.grad = None
            layer(inp).backward(gy)
        total = _timed(both, device, seconds, 3, 200)
        out[name] = (1e3 * fwd, 1e3 * max(total - fwd, 0.0))
        h = y.detach()
    return out


def _first_step(cold: bool, cache_dir: str) -> float | None:
    """Seconds to the first step in a child process. Cold: an empty netcl cache and PoCL's own kernel cache
    off (PoCL finishes compiling kernels at their first launch, so both caches matter). Warm: both caches
    in ``cache_dir``, filled by an earlier run. netcl's bytecode is compiled first (_write_bytecode)."""
    env = settings.child_environment(NETCL_CACHE_DIR=os.path.join(cache_dir, "netcl"),
                                     POCL_CACHE_DIR=os.path.join(cache_dir, "pocl"))
    if cold:
        env["POCL_KERNEL_CACHE"] = "0"
    proc = subprocess.run([sys.executable, "-c", _FIRST_STEP], env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("FIRST_STEP"):
            return float(line.split()[1])
    sys.stderr.write(proc.stderr[-2000:])
    return None


def _write_bytecode() -> None:
    """Python's own bytecode cache is not one of the caches meant: pip compiles every module at install
    time, so a user's first process has it. Compile netcl's the same way (compileall writes even where
    PYTHONDONTWRITEBYTECODE is set, under which every child would otherwise recompile the modules it
    imports, a large part of a warm start)."""
    import compileall
    import netcl
    compileall.compile_dir(os.path.dirname(netcl.__file__), quiet=2)


def run(args):
    import netcl as nc
    from .reference import ReferenceProcess, compare
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    seconds = 0.5 if quick else 1.0
    rounds = 3 if quick else 5
    min_reps = getattr(args, "repeat", None) or 3
    result = {"device": device.describe(), "rounds": rounds, "train_iterations_per_second": {},
              "train_replayed_iterations_per_second": {},
              "torch_iterations_per_second": {}, "ratio_to_torch": {}}
    with ReferenceProcess() as ref:
        result["torch_version"] = ref.torch_version
        if not ref.has_torch:
            result["torch_note"] = ref.missing_torch_note()
        for batch in BATCHES:
            step, model, x = _netcl_train_step(batch, device)
            r = compare(lambda: _timed(step, device, seconds, min_reps, 10_000), ref,
                         {"model": "lenet", "mode": "train", "batch": batch, "seconds": seconds,
                          "min_reps": min_reps}, rounds)
            result["train_iterations_per_second"][batch] = 1.0 / r["netcl_seconds"]
            if "ratio" in r:
                result["torch_iterations_per_second"][batch] = 1.0 / r["reference_seconds"]
                result["ratio_to_torch"][batch] = r["ratio"]
            del step, model, x
            replayed, _, _ = _netcl_train_step(batch, device, replay=True)
            for _ in range(4):  # two steps as written, two recorded: later calls replay
                replayed()
            result["train_replayed_iterations_per_second"][batch] = 1.0 / _timed(
                replayed, device, seconds, min_reps, 10_000)
            del replayed

        _, model, x = _netcl_train_step(INFER_BATCH, device)
        model.eval()

        def infer():
            with nc.no_grad():
                model(x)
        r = compare(lambda: _timed(infer, device, seconds, min_reps, 10_000), ref,
                     {"model": "lenet", "mode": "infer", "batch": INFER_BATCH, "seconds": seconds,
                      "min_reps": min_reps}, rounds)
        result["inference_images_per_second"] = INFER_BATCH / r["netcl_seconds"]
        if "ratio" in r:
            result["torch_inference_images_per_second"] = INFER_BATCH / r["reference_seconds"]
            result["inference_ratio_to_torch"] = r["ratio"]

    _, model, x = _netcl_train_step(LAYER_BATCH, device)
    result["layers_ms_batch_128"] = {k: {"forward": f, "backward": b}
                                     for k, (f, b) in _layer_times(model, x, device, seconds / 4).items()}

    with tempfile.TemporaryDirectory(prefix="netcl-bench-cold-") as cold, \
            tempfile.TemporaryDirectory(prefix="netcl-bench-warm-") as warm:
        _write_bytecode()
        cold_seconds = _first_step(True, cold)
        _first_step(False, warm)  # fills both caches
        result["first_step_seconds"] = {"cold": cold_seconds, "warm": _first_step(False, warm)}

    _print(result)
    return result if getattr(args, "json", False) else None


def _print(r) -> None:
    out = sys.stdout
    print(f"LeNet on {r['device']}", file=out)
    print("training iterations/s (forward + backward + SGD step)", file=out)
    print(f"  {'implementation':<16}" + "".join(f"{b:>11}" for b in BATCHES), file=out)
    print(f"  {'netcl':<16}" + "".join(f"{r['train_iterations_per_second'][b]:>11.1f}" for b in BATCHES), file=out)
    print(f"  {'netcl replayed':<16}" + "".join(f"{r['train_replayed_iterations_per_second'][b]:>11.1f}"
                                               for b in BATCHES), file=out)
    if r["torch_iterations_per_second"]:
        print(f"  {'PyTorch':<16}" + "".join(f"{r['torch_iterations_per_second'][b]:>11.1f}" for b in BATCHES),
              file=out)
        print(f"  {'netcl / PyTorch':<16}" + "".join(f"{r['ratio_to_torch'][b]:>11.2f}" for b in BATCHES), file=out)
        print(f"  (PyTorch {r['torch_version']} in its own process; ratios are medians over {r['rounds']} "
              "alternating rounds)", file=out)
    else:
        print(f"  ({r.get('torch_note', 'no PyTorch')})", file=out)
    line = f"inference at batch {INFER_BATCH}: {r['inference_images_per_second']:.0f} images/s"
    if "torch_inference_images_per_second" in r:
        line += (f" (PyTorch {r['torch_inference_images_per_second']:.0f}, median ratio "
                 f"{r['inference_ratio_to_torch']:.2f})")
    print(line, file=out)
    print(f"per-layer milliseconds at batch {LAYER_BATCH}", file=out)
    print(f"  {'layer':<10}{'forward':>10}{'backward':>10}", file=out)
    for name, t in r["layers_ms_batch_128"].items():
        print(f"  {name:<10}{t['forward']:>10.2f}{t['backward']:>10.2f}", file=out)
    fs = r["first_step_seconds"]
    fmt = lambda v: "failed" if v is None else f"{v:.2f} s"  # noqa: E731
    print(f"first training step in a fresh process: cold cache {fmt(fs['cold'])}, warm cache {fmt(fs['warm'])}",
          file=out)
    sys.stdout.flush()


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=None)
    a = p.parse_args()
    res = run(a)
    if a.json:
        print(json.dumps(res))
