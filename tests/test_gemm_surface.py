"""The GEMM rate surface the cost model prices products by: interpolation, filling, storage, measurement."""
from __future__ import annotations

import math

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_cost, gemm_surface
from netcl.ops.gemm_surface import RateSurface

GRID = {"m": (1, 16, 256), "n": (16, 256, 4096), "k": (4, 64, 1024), "batch": (1, 16)}


def _rate(m, n, k, batch):
    # a smooth made-up law: faster with size along every axis
    return 5.0 * (m ** 0.3) * (n ** 0.2) * (k ** 0.25) * (batch ** 0.1)


def _full(grid=GRID):
    keys = [(m, n, k, b) for m in grid["m"] for n in grid["n"] for k in grid["k"] for b in grid["batch"]]
    return {key: _rate(*key) for key in keys}


def test_grid_points_are_reproduced_and_log_linear_between():
    surface = RateSurface(GRID, _full())
    rng = np.random.default_rng()
    for key in list(_full())[:: 7]:
        assert surface.gflops(*key) == pytest.approx(_rate(*key), rel=1e-9)
    # the law is a power law: log-log multilinear interpolation is exact inside the grid
    for _ in range(20):
        m, n, k = (float(np.exp(rng.uniform(math.log(lo), math.log(hi)))) for lo, hi in
                   ((1, 256), (16, 4096), (4, 1024)))
        b = float(np.exp(rng.uniform(0, math.log(16))))
        assert surface.gflops(m, n, k, b) == pytest.approx(_rate(m, n, k, b), rel=1e-9)


def test_above_the_grid_the_rate_is_clamped_to_its_edge():
    surface = RateSurface(GRID, _full())
    assert surface.gflops(100_000, 16, 4, 1) == pytest.approx(_rate(256, 16, 4, 1))
    assert surface.gflops(1, 16, 4, 1024) == pytest.approx(_rate(1, 16, 4, 16))
    assert surface.gflops(256, 10 ** 6, 10 ** 5, 16) == pytest.approx(_rate(256, 4096, 1024, 16))


def test_below_the_grid_a_product_takes_as_long_as_the_smallest():
    """Tiles are padded to the smallest measured size: a product of 1 or 9 columns (MEC's and Winograd's
    on depthwise layers) costs what one of 16 does, not 16/9 times less."""
    surface = RateSurface(GRID, _full())
    assert surface.gflops(1, 9, 4, 1) == pytest.approx(_rate(1, 16, 4, 1) * 9 / 16)
    assert surface.gflops(1, 1, 1, 1) == pytest.approx(_rate(1, 16, 4, 1) / 16 / 4)
    seconds = lambda m, n, k, b: 2 * m * n * k * b / (surface.gflops(m, n, k, b) * 1e9)
    assert seconds(16, 3, 64, 16) == pytest.approx(seconds(16, 16, 64, 16))
    assert seconds(256, 4096, 2, 1) == pytest.approx(seconds(256, 4096, 4, 1))


def test_unmeasured_points_take_the_best_rate_below_them():
    measured = {key: rate for key, rate in _full().items() if not (key[0] == 256 and key[2] == 1024)}
    surface = RateSurface(GRID, measured)
    for n in GRID["n"]:
        below = max(r for key, r in measured.items() if key[0] <= 256 and key[1] <= n and key[2] <= 1024
                    and key[3] <= 1)
        assert surface.gflops(256, n, 1024, 1) == pytest.approx(below)


def test_rows_round_trip_and_garbage_is_refused():
    surface = RateSurface(GRID, _full())
    again = RateSurface.from_rows(GRID, surface.as_rows())
    assert again.gflops(37, 900, 200, 3) == pytest.approx(surface.gflops(37, 900, 200, 3), rel=1e-3)
    assert RateSurface.from_rows(GRID, [["x", 1, 2, 3, 4]]) is None
    assert RateSurface.from_rows(GRID, []) is None
    with pytest.raises(ValueError):
        RateSurface(GRID, {})


def test_points_respect_the_caps_smallest_first():
    pts = gemm_surface.points(gemm_surface.GRID)
    products = [math.prod(p) for p in pts]
    assert products == sorted(products)
    for m, n, k, b in pts:
        assert 2.0 * m * n * k * b <= gemm_surface.FLOP_CAP
        assert b * max(m * k, k * n, m * n) <= gemm_surface.OPERAND_CAP


def test_the_profile_prices_products_by_the_surface():
    profile = conv_cost.DeviceProfile(gemm_gflops=100.0, bandwidth_gbs=10.0, launch_ms=0.01, source="measured",
                                      class_gflops={"large": 100.0})
    assert profile.rate(256, 256, 256) == 100.0
    profile.surface = RateSurface(GRID, _full())
    assert profile.rate(16, 256, 64, 1) == pytest.approx(_rate(16, 256, 64, 1))
    assert profile.as_dict()["gemm_surface_points"] == len(_full())


def test_measure_on_the_device_within_its_budget():
    device = nc.default_device()
    small = {"m": (1, 8), "n": (16, 64), "k": (4, 16), "batch": (1, 2)}
    surface = gemm_surface.measure(device, np.float32, small, launch_s=0.0, budget_s=60.0)
    assert len(surface.measured) == 16 and all(r > 0 for r in surface.measured.values())
    # with no time at all the smallest point is still measured, and the rest filled from it
    first = gemm_surface.measure(device, np.float32, small, launch_s=0.0, budget_s=0.0)
    assert list(first.measured) == [gemm_surface.points(small)[0]]
    assert first.gflops(8, 64, 16, 2) == pytest.approx(first.measured[(1, 16, 4, 1)])
