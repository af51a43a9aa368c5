"""The depthwise strategy beyond the shared sweep: odd sizes, strides 1-3, multipliers, 3×3 to 7×7, padding
0-3, dilation, batch 1 and 3, against the float64 reference with canaries around every tensor; the fused
bias; a finite-difference check of both gradients; the geometries other devices get (GPU-shaped groups of
single columns, narrower vectors, row runs and weight chunks) run here; and the planner choosing it."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv2d_planner as planner
from netcl.ops import conv_chooser
from netcl.ops import conv_depthwise as depthwise
from netcl.ops.conv2d import CONV2D_DEPTHWISE, conv2d
from netcl.ops.conv_common import PASSES, ConvLayer
from util import assert_finite_differences, check_forced_conv

# (input NCHW, multiplier, kernel (r, s), stride, padding, dilation)
CASES = [
    ((1, 3, 7, 9), 1, (3, 3), 1, 1, 1),
    ((3, 5, 11, 13), 1, (3, 3), 1, 0, 1),
    ((3, 7, 13, 37), 1, (3, 3), 1, 1, 1),       # rows of several vector strips and a moved-back last one
    ((1, 5, 15, 17), 1, (3, 3), 2, 1, 1),       # stride 2
    ((3, 3, 16, 35), 1, (3, 3), 2, 0, 1),
    ((1, 5, 9, 11), 2, (3, 3), 1, 1, 1),        # multiplier 2
    ((3, 3, 13, 19), 2, (3, 3), 2, 1, 1),       # multiplier 2, stride 2
    ((1, 7, 17, 19), 1, (5, 5), 1, 2, 1),       # 5×5
    ((3, 3, 19, 23), 1, (5, 5), 2, 2, 1),       # 5×5, stride 2
    ((1, 3, 11, 21), 2, (5, 5), 1, 0, 1),       # 5×5, multiplier 2, no padding
    ((3, 5, 12, 29), 1, (3, 3), 1, 2, 1),       # padding larger than the kernel's reach on one side
    ((1, 3, 9, 10), 3, (3, 3), 1, 3, 1),        # windows entirely in the padding, multiplier 3
    ((1, 5, 13, 31), 1, (3, 3), 1, 2, 2),       # dilation 2
    ((3, 3, 21, 23), 1, (7, 7), 3, 3, 1),       # stride 3
    ((1, 3, 9, 41), 1, (1, 5), (1, 2), (0, 2), (1, 2)),   # a 1×5 kernel, strides and dilations differ
    ((1, 1, 17, 17), 4, (5, 5), 1, 0, 1),       # one input channel: a LeNet-like first layer
    ((3, 2, 5, 3), 1, (3, 3), 1, 1, 1),         # rows narrower than a vector
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _ids(case):
    xs, m, (r, s), st, pd, dl = case
    return f"x{'x'.join(map(str, xs))}-m{m}-k{r}x{s}-s{st}-p{pd}-d{dl}".replace(" ", "")


def check(case, rng, device, dtype="float32", bias=False, tolerances=(1e-5, 1e-4)):
    xs, multiplier, (r, s), stride, padding, dilation = case
    c = xs[1]
    ws = (c * multiplier, 1, r, s)
    args = (_pair(stride), _pair(padding), _pair(dilation), c)
    layer = ConvLayer.from_shapes(xs, ws, *args, dtype)
    assert all(depthwise.STRATEGY.why_not(layer, p) is None for p in PASSES)
    check_forced_conv(CONV2D_DEPTHWISE, xs, ws, args, rng, device, dtype, bias, tolerances, _ids(case))


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_matches_float64_reference(case, rng, device, canaries):
    check(case, rng, device)


def test_fused_bias(rng, device, canaries):
    check(((3, 5, 9, 19), 2, (3, 3), 1, 1, 1), rng, device, bias=True)
    check(((1, 3, 11, 13), 1, (5, 5), 2, 2, 1), rng, device, bias=True)


def test_float64(rng, device, canaries):
    if not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    for case in (CASES[2], CASES[6], CASES[16]):   # strips, strided strips, whole rows
        check(case, rng, device, "float64", tolerances=(1e-12, 1e-11))


def test_gradients_match_finite_differences(rng, device):
    """d(Σ y·gy)/dθ by central differences in float64, for a few entries of the input and the weight."""
    if not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    xs, ws, stride, padding = (2, 3, 7, 8), (6, 1, 3, 3), 2, 1
    x, w = rng.uniform(-1, 1, xs), rng.uniform(-1, 1, ws)
    gy = rng.uniform(-1, 1, ConvLayer.from_shapes(xs, ws, stride, padding, 1, 3, "float64").output_shape)

    def objective(x_, w_):
        y = conv2d(nc.Tensor.from_host(x_, device), nc.Tensor.from_host(w_, device), stride=stride,
                   padding=padding, groups=3, strategy=CONV2D_DEPTHWISE)
        return float(np.sum(y.to_host() * gy))
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    W = nc.Tensor.from_host(w, device, requires_grad=True)
    conv2d(X, W, stride=stride, padding=padding, groups=3, strategy=CONV2D_DEPTHWISE).backward(
        nc.Tensor.from_host(gy, device))
    assert_finite_differences(objective, x, w, X.grad.to_host(), W.grad.to_host(), rng)


@pytest.mark.parametrize("vector, group", [(1, 32), (4, 1), (2, 3)])
def test_geometries_of_other_devices(vector, group, rng, device, monkeypatch, canaries):
    """A GPU's (single columns, groups of adjacent columns) and narrower CPUs' vectors, on this device."""
    monkeypatch.setattr(depthwise, "_vector_columns", lambda dev, dtype, columns: min(vector, max(1, columns)))
    monkeypatch.setattr(depthwise, "_group_lanes", lambda dev, strips: group)
    monkeypatch.setattr(depthwise, "_whole_row_columns", lambda layer, pass_, dev: 0)  # a GPU's rows: strips
    for case in (CASES[2], CASES[6], CASES[11]):
        check(case, rng, device)


@pytest.mark.parametrize("lanes", [2, 8, 16])
def test_strided_strips_of_every_width(lanes, rng, device, monkeypatch, canaries):
    """Stride-2 strips assembled from two loads and a shuffle, at widths the device may not pick itself:
    rows wide enough for several strips of 16 and a moved-back last one, 3×3 and 5×5."""
    monkeypatch.setattr(depthwise, "register_lanes", lambda dev, dtype: lanes)
    for case in (((2, 3, 9, 71), 1, (3, 3), 2, 1, 1), ((1, 2, 11, 77), 2, (5, 5), 2, 2, 1)):
        check(case, rng, device)


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_whole_rows_at_every_width(lanes, rng, device, monkeypatch, canaries):
    """A CPU's forward pass takes rows of at most one vector whole, the lanes whose taps fall in the
    padding masked: at each vector width, rows as wide as the vector and narrower, stride 1 and 2,
    multipliers, 5×5, windows entirely in the padding, and backward_data of stride-1 layers (the
    flipped forward pass). The first and last rows of a tensor gather their loads from clamped
    addresses; the idle lanes of a run's last row are not stored (the canaries)."""
    monkeypatch.setattr(depthwise, "register_lanes", lambda dev, dtype: lanes)
    cases = [((2, 3, 7, lanes - 1), 1, (3, 3), 1, 1, 1), ((1, 4, 9, lanes), 2, (3, 3), 1, 1, 1),
             ((3, 2, 11, 2 * lanes - 1), 1, (3, 3), 2, 1, 1), ((1, 3, 8, lanes - 1), 1, (5, 5), 1, 2, 1),
             ((1, 3, 9, lanes - 2), 3, (3, 3), 1, 2, 1)]
    for case in cases:
        xs, multiplier, (r, s), stride, padding, _ = case
        layer = ConvLayer.from_shapes(xs, (xs[1] * multiplier, 1, r, s), stride, padding, 1, xs[1])
        if device.kind == "cpu":
            shape = depthwise.geometry(layer, "forward", device)
            assert shape.whole_rows and layer.out_w <= shape.vector <= lanes, (case, shape)
        check(case, rng, device)


def test_row_runs_and_weight_chunks(rng, device, monkeypatch, canaries):
    """Planes split into runs of rows and backward_weight's rows into many chunks (a device with many
    compute units gets them), each chunk's partial sums reduced."""
    monkeypatch.setitem(depthwise.GROUPS_PER_UNIT, device.kind, 1000)
    layer = ConvLayer.from_shapes((3, 5, 13, 37), (5, 1, 3, 3), 1, 1, 1, 5)
    assert depthwise.geometry(layer, "forward", device).global_size[1] > 1
    assert depthwise.geometry(layer, "backward_weight", device).global_size[1] > 1
    for case in (CASES[2], CASES[6]):
        check(case, rng, device)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_row_blocks(rows, rng, device, monkeypatch, canaries):
    """Forward strips of several output rows at once (each input row loaded once for all of them), on
    runs of rows that split planes unevenly: the block's rows and a run's leftover rows, stride 1 and 2,
    5×5, dilation, multipliers, and backward_data's flipped pass of stride-1 layers."""
    monkeypatch.setattr(depthwise, "_row_block", lambda dev, pass_, vector: rows)
    monkeypatch.setitem(depthwise.GROUPS_PER_UNIT, device.kind, 7)
    for case in (CASES[2], CASES[6], CASES[7], CASES[12], CASES[14]):
        check(case, rng, device)


def test_strip_paths_round_alike(rng, device, monkeypatch):
    """An output has the same bits whether its row's strips go alone or in a block of rows, and whether
    an edge strip or a border column computed it."""
    layer = ConvLayer.from_shapes((2, 5, 13, 37), (10, 1, 3, 3), 1, 1, 1, 5)
    x = nc.Tensor.from_host(rng.standard_normal(layer.input_shape).astype(np.float32), device)
    w = nc.Tensor.from_host(rng.standard_normal(layer.weight_shape).astype(np.float32), device)
    outputs = []
    for rows, edges in ((1, False), (2, False), (3, False), (1, True), (2, True), (3, True)):
        monkeypatch.setattr(depthwise, "_row_block", lambda dev, pass_, vector, rows=rows: rows)
        monkeypatch.setattr(depthwise, "_edge_strips", lambda dev, pass_, vector, edges=edges: edges and vector > 1)
        outputs.append(depthwise.STRATEGY.forward(x, w, layer).to_host())
    assert all(np.array_equal(outputs[0], other) for other in outputs[1:])


@pytest.mark.parametrize("edges", [False, True])
def test_edge_strips(edges, rng, device, monkeypatch, canaries):
    """Forward strips over whole rows, the lanes of their taps in the padding masked (the tensor's first
    and last planes, whose edge strips would read outside it, keep the border columns), or the interior
    strips and border columns alone: padding 0-3, stride 2, 5×5, dilation, multipliers, rows just wider
    than a vector, and backward_data's flipped pass of stride-1 layers (negative padding included)."""
    monkeypatch.setattr(depthwise, "_edge_strips", lambda dev, pass_, vector: edges and vector > 1)
    for case in (CASES[0], CASES[1], CASES[2], CASES[4], CASES[7], CASES[10], CASES[11], CASES[12], CASES[13],
                 ((2, 3, 5, 17), 1, (3, 3), 1, 4, 1), ((2, 4, 6, 9), 2, (3, 3), 2, 1, 1)):
        check(case, rng, device)


def test_interior_columns():
    """The columns every tap reads inside the row: 56 wide, 3×3, padding 1 leaves 54; stride 2 leaves 27
    of 28; backward_data's phases of a stride-2 layer each lose one."""
    wide = ConvLayer.from_shapes((1, 4, 56, 56), (4, 1, 3, 3), 1, 1, 1, 4)
    strided = ConvLayer.from_shapes((1, 4, 56, 56), (4, 1, 3, 3), 2, 1, 1, 4)
    assert depthwise.interior_columns(wide, "forward") == 54
    assert depthwise.interior_columns(strided, "forward") == 27
    assert depthwise.interior_columns(strided, "backward_data") == 27
    narrow = ConvLayer.from_shapes((1, 4, 3, 3), (4, 1, 5, 5), 1, 2, 1, 4)
    assert depthwise.interior_columns(narrow, "forward") == 0


@pytest.mark.parametrize("groups, weight, words", [(1, (4, 4, 3, 3), "groups=1"), (2, (4, 2, 3, 3), "groups=2")])
def test_refuses_other_groupings(groups, weight, words, device):
    layer = ConvLayer.from_shapes((1, 4, 8, 8), weight, 1, 1, 1, groups)
    assert words in depthwise.STRATEGY.why_not(layer, "forward")
    with pytest.raises(nc.ShapeError, match="depthwise"):
        conv2d(nc.zeros((1, 4, 8, 8), device=device), nc.zeros(weight, device=device), padding=1, groups=groups,
               strategy=CONV2D_DEPTHWISE)


def test_workspace_is_the_weight_partials(device):
    layer = ConvLayer.from_shapes((8, 144, 56, 56), (144, 1, 3, 3), 1, 1, 1, 144)
    assert depthwise.STRATEGY.workspace_bytes(layer, "forward", device) == 0
    assert depthwise.STRATEGY.workspace_bytes(layer, "backward_data", device) == 0
    partials = depthwise.STRATEGY.workspace_bytes(layer, "backward_weight", device)
    assert 0 < partials < layer.n * layer.c * layer.h * layer.w * layer.itemsize
    shape = depthwise.geometry(layer, "backward_weight", device)
    assert partials == shape.global_size[1] * shape.group * shape.vector * 144 * 9 * 4


def test_planner_knows_it(tmp_path, monkeypatch, device):
    """A MobileNet depthwise layer: every pass has depthwise among the applicable candidates, with cost
    terms that price its traffic as the tensors' bytes; the uncalibrated model prefers it to im2col's
    lowering."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NETCL_CONV_STRATEGY", raising=False)
    conv_chooser.clear_memory_cache()
    try:
        for pass_ in PASSES:
            plan = planner.plan_conv2d((8, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144, pass_=pass_,
                                       device=device, mode="heuristic")
            candidate = plan.candidate(CONV2D_DEPTHWISE)
            assert candidate.applicable, candidate.why_not
            assert candidate.predicted_ms < plan.candidate("im2col").predicted_ms
        assert planner.plan_conv2d((8, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144, device=device,
                                   mode="heuristic").strategy == CONV2D_DEPTHWISE
        assert planner.plan_conv2d((2, 8, 9, 9), (8, 8, 3, 3), padding=1, device=device,
                                   mode="heuristic").candidate(CONV2D_DEPTHWISE).why_not
    finally:
        conv_chooser.clear_memory_cache()
