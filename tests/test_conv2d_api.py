"""conv2d's public surface: argument forms, bias, validation errors, determinism, exact workspace sizes."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import settings
from netcl.ops import conv2d as conv2d_module
from netcl.ops import gemm as gemm_module
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from netcl.runtime import memory
from util import assert_close, conv2d_grads_ref, conv2d_ref


def test_strategy_constants():
    assert (conv2d_module.CONV2D_DIRECT, conv2d_module.CONV2D_IM2COL, conv2d_module.CONV2D_GEMM) == (
        "direct", "im2col", "gemm")
    assert {"direct", "im2col", "gemm"} <= set(strategies())


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("n,k", [(1, 2), (3, 66), (2, 6)])
def test_bias_fused_into_implicit_gemm(n, k, groups, rng, device, canaries):
    """implicit_gemm adds the bias as it stores (several row tiles when k > 64; per group)."""
    x = rng.uniform(-1, 1, (n, 4, 7, 13)).astype(np.float32)
    w = rng.uniform(-1, 1, (k, 4 // groups, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, (k,)).astype(np.float32)
    X, W, B = (nc.Tensor.from_host(a, device, requires_grad=True) for a in (x, w, b))
    y = conv2d(X, W, B, padding=1, groups=groups, strategy="implicit_gemm")
    ref = conv2d_ref(x, w, (1, 1), (1, 1), groups=groups) + b.reshape(1, k, 1, 1)
    assert_close(y.to_host(), ref, 1e-5, "implicit_gemm conv2d with bias")
    gy = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    y.backward(nc.Tensor.from_host(gy, device))
    assert_close(B.grad.to_host(), gy.sum(axis=(0, 2, 3)), 1e-5, "grad bias")


@pytest.mark.parametrize("strategy", ["direct", "im2col"])
def test_bias_and_pair_arguments(strategy, rng, device, canaries):
    x = rng.uniform(-1, 1, (2, 3, 10, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 3, 3, 2)).astype(np.float32)
    b = rng.uniform(-1, 1, (5,)).astype(np.float32)
    X, W, B = (nc.Tensor.from_host(a, device, requires_grad=True) for a in (x, w, b))
    y = conv2d(X, W, B, stride=(2, 1), padding=(1, 0), dilation=(1, 2), strategy=strategy)
    ref = conv2d_ref(x, w, (2, 1), (1, 0), (1, 2)) + b.reshape(1, 5, 1, 1)
    assert_close(y.to_host(), ref, 1e-5, "conv2d with bias")
    gy = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    y.backward(nc.Tensor.from_host(gy, device))
    gx, gw = conv2d_grads_ref(x, w, gy, (2, 1), (1, 0), (1, 2))
    assert_close(X.grad.to_host(), gx, 1e-4, "grad input")
    assert_close(W.grad.to_host(), gw, 1e-4, "grad weight")
    assert_close(B.grad.to_host(), gy.sum(axis=(0, 2, 3)), 1e-4, "grad bias")
    same = conv2d(X, W, B, stride=(2, 1), padding=(1, 0), dilation=(1, 2), strategy="direct")
    assert_close(y.to_host(), same.to_host(), 1e-5, "strategy agreement")


def test_int_and_pair_arguments_agree(rng, device):
    x = nc.Tensor.from_host(rng.standard_normal((1, 2, 8, 8)).astype(np.float32), device)
    w = nc.Tensor.from_host(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), device)
    a = conv2d(x, w, stride=2, padding=1, dilation=2, strategy="im2col").to_host()
    b = conv2d(x, w, stride=(2, 2), padding=(1, 1), dilation=(2, 2), strategy="im2col").to_host()
    np.testing.assert_array_equal(a, b)


def _t(shape, device, dtype=np.float32):
    return nc.Tensor.from_host(np.zeros(shape, dtype), device)


def test_validation_errors(device):
    x, w = _t((1, 4, 8, 8), device), _t((6, 4, 3, 3), device)
    with pytest.raises(nc.ShapeError) as info:
        conv2d(x, _t((6, 3, 3, 3), device), strategy="im2col")
    assert "(1, 4, 8, 8)" in str(info.value) and "(6, 3, 3, 3)" in str(info.value)
    with pytest.raises(nc.ShapeError, match=r"4-D.*\(4, 8, 8\)"):
        conv2d(_t((4, 8, 8), device), w, strategy="direct")
    with pytest.raises(nc.ShapeError, match="larger than the padded input"):
        conv2d(x, _t((6, 4, 9, 9), device), strategy="direct")
    with pytest.raises(nc.ShapeError, match="groups=3"):
        conv2d(x, _t((6, 4, 3, 3), device), groups=3, strategy="direct")
    with pytest.raises(nc.ShapeError, match=r"bias.*\(6,\)"):
        conv2d(x, w, _t((5,), device), strategy="direct")
    with pytest.raises(nc.ShapeError, match="stride"):
        conv2d(x, w, stride=0, strategy="direct")
    with pytest.raises(nc.ShapeError, match="padding"):
        conv2d(x, w, padding=(1, 2, 3), strategy="direct")
    with pytest.raises(nc.DTypeError, match="float64"):
        conv2d(x, _t((6, 4, 3, 3), device, np.float64), strategy="direct")
    with pytest.raises(nc.DTypeError):
        conv2d(np.zeros((1, 4, 8, 8), np.float32), w, strategy="direct")
    with pytest.raises(nc.ShapeError, match="gemm.*1×1"):
        conv2d(x, w, strategy="gemm")


def test_deterministic_mode_repeats_bitwise(rng, device, monkeypatch):
    monkeypatch.setattr(settings, "_chosen", {})  # the choice below ends with the test
    nc.use_deterministic(True)
    x = rng.standard_normal((2, 3, 15, 15)).astype(np.float32)
    w = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    grads = []
    for _ in range(3):
        X = nc.Tensor.from_host(x, device, requires_grad=True)
        conv2d(X, nc.Tensor.from_host(w, device), padding=2, strategy="im2col").sum().backward()
        grads.append(X.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], grads[2])


WORKSPACE_CASES = [
    ((1, 3, 11, 9), (4, 3, 3, 3), 1, 1, 1),
    ((3, 4, 9, 9), (6, 2, 3, 3), 2, 1, 2),
    ((2, 6, 7, 7), (4, 6, 1, 1), 1, 0, 1),
    ((2, 4, 6, 6), (8, 1, 1, 1), 1, 0, 4),
    ((2, 32, 20, 20), (64, 32, 3, 3), 1, 1, 1),   # operands past GEMM's L1 threshold: packing buffers
    ((2, 96, 16, 16), (128, 96, 1, 1), 1, 0, 1),
]


@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("case", WORKSPACE_CASES)
@pytest.mark.parametrize("name", sorted(strategies()))
def test_workspace_bytes_is_exact(name, case, pass_, rng, device, monkeypatch):
    """Every byte a pass allocates besides its result is what workspace_bytes announced (GEMM's cached
    packing buffers count, from an empty cache)."""
    xs, ws, st, pd, g = case
    layer = ConvLayer.from_shapes(xs, ws, st, pd, 1, g, "float32")
    impl = strategies()[name]
    if impl.why_not(layer, pass_):
        pytest.skip(impl.why_not(layer, pass_))
    x = nc.Tensor.from_host(rng.standard_normal(xs).astype(np.float32), device)
    w = nc.Tensor.from_host(rng.standard_normal(ws).astype(np.float32), device)
    gy = nc.Tensor.from_host(rng.standard_normal(layer.output_shape).astype(np.float32), device)
    release = getattr(gemm_module, "release_workspaces", None)
    if release is not None:
        release(device)  # GEMM's packing buffers are cached per device: start from none
    allocated = []
    real_allocate = memory.allocate
    monkeypatch.setattr(memory, "allocate",
                        lambda dev, nbytes: allocated.append(int(nbytes)) or real_allocate(dev, nbytes))
    run = {"forward": lambda: impl.forward(x, w, layer), "backward_data": lambda: impl.backward_data(gy, w, layer),
           "backward_weight": lambda: impl.backward_weight(x, gy, layer)}[pass_]
    out = run()
    device.synchronize()
    assert sum(allocated) - out.nbytes == impl.workspace_bytes(layer, pass_), allocated


def test_training_skips_the_data_gradient_of_a_plain_input(rng, device, monkeypatch):
    """A network's first convolution (ResNet's 7×7 stem) reads an input that needs no gradient: a training
    step runs its forward and weight-gradient passes, never backward_data, and the weight gradient is
    still right."""
    passes = []
    real = conv2d_module.run_pass

    def recording(pass_, *args, **kwargs):
        passes.append(pass_)
        return real(pass_, *args, **kwargs)
    monkeypatch.setattr(conv2d_module, "run_pass", recording)
    conv = nc.nn.Conv2d(3, 5, 7, stride=2, padding=3, bias=False).to(device)
    conv.train()
    x = rng.standard_normal((2, 3, 17, 15)).astype(np.float32)
    y = conv(nc.Tensor.from_host(x, device))
    gy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(nc.Tensor.from_host(gy, device))
    assert passes == ["forward", "backward_weight"]
    _, gw_ref = conv2d_grads_ref(x.astype(np.float64), conv.weight.to_host().astype(np.float64),
                                 gy.astype(np.float64), (2, 2), (3, 3))
    assert_close(conv.weight.grad.to_host(), gw_ref, 1e-4, "weight gradient of a conv on a plain input")
