"""mec conv2d strategy: forward (both Solutions of Algorithm 2) and both gradients against float64 (odd
sizes, channels 1/3/5/17, batch 1, strides, padding, width dilation, groups, canaries), the threshold T
from the tuning database, the refusal of height dilation, and the exact workspace: the compact lowering
in·ow·ih·kw·ic plus the rearranged filter (the partial weight gradients for backward_weight), and
backward_weight's launches, which do not grow with the output rows."""
from __future__ import annotations

import math

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_mec
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from netcl.runtime import tuning_db as db
from netcl.tuning.mec import choose_threshold, tune_threshold
from test_conv_implicit_gemm import check_workspace, strategy_errors
from util import assert_close, conv2d_ref

# operands past the GEMM's L1 threshold, so that netcl.ops.gemm allocates packing buffers
PACKED = ((2, 32, 20, 20), (64, 32, 3, 3), 1, 1, 1, 1, "float32")

CASES = [
    ((1, 1, 7, 9), (3, 1, 3, 3), 1, 1, 1, 1, "float32"),
    ((2, 3, 13, 11), (5, 3, 5, 5), 2, 2, 1, 1, "float32"),
    ((1, 5, 15, 13), (17, 5, 3, 3), (1, 3), 0, (1, 2), 1, "float32"),
    ((3, 17, 9, 7), (5, 17, 3, 3), 1, 0, 1, 1, "float32"),
    ((1, 6, 11, 9), (9, 2, 3, 3), 1, 1, 1, 3, "float32"),                   # groups 3
    ((2, 3, 35, 33), (4, 3, 11, 11), 4, 0, 1, 1, "float32"),                # kh < ... cv1-like, 11×11 stride 4
    ((2, 4, 7, 7), (6, 4, 1, 1), 2, 0, 1, 1, "float32"),                    # kh ≤ sh: no overlap to remove
    ((1, 3, 9, 7), (5, 3, 3, 3), 1, 1, 1, 1, "float64"),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_mec_matches_reference(case, rng, device, canaries):
    errors = strategy_errors("mec", case, rng, device)
    assert errors["forward"] <= 1e-5, errors
    assert errors["grad_input"] <= 1e-4 and errors["grad_weight"] <= 1e-4, errors


@pytest.mark.parametrize("solution", ["A", "B"])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4], ((5, 3, 4, 6), (4, 3, 3, 3), 1, 0, 1, 1, "float32")],
                         ids=["strided", "batch3", "grouped", "batch_over_rows"])
def test_both_solutions(case, solution, rng, device, canaries):
    xs, ws, st, pd, dl, g, dt = case
    layer = ConvLayer.from_shapes(xs, ws, st, pd, dl, g, dt)
    if solution == "A" and conv_mec.output_elements(layer) > conv_mec.lowered_elements(layer):
        pytest.skip("Solution A needs |O| ≤ |L|")
    x = rng.uniform(-1, 1, xs).astype(dt)
    w = rng.uniform(-1, 1, ws).astype(dt)
    y = conv_mec.STRATEGY.forward(nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device), layer,
                                  solution=solution)
    ref = conv2d_ref(x, w, (layer.stride_h, layer.stride_w), (layer.pad_h, layer.pad_w),
                     (layer.dil_h, layer.dil_w), g)
    assert_close(y.to_host(), ref, 1e-5, f"Solution {solution}")


def test_threshold_comes_from_the_tuning_database(device, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    assert conv_mec.threshold(device) == conv_mec.DEFAULT_T
    layer = ConvLayer.from_shapes((2, 3, 13, 11), (5, 3, 3, 3))  # ow = 9, |O| ≤ |L|
    db.store(device, "mec", {"T": 8})
    assert conv_mec.threshold(device) == 8
    assert conv_mec.STRATEGY.solution(layer, device) == "B"
    db.store(device, "mec", {"T": 9})
    assert conv_mec.STRATEGY.solution(layer, device) == "A"


def test_tune_threshold_measures_both_solutions(device, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    layers = [ConvLayer.from_shapes((2, 4, 9, w), (4, 4, 3, 3)) for w in (5, 12)]
    entry = tune_threshold(device, layers, repeat=1)
    assert [r["ow"] for r in entry["measured"]] == [3, 10]
    assert all(r["A_ms"] > 0 and r["B_ms"] > 0 for r in entry["measured"])
    assert entry["T"] in (0, 3, 10)
    assert conv_mec.threshold(device) == entry["T"]


def test_threshold_minimizes_the_total_not_the_first_loss():
    # the bench run's batch-8 figures: B ahead by 2.5 % at ow 12 must not send ow 20 and 26 to B
    measured = [(20, 24.3, 26.5), (10, 13.7, 15.2), (54, 21.0, 18.7), (26, 11.8, 15.2), (12, 13.2, 12.9),
                (5, 9.6, 14.6)]
    results = [{"ow": ow, "A_ms": a, "B_ms": b} for ow, a, b in measured]
    assert choose_threshold(results) == 26
    assert choose_threshold([{"ow": 5, "A_ms": 2.0, "B_ms": 1.0}]) == 0
    assert choose_threshold([{"ow": 5, "A_ms": 1.0, "B_ms": 1.0}]) == 0  # a tie keeps the smaller T
    assert choose_threshold([]) == 0


def test_height_dilation_is_refused_with_the_rule(device):
    x = nc.Tensor.from_host(np.ones((1, 2, 9, 9), np.float32), device)
    w = nc.Tensor.from_host(np.ones((3, 2, 3, 3), np.float32), device)
    with pytest.raises(nc.ShapeError, match="dilation 1 along the height"):
        conv2d(x, w, dilation=(2, 1), strategy="mec")


def test_lowering_is_in_ow_ih_kw_ic(device):
    layer = ConvLayer.from_shapes((2, 3, 13, 11), (5, 3, 5, 5), stride=2, padding=2)
    ow, ih = layer.out_w, 13 + 4
    weight = 5 * 3 * 5 * 5
    impl = strategies()["mec"]
    for pass_ in ("forward", "backward_data", "backward_weight"):
        parts = impl.workspace_breakdown(layer, pass_)
        backward_weight = pass_ == "backward_weight"
        assert parts["lowering"] == 2 * ow * ih * 5 * 3 * 4
        assert parts["filter"] == (0 if backward_weight else weight * 4)
        # one partial gradient per output row: 7 of 1,500 bytes, well within half the cache
        assert parts["partials"] == (layer.out_h * weight * 4 if backward_weight else 0)
        assert parts["grad_rows"] == (2 * 5 * layer.out_h * ow * 4 if backward_weight else 0)
        assert parts["gemm_packing"] >= 0
        assert impl.workspace_bytes(layer, pass_) == sum(parts.values())


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[0], PACKED],
                         ids=["strided", "grouped", "batch1", "gemm_packs"])
@pytest.mark.parametrize("solution", ["A", "B"])
def test_workspace_is_exact(case, solution, device, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    db.store(device, "mec", {"T": 10 ** 6 if solution == "A" else 0})
    layer = ConvLayer.from_shapes(*case)
    if solution == "A" and not conv_mec.uses_solution_a(layer, 10 ** 6):
        pytest.skip("Solution A needs |O| ≤ |L|")
    check_workspace("mec", case, device, monkeypatch)


# backward_weight's row partials: (case, output rows per batched call, None: all of them, as every
# device's cache allows here); every case has stride 2. A smaller count is forced through the cache size
# that conv_mec.weight_partials reads (these operands are too small for the GEMM to pack).
WEIGHT_CASES = {
    "batch7_rows13": (((7, 3, 26, 11), (5, 3, 3, 3), 2, 1, 1, 1, "float32"), None),
    "batch7_groups2_rows13": (((7, 4, 25, 9), (6, 2, 5, 5), 2, 2, 1, 2, "float32"), None),
    "batch1_groups2_rows13_two_calls": (((1, 4, 25, 9), (6, 2, 5, 5), 2, 2, 1, 2, "float32"), 7),
    "batch1_rows13_a_row_a_call": (((1, 3, 26, 11), (5, 3, 3, 3), 2, 1, 1, 1, "float32"), 1),
    "batch7_groups2_row1": (((7, 4, 5, 8), (6, 2, 5, 3), 2, 0, 1, 2, "float32"), None),
    "batch1_row1": (((1, 3, 2, 9), (5, 3, 3, 3), 2, 1, 1, 1, "float32"), None),
}


@pytest.mark.parametrize("name", list(WEIGHT_CASES))
def test_weight_gradient_from_row_partials(name, rng, device, canaries, monkeypatch):
    case, rows = WEIGHT_CASES[name]
    layer = ConvLayer.from_shapes(*case)
    if rows is not None:  # half the cache holds `rows` partial gradients
        monkeypatch.setattr(device, "cache_bytes", 2 * rows * 4 * math.prod(layer.weight_shape))
    assert conv_mec.weight_partials(layer, device) == (rows or layer.out_h)
    errors = strategy_errors("mec", case, rng, device)
    assert errors["grad_weight"] <= 1e-4, errors


def backward_weight_launches(case, device, monkeypatch) -> int:
    """Kernels one backward_weight enqueues (every launch, prepared or not, is recorded by
    Device.throttle), counted on its second run so that first-call work does not count."""
    layer = ConvLayer.from_shapes(*case)
    x = nc.Tensor.from_host(np.ones(layer.input_shape, np.float32), device)
    gy = nc.Tensor.from_host(np.ones(layer.output_shape, np.float32), device)
    conv_mec.STRATEGY.backward_weight(x, gy, layer)
    launched = []
    real = device.throttle
    monkeypatch.setattr(device, "throttle", lambda event: (launched.append(event), real(event)))
    try:
        conv_mec.STRATEGY.backward_weight(x, gy, layer)
    finally:
        monkeypatch.setattr(device, "throttle", real)
    return len(launched)


@pytest.mark.parametrize("batch", [1, 7])
def test_backward_weight_launches_do_not_grow_with_the_rows(batch, device, monkeypatch):
    # the same layer with 3 and 13 output rows: before the row partials, 2 + 3 and 2 + 13 products
    counts = {}
    for height in (5, 25):
        case = ((batch, 4, height, 9), (6, 2, 3, 3), 2, 1, 1, 2, "float32")
        layer = ConvLayer.from_shapes(*case)
        assert conv_mec.weight_partials(layer, device) == layer.out_h
        counts[layer.out_h] = backward_weight_launches(case, device, monkeypatch)
        terms = conv_mec.STRATEGY.cost_terms(layer, "backward_weight", device)
        # mec_lower, the regrouping copy (batch above 1), one product per group, mec_weight_sum
        assert terms.launches == 1 + (batch > 1) + 2 + 1
        assert counts[layer.out_h] == terms.launches, counts
    assert counts[3] == counts[13], counts
