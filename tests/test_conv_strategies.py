"""The shared conv2d strategy sweep: every registered strategy, forced through conv2d + autograd, against
the float64 NumPy reference, forward and both gradients, with canaries around every tensor.

A layer the strategy's why_not rejects for a pass is skipped for that pass (the reason is shown); forcing
the strategy on it must then raise ShapeError. Strategies registered later (implicit GEMM, Winograd, MEC)
join the sweep automatically.
"""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from util import assert_close, conv2d_grads_ref, conv2d_ref

# (forward, gradients) relative L2 tolerances. Winograd's transforms amplify rounding (its input and
# output transforms sum up to 16 or 36 products per tile element), so both forms get the looser bound of the issue.
TOLERANCES = {"winograd": (1e-4, 5e-4), "winograd4": (1e-4, 5e-4)}
DEFAULT_TOLERANCE = (1e-5, 1e-4)

# (input NCHW, weight KCRS, stride, padding, dilation, groups, dtype)
CASES = [
    ((2, 5, 7, 9), (3, 5, 1, 1), 1, 0, 1, 1, "float32"),                    # 1×1, the gemm strategy's case
    ((2, 6, 5, 5), (4, 3, 1, 1), 1, 0, 1, 2, "float32"),                    # 1×1, groups 2
    ((1, 3, 8, 7), (4, 3, 1, 1), 2, 1, 1, 1, "float32"),                    # 1×1 with stride and padding
    ((3, 7, 11, 9), (5, 7, 1, 1), 2, 0, 1, 1, "float32"),                   # 1×1 stride 2, odd sizes (downsample)
    ((1, 6, 10, 13), (8, 3, 1, 1), (3, 2), 0, 1, 2, "float32"),             # 1×1 stride (3, 2), groups 2
    ((2, 5, 7, 7), (3, 5, 1, 1), 2, 0, 1, 1, "float64"),                    # 1×1 stride 2, float64
    ((2, 3, 13, 13), (8, 3, 3, 3), 1, 1, 1, 1, "float32"),
    ((2, 8, 16, 16), (16, 8, 3, 3), 1, 1, 1, 1, "float32"),                 # Winograd-friendly
    ((1, 7, 16, 15), (5, 7, 3, 3), 2, 0, 1, 1, "float32"),
    ((2, 4, 12, 10), (6, 4, 3, 3), 1, 2, 2, 1, "float32"),                  # dilation 2
    ((1, 5, 20, 19), (3, 5, 3, 3), 3, 3, 3, 1, "float32"),                  # stride 3, dilation 3
    ((1, 2, 5, 5), (3, 2, 3, 3), 1, 3, 1, 1, "float32"),                    # windows entirely in padding
    ((3, 1, 17, 17), (4, 1, 5, 5), 1, 0, 1, 1, "float32"),                  # LeNet conv1-like
    ((1, 6, 11, 9), (4, 3, 5, 5), 1, 2, 1, 2, "float32"),                   # 5×5, groups 2
    ((1, 3, 31, 29), (8, 3, 7, 7), 2, 3, 1, 1, "float32"),                  # 7×7 stride 2
    ((1, 3, 35, 35), (4, 3, 11, 11), 4, 0, 1, 1, "float32"),                # 11×11 stride 4
    ((2, 3, 11, 17), (5, 3, 3, 5), (1, 2), (1, 2), (2, 1), 1, "float32"),  # non-square everything
    ((1, 13, 7, 31), (7, 13, 1, 7), 1, (0, 3), 1, 1, "float32"),            # 1×7, odd channels
    ((2, 8, 9, 9), (8, 1, 3, 3), 1, 1, 1, 8, "float32"),                    # depthwise
    ((1, 4, 10, 10), (8, 1, 3, 3), 2, 1, 1, 4, "float32"),                  # depthwise, multiplier 2
    ((2, 3, 5, 37), (24, 3, 3, 3), 1, 1, 1, 1, "float32"),                 # rows wider than a vector, 24 channels
    ((1, 3, 7, 20), (5, 3, 5, 3), 1, (2, 0), 1, 1, "float32"),             # 5×3, padding only in the height
    ((3, 16, 6, 6), (32, 16, 3, 3), 1, 1, 1, 1, "float32"),                 # several rows per vector
    ((2, 3, 9, 9), (4, 3, 3, 3), 1, 1, 1, 1, "float64"),
    ((1, 4, 7, 7), (6, 2, 3, 3), 2, 1, 1, 2, "float64"),
]


def _ids(case):
    x, w, st, pd, dl, g, dt = case
    return f"x{'x'.join(map(str, x))}-w{'x'.join(map(str, w))}-s{st}-p{pd}-d{dl}-g{g}-{dt}".replace(" ", "")


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


STRATEGY_NAMES = sorted(strategies())



def check_strategy(name, case, rng, device):
    """Forward and both gradients of one forced strategy on one layer, each pass skipped with the
    strategy's own reason when it cannot serve it."""
    xs, ws, st, pd, dl, g, dt = case
    if dt == "float64" and not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    layer = ConvLayer.from_shapes(xs, ws, st, pd, dl, g, dt)
    impl = strategies()[name]
    why = {p: impl.why_not(layer, p) for p in ("forward", "backward_data", "backward_weight")}
    if why["forward"]:
        with pytest.raises(nc.ShapeError, match=name):
            conv2d(nc.Tensor.from_host(np.zeros(xs, dt), device), nc.Tensor.from_host(np.zeros(ws, dt), device),
                   stride=st, padding=pd, dilation=dl, groups=g, strategy=name)
        pytest.skip(f"{name} cannot run forward: {why['forward']}")
    fwd_tol, grad_tol = TOLERANCES.get(name, DEFAULT_TOLERANCE)
    x = rng.uniform(-2, 2, xs).astype(dt)
    w = rng.uniform(-2, 2, ws).astype(dt)
    X = nc.Tensor.from_host(x, device, requires_grad=not why["backward_data"])
    W = nc.Tensor.from_host(w, device, requires_grad=not why["backward_weight"])
    y = conv2d(X, W, stride=st, padding=pd, dilation=dl, groups=g, strategy=name)
    args = (_pair(st), _pair(pd), _pair(dl), g)
    assert y.shape == layer.output_shape
    assert_close(y.to_host(), conv2d_ref(x, w, *args), fwd_tol, f"{name} forward")
    if why["backward_data"] and why["backward_weight"]:
        pytest.skip(f"{name} has no backward for this layer: {why['backward_data']}")
    gy = rng.uniform(-2, 2, layer.output_shape).astype(dt)
    y.backward(nc.Tensor.from_host(gy, device))
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    if not why["backward_data"]:
        assert X.grad.shape == X.shape
        assert_close(X.grad.to_host(), gx_ref, grad_tol, f"{name} grad input")
    if not why["backward_weight"]:
        assert W.grad.shape == W.shape
        assert_close(W.grad.to_host(), gw_ref, grad_tol, f"{name} grad weight")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_strategy_matches_reference(name, case, rng, device, canaries):
    check_strategy(name, case, rng, device)


def _random_case(rng):
    r, s = int(rng.choice([1, 2, 3, 5, 7, 11])), int(rng.choice([1, 2, 3, 5, 7]))
    dh, dw = (int(v) for v in rng.integers(1, 4, 2))
    ph, pw = (int(v) for v in rng.integers(0, 4, 2))
    sh, sw = (int(v) for v in rng.integers(1, 5, 2))
    g = int(rng.choice([1, 2, 3]))
    c = g * int(rng.integers(1, 5))
    k = g * int(rng.integers(1, 5))
    # pick the output size first so that every drawn layer is valid (a clamped input still has output ≥ 1)
    h = max(1, (int(rng.integers(1, 9)) - 1) * sh + dh * (r - 1) + 1 - 2 * ph + int(rng.integers(0, sh)))
    w = max(1, (int(rng.integers(1, 9)) - 1) * sw + dw * (s - 1) + 1 - 2 * pw + int(rng.integers(0, sw)))
    if rng.random() < 0.25:  # the 1×1, stride 1, no padding layers the gemm strategy serves
        r = s = 1
        (sh, sw), (ph, pw) = (1, 1), (0, 0)
        h, w = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    n = int(rng.integers(1, 4))
    return ((n, c, h, w), (k, c // g, r, s), (sh, sw), (ph, pw), (dh, dw), g, "float32")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(40))
@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_strategy_random_sweep(name, index, rng, device, canaries):
    check_strategy(name, _random_case(rng), rng, device)


def test_channel_mismatch_names_both_shapes(device):
    x = nc.Tensor.from_host(np.zeros((1, 3, 8, 8), np.float32), device)
    w = nc.Tensor.from_host(np.zeros((4, 5, 3, 3), np.float32), device)
    with pytest.raises(nc.ShapeError) as info:
        conv2d(x, w, strategy="direct")
    assert "(1, 3, 8, 8)" in str(info.value) and "(4, 5, 3, 3)" in str(info.value)


@pytest.mark.skipif("gemm" not in strategies(), reason="the gemm strategy is not registered")
@pytest.mark.parametrize("kw, rule", [
    (dict(kernel=3), "1×1"), (dict(stride=2, padding=1), "padding"), (dict(padding=1), "padding"),
    (dict(dilation=2, kernel=3), "1×1")])
def test_forced_strategy_that_cannot_serve_says_why(device, kw, rule):
    k = kw.pop("kernel", 1)
    x = nc.Tensor.from_host(np.ones((1, 2, 9, 9), np.float32), device)
    w = nc.Tensor.from_host(np.ones((3, 2, k, k), np.float32), device)
    with pytest.raises(nc.ShapeError, match=rule) as info:
        conv2d(x, w, strategy="gemm", **kw)
    assert "gemm" in str(info.value)


def test_unknown_strategy_is_a_shape_error(device):
    x = nc.Tensor.from_host(np.ones((1, 1, 4, 4), np.float32), device)
    with pytest.raises(nc.ShapeError, match="unknown conv2d strategy"):
        conv2d(x, x, strategy="fft")
