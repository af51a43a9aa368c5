"""`netcl tune conv [--quick]`: calibrate the conv planner's cost model on the current device.

Measures what the model needs (netcl.ops.conv_cost): the device quantities (copy bandwidth, launch time,
the GEMM rate per shape class), then every applicable strategy's three passes on a representative set of
layers (LeNet-, ResNet-, MobileNet- and MEC-like: 1×1, 3×3, 5×5, 7×7 and 11×11, depthwise, strided,
batch 1 to 64), timed against each other (netcl.runtime.timing.compare, the fastest sample). Each timing becomes a sample of
that strategy and pass; the model fits its two coefficients per strategy and pass to them. Stored in the
tuning database beside the GEMM tuning (family "conv_calibration"), used by every later process; measured
plans keep adding samples. Before any timing the kernels are built, in two processes on a driver that
hands built programs over cheaply (netcl.tuning.conv_prebuild). Bounded: a budget of 100 s (`--quick`:
25 s) shortens the timed rounds of the remaining passes when the passes so far run late (kernel builds
are not shortened).
"""
from __future__ import annotations

import time

import numpy as np

# (input NCHW, weight KCRS, stride, padding[, groups[, dilation]]): small enough that direct convolution
# stays in tens of ms. Every kind of layer a network brings (stride 1, 2 and 4; 1×1, 3×3, 5×5, 7×7, 11×11;
# depthwise; dilated; few and many channels; batch 1 to 64) has neighbours here: the model's residual
# model learns from measured layers like the one it predicts. Each layer costs a cold calibration
# seconds, most of it building its kernels, so a layer whose neighbours are already here is left out:
# leaving such layers out does not change the planner's choices (benchmarks/planner_offline.py --exclude
# checks that on stored calibrations).
LAYERS = [
    ((8, 64, 8, 8), (64, 64, 3, 3), 1, 1),
    ((1, 128, 14, 14), (128, 128, 3, 3), 1, 0),
    ((8, 32, 16, 16), (64, 32, 1, 1), 1, 0),
    ((2, 3, 64, 64), (24, 3, 5, 5), 2, 2),
    ((1, 3, 115, 115), (32, 3, 11, 11), 4, 0),
    ((4, 32, 16, 16), (48, 32, 3, 3), 2, 1),
    ((4, 64, 14, 14), (128, 64, 1, 1), 1, 0),
    ((64, 1, 28, 28), (20, 1, 5, 5), 1, 0),       # LeNet as `netcl train lenet` runs it
    ((64, 20, 12, 12), (50, 20, 5, 5), 1, 0),
    ((1, 96, 24, 24), (128, 96, 5, 5), 1, 0),
    ((8, 32, 16, 16), (32, 1, 3, 3), 1, 1, 32),   # depthwise
    ((4, 48, 24, 24), (48, 1, 3, 3), 2, 1, 48),   # depthwise, strided
    ((4, 96, 16, 16), (96, 96, 3, 3), 1, 1),      # many channels: where Winograd wins
    ((2, 48, 32, 32), (48, 48, 3, 3), 1, 1),
    ((4, 48, 20, 20), (96, 48, 1, 1), 2, 0),      # a strided 1×1 projection
    ((2, 192, 8, 8), (96, 192, 1, 1), 1, 0),
    ((4, 24, 20, 20), (24, 24, 3, 3), 1, 2, 1, 2),  # dilated
    ((2, 3, 48, 48), (24, 3, 7, 7), 2, 3),        # a 7×7 stem
    # Large layers (0.4-0.8 GFLOP): without them every sample of Winograd and direct_blocked is short,
    # their fits price the arithmetic from launches and transforms alone, and layers ten times larger are
    # predicted far too fast.
    ((1, 48, 96, 96), (96, 48, 3, 3), 1, 1),
    ((1, 32, 128, 128), (64, 32, 5, 5), 2, 2),
    ((4, 256, 28, 28), (256, 256, 1, 1), 1, 0),
    # A working set past the others' (19 MB of input): the layers above misprice layers whose data leave
    # the caches, such as ResNet-50's bottleneck 1×1 at 56 pixels and batch 8.
    ((8, 192, 56, 56), (96, 192, 1, 1), 1, 0),
    # Batch-1 layers of an ImageNet-sized network (the MEC paper's): a wide RGB input, a 7×7 strided layer
    # on 64 channels at 56 pixels, and many channels on few pixels, where im2col, implicit GEMM and
    # Winograd trade places with the smaller layers above.
    ((1, 3, 160, 160), (32, 3, 3, 3), 1, 1),
    ((1, 64, 56, 56), (64, 64, 7, 7), 2, 3),
    ((1, 256, 12, 12), (384, 256, 3, 3), 1, 1),
    # More depthwise layers (MobileNet-like: many batches, many channels, a 5×5 kernel) and a batch-8 3×3
    # layer: with two depthwise layers the residual model meets Winograd's and direct convolution's
    # depthwise behaviour once each, too few to price a wider depthwise layer.
    ((16, 32, 24, 24), (32, 1, 3, 3), 1, 1, 32),
    ((2, 128, 28, 28), (128, 1, 3, 3), 1, 1, 128),
    ((4, 96, 14, 14), (96, 1, 5, 5), 1, 2, 96),
    ((8, 80, 20, 20), (80, 80, 3, 3), 1, 1),
    # ImageNet-class networks at 224 pixels (ResNet-18/50, MobileNetV2): depthwise layers where the
    # depthwise kernels' rows are wide (56 and 112 pixels, stride 1 and 2) and where they are 7 pixels
    # over many channels, a 7×7 stride-2 stem on 3 channels, 1×1 convolutions at batch 1 (one small
    # product each) and a strided 3×3 layer at batch 1: the layers benchmarks/planner_accuracy.py's
    # "imagenet" set holds have neighbours here, not copies.
    ((2, 96, 56, 56), (96, 1, 3, 3), 1, 1, 96),
    ((1, 64, 112, 112), (64, 1, 3, 3), 2, 1, 64),
    ((4, 576, 7, 7), (576, 1, 3, 3), 1, 1, 576),
    ((1, 3, 160, 160), (64, 3, 7, 7), 2, 3),
    ((1, 128, 28, 28), (512, 128, 1, 1), 1, 0),
    ((1, 1024, 7, 7), (256, 1024, 1, 1), 1, 0),
    ((1, 64, 56, 56), (128, 64, 3, 3), 2, 1),
    # A ResNet stride-2 1×1 projection at batch 4 (the second stage's): the gemm strategy's subsample and
    # the products after it, beside implicit GEMM's residue classes, at a size where the two differ.
    ((4, 128, 28, 28), (256, 128, 1, 1), 2, 0),
    # Narrow 1×1 layers at batch 1 (MobileNetV2's projections and expansions): an inner dimension or a
    # result of 16-160 rows over 49-12544 pixels, where the pointwise kernels' one launch and in-place
    # reads beat a product's packing and gather tables. The 1×1 layers above are wide or batched, and
    # alone they price these layers by the wrong trend.
    ((1, 32, 112, 112), (16, 32, 1, 1), 1, 0),
    ((1, 576, 14, 14), (96, 576, 1, 1), 1, 0),
    ((1, 160, 7, 7), (960, 160, 1, 1), 1, 0),
]
QUICK_LAYERS = [LAYERS[0], LAYERS[2], LAYERS[4], LAYERS[8]]
# The fastest sample: a device characteristic, which load from other processes only slows down (the
# median of a few samples moves with the load). Two warm-up runs: PoCL generates code at the first launch
# and GEMM's packing buffers reach their size over the first runs. Samples spread over at least 0.4 s
# (0.15 s quick): a burst of load outlasts a few short runs. A runner over 0.1 s and 3x the fastest gets
# one sample: more samples of a strategy that slow would cost the calibration seconds to place a strategy
# that cannot win.
TIMING = dict(warmup=2, min_runs=3, max_runs=20, time_budget_s=0.25, contention=1.2, settle_below_s=0.01,
              statistic="min", min_time_s=0.4, slow_s=0.1)
QUICK_TIMING = dict(warmup=2, min_runs=2, max_runs=10, time_budget_s=0.1, contention=1.1, settle_below_s=0.0,
                    statistic="min", min_time_s=0.15, slow_s=0.1)
# The shortest timed rounds a pass gets: on a fresh cache builds and warm-ups alone take over half of a
# calibration, so the timed rounds must be able to shrink well below --quick's spans.
SHORTEST = dict(time_budget_s=0.05, min_time_s=0.08)
# Seconds the whole calibration aims at, by quick (the targets are 2 minutes and 30 s). Kernel builds and
# warm-ups take what they take (with a fresh cache, about half of the calibration); when the passes so far
# project past the budget, the timed rounds of the rest are shortened, never below SHORTEST.
BUDGET_S = {False: 100.0, True: 25.0}
# Seconds for the GEMM rate surface (netcl.ops.gemm_surface), by quick: about twice what its grid takes
# on a 2-core CPU.
SURFACE_BUDGET_S = {False: 25.0, True: 5.0}


def calibration_layers(quick: bool, dtype: str = "float32") -> list:
    from ..ops.conv_common import ConvLayer
    layers = []
    for x, w, stride, padding, *rest in (QUICK_LAYERS if quick else LAYERS):
        groups, dilation = (rest + [1, 1])[:2]
        layers.append(ConvLayer.from_shapes(x, w, stride=stride, padding=padding, groups=groups,
                                            dilation=dilation, dtype=dtype))
    return layers


def shortened(timing: dict, scale: float) -> dict:
    """``timing`` with its timed rounds' spans scaled by ``scale`` (≤ 1), never below SHORTEST."""
    return dict(timing, **{span: max(SHORTEST[span], timing[span] * scale) for span in SHORTEST})


def rounds_scale(seconds_left: float, passes_left: int, mean_pass_s: float) -> float:
    """The timed rounds' scale for the next pass: the time each remaining pass may take within the budget
    over what the passes so far took on average, at most 1 (a ratio, not a product of ratios, so that a
    run that catches up with its budget gets full-length rounds back)."""
    if passes_left <= 0 or mean_pass_s <= 0:
        return 1.0
    return min(1.0, max(0.0, seconds_left / passes_left / mean_pass_s))


def calibrate(device, dtype: str = "float32", quick: bool = False, progress: bool = True, layers=None,
              budget_s: float | None = None) -> dict:
    """Measure and store this device's calibration (on ``layers``, ConvLayers, instead of the
    representative set when given) within about ``budget_s`` seconds (BUDGET_S by default); returns what
    was measured, how long it took and how far the timed rounds were shortened to keep to the budget.
    The binaries of the programs it builds are not written (see binaries.unsaved_builds_discarded)."""
    from ..runtime import binaries
    with binaries.unsaved_builds_discarded():
        return _measure_and_store(device, dtype, quick, progress, layers, budget_s)


def _measure_and_store(device, dtype, quick, progress, layers, budget_s) -> dict:
    from tqdm import tqdm
    from ..errors import NetclError
    from ..ops import conv2d_planner as planner
    from ..ops import conv_chooser
    from ..ops import conv_profile
    from ..ops import gemm_surface
    from ..ops.conv_registry import strategies
    from .conv_prebuild import compile_ahead
    started = time.perf_counter()
    budget_s = BUDGET_S[quick] if budget_s is None else float(budget_s)
    grid = gemm_surface.QUICK_GRID if quick else gemm_surface.GRID
    layers = calibration_layers(quick, dtype) if layers is None else list(layers)
    with tqdm(desc=f"building kernels on {device.name}", unit="job", disable=not progress, leave=False) as build_bar:
        prebuilt = compile_ahead(device, layers, grid, dtype, build_bar.update)
    with tqdm(total=len(gemm_surface.points(grid)), desc=f"GEMM rates on {device.name}", unit="shape",
              disable=not progress, leave=False) as rates_bar:
        basics = conv_profile.measure_basics(device, dtype, grid, SURFACE_BUDGET_S[quick], rates_bar.update)
    registry = strategies()
    steps = [(layer, pass_) for layer in layers for pass_ in ("forward", "backward_data", "backward_weight")]
    rng = np.random.default_rng(0)
    timings = 0
    base = QUICK_TIMING if quick else TIMING
    scale, smallest_scale = 1.0, 1.0
    passes_started = time.perf_counter()
    bar = tqdm(steps, desc=f"calibrating conv on {device.name}", unit="pass", disable=not progress, leave=False)
    for done, (layer, pass_) in enumerate(bar):
        if done:
            now = time.perf_counter()
            scale = rounds_scale(budget_s - (now - started), len(steps) - done, (now - passes_started) / done)
            smallest_scale = min(smallest_scale, scale)
        found = planner.answers(layer, pass_, device)
        impls = {a.strategy: registry[a.strategy] for a in found if a.why_not is None}
        results = planner.time_strategies(impls, layer, pass_, device, rng, **shortened(base, scale))
        measured = {name: ms for name, ms in results.items() if not isinstance(ms, NetclError)}
        terms = {a.strategy: a.terms for a in found if a.terms is not None}
        conv_profile.record(device, dtype, pass_, measured, terms, layer.signature(), by="netcl tune conv")
        timings += len(measured)
    bar.close()
    residual = conv_profile.score_residual(device, dtype)
    seconds = time.perf_counter() - started
    conv_profile.update(device, dtype, lambda e: e.update(tune_seconds=round(seconds, 1), quick=quick,
                                                          rounds_scale=round(smallest_scale, 3),
                                                          tuned_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    conv_chooser.clear_memory_cache(device)
    profile = conv_profile.device_profile(device, dtype)
    return {"seconds": round(seconds, 1), "budget_seconds": budget_s, "rounds_scale": round(smallest_scale, 3),
            "layers": len(layers), "timings": timings, "basics": basics, "prebuilt": prebuilt, "residual": residual,
            "coefficients": profile.as_dict()["coefficients"]}


def run_cli(args) -> dict:
    import netcl as nc
    from ..ops.conv_profile import calibration_summary
    from ..runtime import tuning_db as db
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    quiet = bool(getattr(args, "json", False))
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    log(f"calibrating the conv planner on {device.describe()}{' (quick)' if quick else ''}")
    result = calibrate(device, "float32", quick, progress=not quiet)
    log(f"{result['timings']} timings on {result['layers']} layers in {result['seconds']:.0f} s; "
        f"{calibration_summary(device)}; stored in {db.db_path()}")
    return {"tuned": "conv", "device": device.describe(), "device_identity": device.identity,
            "database": str(db.db_path()), **result}
