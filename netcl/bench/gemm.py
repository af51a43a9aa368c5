"""`netcl bench gemm [--json] [--quick]`: GFLOP/s of netcl's GEMM beside NumPy and a textbook kernel.

Shapes: square 256/512/1024/2048 and the LeNet-shaped products (M x N x K). Every case is timed as the
median of ``--repeat`` runs after a warm-up run (so kernel compilation is excluded). NumPy runs in a
process of its own (netcl.bench.reference), in the same rounds as netcl's runners (netcl.bench.reference
.interleave: rotated order, the reference side first in every other round), so a burst of load from other
processes hits all of them alike and the ratios stay meaningful on a shared machine. netcl's time
includes any operand packing (it is part of the product) and waits for the device to finish.

Two netcl columns: ``netcl`` times one call between two waits for the device (a latency, which on PoCL
includes waking the driver's threads, which can take longer than a small product itself),
and ``netcl_pipelined`` times a run of calls between two waits, divided by their number (a throughput:
how a training loop issues its products, with host work and kernels overlapping as the device allows).
NumPy is timed both ways too (``numpy``: one call, when OpenBLAS's threads may have to wake after the
round trip to its process; ``numpy_pipelined``: the same run of calls), and each netcl column is compared
with its NumPy counterpart. Large products issue one call per sample either way.
"""
from __future__ import annotations

import statistics

import numpy as np

SQUARE = (256, 512, 1024, 2048)
LENET = ((20, 36864, 25), (50, 4096, 500), (50, 500, 4096), (500, 4096, 50), (64, 500, 800), (500, 800, 64),
         (64, 10, 500))


def shapes(quick: bool):
    square = SQUARE[:2] if quick else SQUARE
    return [("square", (n, n, n)) for n in square] + [("lenet", s) for s in LENET]


def _textbook(device, a, b, c, M, N, K):
    from ..runtime.kernels import get_kernel, launch
    kernel = get_kernel(device, "gemm_textbook.cl", "gemm_textbook", T="float", TS=16)
    return lambda: launch(device, kernel, (N, M), (16, 16), np.int32(M), np.int32(N), np.int32(K),
                          a.buffer, b.buffer, c.buffer)


def measure(M: int, N: int, K: int, repeat: int, device, ref, textbook: bool = True, rng=None) -> dict:
    """Median GFLOP/s of netcl, NumPy (in ``ref``, a netcl.bench.reference.ReferenceProcess) and
    (optionally) the textbook kernel on one float32 product."""
    from ..ops.gemm import gemm, params_for, shape_class
    from ..runtime.timing import sample
    from ..runtime.timing import calls_per_sample
    from ..tensor import Tensor
    from .reference import interleave
    rng = rng or np.random.default_rng(0)
    ha = rng.standard_normal((M, K)).astype(np.float32)
    hb = rng.standard_normal((K, N)).astype(np.float32)
    a, b = Tensor.from_host(ha, device), Tensor.from_host(hb, device)
    c = Tensor.empty((M, N), np.float32, device)
    flop = 2.0 * M * N * K
    calls = calls_per_sample(flop)
    one_call = lambda: gemm(a, b, c)  # noqa: E731
    matmul = {"model": "matmul", "M": M, "N": N, "K": K, "seconds": 0.0}
    # NumPy runs in a process of its own (netcl.bench.reference): in this one, PoCL's worker threads and
    # OpenBLAS's take each other's cores (OpenBLAS's spin for a while after each call).
    times = interleave({"netcl": one_call, "netcl_pipelined": (one_call, calls)}, device, ref,
                       {"numpy": dict(matmul, min_reps=1), "numpy_pipelined": dict(matmul, min_reps=calls)},
                       rounds=repeat)
    if textbook:
        c2 = Tensor.empty((M, N), np.float32, device)
        run_textbook = _textbook(device, a, b, c2, M, N, K)
        # The yardstick takes seconds per run on the large squares: one sample of those is enough.
        first = sample(run_textbook, device, repeats=1).samples
        times["textbook"] = first if first[0] > 2.0 else first + sample(run_textbook, device, repeats=repeat - 1,
                                                                         warmup=0).samples
    check = np.linalg.norm(c.to_host() - ha.astype(np.float64) @ hb) / max(np.linalg.norm(ha.astype(np.float64) @ hb), 1e-30)
    row = {"M": M, "N": N, "K": K, "class": shape_class(M, N, K), "rel_l2": float(check),
           "params": params_for(device, np.float32, M, N, K)}
    for name, ts in times.items():
        row[f"{name}_gflops"] = round(flop / statistics.median(ts) / 1e9, 2)
        row[f"{name}_gflops_best"] = round(flop / min(ts) / 1e9, 2)  # what load from other processes hides
    row["vs_numpy"] = round(row["netcl_gflops"] / row["numpy_gflops"], 3)
    row["vs_numpy_pipelined"] = round(row["netcl_pipelined_gflops"] / row["numpy_pipelined_gflops"], 3)
    row["pipelined_calls"] = calls
    if textbook:
        row["vs_textbook"] = round(row["netcl_gflops"] / row["textbook_gflops"], 2)
    return row


def run(args) -> dict:
    """Print the table (also with --json: the CLI prints the returned object as the last line)."""
    import netcl as nc
    from ..runtime import tuning_db as db
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None) or (3 if quick else 7)
    print(f"GEMM float32 on {device.describe()}, GFLOP/s (median of {repeat}; tuning db {db.identity(device)})")
    print(f"{'kind':7s} {'M x N x K':>18s} {'netcl':>8s} {'numpy':>8s} {'textbook':>9s} {'/numpy':>7s} "
          f"{'/textbook':>9s} | pipelined: {'netcl':>8s} {'numpy':>8s} {'/numpy':>7s}")
    rows = []
    from .reference import ReferenceProcess
    with ReferenceProcess() as ref:
        for kind, (M, N, K) in shapes(quick):
            row = measure(M, N, K, repeat, device, ref)
            row["kind"] = kind
            rows.append(row)
            print(f"{kind:7s} {f'{M} x {N} x {K}':>18s} {row['netcl_gflops']:8.1f} {row['numpy_gflops']:8.1f} "
                  f"{row['textbook_gflops']:9.1f} {row['vs_numpy']:7.2f} {row['vs_textbook']:9.1f} | {'':10s} "
                  f"{row['netcl_pipelined_gflops']:8.1f} {row['numpy_pipelined_gflops']:8.1f} "
                  f"{row['vs_numpy_pipelined']:7.2f}", flush=True)
    square = [r["vs_numpy"] for r in rows if r["kind"] == "square" and r["M"] >= 512]
    lenet = [r["vs_numpy"] for r in rows if r["kind"] == "lenet"]
    lenet_pipelined = [r["vs_numpy_pipelined"] for r in rows if r["kind"] == "lenet"]
    summary = {"min_vs_numpy_square_512_2048": min(square) if square else None,
               "min_vs_numpy_lenet": min(lenet) if lenet else None,
               "min_vs_numpy_lenet_pipelined": min(lenet_pipelined) if lenet_pipelined else None,
               "geomean_vs_numpy_lenet": round(float(np.exp(np.mean(np.log(lenet)))), 3) if lenet else None}
    print("summary:", ", ".join(f"{k} {v}" for k, v in summary.items()))
    return {"benchmark": "gemm", "device": device.describe(), "device_identity": device.identity,
            "tuning_db": db.identity(device), "repeat": repeat, "rows": rows, "summary": summary}
