"""`netcl bench dense`: dense pixelwise labelling vs patch-by-patch scanning (Tables 1 and 3 of Li, Zhao &
Wang) on the Plain CNN₁ of Table 1 with 133×133 patches, plus the Figure 3 toy network.

Dense: the converted model on the whole image, timed layer by layer (the device is synchronized after
each layer). Patch-by-patch: the original model on batches of cropped patches, timed layer by layer on a
random sample of pixels and scaled to every pixel of the image (cropping is not timed, which favours the
baseline). The dense scores at the sampled pixels are checked against the patch scores. Backward: one
training step (forward + masked backward) of the dense model over the whole image, with few and with all
pixels selected, against the patch mini-batch step scaled to every pixel.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..autograd import no_grad
from ..dense import convert, crop_patches, masked_cross_entropy
from ..dense.convert import Spatial
from .. import nn as L  # the public layer names, wherever netcl.nn defines them
from ..ops.conv_common import ConvLayer
from ..runtime.device import default_device
from ..runtime.timing import timed_call, timed_result
from ..tensor import Tensor

PATCH = 133
LAYER_NAMES = ("conv1", "pool1", "tanh1", "conv2", "pool2", "tanh2", "conv3")


def plain_cnn1():
    """Table 1's Plain CNN₁: conv 50@6×6, pool 8×8/8, tanh, conv 50@3×3, pool 2×2/2, tanh, conv 32@7×7
    (random weights: the running time does not depend on their values)."""
    return L.Sequential(L.Conv2d(3, 50, 6), L.MaxPool2d(8, 8), L.Tanh(), L.Conv2d(50, 50, 3), L.MaxPool2d(2, 2),
                        L.Tanh(), L.Conv2d(50, 32, 7)).eval()


def figure3():
    """Figure 3: conv 2×2, pool 2×2/2, conv 2×2, pool 3×3/3, conv 2×2; 15×15 patches, one score."""
    return L.Sequential(L.Conv2d(1, 1, 2), L.MaxPool2d(2, 2), L.Conv2d(1, 1, 2), L.MaxPool2d(3, 3),
                        L.Conv2d(1, 1, 2)).eval()


def _dense_layer_times(dense, x, device):
    """Seconds per original layer for one dense forward (the padding is counted in the first layer)."""
    times, last = {}, [0.0]

    def trace(name, maps):
        device.synchronize()
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - last[0]
        last[0] = now

    device.synchronize()
    last[0] = time.perf_counter()
    with no_grad():
        scores = dense(x, trace=trace)
    pad = times.pop("pad")
    first = next(iter(times))
    times[first] += pad
    return times, scores


def _patch_layer_times(model, patches, device, strategies=None):
    from ..ops.conv2d_planner import plan_conv2d_layer
    times, out = {}, patches
    with no_grad():
        for name, layer in model.named_layers():
            if strategies is not None and isinstance(layer, L.Conv2d):
                geometry = ConvLayer.from_shapes(out.shape, layer.weight.shape, layer.stride, layer.padding,
                                                 layer.dilation, layer.groups, out.dtype)
                strategies[name] = plan_conv2d_layer(geometry, "forward").strategy
            out, times[name] = timed_result(lambda: layer(out), device)
    return times, out


def _median_times(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _planned_strategies(dense, image_hw, device):
    """The strategy the planner picks for the forward pass of each dense convolution."""
    from ..ops.conv2d_planner import plan_conv2d_layer
    out, channels = {}, dense.in_channels
    for step in dense.steps:
        if not isinstance(step, Spatial):
            continue
        if step.kind in ("conv", "linear") and len(step.groups) == 1:
            (groups,) = step.groups.values()
            if len(groups) == 1:
                lh = step.axes_out[0].length(image_hw[0]) + step.dense_dilation[0] * (step.kernel[0] - 1)
                lw = step.axes_out[1].length(image_hw[1]) + step.dense_dilation[1] * (step.kernel[1] - 1)
                w = step.weight()
                layer = ConvLayer.from_shapes((1, channels, lh, lw), w.shape, 1, 0, step.dense_dilation, 1, w.dtype)
                plan = plan_conv2d_layer(layer, "forward")
                out[step.name] = {"strategy": plan.strategy, "reason": plan.reason,
                                  "dilation": step.dense_dilation[0], "input": list(layer.input_shape)}
        if step.kind in ("conv", "linear"):
            channels = step.weight().shape[0]
    return out


def _train_step(dense, x, labels, mask, device):
    return timed_call(lambda: masked_cross_entropy(dense(x), labels, mask).backward(), device)


def bench_plain_cnn1(size: int, samples: int, batch: int, repeat: int, rng, device, backward: bool):
    model = plain_cnn1()
    dense = convert(model, PATCH)
    image = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    x = Tensor.from_host(image, device)
    _dense_layer_times(dense, x, device)  # warm-up: kernel builds and plans
    runs = []
    for _ in range(repeat):
        t, scores = _dense_layer_times(dense, x, device)
        runs.append(t)
    dense_t = _median_times(runs)
    dense_t = {LAYER_NAMES[int(k)]: v for k, v in dense_t.items()}
    scores = scores.to_host()[0]

    pixels = rng.integers(0, size, (samples, 2))
    patch_runs, max_err = [], 0.0
    warm = crop_patches(image, pixels[:batch], PATCH, device)
    patch_strategies = {}
    _patch_layer_times(model, warm, device, patch_strategies)
    for start in range(0, samples, batch):
        chunk = pixels[start:start + batch]
        patches = crop_patches(image, chunk, PATCH, device)
        t, out = _patch_layer_times(model, patches, device)
        patch_runs.append(t)
        ref = out.reshape((len(chunk), -1)).to_host()
        got = scores[:, chunk[:, 0], chunk[:, 1]].T
        max_err = max(max_err, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)))
    scale = size * size / samples
    patch_t = {LAYER_NAMES[int(k)]: sum(r[k] for r in patch_runs) * scale for k in patch_runs[0]}
    rows = [{"layer": name, "dense_ms": dense_t[name] * 1e3, "patch_ms": patch_t[name] * 1e3,
             "speedup": patch_t[name] / dense_t[name]} for name in LAYER_NAMES]
    total_dense, total_patch = sum(dense_t.values()), sum(patch_t.values())
    result = {"image": size, "padded": size + PATCH - 1, "layers": rows, "dense_ms": total_dense * 1e3,
              "patch_ms": total_patch * 1e3, "speedup": total_patch / total_dense,
              "sampled_pixels": samples, "patch_batch": batch, "max_rel_error": max_err,
              "strategies": _planned_strategies(dense, (size, size), device),
              "patch_strategies": patch_strategies}
    if backward:
        result["backward"] = bench_backward(model, dense, image, x, pixels, batch, repeat, rng, device)
    return result


def bench_backward(model, dense, image, x, pixels, batch, repeat, rng, device):
    size = image.shape[-1]
    labels = rng.integers(0, 32, (1, size, size))
    few = np.zeros((1, size, size), bool)
    few[0, pixels[:, 0], pixels[:, 1]] = True
    every = np.ones((1, size, size), bool)
    _train_step(dense, x, labels, every, device)
    model.zero_grad()
    dense_few = statistics.median(_train_step(dense, x, labels, few, device) for _ in range(repeat))
    model.zero_grad()
    dense_all = statistics.median(_train_step(dense, x, labels, every, device) for _ in range(repeat))
    model.zero_grad()
    from ..nn import CrossEntropyLoss
    loss_fn = CrossEntropyLoss(reduction="sum")
    patch_s = 0.0
    for start in range(0, len(pixels), batch):
        chunk = pixels[start:start + batch]
        patches = crop_patches(image, chunk, PATCH, device)
        target = Tensor.from_host(labels[0, chunk[:, 0], chunk[:, 1]], device)
        patch_s += timed_call(lambda: loss_fn(model(patches).reshape((len(chunk), -1)), target).backward(), device)
    model.zero_grad()
    patch_all = patch_s * size * size / len(pixels)
    return {"dense_step_ms_few_pixels": dense_few * 1e3, "few_pixels": int(few.sum()),
            "dense_step_ms_all_pixels": dense_all * 1e3, "patch_step_ms_all_pixels": patch_all * 1e3,
            "speedup": patch_all / dense_all}


def bench_figure3(size: int, repeat: int, rng, device):
    model = figure3()
    dense = convert(model, 15)
    image = rng.standard_normal((1, 1, size, size)).astype(np.float32)
    x = Tensor.from_host(image, device)
    _dense_layer_times(dense, x, device)
    dense_s = statistics.median(sum(_dense_layer_times(dense, x, device)[0].values()) for _ in range(repeat))
    scores = _dense_layer_times(dense, x, device)[1].to_host()[0, 0]
    patches = crop_patches(image, None, 15, device)
    with no_grad():
        model(patches)
        out, patch_s = timed_result(lambda: model(patches), device)
        ref = out.to_host().reshape(size, size)
    err = float(np.abs(scores - ref).max() / np.abs(ref).max())
    return {"image": size, "dense_ms": dense_s * 1e3, "patch_ms": patch_s * 1e3, "speedup": patch_s / dense_s,
            "max_rel_error": err}


def _print_plain(r):
    print(f"\nPlain CNN₁, {r['image']}×{r['image']} image (padded to 3×{r['padded']}×{r['padded']}); "
          f"patch-by-patch timed on {r['sampled_pixels']} random pixels in batches of {r['patch_batch']} "
          f"and scaled to {r['image'] ** 2} pixels")
    print(f"{'layer':8s} {'patch-by-patch ms':>18s} {'dense ms':>10s} {'speedup':>9s}  planner: patch / dense strategy")
    for row in r["layers"]:
        key = str(LAYER_NAMES.index(row["layer"]))
        plan = r["strategies"].get(key, {})
        extra = f"  {r['patch_strategies'][key]} / {plan['strategy']} (dilation {plan['dilation']})" if plan else ""
        print(f"{row['layer']:8s} {row['patch_ms']:18.1f} {row['dense_ms']:10.2f} {row['speedup']:9.1f}{extra}")
    print(f"{'overall':8s} {r['patch_ms']:18.1f} {r['dense_ms']:10.2f} {r['speedup']:9.1f}")
    print(f"max |dense − patch| / max |patch| at the sampled pixels: {r['max_rel_error']:.2e}")
    b = r.get("backward")
    if b:
        print(f"training step (forward + masked backward, whole image): dense {b['dense_step_ms_all_pixels']:.1f} ms "
              f"with all pixels, {b['dense_step_ms_few_pixels']:.1f} ms with {b['few_pixels']} pixels; "
              f"patch mini-batches for all pixels {b['patch_step_ms_all_pixels']:.0f} ms (scaled); "
              f"speedup {b['speedup']:.0f}×")


def run(args):
    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None) or (1 if quick else 3)
    device = default_device()
    rng = np.random.default_rng(0)
    sizes = (16,) if quick else (64, 128)
    samples, batch = (16, 16) if quick else (128, 64)
    print(f"netcl bench dense on {device.describe()}")
    plain = [bench_plain_cnn1(s, samples, batch, repeat, rng, device, backward=True) for s in sizes]
    for r in plain:
        _print_plain(r)
    fig = [bench_figure3(s, repeat, rng, device) for s in ((5, 32) if quick else (5, 64))]
    print("\nFigure 3 toy network (15×15 patches), every pixel scanned:")
    for r in fig:
        print(f"  {r['image']}×{r['image']}: patch-by-patch {r['patch_ms']:.2f} ms, dense {r['dense_ms']:.2f} ms, "
              f"speedup {r['speedup']:.1f}, max rel error {r['max_rel_error']:.1e}")
    return {"device": device.describe(), "plain_cnn1": plain, "figure3": fig}
