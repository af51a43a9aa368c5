"""The pointwise strategy beyond the shared sweep: odd sizes, groups, planes narrower than a vector and
planes that end in a moved-back vector, row counts that leave partial row tiles, batch 1 and 3, against
the float64 reference with canaries around every tensor; the fused bias; float64; a finite-difference
check of both gradients; the geometries other devices get (GPU groups of single pixels, narrower vectors,
other row tiles) run here; and what it refuses."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_pointwise as pointwise
from netcl.ops.conv2d import CONV2D_POINTWISE, conv2d
from netcl.ops.conv_common import PASSES, ConvLayer
from util import assert_finite_differences, check_forced_conv

# (input NCHW, output channels, groups)
CASES = [
    ((1, 3, 7, 9), 5, 1),
    ((3, 7, 13, 37), 11, 1),     # planes of several vectors and a moved-back last one
    ((1, 32, 17, 17), 16, 1),    # a full row tile
    ((2, 13, 5, 3), 29, 1),      # rows past the last row tile; planes narrower than a wide vector
    ((1, 5, 1, 1), 3, 1),        # one pixel
    ((3, 6, 3, 5), 9, 3),        # groups
    ((2, 8, 7, 7), 8, 8),        # one channel per group
    ((1, 24, 14, 14), 144, 1),   # MobileNetV2's expansion shape, smaller
    ((1, 144, 9, 11), 24, 1),    # and its projection
]


def _ids(case):
    xs, k, g = case
    return f"x{'x'.join(map(str, xs))}-k{k}-g{g}"


def check(case, rng, device, dtype="float32", bias=False, tolerances=(1e-5, 1e-4)):
    xs, k, groups = case
    ws = (k, xs[1] // groups, 1, 1)
    args = ((1, 1), (0, 0), (1, 1), groups)
    layer = ConvLayer.from_shapes(xs, ws, *args, dtype)
    assert all(pointwise.STRATEGY.why_not(layer, p) is None for p in PASSES)
    check_forced_conv(CONV2D_POINTWISE, xs, ws, args, rng, device, dtype, bias, tolerances, _ids(case))


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_matches_float64_reference(case, rng, device, canaries):
    check(case, rng, device)


def test_fused_bias(rng, device, canaries):
    check(((3, 5, 9, 19), 7, 1), rng, device, bias=True)
    check(((1, 6, 5, 5), 4, 2), rng, device, bias=True)


def test_float64(rng, device, canaries):
    if not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    for case in (CASES[1], CASES[3], CASES[5]):
        check(case, rng, device, "float64", tolerances=(1e-12, 1e-11))


def test_gradients_match_finite_differences(rng, device):
    """d(Σ y·gy)/dθ by central differences in float64, for a few entries of the input and the weight."""
    if not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    xs, ws = (2, 4, 5, 7), (6, 2, 1, 1)
    x, w = rng.uniform(-1, 1, xs), rng.uniform(-1, 1, ws)
    gy = rng.uniform(-1, 1, (2, 6, 5, 7))

    def objective(x_, w_):
        y = conv2d(nc.Tensor.from_host(x_, device), nc.Tensor.from_host(w_, device), groups=2,
                   strategy=CONV2D_POINTWISE)
        return float(np.sum(y.to_host() * gy))
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    W = nc.Tensor.from_host(w, device, requires_grad=True)
    conv2d(X, W, groups=2, strategy=CONV2D_POINTWISE).backward(nc.Tensor.from_host(gy, device))
    assert_finite_differences(objective, x, w, X.grad.to_host(), W.grad.to_host(), rng)


@pytest.mark.parametrize("vector, first, group", [(1, True, 64), (1, True, 5), (4, False, 1), (2, True, 3)])
def test_geometries_of_other_devices(vector, first, group, rng, device, monkeypatch, canaries):
    """A GPU's (single pixels in groups of adjacent ones along the first dimension, the last group partly
    past the plane) and narrower CPUs' vectors, in either launch order, on this device."""
    monkeypatch.setattr(pointwise, "_vector", lambda dev, dtype, pixels: min(vector, pixels))
    monkeypatch.setattr(pointwise, "pixels_first", lambda dev, layer, pass_: first)
    monkeypatch.setattr(pointwise, "_pixel_group", lambda dev: group)
    for case in (CASES[1], CASES[3], CASES[5]):
        check(case, rng, device)


@pytest.mark.parametrize("rows", [4, 8, 12, 16])
def test_every_row_tile(rows, rng, device, monkeypatch, canaries):
    """Each row tile the host may pick, on rows that fill it, leave part of the last one, or fall short
    of one."""
    monkeypatch.setattr(pointwise, "_row_tile", lambda count, vector: rows)
    for case in (((1, 9, 6, 7), 17, 1), ((2, 5, 4, 5), 3, 1)):
        check(case, rng, device)


def test_weight_tiles_past_the_channels(rng, device, canaries):
    """backward_weight's 4×4 tiles over channel counts that leave partial tiles both ways."""
    check(((2, 7, 6, 11), 5, 1), rng, device)
    check(((1, 10, 3, 3), 6, 2), rng, device)


@pytest.mark.parametrize("kw, rule", [
    (dict(weight=(4, 3, 3, 3), padding=1), "1×1 kernel"),
    (dict(weight=(4, 3, 1, 1), stride=2), "stride"),
    (dict(weight=(4, 3, 1, 1), padding=1), "padding"),
])
def test_refuses_what_it_cannot_serve(kw, rule, device):
    layer = ConvLayer.from_shapes((1, 3, 8, 8), kw["weight"], kw.get("stride", 1), kw.get("padding", 0))
    for pass_ in PASSES:
        assert rule in pointwise.STRATEGY.why_not(layer, pass_)
    with pytest.raises(nc.ShapeError, match="pointwise"):
        conv2d(nc.Tensor.from_host(np.zeros((1, 3, 8, 8), np.float32), device),
               nc.Tensor.from_host(np.zeros(kw["weight"], np.float32), device), stride=kw.get("stride", 1),
               padding=kw.get("padding", 0), strategy=CONV2D_POINTWISE)


def test_cost_terms_count_the_padded_tiles(device, monkeypatch):
    """The issued arithmetic covers the row tiles and the moved-back vector; the bytes every tensor and, in
    a GPU's launch order, the input planes each further row tile reads again."""
    layer = ConvLayer.from_shapes((1, 8, 5, 7), (13, 8, 1, 1))
    for first in (False, True):
        monkeypatch.setattr(pointwise, "pixels_first", lambda dev, layer, pass_: first)
        shape = pointwise.geometry(layer, "forward", device)
        terms = pointwise.STRATEGY.cost_terms(layer, "forward", device)
        assert terms.kernel_flops >= layer.flops
        tiles = -(-13 // shape.rows)
        assert terms.kernel_flops == 2.0 * tiles * shape.rows * 8 * (-(-35 // shape.vector) * shape.vector)
        x_bytes = 8 * 35 * 4
        assert terms.bytes_moved == (8 * 35 + 13 * 8 + 13 * 35) * 4 + (tiles - 1) * x_bytes * first
    assert terms.launches == 1
    assert pointwise.STRATEGY.workspace_bytes(layer, "forward", device) == 0
