"""`netcl tune gemm [--quick]`: search the GEMM template's parameters on the current device.

For each dtype and shape class (netcl.ops.gemm.shape_class) the tuner times candidates on a few
representative products (for the batched class, batches of them, each batch one launch) and keeps the
fastest whose result matches a float64 NumPy reference (relative L2 error <= 1e-5 for float32, 1e-12
for float64; anything else, or a failed build, is rejected). The
search is staged to keep the number of kernel builds small: first the register tile (MR x VW*NV), then
the work-group shape and grid order, then packing and K unrolling, then the register tile again with
those, then (full search only) local-memory tiles. The current parameters are always a candidate, so a
re-tune never makes things worse by its own measurement. Winners go to the tuning database
(netcl.runtime.tuning_db) under family "gemm", key "<dtype>/<class>" (and "<dtype>" for the large class,
the fallback), together with the GFLOP/s measured, which netcl.ops.gemm.expected_gflops serves to cost
models such as the conv planner's.
"""
from __future__ import annotations

import datetime
import math
import time

import numpy as np

from ..runtime import binaries
from ..runtime import tuning_db as db
from ..runtime.timing import calls_per_sample

SHAPES = {
    "large": [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)],
    "small_k": [(20, 36864, 25), (500, 4096, 50), (500, 800, 64), (64, 16384, 64)],
    "small_mn": [(50, 4096, 500), (50, 500, 4096), (64, 500, 800), (96, 196, 576)],
    "small_n": [(512, 49, 4608), (2048, 49, 512), (256, 49, 2304)],  # ResNets' 7x7 layers at batch 1
    "tiny": [(64, 10, 500), (10, 500, 64), (64, 500, 10)],  # LeNet's last layer, forward and backward
    # (M, N, K, batch): Winograd F(4x4) products of ResNets' 3x3 layers at batch 1 (56, 28 and 14 pixels)
    "batched": [(64, 196, 64, 36), (128, 49, 128, 36), (256, 16, 256, 36), (128, 196, 64, 36)],
}
QUICK_SHAPES = {
    "large": [(512, 512, 512), (1536, 1536, 1536)],  # a big one: grid order matters once B leaves L2
    "small_k": [(20, 36864, 25), (500, 4096, 50), (64, 16384, 64)],  # the last: a Winograd product
    "small_mn": [(50, 4096, 500), (64, 500, 800), (96, 196, 576)],  # the last: MobileNetV2's 14x14 projection
    "small_n": [(512, 49, 4608), (2048, 49, 512)],
    "tiny": [(64, 10, 500), (10, 500, 64)],
    "batched": [(64, 196, 64, 36), (128, 49, 128, 36), (256, 16, 256, 36)],
}
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def _tiles(lanes: int, quick: bool, dtype: str = "float32"):
    """Register tiles (MR rows x NV vectors of VW lanes). A CPU with 32 vector registers (AVX-512) wants 16-24
    accumulators, one with 16 (AVX2) 8-12: both kinds are tried and the device's measurement decides,
    so no tile count is assumed from the instruction set (a search of 256-bit tiles only leaves an
    AVX-512 CPU at a fraction of its speed).

    The reported width is not always the compiled one: the PoCL wheel (LLVM 14) reports 16 floats on a
    Zen 4 but compiles for znver3, AVX2, where a 16-lane tile of 16-32 accumulators spills and runs far
    slower than an 8-lane one. So a device reporting more than 256 bits also gets
    256-bit tiles."""
    from ..ops.gemm import lanes_in_256_bits
    narrow = lanes_in_256_bits(dtype)
    tiles = [(4, lanes, 2), (6, lanes, 2), (8, lanes, 2), (4, lanes, 3), (3, lanes, 4), (8, lanes, 1),
             (2, lanes, 4)]  # lanes: netcl.ops.gemm.native_lanes of the device and dtype
    if lanes > narrow:
        tiles += [(4, narrow, 2), (6, narrow, 2), (4, narrow, 3), (8, narrow, 1)]
    if not quick:
        tiles += [(12, lanes, 2), (6, lanes, 3), (5, lanes, 2), (4, 2 * lanes, 1), (2, 2 * lanes, 2),
                  (4, lanes // 2, 4), (8, lanes // 2, 2)]
    unique = dict.fromkeys((mr, vw, nv) for mr, vw, nv in tiles if vw <= 16)
    return [{"MR": mr, "VW": vw, "NV": nv} for mr, vw, nv in unique]


def _groups(quick: bool):
    groups = [(1, 1, "mn"), (8, 1, "mn"), (1, 8, "nm"), (1, 8, "mn"), (4, 4, "mn"), (32, 1, "mn"), (128, 1, "mn"),
              (1, 32, "nm")]
    if not quick:
        groups += [(1, 1, "nm"), (4, 4, "nm"), (2, 8, "nm"), (2, 8, "mn"), (16, 1, "mn"), (64, 1, "mn"), (1, 128, "nm")]
    return [{"WG_M": m, "WG_N": n, "ORDER": o} for m, n, o in groups]


def _extras(quick: bool):
    extras = [{"PACK_B": 1, "PACK_A": 0, "KU": 1}, {"PACK_B": 0, "PACK_A": 0, "KU": 1},
              {"PACK_B": 1, "PACK_A": 1, "KU": 1}, {"PACK_B": 1, "PACK_A": 0, "KU": 2}]
    if not quick:
        extras += [{"PACK_B": 0, "PACK_A": 1, "KU": 1}, {"PACK_B": 1, "PACK_A": 1, "KU": 4}]
    return extras


def _local_variants(dtype: str):
    vw = 4 if dtype == "float32" else 2
    return [{"LOCAL": 1, "MR": mr, "VW": vw, "NV": 1, "WG_M": wm, "WG_N": wn, "KC": kc, "ORDER": "nm"}
            for mr, wm, wn, kc in ((4, 8, 16, 16), (4, 4, 4, 32), (2, 8, 8, 16), (8, 4, 4, 16))]


class _Case:
    """One product (a batch of them, one launch, when ``batch`` > 1) with its operands on the device and
    its float64 reference."""

    def __init__(self, device, dtype, M, N, K, batch: int = 1, *, rng):
        from ..tensor import Tensor
        self.M, self.N, self.K, self.batch = M, N, K, batch
        self.flop = 2.0 * M * N * K * batch
        shape = (batch,) if batch > 1 else ()
        a = rng.standard_normal(shape + (M, K)).astype(dtype)
        b = rng.standard_normal(shape + (K, N)).astype(dtype)
        self.ref = a.astype(np.float64) @ b.astype(np.float64)
        self.a, self.b = Tensor.from_host(a, device), Tensor.from_host(b, device)
        self.c = Tensor.empty(shape + (M, N), dtype, device)
        self.device = device

    @property
    def name(self) -> str:
        return f"{self.M}x{self.N}x{self.K}" + (f"x{self.batch}" if self.batch > 1 else "")

    def run(self, params) -> None:
        from ..ops.gemm import gemm, gemm_batched
        (gemm_batched if self.batch > 1 else gemm)(self.a, self.b, self.c, params=params)

    def error(self) -> float:
        out = self.c.to_host().astype(np.float64)
        if not np.all(np.isfinite(out)):
            return math.inf
        return float(np.linalg.norm(out - self.ref) / max(np.linalg.norm(self.ref), 1e-300))

    def gflops(self, params, repeat: int) -> float:
        from ..runtime.timing import sample
        # A small product is timed as a run of calls between two waits, as a training loop issues it:
        # one call between waits would time the driver's wake-up latency, the same for every candidate.
        calls = calls_per_sample(self.flop)
        # The fastest sample, not the median: other processes only ever slow a run down, so on a shared
        # machine the minimum is the steadiest estimate of what the kernel itself can do. The warm-up run
        # builds the kernel and warms the caches.
        timing = sample(lambda: self.run(params), self.device, repeats=repeat,
                        warmup=calls, calls=calls, statistic="min")
        return self.flop / timing.seconds / 1e9


def _score(cases, params, repeat: int, tol: float):
    """Geometric-mean GFLOP/s over the cases, or (None, reason) if the candidate fails or is wrong."""
    from ..errors import NetclError
    from ..ops.elementwise import fill
    rates = []
    for case in cases:
        try:
            fill(case.c, float("nan"))  # a candidate that leaves parts of C unwritten must not pass
            rate = case.gflops(params, repeat)
        except NetclError as exc:
            return None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        err = case.error()
        if not err <= tol:
            return None, f"rejected: relative L2 error {err:.2e} > {tol:.0e} on {case.name}"
        rates.append(rate)
    return float(np.exp(np.mean(np.log(rates)))), [round(r, 2) for r in rates]


LEADERS = 4  # candidates re-timed head to head before the choice


def _settle(cases, leaders: list, repeat: int) -> dict:
    """(Geometric-mean GFLOP/s, [GFLOP/s per case]) of each leader, the leaders timed against each other on each
    case in rotated rounds (netcl.runtime.timing.compare), the median of each one's samples.

    The search's scores are each the fastest of a few samples taken minutes apart from its rivals', so
    the top few differ by less than their noise. Keeping the larger of a search score and one re-timing,
    picks whichever leader had the luckier sample, which can be one that is slower at every size when
    the leaders are timed against each other."""
    from ..runtime.timing import compare
    logs = {key: [] for key in leaders}
    for case in cases:
        calls = calls_per_sample(case.flop)
        runners = {key: _calls(case, dict(key), calls) for key in leaders}
        timings = compare(runners, case.device, warmup=1, min_runs=max(repeat, 5), max_runs=3 * repeat,
                          time_budget_s=2.0)
        for key, timing in timings.items():
            failed = isinstance(timing, Exception)
            logs[key].append(-math.inf if failed else math.log(1e-9 * case.flop * calls / timing.seconds))
    return {key: (float(np.exp(np.mean(values))), [round(float(np.exp(v)), 2) for v in values])
            for key, values in logs.items()}


def _calls(case, params: dict, calls: int):
    def run():
        for _ in range(calls):
            case.run(params)
    return run


def tune_class(device, dtype: str, cls: str, quick: bool, log=print) -> dict:
    """Search one (dtype, shape class); returns the winner with its measured rates."""
    from ..ops.gemm import native_lanes, normalize, params_for
    shapes = (QUICK_SHAPES if quick else SHAPES)[cls]
    rng = np.random.default_rng(1234)
    cases = [_Case(device, np.dtype(dtype), *shape, rng=rng) for shape in shapes]
    repeat = 3 if quick else 5
    tol = TOLERANCE[dtype]
    tried: dict[tuple, float | None] = {}

    def trial(params):
        params = normalize(params)
        key = tuple(sorted(params.items()))
        if key not in tried:
            score, detail = _score(cases, params, repeat, tol)
            tried[key] = score
            text = f"{score:7.1f} GFLOP/s {detail}" if score is not None else detail
            log(f"  {dtype}/{cls} {_fmt(params)}: {text}")
        return tried[key]

    current = params_for(device, dtype, *shapes[0])
    best = normalize(current)
    best_score = trial(best) or 0.0
    lanes = native_lanes(device, dtype)
    # The register tile is searched again once the grid and packing are chosen: it is first timed with
    # B packed, and a tile that wins without packing (a narrow one on few-column products) loses there.
    tiles = _tiles(lanes, quick, dtype)
    stages = [tiles, _groups(quick), _extras(quick), tiles]
    if not quick:
        stages.append(_local_variants(dtype))
    base = {"MR": 4, "VW": lanes, "NV": 2, "WG_M": 8, "WG_N": 1, "KU": 1, "LOCAL": 0, "PACK_B": 1, "PACK_A": 0,
            "ORDER": "mn"} if device.kind == "cpu" else dict(current)
    for stage in stages:
        stage_base = dict(best) if best.get("LOCAL") == base.get("LOCAL") else dict(base)
        for change in stage:
            candidate = normalize({**stage_base, **change})
            if candidate["WG_M"] * candidate["WG_N"] > device.max_work_group_size:
                continue
            score = trial(candidate)
            if score is not None and score > best_score:
                best, best_score = candidate, score
        base = dict(best)
    leaders = sorted((k for k, v in tried.items() if v is not None), key=lambda k: -tried[k])[:LEADERS]
    if len(leaders) > 1:
        settled = _settle(cases, leaders, repeat)
        for key in leaders:
            rate, per_case = settled[key]
            log(f"  {dtype}/{cls} {_fmt(dict(key))}: {rate:7.1f} GFLOP/s {per_case} head to head")
        best_key = max(leaders, key=lambda k: settled[k][0])
        best, (best_score, per_case) = dict(best_key), settled[best_key]
    else:  # one candidate passed, or none (the current parameters stay): its rates from one more timing
        best = dict(leaders[0]) if leaders else best
        best_score, per_case = _score(cases, best, repeat, tol)
        if best_score is None:
            best_score, per_case = 0.0, []
    rates = {case.name: r for case, r in zip(cases, per_case)}
    return {"params": best, "gflops": round(best_score, 2), "rates": rates, "candidates": len(tried)}


def _fmt(params) -> str:
    return " ".join(f"{k}={params[k]}" for k in sorted(params))


def run_cli(args) -> dict:
    import netcl as nc
    device = nc.default_device()
    quick = bool(getattr(args, "quick", False))
    quiet = bool(getattr(args, "json", False))
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    plan = [("float32", cls) for cls in SHAPES]
    if device.has_fp64:
        plan += [("float64", "large")] if quick else [("float64", cls) for cls in SHAPES]
    log(f"tuning gemm on {device.describe()}{' (quick)' if quick else ''}")
    start = time.perf_counter()
    results = {}
    # the losing candidates' binaries, also after an interrupted search: writing them at exit took 2.5
    # min of PoCL's time; the next process rebuilds the few programs it uses
    with binaries.unsaved_builds_discarded():
        for dtype, cls in plan:
            log(f"{dtype}/{cls}:")
            found = tune_class(device, dtype, cls, quick, log)
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            entry = {**found["params"], "gflops": found["gflops"], "rates": found["rates"], "tuned_at": stamp,
                     "quick": quick}
            db.store(device, "gemm", entry, key=f"{dtype}/{cls}")
            if cls == "large":
                db.store(device, "gemm", entry, key=dtype)
            results[f"{dtype}/{cls}"] = found
            log(f"  -> {_fmt(found['params'])}: {found['gflops']:.1f} GFLOP/s")
    elapsed = time.perf_counter() - start
    log(f"stored in {db.db_path()} ({elapsed:.0f} s)")
    return {"tuned": "gemm", "device": device.describe(), "device_identity": device.identity,
            "database": str(db.db_path()), "seconds": round(elapsed, 1), "results": results,
            "tuning_db": db.identity(device)}
