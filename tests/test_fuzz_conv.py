"""Fuzzed conv2d sweep: a seeded generator of valid layers (batch, channels, sizes, kernel, stride, padding,
dilation, groups), each checked with every registered strategy that serves it, forward and both
gradients, against the float64 NumPy reference (tests/util.py) with the convolution issues' tolerances:
relative L2 error ≤ 1e-5 forward and ≤ 1e-4 for gradients (Winograd: 1e-4 and 5e-4). Results containing
NaN/Inf, or all zeros where the reference is not, fail.

64 layers run in the default suite, 5,136 more behind the `slow` marker (nearly every fuzzed geometry is
a program to build: 200 cases per sweep were 6 of a cold PoCL suite's 21 minutes). The layers are a pure
function of the seed (NETCL_FUZZ_SEED, default below) and the layer's index, so a failure names the layer and the
command that replays exactly it. Every tensor sits between canary elements (tests/conftest.py), so a write
past a tensor's end fails the case even where it stays inside one buffer. Strategies registered later join automatically (netcl.ops.conv_common).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from util import assert_close, conv2d_grads_ref, conv2d_ref

SEED = int(os.environ.get("NETCL_FUZZ_SEED", "20240917"))
DEFAULT_LAYERS = 64
SLOW_LAYERS = 5200 - DEFAULT_LAYERS  # indices up to 5199, as before
TOLERANCES = {"winograd": (1e-4, 5e-4)}
DEFAULT_TOLERANCE = (1e-5, 1e-4)
PASSES = ("forward", "backward_data", "backward_weight")


def layer_rng(kind: str, index: int) -> np.random.Generator:
    """The generator of one fuzzed case: a function of (seed, kind, index) only, so any case replays alone."""
    return np.random.default_rng([SEED, sum(map(ord, kind)), index])


def random_conv_layer(rng: np.random.Generator) -> dict:
    """A valid layer, small enough to check against the float64 reference in milliseconds. A quarter are
    3×3 stride-1 (Winograd's), a sixth 1×1 stride-1 unpadded (the gemm strategy's), the rest anything."""
    style = rng.choice(["winograd", "pointwise", "any"], p=[0.25, 0.15, 0.6])
    if style == "winograd":
        (r, s), (sh, sw), (dh, dw) = (3, 3), (1, 1), (1, 1)
        ph, pw = (int(v) for v in rng.integers(0, 3, 2))
    elif style == "pointwise":
        (r, s), (sh, sw), (ph, pw), (dh, dw) = (1, 1), (1, 1), (0, 0), (1, 1)
    else:
        r, s = (int(v) for v in rng.choice([1, 2, 3, 4, 5, 7], 2))
        sh, sw = (int(v) for v in rng.integers(1, 4, 2))
        ph, pw = (int(v) for v in rng.integers(0, 4, 2))
        dh, dw = (int(v) for v in rng.choice([1, 1, 2, 3], 2))
    kind = rng.choice(["dense", "grouped", "depthwise"], p=[0.6, 0.25, 0.15])
    if kind == "depthwise":
        groups = int(rng.integers(1, 6))
        c, k = groups, groups * int(rng.integers(1, 3))
    else:
        groups = 1 if kind == "dense" else int(rng.integers(2, 4))
        c, k = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 5))
    # draw the output size first so that every layer is valid; the input may exceed the minimum by up to
    # stride − 1 rows/columns that no window reads
    oh, ow = (int(v) for v in rng.integers(1, 7, 2))
    h = max(1, (oh - 1) * sh + dh * (r - 1) + 1 - 2 * ph + int(rng.integers(0, sh)))
    w = max(1, (ow - 1) * sw + dw * (s - 1) + 1 - 2 * pw + int(rng.integers(0, sw)))
    n = int(rng.integers(1, 4))
    dtype = "float64" if rng.random() < 0.1 else "float32"
    return {"input": (n, c, h, w), "weight": (k, c // groups, r, s), "stride": (sh, sw), "padding": (ph, pw),
            "dilation": (dh, dw), "groups": groups, "dtype": dtype}


def describe(spec: dict) -> str:
    return (f"input {spec['input']}, weight {spec['weight']}, stride {spec['stride']}, padding {spec['padding']}, "
            f"dilation {spec['dilation']}, groups {spec['groups']}, {spec['dtype']}")


def replay_hint(test: str, index: int) -> str:
    return f"replay: NETCL_FUZZ_SEED={SEED} python -m pytest 'tests/test_fuzz_conv.py::{test}[{index}]'"


def check_finite_nonzero(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(actual)):
        raise AssertionError(f"{what}: result contains NaN or Inf")
    if np.any(expected != 0) and not np.any(actual != 0):
        raise AssertionError(f"{what}: result is all zeros")


def check_conv_layer(spec: dict, rng: np.random.Generator, device) -> list[str]:
    """Every strategy that serves the layer, every pass it serves; returns "strategy/pass" for each check."""
    if spec["dtype"] == "float64" and not device.has_fp64:
        spec = {**spec, "dtype": "float32"}
    dt = spec["dtype"]
    args = (spec["stride"], spec["padding"], spec["dilation"], spec["groups"])
    layer = ConvLayer.from_shapes(spec["input"], spec["weight"], *args, dt)
    x = rng.uniform(-1, 1, spec["input"]).astype(dt)
    w = rng.uniform(-1, 1, spec["weight"]).astype(dt)
    gy = rng.uniform(-1, 1, layer.output_shape).astype(dt)
    y_ref = conv2d_ref(x, w, *args)
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    checked = []
    for name, impl in sorted(strategies().items()):
        why = {p: impl.why_not(layer, p) for p in PASSES}
        if why["forward"]:
            continue
        fwd_tol, grad_tol = TOLERANCES.get(name, DEFAULT_TOLERANCE)
        X = nc.Tensor.from_host(x, device, requires_grad=not why["backward_data"])
        W = nc.Tensor.from_host(w, device, requires_grad=not why["backward_weight"])
        y = conv2d(X, W, stride=args[0], padding=args[1], dilation=args[2], groups=args[3], strategy=name)
        out = y.to_host()
        check_finite_nonzero(out, y_ref, f"{name} forward")
        assert_close(out, y_ref, fwd_tol, f"{name} forward")
        checked.append(f"{name}/forward")
        if why["backward_data"] and why["backward_weight"]:
            continue
        y.backward(nc.Tensor.from_host(gy, device))
        for pass_, tensor, ref in (("backward_data", X, gx_ref), ("backward_weight", W, gw_ref)):
            if why[pass_]:
                continue
            got = tensor.grad.to_host()
            check_finite_nonzero(got, ref, f"{name} {pass_}")
            assert_close(got, ref, grad_tol, f"{name} {pass_}")
            checked.append(f"{name}/{pass_}")
    return checked


def run_case(test: str, index: int, device) -> list[str]:
    """Check fuzzed layer ``index`` (AssertionError naming it and its replay); the passes checked."""
    rng = layer_rng("conv", index)
    spec = random_conv_layer(rng)
    try:
        checked = check_conv_layer(spec, rng, device)
    except AssertionError as exc:
        raise AssertionError(f"conv layer #{index} ({describe(spec)}): {exc}\n{spec!r}\n"
                             f"{replay_hint(test, index)}") from None
    return checked


@pytest.mark.parametrize("index", range(DEFAULT_LAYERS))
def test_conv_fuzz(index, device, canaries):
    checked = run_case("test_conv_fuzz", index, device)
    assert "direct/forward" in checked, f"the direct strategy must serve every layer (#{index})"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(DEFAULT_LAYERS, DEFAULT_LAYERS + SLOW_LAYERS))
def test_conv_fuzz_slow(index, device, canaries):
    checked = run_case("test_conv_fuzz_slow", index, device)
    assert "direct/forward" in checked, f"the direct strategy must serve every layer (#{index})"


def test_generator_covers_every_strategy_and_parameter():
    """The default sweep's layers reach every strategy and every kind of parameter."""
    specs = [random_conv_layer(layer_rng("conv", i)) for i in range(DEFAULT_LAYERS)]
    served = set()
    for spec in specs:
        layer = ConvLayer.from_shapes(spec["input"], spec["weight"], spec["stride"], spec["padding"],
                                      spec["dilation"], spec["groups"], spec["dtype"])
        served |= {name for name, impl in strategies().items() if not impl.why_not(layer, "forward")}
    assert served == set(strategies()), f"no fuzzed layer is served by {set(strategies()) - served}"
    assert any(s["groups"] > 1 for s in specs) and any(s["weight"][1] == 1 and s["groups"] > 1 for s in specs)
    assert any(max(s["stride"]) > 1 for s in specs) and any(max(s["dilation"]) > 1 for s in specs)
    assert any(max(s["padding"]) > 0 for s in specs) and any(s["input"][0] > 1 for s in specs)
    assert any(s["weight"][2] != s["weight"][3] for s in specs) and any(s["dtype"] == "float64" for s in specs)
