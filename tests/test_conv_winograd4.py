"""winograd4, F(4×4, 3×3): forward and the input gradient against float64 (odd and tiny sizes, so partial
tiles and partial runs of a work-item's tiles everywhere; channels 1/3/5/17; batch 1; groups; padding 0..4;
canaries), its rounding against F(2×2, 3×3)'s, its refusal of the weight gradient and of other layers, and
the exact workspace."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import CONV2D_WINOGRAD4, conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from test_conv_implicit_gemm import check_workspace
from util import conv2d_grads_ref, conv2d_ref, rel_l2

CASES = [
    ((1, 1, 7, 9), (3, 1, 3, 3), 1, "float32"),
    ((2, 3, 13, 11), (5, 3, 3, 3), 0, "float32"),
    ((1, 5, 15, 13), (17, 5, 3, 3), 2, "float32"),
    ((3, 17, 9, 7), (5, 17, 3, 3), (1, 0), "float32"),
    ((1, 4, 2, 2), (3, 4, 3, 3), 2, "float32"),                     # smaller than one tile
    ((1, 2, 5, 4), (3, 2, 3, 3), 4, "float32"),                     # padding > 2: negative in backward
    ((1, 3, 7, 45), (4, 3, 3, 3), 1, "float32"),                    # 12 tiles a row: several work-items
    ((2, 8, 23, 21), (6, 8, 3, 3), 1, "float32"),
    ((1, 3, 9, 7), (5, 3, 3, 3), 1, "float64"),
    ((2, 4, 11, 6), (3, 4, 3, 3), 0, "float64"),
]
GROUPED = [((1, 6, 5, 9), (9, 2, 3, 3), 1, 3, "float32"), ((2, 4, 6, 6), (4, 1, 3, 3), 1, 4, "float32")]


def _errors(xs, ws, padding, groups, dtype, rng, device) -> dict:
    """conv2d forced to winograd4 (the input gradient through autograd) against float64 NumPy."""
    if dtype == "float64" and not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    pad = padding if isinstance(padding, tuple) else (padding, padding)
    x = rng.uniform(-1, 1, xs).astype(dtype)
    w = rng.uniform(-1, 1, ws).astype(dtype)
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    y = conv2d(X, nc.Tensor.from_host(w, device), padding=padding, groups=groups, strategy=CONV2D_WINOGRAD4)
    args = ((1, 1), pad, (1, 1), groups)
    forward = rel_l2(y.to_host(), conv2d_ref(x, w, *args))
    gy = rng.uniform(-1, 1, y.shape).astype(dtype)
    y.backward(nc.Tensor.from_host(gy, device))
    gx_ref, _ = conv2d_grads_ref(x, w, gy, *args)
    return {"forward": forward, "grad_input": rel_l2(X.grad.to_host(), gx_ref)}


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_winograd4_matches_reference(case, rng, device, canaries):
    xs, ws, padding, dtype = case
    tolerance = 1e-4 if dtype == "float32" else 1e-12
    errors = _errors(xs, ws, padding, 1, dtype, rng, device)
    assert errors["forward"] <= tolerance and errors["grad_input"] <= 5 * tolerance, errors


@pytest.mark.parametrize("case", GROUPED, ids=["groups3", "depthwise"])
def test_winograd4_grouped_matches_reference(case, rng, device, canaries):
    xs, ws, padding, groups, dtype = case
    errors = _errors(xs, ws, padding, groups, dtype, rng, device)
    assert errors["forward"] <= 1e-4 and errors["grad_input"] <= 5e-4, errors


def test_rounding_is_close_to_f2x2(rng, device):
    """The larger tiles' transforms scale by up to 8 (points ±2): on a ResNet-like layer their error stays
    within an order of magnitude of F(2×2, 3×3)'s (both near float32's resolution)."""
    x = rng.uniform(-1, 1, (1, 32, 28, 28)).astype(np.float32)
    w = rng.uniform(-1, 1, (32, 32, 3, 3)).astype(np.float32)
    ref = conv2d_ref(x, w, (1, 1), (1, 1), (1, 1), 1)
    X, W = nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device)
    errors = {name: rel_l2(conv2d(X, W, padding=1, strategy=name).to_host(), ref)
              for name in ("winograd", "winograd4")}
    assert errors["winograd4"] <= max(10 * errors["winograd"], 1e-5), errors


def test_weight_gradient_is_refused_with_the_reason(device):
    layer = ConvLayer.from_shapes((1, 2, 8, 8), (3, 2, 3, 3), padding=1)
    assert "data passes only" in strategies()["winograd4"].why_not(layer, "backward_weight")
    X = nc.Tensor.from_host(np.ones((1, 2, 8, 8), np.float32), device)
    W = nc.Tensor.from_host(np.ones((3, 2, 3, 3), np.float32), device, requires_grad=True)
    y = conv2d(X, W, padding=1, strategy="winograd4")
    with pytest.raises(nc.ShapeError, match="winograd4.*backward_weight.*data passes only"):
        y.backward(nc.Tensor.from_host(np.ones(y.shape, np.float32), device))


@pytest.mark.parametrize("weight, kw, rule", [
    ((4, 3, 5, 5), {}, "needs a 3×3 kernel"),
    ((4, 3, 3, 3), {"stride": 2}, "needs stride 1"),
    ((4, 3, 3, 3), {"dilation": 2}, "needs dilation 1"),
])
def test_forcing_winograd4_where_it_cannot_run_names_the_rule(weight, kw, rule, device):
    x = nc.Tensor.from_host(np.ones((1, 3, 12, 12), np.float32), device)
    w = nc.Tensor.from_host(np.ones(weight, np.float32), device)
    with pytest.raises(nc.ShapeError, match=rule) as info:
        conv2d(x, w, strategy="winograd4", **kw)
    assert "winograd4" in str(info.value)


@pytest.mark.parametrize("case", [((2, 5, 13, 11), (7, 5, 3, 3), 1, 1, 1, 1, "float32"),
                                  ((1, 6, 9, 10), (4, 3, 3, 3), 1, 0, 1, 2, "float32"),
                                  ((2, 32, 20, 20), (64, 32, 3, 3), 1, 1, 1, 1, "float32")],
                         ids=["plain", "grouped", "gemm_packs"])
def test_workspace_is_exact(case, device, monkeypatch):
    check_workspace("winograd4", case, device, monkeypatch, passes=("forward", "backward_data"))

