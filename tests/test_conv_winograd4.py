"""winograd4, F(4×4, 3×3): forward and both gradients against float64 (odd and tiny sizes, so partial tiles
and partial runs of a work-item's tiles everywhere; channels 1/3/5/17; batch 1; groups; padding 0..4;
canaries), its rounding against F(2×2, 3×3)'s and the exact workspace (its refusals: test_conv_winograd.py)."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import conv2d
from test_conv_implicit_gemm import check_workspace, strategy_errors
from util import conv2d_ref, rel_l2

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


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_winograd4_matches_reference(case, rng, device, canaries):
    xs, ws, padding, dtype = case
    forward_tol, grad_tol = (1e-4, 5e-4) if dtype == "float32" else (1e-12, 1e-12)
    errors = strategy_errors("winograd4", (xs, ws, 1, padding, 1, 1, dtype), rng, device)
    assert errors["forward"] <= forward_tol, errors
    assert errors["grad_input"] <= grad_tol and errors["grad_weight"] <= grad_tol, errors


@pytest.mark.parametrize("case", GROUPED, ids=["groups3", "depthwise"])
def test_winograd4_grouped_matches_reference(case, rng, device, canaries):
    xs, ws, padding, groups, dtype = case
    errors = strategy_errors("winograd4", (xs, ws, 1, padding, 1, groups, dtype), rng, device)
    assert errors["forward"] <= 1e-4, errors
    assert errors["grad_input"] <= 5e-4 and errors["grad_weight"] <= 5e-4, errors


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


@pytest.mark.parametrize("case", [((2, 5, 13, 11), (7, 5, 3, 3), 1, 1, 1, 1, "float32"),
                                  ((1, 6, 9, 10), (4, 3, 3, 3), 1, 0, 1, 2, "float32"),
                                  ((2, 32, 20, 20), (64, 32, 3, 3), 1, 1, 1, 1, "float32")],
                         ids=["plain", "grouped", "gemm_packs"])
def test_workspace_is_exact(case, device, monkeypatch):
    check_workspace("winograd4", case, device, monkeypatch)

