"""`netcl bench conv [--json] [--quick] [--repeat N]`: every registered conv2d strategy, forward and both
backward passes, on the LeNet layers (batch 64) and the MEC paper's cv1–cv12 (Table 2, batch 1 and 32).

Per (layer, strategy, pass): applicability (the strategy's own why_not), exact workspace bytes, the
median time of ``--repeat`` runs after a warm-up run (kernel builds excluded), GFLOP/s of the direct
definition (2·N·K·P·Q·C/G·R·S), and, at batch 1 and for LeNet, the float32 result's relative L2 error
against a float64 run of the reference strategy on the same data. Strategies are timed round-robin
inside each repetition, so load from other processes hits them alike and the ratios stay meaningful on
a shared machine. A run predicted (from the same layer at batch 1) to take longer than
NETCL_BENCH_CONV_MAX_S seconds (default 60) is skipped and reported as such.

Before timing, the full run tunes MEC's threshold T on this device (netcl.tuning.mec.tune_threshold)
and stores it in the tuning database; --quick keeps the stored (or default) T.
"""
from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from .. import settings
from ..runtime.timing import timed_call, timed_result

PASSES = ("forward", "backward_data", "backward_weight")

# (name, input (H, W, C), kernel (R, S, K), stride) of Table 2 of the MEC paper; padding 0 as there
CV = [("cv1", (227, 227, 3), (11, 11, 96), 4), ("cv2", (231, 231, 3), (11, 11, 96), 4),
      ("cv3", (227, 227, 3), (7, 7, 64), 2), ("cv4", (224, 224, 64), (7, 7, 64), 2),
      ("cv5", (24, 24, 96), (5, 5, 256), 1), ("cv6", (12, 12, 256), (3, 3, 512), 1),
      ("cv7", (224, 224, 3), (3, 3, 64), 1), ("cv8", (112, 112, 64), (3, 3, 128), 1),
      ("cv9", (56, 56, 64), (3, 3, 64), 1), ("cv10", (28, 28, 128), (3, 3, 128), 1),
      ("cv11", (14, 14, 256), (3, 3, 256), 1), ("cv12", (7, 7, 512), (3, 3, 512), 1)]
LENET = [("lenet.conv1", (28, 28, 1), (5, 5, 20), 1), ("lenet.conv2", (12, 12, 20), (5, 5, 50), 1)]
QUICK_CV = ("cv6", "cv10", "cv12")


def cases(quick: bool):
    """(name, batch, ConvLayer) in the order they run: batch-1 layers first, so the large batch can be
    predicted (and skipped) from them."""
    from ..ops.conv_common import ConvLayer

    def layer(spec, n):
        name, (h, w, c), (r, s, k), st = spec
        return ConvLayer.from_shapes((n, c, h, w), (k, c, r, s), stride=st)

    cv = [spec for spec in CV if not quick or spec[0] in QUICK_CV]
    big = 8 if quick else 32
    out = [(spec[0], 64, layer(spec, 64)) for spec in LENET]
    out += [(spec[0], 1, layer(spec, 1)) for spec in cv]
    out += [(spec[0], big, layer(spec, big)) for spec in cv]
    return out


def _runner(impl, pass_, x, w, gy, layer):
    return {"forward": lambda: impl.forward(x, w, layer),
            "backward_data": lambda: impl.backward_data(gy, w, layer),
            "backward_weight": lambda: impl.backward_weight(x, gy, layer)}[pass_]


def _rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(a.astype(np.float64) - ref) / (den if den > 0 else 1.0))


def _reference(layer, host, device, impls):
    """float64 results of every pass from the most trusted strategy that serves the layer."""
    from ..tensor import Tensor
    layer64 = dataclasses.replace(layer, dtype="float64")
    x, w, gy = (Tensor.from_host(a.astype(np.float64), device) for a in host)
    for name in ("im2col", "direct"):
        impl = impls.get(name)
        if impl is not None and all(impl.why_not(layer64, p) is None for p in PASSES):
            return name, {p: _runner(impl, p, x, w, gy, layer64)().to_host() for p in PASSES}
    return None, {}


def bench_case(name, batch, layer, device, impls, repeat, predicted, max_s, with_errors):
    from ..errors import DeviceMemoryError
    from ..tensor import Tensor
    rng = np.random.default_rng(batch)
    host = [rng.uniform(-1, 1, s).astype(np.float32) for s in (layer.input_shape, layer.weight_shape,
                                                                layer.output_shape)]
    x, w, gy = (Tensor.from_host(a, device) for a in host)
    ref_name, ref = _reference(layer, host, device, impls) if with_errors and device.has_fp64 else (None, {})
    rows, runs = [], {}
    for sname, impl in impls.items():
        for pass_ in PASSES:
            row = {"layer": name, "batch": batch, "strategy": sname, "pass": pass_, "gflop": layer.flops / 1e9,
                   "applicable": True, "why_not": None, "workspace_bytes": None, "ms": None, "gflops": None,
                   "rel_err": None, "skipped": None}
            why = impl.why_not(layer, pass_, device)
            if why:
                row.update(applicable=False, why_not=why)
            else:
                row["workspace_bytes"] = int(impl.workspace_bytes(layer, pass_, device))
                guess = predicted.get((name, sname, pass_))
                if guess is not None and guess * batch > max_s:
                    row["skipped"] = f"predicted {guess * batch:.0f} s per run > {max_s:g} s"
                else:
                    runs[(sname, pass_)] = (row, _runner(impl, pass_, x, w, gy, layer), [])
                if sname == "mec" and pass_ == "forward":
                    row["mec_solution"] = impl.solution(layer, device)
            rows.append(row)
    # warm-up (builds kernels, gives the error check its result), then round-robin repetitions
    for key, (row, fn, times) in list(runs.items()):
        try:
            out, warm = timed_result(fn, device)
        except DeviceMemoryError as exc:
            row["skipped"] = f"out of device memory: {exc}"
            del runs[key]
            continue
        if ref:
            row["rel_err"] = _rel_l2(out.to_host(), ref[key[1]])
            row["reference"] = ref_name
        if warm > 5.0:
            times.append(warm)  # a slow case: its warm-up run is its one timed run (builds take < 5 s)
    for rep in range(repeat):
        for key, (row, fn, times) in runs.items():
            if times and times[0] > 5.0:
                continue
            times.append(timed_call(fn, device))
    for key, (row, fn, times) in runs.items():
        t = statistics.median(times)
        row["ms"] = round(t * 1e3, 3)
        row["gflops"] = round(layer.flops / t / 1e9, 3)
        if batch == 1:
            predicted[(row["layer"], row["strategy"], row["pass"])] = t
    return rows


def _fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def summarize(rows, big: int) -> dict:
    """The issue's targets as measured ratios (time of im2col / time of the strategy, forward unless
    said otherwise) at the large batch."""
    t = {(r["layer"], r["strategy"], r["pass"]): r["ms"] for r in rows if r["batch"] == big and r["ms"]}

    def ratio(layer, strategy, pass_="forward"):
        a, b = t.get((layer, "im2col", pass_)), t.get((layer, strategy, pass_))
        return round(a / b, 3) if a and b else None

    out = {"batch": big,
           "winograd_vs_im2col_forward": {l: ratio(l, "winograd") for l in ("cv6", "cv9", "cv10", "cv12")},
           "implicit_gemm_vs_im2col_forward": {f"cv{i}": ratio(f"cv{i}", "implicit_gemm") for i in range(5, 13)},
           "mec_vs_im2col_forward": {f"cv{i}": ratio(f"cv{i}", "mec") for i in range(1, 13)}}
    mec = [v for v in out["mec_vs_im2col_forward"].values() if v is not None]
    out["mec_no_slower_count"] = f"{sum(v >= 1.0 for v in mec)}/{len(mec)}"
    return out


def run(args) -> dict:
    import netcl as nc
    from ..ops import conv_mec
    from ..tuning import mec as mec_tuning
    from ..ops.conv_registry import strategies
    from ..runtime import tuning_db as db
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None) or (2 if quick else 3)
    max_s = settings.BENCH_CONV_MAX_S.get()
    quiet = bool(getattr(args, "json", False))
    impls = strategies()
    all_cases = cases(quick)
    tuned = None
    if not quick:
        tune_names = ("cv5", "cv6", "cv9", "cv10", "cv11", "cv12")
        tune_layers = [dataclasses.replace(layer, n=8) for name, batch, layer in all_cases
                       if batch == 32 and name in tune_names]
        tuned = mec_tuning.tune_threshold(device, tune_layers)
    if not quiet:
        print(f"conv2d strategies on {device.describe()}; median of {repeat}; MEC threshold T = "
              f"{conv_mec.threshold(device)}" + (" (tuned now)" if tuned else ""))
        print(f"{'layer':12s} {'N':>3s} {'strategy':14s} {'pass':16s} {'ms':>10s} {'GFLOP/s':>8s} "
              f"{'workspace':>10s} {'rel err':>8s}")
    rows, predicted = [], {}
    for name, batch, layer in all_cases:
        case_rows = bench_case(name, batch, layer, device, impls, repeat, predicted, max_s,
                               with_errors=batch == 1 or name.startswith("lenet"))
        rows += case_rows
        if not quiet:
            for r in case_rows:
                if not r["applicable"]:
                    continue
                tail = r["skipped"] or ""
                ms = f"{r['ms']:10.2f}" if r["ms"] is not None else f"{'-':>10s}"
                gf = f"{r['gflops']:8.2f}" if r["gflops"] is not None else f"{'-':>8s}"
                err = f"{r['rel_err']:8.1e}" if r["rel_err"] is not None else f"{'-':>8s}"
                print(f"{name:12s} {batch:3d} {r['strategy']:14s} {r['pass']:16s} {ms} {gf} "
                      f"{_fmt_bytes(r['workspace_bytes']):>10s} {err} {tail}", flush=True)
    summary = summarize(rows, 8 if quick else 32)
    if not quiet:
        print("summary:", summary)
    return {"benchmark": "conv", "device": device.describe(), "device_identity": device.identity,
            "tuning_db": db.identity(device), "repeat": repeat, "quick": quick,
            "mec_threshold": conv_mec.threshold(device), "mec_tuning": tuned, "rows": rows, "summary": summary}
