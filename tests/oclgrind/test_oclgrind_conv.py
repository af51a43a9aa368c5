"""Every registered conv2d strategy, forward and both gradients, in every float dtype the device has, on a
handful of tiny layers that exercise the edges (padding, stride, dilation, groups, 1×1, odd sizes), plus
im2col / col2im in both layouts and both col2im forms. Results are checked against float64 NumPy, so the
tests are meaningful on any device; under Oclgrind they also check every memory access."""
from __future__ import annotations

import os

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from util import assert_close, assert_close_to_scale, conv2d_grads_ref, conv2d_ref

pytestmark = pytest.mark.oclgrind

# (input NCHW, weight KCRS, stride, padding, dilation, groups): small enough for the simulator, varied
# enough that every strategy finds layers it serves (1×1 for gemm, with and without a stride; 3×3
# stride 1 for Winograd).
LAYERS = [
    ((2, 3, 5, 6), (4, 3, 1, 1), 1, 0, 1, 1),
    ((1, 4, 6, 5), (4, 2, 3, 3), 1, 1, 1, 2),
    ((2, 2, 7, 7), (3, 2, 3, 3), 2, 2, 2, 1),
    ((1, 3, 6, 7), (2, 3, 2, 3), (2, 1), (0, 1), (1, 2), 1),
    ((1, 2, 4, 4), (3, 2, 3, 3), 1, 2, 1, 1),   # some windows lie entirely in the padding
    ((1, 8, 4, 5), (2, 8, 3, 3), 1, 1, 1, 1),   # 8 input channels: Winograd's vector filter transform
    ((2, 3, 4, 8), (4, 3, 3, 3), 1, 1, 1, 1),   # rows of whole vectors: direct_blocked without bounds tests
    ((1, 2, 6, 11), (3, 2, 3, 3), 1, 0, 1, 1),  # no padding, rows past a block: direct_blocked's shifted last blocks
    ((2, 3, 7, 9), (6, 1, 3, 3), 2, 1, 1, 3),   # depthwise, multiplier 2, stride 2
    ((2, 3, 7, 6), (4, 3, 1, 1), 2, 0, 1, 1),   # strided 1×1 (gemm's subsample), a last input row unread
    ((1, 3, 5, 16), (4, 3, 3, 3), 2, 1, 1, 1),   # stride 2, rows of whole vectors: direct_blocked's vector loads
    ((1, 2, 9, 13), (3, 2, 5, 5), 2, 2, 1, 1),   # a 5×5 stride-2 layer whose last blocks reach past the input
]
TOLERANCES = {"winograd": (1e-4, 5e-4), "winograd4": (1e-4, 5e-4)}


def dtypes_of(device):
    return ["float32"] + (["float64"] if device.has_fp64 else [])


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def run_layer(name, spec, dtype, rng, device):
    """Forward and every gradient the strategy serves for one layer; returns the passes that ran."""
    xs, ws, st, pd, dl, g = spec
    layer = ConvLayer.from_shapes(xs, ws, st, pd, dl, g, dtype)
    impl = strategies()[name]
    why = {p: impl.why_not(layer, p) for p in ("forward", "backward_data", "backward_weight")}
    if why["forward"]:
        return []
    fwd_tol, grad_tol = TOLERANCES.get(name, (1e-5, 1e-4))
    x = rng.uniform(-1, 1, xs).astype(dtype)
    w = rng.uniform(-1, 1, ws).astype(dtype)
    X = nc.Tensor.from_host(x, device, requires_grad=not why["backward_data"])
    W = nc.Tensor.from_host(w, device, requires_grad=not why["backward_weight"])
    y = conv2d(X, W, stride=st, padding=pd, dilation=dl, groups=g, strategy=name)
    args = (_pair(st), _pair(pd), _pair(dl), g)
    assert_close(y.to_host(), conv2d_ref(x, w, *args), fwd_tol, f"{name} forward")
    ran = ["forward"]
    if why["backward_data"] and why["backward_weight"]:
        return ran
    gy = rng.uniform(-1, 1, layer.output_shape).astype(dtype)
    y.backward(nc.Tensor.from_host(gy, device))
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    if not why["backward_data"]:
        assert_close(X.grad.to_host(), gx_ref, grad_tol, f"{name} grad input")
        ran.append("backward_data")
    if not why["backward_weight"]:
        assert_close(W.grad.to_host(), gw_ref, grad_tol, f"{name} grad weight")
        ran.append("backward_weight")
    return ran


@pytest.mark.parametrize("name", sorted(strategies()))
def test_strategy_every_pass_and_dtype(name, rng, device):
    served = set()
    for dtype in dtypes_of(device):
        for spec in LAYERS:
            served.update(run_layer(name, spec, dtype, rng, device))
    assert served, f"no test layer is served by strategy {name!r}: add one it accepts to LAYERS"


def test_winograd_whole_plane_kernels(rng, device, monkeypatch):
    """Winograd's whole-plane transforms (a CPU device's kernels for small images, 4 and 8 samples per
    work-item; the simulator is no CPU, so its kind is overridden), with padding past the border and
    negative in backward_data."""
    monkeypatch.setattr(device, "kind", "cpu")
    for spec in [((4, 2, 5, 3), (3, 2, 3, 3), 1, 1, 1, 1), ((8, 1, 4, 4), (2, 1, 3, 3), 1, 3, 1, 1)]:
        assert run_layer("winograd", spec, "float32", rng, device) == ["forward", "backward_data",
                                                                       "backward_weight"]


def test_depthwise_cpu_strips(rng, device, monkeypatch):
    """The depthwise strips a CPU runs (4 and 16 columns a vector, a last strip moved back, borders on
    both sides; at stride 2 each tap's two loads), padding beyond the kernel's reach, and backward_data's
    phases of stride 2; the forward pass's edge strips, whose loads reach into the rows before and after
    (the tensor's first and last planes keep the border columns), 5×5 and negative flipped padding."""
    from netcl.ops import conv_depthwise
    monkeypatch.setattr(device, "kind", "cpu")
    monkeypatch.setattr(conv_depthwise, "_whole_row_columns", lambda layer, pass_, dev: 0)
    for vector in (4, 16):
        monkeypatch.setattr(conv_depthwise, "_vector_columns",
                            lambda dev, dtype, columns: vector if columns >= vector else 1)
        for spec in [((1, 2, 5, 23), (2, 1, 3, 3), 1, 1, 1, 2), ((2, 2, 6, 37), (4, 1, 3, 5), 2, (1, 3), 1, 2),
                     ((1, 1, 4, 22), (2, 1, 3, 3), 1, 3, 2, 1), ((2, 3, 5, 23), (3, 1, 3, 3), 1, 1, 1, 3),
                     ((2, 3, 7, 21), (6, 1, 5, 5), 1, 2, 1, 3), ((2, 3, 5, 19), (3, 1, 3, 3), 1, 3, 1, 3)]:
            assert run_layer("depthwise", spec, "float32", rng, device) == ["forward", "backward_data",
                                                                          "backward_weight"]


def test_depthwise_cpu_whole_rows(rng, device, monkeypatch):
    """The depthwise forward pass a CPU runs on rows no wider than a vector (4 and 16 lanes; rows as wide
    as the vector and narrower, stride 2, a multiplier, 5×5 past the border): whole-row loads that reach
    past the tensor's rows but not the buffer's ends, the first and last rows' clamped gathers, the last
    row's partial store; backward_data's flipped pass takes the same path."""
    from netcl.ops import conv_depthwise
    monkeypatch.setattr(device, "kind", "cpu")
    for lanes in (4, 16):
        monkeypatch.setattr(conv_depthwise, "register_lanes", lambda dev, dtype: lanes)
        for spec in [((2, 2, 5, lanes), (2, 1, 3, 3), 1, 1, 1, 2), ((1, 2, 6, 2 * lanes - 1), (4, 1, 3, 3), 2, 1, 1, 2),
                     ((1, 1, 4, 3), (1, 1, 5, 5), 1, 2, 1, 1)]:
            assert run_layer("depthwise", spec, "float32", rng, device) == ["forward", "backward_data",
                                                                          "backward_weight"]


def test_pointwise_cpu_vectors(rng, device, monkeypatch):
    """The pointwise kernels a CPU runs (4 and 16 pixels a vector, a plane's last vector moved back, row
    tiles past the channels, groups), every pass."""
    from netcl.ops import conv_pointwise
    monkeypatch.setattr(device, "kind", "cpu")
    for vector in (4, 16):
        monkeypatch.setattr(conv_pointwise, "_vector", lambda dev, dtype, pixels: vector if pixels >= vector else 1)
        for spec in [((1, 3, 5, 7), (5, 3, 1, 1), 1, 0, 1, 1), ((2, 4, 3, 9), (6, 2, 1, 1), 1, 0, 1, 2)]:
            assert run_layer("pointwise", spec, "float32", rng, device) == ["forward", "backward_data",
                                                                          "backward_weight"]


@pytest.mark.parametrize("transposed", [False, True])
def test_im2col_col2im_both_forms(transposed, rng, device):
    from netcl.ops.im2col import _layer, col2im, im2col, im2col_into
    for dtype in dtypes_of(device):
        for xs, ws, st, pd, dl, _ in LAYERS:
            r, s = ws[2:]
            x = rng.uniform(-1, 1, xs).astype(dtype)
            cols = im2col(nc.Tensor.from_host(x, device), r, s, st, pd, dl, transposed=transposed)
            ref = _im2col_ref(x, r, s, _pair(st), _pair(pd), _pair(dl))
            assert_close(cols.to_host(), ref.T if transposed else ref, 1e-6, "im2col")
            layer = _layer(xs, r, s, st, pd, dl, dtype)
            for runs in (1, 3):  # the CPU run forms, which Oclgrind's GPU-like device would not pick
                im2col_into(nc.Tensor.from_host(x, device), layer, cols, transposed=transposed, runs=runs)
                assert_close(cols.to_host(), ref.T if transposed else ref, 1e-6, f"im2col runs={runs}")
            c = rng.uniform(-1, 1, cols.shape).astype(dtype)
            expected = _col2im_ref(c.T if transposed else c, xs, r, s, _pair(st), _pair(pd), _pair(dl))
            for deterministic in (False, True):
                got = col2im(nc.Tensor.from_host(c, device), xs, r, s, st, pd, dl, transposed=transposed,
                             deterministic=deterministic)
                assert_close(got.to_host(), expected, 1e-5, f"col2im deterministic={deterministic}")


def test_im2col_chunk_form(rng, device):
    """The chunk form (a CPU's, for unpadded matrices beyond its cache; forced here) on outputs off the
    vector alignment: stride 1, 2 and 4 loads, dilation, and last rows whose vector load is clamped."""
    from netcl.ops.im2col import _layer, im2col_into
    for dtype in dtypes_of(device):
        for xs, (r, s), st, dl in [((1, 2, 9, 12), (3, 3), 1, 1), ((2, 1, 7, 20), (3, 2), (1, 2), (2, 1)),
                                   ((1, 2, 6, 33), (2, 3), 4, 1)]:
            x = rng.uniform(-1, 1, xs).astype(dtype)
            ref = _im2col_ref(x, r, s, _pair(st), (0, 0), _pair(dl)).T
            padded = nc.Tensor.from_host(np.zeros(ref.size + 5, dtype), device)
            view = padded[3:3 + ref.size].reshape(ref.shape)
            im2col_into(nc.Tensor.from_host(x, device), _layer(xs, r, s, st, 0, dl, dtype), view, transposed=True,
                        runs=2, chunks=True)
            assert_close(view.to_host(), ref, 1e-6, f"im2col chunks {xs}")


def _im2col_ref(x, r, s, stride, padding, dilation):
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((n, ho, wo, c, r, s))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
            cols[:, :, :, :, i, j] = patch.transpose(0, 2, 3, 1)
    return cols.reshape(n * ho * wo, c * r * s)


def _col2im_ref(cols, shape, r, s, stride, padding, dilation):
    n, c, h, w = shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
    c6 = np.asarray(cols, np.float64).reshape(n, ho, wo, c, r, s)
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(r):
        for j in range(s):
            xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += \
                c6[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return xp[:, :, ph:ph + h, pw:pw + w]


def test_implicit_gemm_every_row_tile(rng, device):
    """implicit_gemm picks its row tile (TM) from ROW_TILES by the GEMM's row count (K/G forward and
    backward weight, C/G backward data): one layer per tile, with as many channels as the tile has rows."""
    import importlib
    module = importlib.import_module("netcl.ops.conv_implicit_gemm")
    if "implicit_gemm" not in strategies() or not hasattr(module, "ROW_TILES"):
        pytest.skip("no implicit_gemm strategy with a ROW_TILES table in this build")
    tiles = set()
    for tm in module.ROW_TILES:
        spec = ((1, tm, 2, 3), (tm, tm, 1, 1), 1, 0, 1, 1)
        ran = run_layer("implicit_gemm", spec, "float32", rng, device)
        assert ran == ["forward", "backward_data", "backward_weight"]
        tiles.add(module.choose_tile(ConvLayer.from_shapes(spec[0], spec[1]), "forward")[0])
    assert tiles == set(module.ROW_TILES)


def test_strategy_solutions(rng, device):
    """A strategy whose forward takes a `solution` argument (MEC: Algorithm 2's solutions A and B; B in
    both of its batch/row orders) runs each solution, whatever its own threshold would pick."""
    import inspect
    found = False
    for name, impl in sorted(strategies().items()):
        if "solution" not in inspect.signature(impl.forward).parameters:
            continue
        found = True
        for dtype in dtypes_of(device):
            for xs, ws in (((1, 2, 6, 5), (3, 2, 3, 3)), ((3, 2, 3, 5), (3, 2, 3, 3))):  # N ≤ P and N > P
                layer = ConvLayer.from_shapes(xs, ws, dtype=dtype)
                x = rng.uniform(-1, 1, xs).astype(dtype)
                w = rng.uniform(-1, 1, ws).astype(dtype)
                for solution in ("A", "B"):
                    y = impl.forward(nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device), layer,
                                     solution=solution)
                    assert_close(y.to_host(), conv2d_ref(x, w), 1e-5, f"{name} solution {solution}")
    if not found:
        pytest.skip("no strategy with selectable solutions in this build")


FUZZED_LAYERS = int(os.environ.get("NETCL_OCLGRIND_FUZZED_LAYERS", "12"))


@pytest.mark.parametrize("index", range(FUZZED_LAYERS))
def test_fuzzed_layer_every_strategy(index, device):
    """The first layers of the default fuzzed sweep (tests/test_fuzz_conv.py), every strategy and pass:
    geometry the hand-picked LAYERS above do not think of, under the simulator's checks."""
    from test_fuzz_conv import run_case
    run_case("test_conv_fuzz", index, device)


# The strategies whose forward fuses an inference epilogue, each on a layer whose blocks or tiles reach
# past the output (their stores and residual loads test bounds) and, for direct_blocked and depthwise, one
# whose rows are whole vectors or strips.
EPILOGUE_LAYERS = {
    "direct_blocked": [((1, 3, 5, 7), (5, 3, 3, 3), 1, 1, 1), ((1, 2, 2, 16), (3, 2, 3, 3), 1, 1, 1)],
    "implicit_gemm": [((2, 4, 5, 6), (6, 2, 3, 3), 2, 1, 2)],
    "depthwise": [((1, 3, 4, 19), (6, 1, 3, 3), 1, 1, 3), ((1, 2, 5, 7), (2, 1, 3, 3), 2, 1, 2)],
    "gemm": [((2, 5, 4, 9), (7, 5, 1, 1), 1, 0, 1)],      # the GEMM's store, its column tail
    "pointwise": [((2, 5, 3, 7), (9, 5, 1, 1), 1, 0, 1)],  # a row tile past the channels
    "im2col": [((1, 3, 5, 7), (5, 3, 3, 3), 1, 1, 1)],    # one image: the product writes the output
    # the output transform's store: partial tiles of the tile kernel, and (on a CPU device) the
    # whole-plane kernel with four samples in its lanes
    "winograd": [((1, 3, 5, 7), (4, 3, 3, 3), 1, 1, 1), ((4, 2, 5, 6), (3, 2, 3, 3), 1, 1, 1)],
    # F(4×4, 3×3): a partial tile at the bottom and a work-item's run of tiles past the right border
    "winograd4": [((1, 2, 6, 21), (3, 2, 3, 3), 1, 1, 1)],
}


@pytest.mark.parametrize("strategy", sorted(EPILOGUE_LAYERS))
def test_fused_inference_epilogue(strategy, rng, device):
    """conv2d_inference's bias, residual and activation in the convolution's store: every activation, with and
    without the residual (alternately), in every float dtype, against float64 NumPy."""
    from netcl.ops.conv2d import conv2d_inference
    for dtype in dtypes_of(device):
        for index, activation in enumerate(("none", "relu", "relu6", "hardswish")):
            for xs, ws, st, pd, g in EPILOGUE_LAYERS[strategy]:
                x = rng.uniform(-1, 1, xs).astype(dtype)
                w = rng.uniform(-1, 1, ws).astype(dtype)
                ref = conv2d_ref(x, w, _pair(st), _pair(pd), (1, 1), g)
                bias = rng.uniform(-6, 6, ws[0]).astype(dtype)
                residual = rng.uniform(-3, 3, ref.shape).astype(dtype) if index % 2 else None
                z = ref + bias.reshape(1, -1, 1, 1) + (0 if residual is None else residual)
                expected = {"none": z, "relu": np.maximum(z, 0), "relu6": np.clip(z, 0, 6),
                            "hardswish": z * np.clip(z + 3, 0, 6) / 6}[activation]
                y = conv2d_inference(nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device),
                                     nc.Tensor.from_host(bias, device), st, pd, 1, g, strategy,
                                     residual=None if residual is None else nc.Tensor.from_host(residual, device),
                                     activation=activation)
                # measured against the pre-activation values: an activation that zeroes most of a small
                # output leaves a norm too small to be relative to
                assert_close_to_scale(y.to_host(), expected, z, 1e-5, f"{strategy} {activation} {dtype} {xs}")
