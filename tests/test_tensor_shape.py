"""Tensor's PyTorch-style shape methods, iteration, host copies and moves between devices."""
import numpy as np
import pytest

import netcl as nc
from test_autograd import check
from util import assert_close


def test_unsqueeze_squeeze_flatten_view(rng, canaries):
    x = rng.standard_normal((7, 1, 13, 1))
    t = nc.tensor(x)
    for d in range(-5, 5):
        assert t.unsqueeze(d).shape == np.expand_dims(x, d).shape, d
    assert t.squeeze().shape == (7, 13)
    assert t.squeeze(1).shape == (7, 13, 1) and t.squeeze(0).shape == t.shape and t.squeeze(-1).shape == (7, 1, 13)
    assert t.squeeze((1, 3)).shape == (7, 13)
    assert t.flatten().shape == (91,) and t.flatten(1).shape == (7, 13) and t.flatten(0, 1).shape == (7, 13, 1)
    assert t.flatten(-2, -1).shape == (7, 1, 13)
    np.testing.assert_array_equal(t.flatten(1, 2).to_host(), x.reshape(7, 13, 1))
    np.testing.assert_array_equal(t.view(13, 7).to_host(), x.reshape(13, 7))
    np.testing.assert_array_equal(t.view((-1, 7)).to_host(), x.reshape(-1, 7))
    np.testing.assert_array_equal(t[:, 0].T.flatten().to_host(), x[:, 0].T.reshape(-1))
    assert nc.tensor(np.float32(3)).flatten().shape == (1,)
    assert nc.tensor(np.float32(3)).unsqueeze(0).shape == (1,)
    assert t.numel() == 91 and nc.tensor(np.float32(1)).numel() == 1
    with pytest.raises(nc.ShapeError):
        t.unsqueeze(5)
    with pytest.raises(nc.ShapeError):
        t.flatten(2, 1)


def test_shape_method_grads(rng):
    x = rng.standard_normal((3, 1, 5))
    check(lambda t: t.squeeze(1).unsqueeze(0) * 2.0, x)
    check(lambda t: t.flatten() * t.view(15), x)


def test_iteration_over_first_axis(rng, canaries):
    x = rng.standard_normal((7, 3))
    rows = list(nc.tensor(x))
    assert len(rows) == 7
    for row, expected in zip(rows, x):
        np.testing.assert_array_equal(row.to_host(), expected)
    assert [v.item() for v in nc.tensor(np.arange(5))] == [0, 1, 2, 3, 4]
    assert list(nc.zeros((0, 2))) == []
    with pytest.raises(TypeError):
        iter(nc.tensor(np.float32(1)))
    with pytest.raises(TypeError):
        list(nc.tensor(np.float32(1)))


def test_iteration_is_differentiable(rng):
    x = rng.standard_normal((4, 3))
    check(lambda t: sum((row * float(k + 1) for k, row in enumerate(t)), nc.zeros(3, dtype=np.float64)), x)


def test_host_copies(rng):
    x = rng.standard_normal((3, 5))
    t = nc.tensor(x)
    for host in (t.cpu(), t.numpy(), t.to_host()):
        assert isinstance(host, np.ndarray) and host.dtype == np.float64
        np.testing.assert_array_equal(host, x)
    host = t.cpu()
    host[0, 0] = 123.0
    assert t[0, 0].item() == x[0, 0], "cpu() is a copy"


def test_to_same_device_and_dtype(rng):
    t = nc.tensor(rng.standard_normal(7).astype(np.float32))
    assert t.to(t.device) is t
    assert t.to(nc.default_device()) is t
    assert t.to("pocl" if "portable" in t.device.platform.lower() else str(t.device.index)) is t
    assert t.to(str(t.device.index)) is t
    assert t.to(np.float32) is t
    assert t.to(np.float64).dtype == np.float64 and t.to("float64").dtype == np.float64
    assert t.to(dtype=np.float64, device=t.device).dtype == np.float64
    assert t.to(nc.zeros(2, dtype=np.float64)).dtype == np.float64 and t.to(nc.zeros(2)) is t
    c = t.to(t.device, copy=True)
    assert c is not t and np.array_equal(c.to_host(), t.to_host())
    with pytest.raises(nc.DeviceError):
        t.to("no such device anywhere")
    with pytest.raises(nc.DTypeError):
        t.to([1, 2])


@pytest.fixture
def other_device(device):
    """A second Device on the same OpenCL device: its own context and queue, so copies must cross over."""
    return nc.Device(device.cl_device, index=len(nc.devices()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_to_other_device_copies(dtype, other_device, rng):
    x = (rng.standard_normal((7, 13)) * 10).astype(dtype)
    t = nc.tensor(x)
    moved = t[::2].to(other_device)
    assert moved.device is other_device and moved.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(moved.to_host(), x[::2])
    with pytest.raises(nc.DeviceError):
        t + nc.tensor(x, device=other_device)


def test_to_other_device_is_differentiable(other_device, rng):
    x = rng.standard_normal((5, 3))
    w = rng.standard_normal((5, 3))
    t = nc.tensor(x, requires_grad=True)
    y = t.to(other_device) * nc.tensor(w, device=other_device)
    y.sum().backward()
    assert t.grad.device is t.device
    assert_close(t.grad.to_host(), w, 1e-15, "gradient back across devices")
