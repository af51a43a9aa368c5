"""Sigmoid, LeakyReLU, GELU (exact and tanh), Hardtanh, ReLU6, Hardswish, Hardsigmoid, SiLU (with PyTorch's
gradients at their kinks), Softmax / LogSoftmax along any dim, Identity,
AdaptiveAvgPool2d, and the containers ModuleList / ModuleDict, Module.to and buffers: float64 NumPy
references on odd sizes with canaries, finite differences for the gradients."""
from __future__ import annotations

import math

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from nn_reference import finite_difference
from util import assert_close, assert_close_to_scale

_erf = np.vectorize(math.erf)


def gelu_ref(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def hard_gate_ref(x):
    return np.clip(x + 3, 0, 6) / 6


ACTIVATIONS = {
    "sigmoid": (lambda: nc.nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    "hardtanh": (lambda: nc.nn.Hardtanh(), lambda x: np.clip(x, -1, 1)),
    "hardtanh_-2_0.5": (lambda: nc.nn.Hardtanh(min_val=-2, max_val=0.5), lambda x: np.clip(x, -2, 0.5)),
    "relu6": (lambda: nc.nn.ReLU6(), lambda x: np.clip(x, 0, 6), 8.0),  # inputs past the clamp at 6
    "hardswish": (lambda: nc.nn.Hardswish(), lambda x: x * hard_gate_ref(x)),
    "hardsigmoid": (lambda: nc.nn.Hardsigmoid(), hard_gate_ref),
    "silu": (lambda: nc.nn.SiLU(), lambda x: x / (1 + np.exp(-x))),
    "leaky_relu": (lambda: nc.nn.LeakyReLU(), lambda x: np.where(x > 0, x, 0.01 * x)),
    "leaky_relu_0.3": (lambda: nc.nn.LeakyReLU(negative_slope=0.3), lambda x: np.where(x > 0, x, 0.3 * x)),
    "gelu": (lambda: nc.nn.GELU(), lambda x: gelu_ref(x, "none")),
    "gelu_tanh": (lambda: nc.nn.GELU(approximate="tanh"), lambda x: gelu_ref(x, "tanh")),
    "identity": (lambda: nc.nn.Identity(7, unused=True), lambda x: x),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 31)])
def test_activation_forward_backward(device, rng, canaries, name, shape):
    make, ref, *span = ACTIVATIONS[name]
    # (GELU's far tail, where erfc's float rounding is relative to values near 1e-11, stays out)
    x_h = rng.uniform(-1, 1, size=shape).astype(np.float32) * (span[0] if span else 4.0)
    x = nc.tensor(x_h, device=device, requires_grad=True)
    y = make()(x)
    assert_close(y.to_host(), ref(x_h.astype(np.float64)), 1e-6, f"{name} forward")
    gy = rng.uniform(-1, 1, size=shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    numeric = finite_difference(lambda z: float(np.sum(ref(z) * gy)), x_h.astype(np.float64))
    # measured against the upstream gradient's size: f' passes through 0 (GELU near x = -0.75), where a
    # one-element relative error means nothing
    assert_close_to_scale(x.grad.to_host(), numeric, gy, 1e-5, f"{name} grad")


# PyTorch's gradients (hardtanh_backward, hardswish_backward, hardsigmoid_backward) including the kinks,
# where a finite difference cannot tell: (functional, layer, forward, derivative), float64
KINKED = {
    "relu6": (F.relu6, nc.nn.ReLU6, lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)).astype(float)),
    "hardtanh": (lambda x: F.hardtanh(x, -2.0, 3.0), lambda: nc.nn.Hardtanh(-2.0, 3.0), lambda x: np.clip(x, -2, 3),
                 lambda x: ((x > -2) & (x < 3)).astype(float)),
    "hardswish": (F.hardswish, nc.nn.Hardswish, lambda x: x * hard_gate_ref(x),
                  lambda x: np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0))),
    "hardsigmoid": (F.hardsigmoid, nc.nn.Hardsigmoid, hard_gate_ref,
                    lambda x: np.where((x > -3) & (x < 3), 1 / 6, 0.0)),
    "silu": (F.silu, nc.nn.SiLU, lambda x: x / (1 + np.exp(-x)),
             lambda x: (1 / (1 + np.exp(-x))) * (1 + x * (1 - 1 / (1 + np.exp(-x))))),
}


@pytest.mark.parametrize("name", sorted(KINKED))
def test_activation_kinks_and_functional_form(device, rng, canaries, name):
    functional, layer, ref, derivative = KINKED[name]
    kinks = np.array([-6, -3, -2, -1.5, -1, 0, 1, 3, 6, 7], np.float32)
    x_h = np.concatenate([kinks, rng.uniform(-9, 9, size=23).astype(np.float32)])  # 33 elements
    gy = rng.uniform(-1, 1, size=x_h.shape).astype(np.float32)
    grads = []
    for fn in (functional, layer()):
        x = nc.tensor(x_h, device=device, requires_grad=True)
        y = fn(x)
        assert_close(y.to_host(), ref(x_h.astype(np.float64)), 1e-6, f"{name} forward")
        y.backward(nc.tensor(gy, device=device))
        grads.append(x.grad.to_host())
        assert_close(grads[-1], gy * derivative(x_h.astype(np.float64)), 1e-6, f"{name} grad")
    np.testing.assert_array_equal(grads[0], grads[1])


@pytest.mark.parametrize("fn", [F.relu6, F.hardtanh, F.hardswish, F.hardsigmoid, F.silu])
def test_activation_passes_nan_forward(device, fn):
    y = fn(nc.tensor(np.array([np.nan, 1.0], np.float32), device=device)).to_host()
    assert np.isnan(y[0]) and np.isfinite(y[1])


def test_hardtanh_checks_its_bounds(device):
    with pytest.raises(nc.ShapeError, match="max_val"):
        nc.nn.Hardtanh(1.0, 1.0)
    with pytest.raises(nc.ShapeError, match="cannot be greater"):
        F.hardtanh(nc.zeros((2,), device=device), 2.0, 1.0)
    with pytest.raises(nc.ShapeError, match="must be a number"):
        nc.nn.Hardtanh("0", 1.0)
    assert repr(nc.nn.Hardtanh(-2, 0.5)) == "Hardtanh(min_val=-2.0, max_val=0.5)"
    assert isinstance(nc.nn.ReLU6(), nc.nn.Hardtanh) and repr(nc.nn.ReLU6()) == "ReLU6()"


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((7, 13), 1), ((7, 13), 0), ((3, 5, 7), 1), ((3, 5, 7), -1),
                                       ((1, 31), 1), ((5,), 0)])
def test_softmax_and_log_softmax(device, rng, canaries, log, shape, dim):
    x_h = rng.uniform(-5, 5, size=shape).astype(np.float32)
    x_h.flat[0] = 80.0  # large logits must not overflow

    def ref(z):
        m = z.max(dim, keepdims=True)
        lse = m + np.log(np.exp(z - m).sum(dim, keepdims=True))
        return z - lse if log else np.exp(z - lse)

    x = nc.tensor(x_h, device=device, requires_grad=True)
    layer = nc.nn.LogSoftmax(dim=dim) if log else nc.nn.Softmax(dim=dim)
    y = layer(x)
    assert_close(y.to_host(), ref(x_h.astype(np.float64)), 1e-6, "forward")
    gy = rng.uniform(-1, 1, size=shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    numeric = finite_difference(lambda z: float(np.sum(ref(z) * gy)), x_h.astype(np.float64))
    assert_close(x.grad.to_host(), numeric, 1e-4, "grad")


def test_softmax_needs_a_valid_dim(device):
    with pytest.raises(nc.ShapeError, match="dim must be given"):
        F.softmax(nc.zeros((2, 3), device=device))
    with pytest.raises(nc.ShapeError, match="out of range"):
        F.log_softmax(nc.zeros((2, 3), device=device), dim=2)


def adaptive_ref(x, out_h, out_w):
    n, c, h, w = x.shape
    y = np.zeros((n, c, out_h, out_w))
    for i in range(out_h):
        h0, h1 = (i * h) // out_h, -(-((i + 1) * h) // out_h)
        for j in range(out_w):
            w0, w1 = (j * w) // out_w, -(-((j + 1) * w) // out_w)
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean((2, 3))
    return y


@pytest.mark.parametrize("shape,out", [((2, 3, 8, 8), 1), ((3, 5, 7, 13), (3, 4)), ((1, 2, 5, 5), (5, 5)),
                                       ((2, 1, 7, 3), (4, None)), ((2, 3, 3, 5), (7, 9)), ((13, 7, 1, 1), 1),
                                       ((3, 4, 7, 7), 1)])  # global: whole vectors of partial sums and a tail
def test_adaptive_avg_pool2d(device, rng, canaries, shape, out):
    x_h = rng.uniform(-2, 2, size=shape).astype(np.float32)
    pair = (out, out) if isinstance(out, int) else out
    oh, ow = (shape[2] if pair[0] is None else pair[0]), (shape[3] if pair[1] is None else pair[1])
    x = nc.tensor(x_h, device=device, requires_grad=True)
    y = nc.nn.AdaptiveAvgPool2d(out)(x)
    assert y.shape == shape[:2] + (oh, ow)
    assert_close(y.to_host(), adaptive_ref(x_h.astype(np.float64), oh, ow), 1e-6, "forward")
    gy = rng.uniform(-1, 1, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    numeric = finite_difference(lambda z: float(np.sum(adaptive_ref(z, oh, ow) * gy)), x_h.astype(np.float64))
    assert_close(x.grad.to_host(), numeric, 1e-5, "grad")
    with pytest.raises(nc.ShapeError, match="output_size"):
        F.adaptive_avg_pool2d(x, 0)


def test_module_list_and_dict_register_children(device):
    layers = nc.nn.ModuleList([nc.nn.Linear(3, 4, device=device), nc.nn.ReLU()])
    layers.append(nc.nn.Linear(4, 2, device=device))
    assert len(layers) == 3 and isinstance(layers[-1], nc.nn.Linear)
    assert [n for n, _ in layers.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    heads = nc.nn.ModuleDict({"a": nc.nn.Linear(2, 2, device=device)})
    heads["b"] = nc.nn.BatchNorm1d(2, device=device)
    assert list(heads.keys()) == ["a", "b"] and "b" in heads
    assert "b.running_mean" in heads.state_dict() and "b.num_batches_tracked" in heads.state_dict()
    del layers[1]
    assert [n for n, _ in layers.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(TypeError):
        layers.append("not a module")


def test_module_to_buffers_and_zero_grad(device, rng):
    model = nc.nn.Sequential(nc.nn.Conv2d(in_channels=2, out_channels=3, kernel_size=3, device=device),
                             nc.nn.BatchNorm2d(3, device=device))
    assert model.to(device) is model
    assert [n for n, _ in model.named_buffers()] == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert len(model.buffers()) == 3
    model(nc.tensor(rng.normal(size=(2, 2, 5, 5)).astype(np.float32), device=device)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=False)
    assert all(not np.any(p.grad.to_host()) for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(nc.ShapeError, match="both in_ch"):
        nc.nn.Conv2d(2, 3, 3, in_channels=2)
