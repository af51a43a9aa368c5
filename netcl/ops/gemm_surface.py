"""The device's GEMM rate as a function of the product's shape, measured on a grid and interpolated.

The cost model prices a strategy's products by the rate netcl's GEMM reaches on them. One rate per shape
class is not enough: products of one class run at rates more than twice apart, and pricing them all at
the class's one measured rate made im2col look much slower than it was on the MEC paper's batch-1 layers.
So calibration times the GEMM on a grid of
shapes (powers of four in M, N and K, batches 1 and 16) and a product's rate is the multilinear
interpolation of log rate in log M, log N, log K and log batch, clamped to the grid above its largest
sizes; below its smallest N or K a product takes as long as the smallest one (its tiles are padded to
that size), so its rate falls in proportion.

Points whose product would exceed ``FLOP_CAP`` or whose operands would exceed ``OPERAND_CAP`` are not run:
their rate is the best rate measured at a grid point no larger in every dimension (a larger product of
the same proportions is at least as efficient: more work per launch and per tile edge).
"""
from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

GRID = {"m": (1, 4, 16, 64, 256, 1024, 4096), "n": (16, 64, 256, 1024, 4096, 16384, 65536),
        "k": (4, 16, 64, 256, 1024, 4096, 16384), "batch": (1, 16)}
QUICK_GRID = {"m": (1, 8, 64, 512, 4096), "n": (16, 128, 1024, 8192, 65536),
              "k": (4, 32, 256, 2048, 16384), "batch": (1, 16)}
FLOP_CAP = 4e9
OPERAND_CAP = 1 << 24  # elements of the largest operand


class RateSurface:
    """GFLOP/s by (m, n, k, batch) from measured grid points {(m, n, k, batch): gflops}."""

    def __init__(self, grid: dict, measured: dict):
        self.axes = [tuple(int(v) for v in grid[name]) for name in ("m", "n", "k", "batch")]
        if any(not axis or min(axis) < 1 or list(axis) != sorted(set(axis)) for axis in self.axes):
            raise ValueError(f"a rate surface's axes must be increasing positive sizes, got {self.axes}")
        self.measured = {tuple(int(v) for v in key): float(rate) for key, rate in measured.items() if rate > 0}
        if not self.measured:
            raise ValueError("a rate surface needs at least one measured point")
        self.log_axes = [tuple(math.log(v) for v in axis) for axis in self.axes]
        self.log_rates = self._fill()

    def _fill(self) -> np.ndarray:
        """log GFLOP/s at every grid point; unmeasured points take the best of their measured down-set."""
        table = np.full(tuple(len(axis) for axis in self.axes), -np.inf)
        for key, rate in self.measured.items():
            if all(v in axis for v, axis in zip(key, self.axes)):
                table[tuple(axis.index(v) for v, axis in zip(key, self.axes))] = math.log(rate)
        # running maximum along each axis in turn = the maximum over the down-set, for the unmeasured
        best = table.copy()
        for axis in range(4):
            best = np.maximum.accumulate(best, axis=axis)
        filled = np.where(np.isfinite(table), table, best)
        if not np.all(np.isfinite(filled)):
            # a point with no measured point below it (the grid's smallest corner was not measured):
            # the smallest measured rate, the cautious guess
            filled[~np.isfinite(filled)] = min(math.log(r) for r in self.measured.values())
        return filled

    def gflops(self, m: int, n: int, k: int, batch: int = 1) -> float:
        corners = []
        below = 0.0  # log of how far m, n and k lie below the grid's smallest sizes
        for axis, (logs, value) in enumerate(zip(self.log_axes, (m, n, k, batch))):
            if axis < 3:
                below += min(0.0, math.log(max(value, 1)) - logs[0])
            if len(logs) == 1:
                corners.append(((0, 1.0),))
                continue
            x = min(max(math.log(max(value, 1)), logs[0]), logs[-1])
            i = min(bisect.bisect_right(logs, x) - 1, len(logs) - 2)
            t = (x - logs[i]) / (logs[i + 1] - logs[i])
            corners.append(((i, 1.0 - t), (i + 1, t)))
        total = 0.0
        for combo in itertools.product(*corners):
            weight = math.prod(w for _, w in combo)
            if weight:
                total += weight * self.log_rates[tuple(i for i, _ in combo)]
        # a product smaller than the grid's smallest in m, n or k takes as long as that smallest one (its
        # tiles are padded to the same size), so its rate falls with its size there
        return math.exp(total + below)

    def as_rows(self) -> list:
        return [[*key, round(rate, 3)] for key, rate in sorted(self.measured.items())]

    @classmethod
    def from_rows(cls, grid: dict, rows) -> "RateSurface | None":
        """From stored rows [[m, n, k, batch, gflops], ...]; None when they are unusable."""
        try:
            measured = {tuple(int(v) for v in row[:4]): float(row[4]) for row in rows
                        if len(row) == 5 and float(row[4]) > 0}
            return cls(grid, measured) if measured else None
        except (TypeError, ValueError, KeyError, IndexError):
            return None


def points(grid: dict) -> list:
    """The grid points that are run, smallest product first: (m, n, k, batch) within the flop and operand
    caps."""
    kept = []
    for m, n, k, batch in itertools.product(grid["m"], grid["n"], grid["k"], grid["batch"]):
        if 2.0 * m * n * k * batch <= FLOP_CAP and batch * max(m * k, k * n, m * n) <= OPERAND_CAP:
            kept.append((m, n, k, batch))
    return sorted(kept, key=lambda p: (math.prod(p), p))


def measure(device, dtype, grid: dict, launch_s: float, budget_s: float = 30.0, progress=None) -> RateSurface:
    """Time netcl's GEMM at the grid's points on ``device``, smallest first, until ``budget_s`` is spent
    (a slow device, a simulator above all, measures the small corner and fills the rest from it): the
    fastest of 5 samples each, the launch time taken off (a pass's launches are priced separately).
    ``progress()`` is called after each point."""
    import time
    from ..runtime.timing import sample
    from ..tensor import Tensor
    from ..runtime.timing import calls_per_sample
    from .gemm import gemm_batched
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    measured = {}
    deadline = time.perf_counter() + budget_s
    for m, n, k, batch in points(grid):
        if measured and time.perf_counter() > deadline:
            break
        a = Tensor.from_host(rng.uniform(-1, 1, (batch, m, k)).astype(dt), device=device)
        b = Tensor.from_host(rng.uniform(-1, 1, (batch, k, n)).astype(dt), device=device)
        c = Tensor.empty((batch, m, n), dt, device)
        flop = 2.0 * m * n * k * batch
        calls = calls_per_sample(flop)
        seconds = sample(lambda: gemm_batched(a, b, c), device, repeats=5, calls=calls, statistic="min").seconds
        # never below a tenth of the measured time: a product is not free because a launch is slow
        measured[(m, n, k, batch)] = flop / max(seconds - launch_s / calls, 0.1 * seconds) / 1e9
        if progress is not None:
            progress()
    return RateSurface(grid, measured)
