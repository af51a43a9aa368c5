"""Layers: forward and backward of Linear, Conv2d, ReLU, Tanh, Dropout, Flatten and CrossEntropyLoss
against float64 NumPy references and float64 finite differences, with canaries."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from nn_reference import cross_entropy_ref, finite_difference, scalar_through
from util import assert_close, conv2d_grads_ref, conv2d_ref


@pytest.mark.parametrize("n,fin,fout,bias", [(1, 1, 1, True), (7, 13, 5, True), (33, 31, 17, False),
                                             (64, 800, 10, True)])
def test_linear_forward_backward(device, rng, canaries, n, fin, fout, bias):
    layer = nc.nn.Linear(fin, fout, bias=bias, device=device)
    x_host = rng.uniform(-2, 2, size=(n, fin)).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = layer(x)
    w = layer.weight.to_host().astype(np.float64)
    b = layer.bias.to_host().astype(np.float64) if bias else np.zeros(fout)
    assert_close(y.to_host(), x_host @ w.T + b, 1e-5, "linear forward")
    gy = rng.uniform(-2, 2, size=(n, fout)).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), gy.astype(np.float64) @ w, 1e-5, "linear grad x")
    assert_close(layer.weight.grad.to_host(), gy.astype(np.float64).T @ x_host, 1e-5, "linear grad w")
    if bias:
        assert_close(layer.bias.grad.to_host(), gy.sum(0), 1e-5, "linear grad b")


def test_linear_accepts_leading_dimensions(device, rng):
    layer = nc.nn.Linear(5, 3, device=device)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    y = layer(nc.tensor(x, device=device))
    ref = x @ layer.weight.to_host().T + layer.bias.to_host()
    assert y.shape == (2, 4, 3)
    assert_close(y.to_host(), ref, 1e-5, "linear 3-D input")
    with pytest.raises(nc.ShapeError, match="last dimension 5"):
        layer(nc.zeros((2, 4), device=device))


def test_linear_and_tanh_gradients_finite_differences_float64(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    layer = nc.nn.Linear(4, 3, device=device, dtype=np.float64)
    x_host = rng.uniform(-1, 1, size=(5, 4))
    gy = rng.uniform(-1, 1, size=(5, 3))
    fn = lambda t: layer(t).tanh()  # noqa: E731
    x = nc.tensor(x_host, device=device, requires_grad=True)
    fn(x).backward(nc.tensor(gy, device=device))
    numeric = finite_difference(scalar_through(fn, gy, device), x_host)
    assert_close(x.grad.to_host(), numeric, 1e-7, "linear+tanh grad x vs finite differences")
    w_host = layer.weight.to_host()

    def through_weight(w):
        with nc.no_grad():
            return float(np.sum(F.linear(nc.tensor(x_host, device=device), nc.tensor(w, device=device),
                                         layer.bias).tanh().to_host() * gy))
    assert_close(layer.weight.grad.to_host(), finite_difference(through_weight, w_host), 1e-7,
                 "linear grad w vs finite differences")


@pytest.mark.parametrize("strategy", ["direct", "im2col"])
def test_conv2d_layer_trains_every_parameter(device, rng, canaries, strategy):
    layer = nc.nn.Conv2d(3, 5, 3, stride=2, padding=1, strategy=strategy, device=device)
    x_host = rng.uniform(-2, 2, size=(2, 3, 9, 7)).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = layer(x)
    w = layer.weight.to_host()
    ref = conv2d_ref(x_host, w, (2, 2), (1, 1)) + layer.bias.to_host().reshape(1, -1, 1, 1)
    assert_close(y.to_host(), ref, 1e-5, "Conv2d forward")
    gy = rng.uniform(-1, 1, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    gx, gw = conv2d_grads_ref(x_host, w, gy, (2, 2), (1, 1))
    assert_close(x.grad.to_host(), gx, 1e-5, "Conv2d grad x")
    assert_close(layer.weight.grad.to_host(), gw, 1e-5, "Conv2d grad w")
    assert_close(layer.bias.grad.to_host(), gy.sum((0, 2, 3)), 1e-5, "Conv2d grad b")


def test_default_initialization_matches_pytorch_bounds(device):
    nc.nn.init.manual_seed(3)
    conv = nc.nn.Conv2d(20, 50, 5, device=device)
    fc = nc.nn.Linear(800, 500, device=device)
    for w, fan_in in ((conv.weight, 500), (fc.weight, 800)):
        host = w.to_host()
        bound = 1 / np.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5))
        assert np.abs(host).max() <= bound and np.abs(host).max() > 0.95 * bound
        assert abs(host.std() - bound / np.sqrt(3)) < 0.05 * bound
    assert np.abs(fc.bias.to_host()).max() <= 1 / np.sqrt(800)


@pytest.mark.parametrize("n,c", [(1, 1), (7, 10), (65, 3), (200, 31)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_forward_backward(device, rng, canaries, n, c, reduction):
    logits = rng.uniform(-5, 5, size=(n, c)).astype(np.float32)
    target = rng.integers(0, c, size=n)
    x = nc.tensor(logits, device=device, requires_grad=True)
    loss = nc.nn.CrossEntropyLoss(reduction=reduction)(x, nc.tensor(target, device=device))
    ref_loss, ref_grad = cross_entropy_ref(logits, target, reduction)
    assert loss.shape == ()
    assert abs(loss.item() - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    (loss * 3.0).backward()
    assert_close(x.grad.to_host(), 3.0 * ref_grad, 1e-5, "cross-entropy grad")


def test_cross_entropy_is_stable_for_huge_logits_and_int32_targets(device, canaries):
    logits = np.array([[1000.0, 0.0, -1000.0], [-500.0, 500.0, 499.0]], np.float32)
    target = np.array([0, 2], np.int32)
    loss = F.cross_entropy(nc.tensor(logits, device=device), nc.tensor(target, device=device))
    ref, _ = cross_entropy_ref(logits.astype(np.float64), target)
    assert np.isfinite(loss.item()) and abs(loss.item() - ref) < 1e-4


def test_cross_entropy_finite_differences_float64(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    logits = rng.uniform(-3, 3, size=(6, 5))
    target = nc.tensor(rng.integers(0, 5, size=6), device=device)
    x = nc.tensor(logits, device=device, requires_grad=True)
    F.cross_entropy(x, target).backward()

    def f(z):
        with nc.no_grad():
            return F.cross_entropy(nc.tensor(z, device=device), target).item()
    assert_close(x.grad.to_host(), finite_difference(f, logits), 1e-7, "cross-entropy vs finite differences")


def test_cross_entropy_bad_inputs(device):
    with pytest.raises(nc.ShapeError, match=r"\(N, C\)"):
        F.cross_entropy(nc.zeros((4, 3), device=device), nc.tensor(np.zeros(5, np.int64), device=device))
    with pytest.raises(nc.DTypeError, match="int32 or int64"):
        F.cross_entropy(nc.zeros((4, 3), device=device), nc.zeros((4,), device=device))
    with pytest.raises(nc.ShapeError, match="reduction"):
        nc.nn.CrossEntropyLoss("none")
    with pytest.raises(nc.ClassIndexError, match="class index 3 at position 1 is out of range for 3 classes"):
        F.cross_entropy(nc.zeros((2, 3), device=device), np.array([0, 3]))  # host targets: at the call
    out_of_range = F.cross_entropy(nc.zeros((2, 3), device=device), nc.tensor(np.array([-2, 0]), device=device))
    with pytest.raises(nc.ClassIndexError, match="class index -2 at position 0"):  # device ones: at the read
        out_of_range.item()


def test_dropout_mask_scaling_and_gradient(device, rng, canaries):
    x_host = rng.uniform(0.5, 2, size=(64, 500)).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    drop = nc.nn.Dropout(0.5, seed=7)
    y = drop(x)
    out = y.to_host()
    kept = out != 0
    assert 0.45 < kept.mean() < 0.55
    assert_close(out[kept], 2 * x_host[kept], 1e-6, "kept elements scaled by 1/(1-p)")
    gy = rng.uniform(-1, 1, size=out.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), np.where(kept, 2 * gy, 0), 1e-6, "dropout gradient")
    assert not np.array_equal(drop(x).to_host() != 0, kept), "each call draws a new mask"
    replay = nc.nn.Dropout(0.5, seed=7)
    assert np.array_equal(replay(x).to_host(), out), "same seed and call count, same mask"
    drop.eval()
    assert np.array_equal(drop(x).to_host(), x_host)
    with pytest.raises(nc.ShapeError):
        nc.nn.Dropout(1.5)


@pytest.mark.parametrize("name", ["ReLU", "Tanh"])
def test_activations(device, rng, canaries, name):
    x_host = rng.uniform(-2, 2, size=(3, 7, 13)).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = getattr(nc.nn, name)()(x)
    ref = np.maximum(x_host, 0) if name == "ReLU" else np.tanh(x_host.astype(np.float64))
    dref = (x_host > 0).astype(np.float64) if name == "ReLU" else 1 - np.tanh(x_host.astype(np.float64)) ** 2
    assert_close(y.to_host(), ref, 1e-6, name)
    gy = rng.uniform(-1, 1, size=x_host.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), gy * dref, 1e-6, f"{name} gradient")


def test_flatten_and_sequential(device, rng, canaries):
    x_host = rng.standard_normal((4, 2, 3, 5)).astype(np.float32)
    model = nc.nn.Sequential(nc.nn.Flatten(), nc.nn.Linear(30, 7, device=device), nc.nn.ReLU())
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = model(x)
    lin = model[1]
    ref = np.maximum(x_host.reshape(4, 30) @ lin.weight.to_host().T + lin.bias.to_host(), 0)
    assert_close(y.to_host(), ref, 1e-5, "Flatten -> Linear -> ReLU")
    y.sum().backward()
    assert x.grad.shape == x_host.shape
    assert len(model) == 3 and isinstance(model[-1], nc.nn.ReLU)


def test_conv_and_linear_start_from_given_weights(device, rng):
    w, b = rng.standard_normal((6, 2, 3, 3)), rng.standard_normal(6)
    conv = nc.nn.Conv2d(6, 6, 3, groups=3, device=device, initial_weight=w, initial_bias=b)
    assert np.array_equal(conv.weight.to_host(), w.astype(np.float32)) and conv.weight.requires_grad
    assert np.array_equal(conv.bias.to_host(), b.astype(np.float32))
    linear = nc.nn.Linear(3, 2, bias=False, device=device, initial_weight=np.ones((2, 3)))
    assert np.array_equal(linear.weight.to_host(), np.ones((2, 3), np.float32)) and linear.bias is None
    with pytest.raises(nc.ShapeError, match="initial_weight"):
        nc.nn.Conv2d(6, 6, 3, device=device, initial_weight=w)
    with pytest.raises(nc.ShapeError, match="initial_bias"):
        nc.nn.Linear(3, 2, device=device, initial_bias=np.zeros(3))
