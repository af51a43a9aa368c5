"""`netcl bench im2col [--json] [--quick]`: the one-pass im2col kernel against a Caffe-style kernel.

Layers: LeNet conv1/conv2 (netcl.models.lenet, after Hao Zhang's im2col report, Table 2) at batch 64 and
128, and cv1–cv12 of the MEC paper (netcl.cli.conv_layers; padding 0 as listed) at batch 1, the paper's
mobile setting.
Both kernels write the same (C·R·S, N·P·Q) float32 matrix and are compiled with the same constants; they
are timed round-robin (best of --repeat rounds after a warm-up that also compiles), so load from other
processes hits both alike. GB/s counts the minimum traffic, input read once plus the matrix written once,
and is set against the device's copy bandwidth, measured with a copy kernel on a buffer well beyond the
last-level cache right before each layer (on a shared machine the load changes from layer to layer). A layer
is "large" when its matrix is ≥ 16 MiB. col2im (atomic scatter and gather) is timed on the same layers:
it is what the im2col strategy's backward pass runs.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from ..ops.copy_probe import CopyProbe

LARGE_BYTES = 16 << 20

# name: (input NCHW, kernel, stride)
MEC = {"cv1": ((1, 3, 227, 227), 11, 4), "cv2": ((1, 3, 231, 231), 11, 4), "cv3": ((1, 3, 227, 227), 7, 2),
       "cv4": ((1, 64, 224, 224), 7, 2), "cv5": ((1, 96, 24, 24), 5, 1), "cv6": ((1, 256, 12, 12), 3, 1),
       "cv7": ((1, 3, 224, 224), 3, 1), "cv8": ((1, 64, 112, 112), 3, 1), "cv9": ((1, 64, 56, 56), 3, 1),
       "cv10": ((1, 128, 28, 28), 3, 1), "cv11": ((1, 256, 14, 14), 3, 1), "cv12": ((1, 512, 7, 7), 3, 1)}


def layers(quick: bool) -> dict:
    out = {}
    for b in ((64,) if quick else (64, 128)):
        out[f"lenet_conv1_b{b}"] = ((b, 1, 28, 28), 5, 1)
        out[f"lenet_conv2_b{b}"] = ((b, 20, 12, 12), 5, 1)
    out.update({k: v for k, v in MEC.items() if not quick or k in ("cv1", "cv4", "cv8", "cv9", "cv12")})
    return out


def _timed(runners: dict, device, repeat: int) -> dict:
    """Best seconds of each runner over ``repeat`` rounds; round 0 is the warm-up. The best, not the
    median: on a machine shared with other jobs the median moves by 3-5x from run to run, the best of a
    handful of rounds by a few percent. The order rotates from round to round: whichever runs first in a
    round finds the caches holding the previous runner's data, not its own."""
    from ..runtime.timing import compare
    results = compare(runners, device, warmup=1, min_runs=repeat, max_runs=repeat, time_budget_s=0.0,
                      settle_below_s=0.0, slow_s=float("inf"), statistic="min", errors=())
    return {name: timing.seconds for name, timing in results.items()}


def copy_probe(device, quick: bool) -> CopyProbe:
    """The copy timed next to each layer's kernels (right before them, in rounds of its own), so that the
    fraction of copy bandwidth compares runs under the same machine load."""
    return CopyProbe(device, 64 << 20 if quick else 256 << 20)


def measure(name: str, shape, k: int, stride: int, device, repeat: int, copy: CopyProbe) -> dict:
    from ..ops.im2col import _layer, _params, col2im_into, cols_shape, im2col_launch
    from ..runtime.kernels import get_kernel, launch, local_size_1d
    from ..tensor import Tensor
    layer = _layer(shape, k, k, stride, 0, 1, "float32")
    x = Tensor.from_host(np.random.default_rng(0).standard_normal(shape).astype(np.float32), device)
    ours, caffe = (Tensor.empty(cols_shape(layer, True), np.float32, device) for _ in range(2))
    grad_x = Tensor.empty(shape, np.float32, device)
    local = local_size_1d(device, ours.size)[0]
    caffe_kernel = get_kernel(device, "im2col.cl", "im2col_caffe", **_params(layer, np.float32, True, local))
    items = layer.n * layer.c * layer.out_h * layer.out_w
    one_pass, one_pass_global, one_pass_local = im2col_launch(device, layer, np.float32, True)
    # in rounds of its own: its 512 MiB of traffic would evict the layer's data before the next kernel
    copy_gbps = copy.gbps(_timed({"copy": copy}, device, repeat)["copy"])
    t = _timed({
        # both kernels launched directly, so that the host-side cost of the API call is not counted
        "one_pass": lambda: launch(device, one_pass, one_pass_global, one_pass_local, x.buffer, np.int64(x.offset),
                                   ours.buffer, np.int64(ours.offset)),
        "caffe": lambda: launch(device, caffe_kernel, (items,), (local,), x.buffer, np.int64(x.offset),
                                caffe.buffer, np.int64(caffe.offset)),
        "col2im_atomic": lambda: col2im_into(ours, layer, grad_x, transposed=True, deterministic=False),
        "col2im_gather": lambda: col2im_into(ours, layer, grad_x, transposed=True, deterministic=True),
    }, device, repeat)
    if not np.array_equal(ours.to_host(), caffe.to_host()):
        raise RuntimeError(f"bench im2col: the one-pass and Caffe-style kernels disagree on {name}")
    traffic = x.nbytes + ours.nbytes
    gbps = {key: traffic / sec / 1e9 for key, sec in t.items()}
    return {"layer": name, "input": list(shape), "kernel": k, "stride": stride,
            "cols_shape": list(ours.shape), "cols_bytes": ours.nbytes, "large": ours.nbytes >= LARGE_BYTES,
            "one_pass_ms": round(t["one_pass"] * 1e3, 4), "caffe_ms": round(t["caffe"] * 1e3, 4),
            "one_pass_gbps": round(gbps["one_pass"], 3), "caffe_gbps": round(gbps["caffe"], 3),
            "speedup_vs_caffe": round(t["caffe"] / t["one_pass"], 3),
            "copy_gbps": round(copy_gbps, 3), "fraction_of_copy": round(gbps["one_pass"] / copy_gbps, 3),
            "col2im_atomic_ms": round(t["col2im_atomic"] * 1e3, 4),
            "col2im_gather_ms": round(t["col2im_gather"] * 1e3, 4)}


def run(args) -> dict:
    import netcl as nc
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None) or (3 if quick else 9)
    as_json = bool(getattr(args, "json", False))
    copy = copy_probe(device, quick)
    if not as_json:
        print(f"im2col float32 on {device.describe()}: best of {repeat}")
        print(f"{'layer':18s} {'cols MB':>8s} {'one-pass':>9s} {'caffe':>9s} {'speedup':>8s} {'copy':>7s} "
              f"{'of copy':>8s} {'col2im at':>10s} {'col2im ga':>10s}")
        print(f"{'':18s} {'':>8s} {'GB/s':>9s} {'GB/s':>9s} {'':>8s} {'GB/s':>7s} {'':>8s} {'ms':>10s} {'ms':>10s}")
    rows = []
    for name, (shape, k, stride) in layers(quick).items():
        row = measure(name, shape, k, stride, device, repeat, copy)
        rows.append(row)
        if not as_json:
            print(f"{name:18s} {row['cols_bytes'] / 1e6:8.1f} {row['one_pass_gbps']:9.2f} {row['caffe_gbps']:9.2f} "
                  f"{row['speedup_vs_caffe']:7.2f}x {row['copy_gbps']:7.2f} {row['fraction_of_copy']:7.0%}"
                  f"{'*' if row['large'] else ' '}{row['col2im_atomic_ms']:10.2f} {row['col2im_gather_ms']:10.2f}")
    copy_gbps = statistics.median(r["copy_gbps"] for r in rows)
    speedups = [r["speedup_vs_caffe"] for r in rows]
    large = [r for r in rows if r["large"]]
    summary = {
        "geomean_speedup_vs_caffe": round(math.exp(statistics.fmean(math.log(s) for s in speedups)), 3),
        "min_speedup_vs_caffe": min(speedups),
        "large_layers": [r["layer"] for r in large],
        "large_min_fraction_of_copy": min((r["fraction_of_copy"] for r in large), default=None),
    }
    summary["target_speedup_1_2x_met"] = summary["geomean_speedup_vs_caffe"] >= 1.2
    summary["layers_below_1_2x"] = [r["layer"] for r in rows if r["speedup_vs_caffe"] < 1.2]
    summary["target_half_copy_bandwidth_met"] = (summary["large_min_fraction_of_copy"] or 0) >= 0.5
    if not as_json:
        print(f"geomean speedup {summary['geomean_speedup_vs_caffe']:.2f}x "
              f"(min {summary['min_speedup_vs_caffe']:.2f}x); "
              f"large layers (*, ≥ 16 MiB) reach ≥ {summary['large_min_fraction_of_copy']:.0%} of copy bandwidth"
              if large else f"geomean speedup {summary['geomean_speedup_vs_caffe']:.2f}x")
    return {"benchmark": "im2col", "device": device.as_dict(), "dtype": "float32", "repeat": repeat,
            "copy_gbps": round(copy_gbps, 3), "layers": rows, "summary": summary}
