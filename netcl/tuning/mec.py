"""Tuning MEC's threshold T (Algorithm 2, line 8: Solution A for outputs at most T wide, else B) on the
device: both solutions timed on a set of layers, T set to what minimizes their total
(`netcl bench conv` runs it before timing). Stored in the tuning database (family "mec");
netcl.ops.conv_mec.threshold reads it."""
from __future__ import annotations

import numpy as np

from ..ops import conv_mec
from ..runtime.timing import compare
from ..tensor import Tensor
from ..runtime import tuning_db as db


def choose_threshold(results) -> int:
    """The T (0 or a measured ow) that minimizes the total time of the measured layers when each runs A
    if its ow ≤ T, else B; the smaller T on a tie. A rule like "the largest ow up to which A never lost"
    lets one near-tie within the noise set T, and sends larger layers to the variant that lost on them
    clearly in the same tuning run."""
    candidates = sorted({0, *(r["ow"] for r in results)})
    def total(t):
        return sum(r["A_ms"] if r["ow"] <= t else r["B_ms"] for r in results)
    return min(candidates, key=lambda t: (total(t), t))


def tune_threshold(device, layers, repeat: int = 2, store: bool = True) -> dict:
    """Time Solutions A and B of the forward pass on ``layers`` (those where A is possible), in
    alternating rounds, and set T to the ow threshold under which the measured layers take least time in
    all (choose_threshold); stored in the tuning database (family "mec")."""
    rng = np.random.default_rng(0)
    results = []
    for layer in layers:
        if conv_mec.output_elements(layer) > conv_mec.lowered_elements(layer) or conv_mec.STRATEGY.why_not(layer, "forward", device):
            continue
        x = Tensor.from_host(rng.standard_normal(layer.input_shape).astype(layer.dtype), device)
        w = Tensor.from_host(rng.standard_normal(layer.weight_shape).astype(layer.dtype), device)
        # alternating rounds (AB, BA, ...): whichever runs second finds warm caches; the fastest sample
        timed = compare({sol: (lambda sol=sol: conv_mec.STRATEGY.forward(x, w, layer, solution=sol)) for sol in "AB"},
                        device, warmup=1, min_runs=repeat, max_runs=repeat, time_budget_s=0.0,
                        settle_below_s=0.0, slow_s=float("inf"), statistic="min", errors=())
        best = {sol: timed[sol].seconds for sol in "AB"}
        results.append({"ow": layer.out_w, "layer": layer.signature(), "A_ms": best["A"] * 1e3,
                        "B_ms": best["B"] * 1e3})
    t = choose_threshold(results)
    entry = {"T": t, "measured": results}
    if store and results:
        db.store(device, "mec", entry)
    return entry
