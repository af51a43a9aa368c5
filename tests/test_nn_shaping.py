"""The data-moving layers an imported ONNX graph uses (nc.nn.Reshape, Permute, Concat, ConstantPad2d and
F.pad): values against NumPy in float64, gradients against the reference and finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from nn_reference import finite_difference, scalar_through
from util import assert_close


@pytest.mark.parametrize("shape,pad", [
    ((2, 3, 5, 7), (1, 2, 0, 3)),            # width and height, PyTorch's order
    ((3, 4, 5), (2, -1, -2, 1)),             # negative widths crop
    ((2, 3, 5, 7), (0, 0, 1, 1, 2, 0)),      # three dims
])
def test_pad_values_and_gradient(device, rng, canaries, shape, pad):
    x_host = rng.standard_normal(shape).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = F.pad(x, pad, value=0.25)
    pairs = [(pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)][::-1]
    widths = [(0, 0)] * (len(shape) - len(pairs)) + pairs
    grown = np.pad(x_host.astype(np.float64), [(max(b, 0), max(a, 0)) for b, a in widths], constant_values=0.25)
    crop = tuple(slice(max(-b, 0), grown.shape[k] - max(-a, 0)) for k, (b, a) in enumerate(widths))
    expected = grown[crop]
    assert y.shape == expected.shape
    assert_close(y.to_host(), expected, 1e-7, "pad forward")
    gy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    # d<pad(x), gy>/dx: gy where x landed, zero where x was cropped away
    g_grown = np.zeros(grown.shape)
    g_grown[crop] = gy
    inside = tuple(slice(max(b, 0), max(b, 0) + n) for n, (b, _) in zip(shape, widths))
    assert_close(x.grad.to_host(), g_grown[inside], 1e-7, "pad backward")


def test_pad_gradient_finite_differences_float64(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    x_host = rng.standard_normal((2, 3, 4))
    gy = rng.standard_normal((2, 4, 5))
    x = nc.tensor(x_host, device=device, requires_grad=True)
    fn = lambda t: F.pad(t, (2, -1, 0, 1), value=-1.5)
    fn(x).backward(nc.tensor(gy, device=device))
    numeric = finite_difference(scalar_through(fn, gy, device), x_host)
    assert_close(x.grad.to_host(), numeric, 1e-7, "pad gradient vs finite differences")


def test_pad_rejects_bad_widths(device):
    x = nc.zeros((2, 3), device=device)
    with pytest.raises(nc.ShapeError, match="pair"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(nc.ShapeError, match="nothing"):
        F.pad(x, (-2, -1))
    with pytest.raises(nc.ShapeError, match="reflect"):
        F.pad(x, (1, 1), mode="reflect")


def test_layers_and_their_gradients(device, rng, canaries):
    a_host, b_host = rng.standard_normal((2, 3, 5)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    a = nc.tensor(a_host, device=device, requires_grad=True)
    b = nc.tensor(b_host, device=device, requires_grad=True)
    joined = nc.nn.Concat(1)(a, b)
    assert_close(joined.to_host(), np.concatenate([a_host, b_host], 1), 0, "Concat")
    moved = nc.nn.Permute((2, 0, 1))(joined)
    flat = nc.nn.Reshape((0, -1), copy_zeros=True)(moved)
    assert flat.shape == (5, 14)
    padded = nc.nn.ConstantPad2d((1, 0, 0, 2), 3.0)(flat)
    expected = np.pad(np.concatenate([a_host, b_host], 1).transpose(2, 0, 1).reshape(5, 14), ((0, 2), (1, 0)),
                      constant_values=3.0)
    assert_close(padded.to_host(), expected, 0, "Permute, Reshape, ConstantPad2d")
    gy = rng.standard_normal(padded.shape).astype(np.float32)
    padded.backward(nc.tensor(gy, device=device))
    g = gy[:5, 1:].reshape(5, 2, 7).transpose(1, 2, 0)
    assert_close(a.grad.to_host(), g[:, :3], 1e-7, "gradient through the layers (a)")
    assert_close(b.grad.to_host(), g[:, 3:], 1e-7, "gradient through the layers (b)")


def test_layer_arguments_are_checked(device):
    with pytest.raises(nc.ShapeError):
        nc.nn.Reshape((-1, -1))
    with pytest.raises(nc.ShapeError):
        nc.nn.Permute((0, 0, 1))
    with pytest.raises(nc.ShapeError, match="3-D"):
        nc.nn.Permute((0, 2, 1))(nc.zeros((2, 3), device=device))
    with pytest.raises(nc.ShapeError, match="copies an axis"):
        nc.nn.Reshape((1, 0, 0), copy_zeros=True)(nc.zeros((6, 1), device=device))
    assert nc.nn.Reshape((3, 0)).shape == (3, 0) and "copy_zeros" not in repr(nc.nn.Reshape((3, -1)))
