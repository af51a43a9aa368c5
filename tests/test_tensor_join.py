"""nc.cat/stack/where/maximum/minimum/clamp against float64 NumPy, with PyTorch's gradient conventions."""
import numpy as np
import pytest

import netcl as nc
from test_autograd import check
from util import assert_close

DTYPES = [np.float32, np.float64, np.int32, np.int64]


def _data(rng, shape, dtype):
    return (rng.standard_normal(shape) * 10).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dtype, dim, rng, canaries):
    shapes = [(7, 13, 3), (7, 1, 3), (7, 31, 3)] if dim == 1 else \
        [(1, 13, 3), (7, 13, 3)] if dim == 0 else [(7, 13, 1), (7, 13, 5), (7, 13, 3)]
    parts = [_data(rng, s, dtype) for s in shapes]
    got = nc.cat([nc.tensor(p) for p in parts], dim)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.to_host(), np.concatenate(parts, dim))
    strided = [nc.tensor(np.ascontiguousarray(np.swapaxes(p, 0, 2))).transpose(0, 2) for p in parts]
    np.testing.assert_array_equal(nc.cat(strided, dim).to_host(), np.concatenate(parts, dim))


def test_cat_promotes_skips_empty_and_checks(rng, canaries):
    a, b = _data(rng, (3, 5), np.float32), _data(rng, (2, 5), np.int64)
    got = nc.cat((nc.tensor(a), nc.tensor(b)))
    assert got.dtype == np.float64  # NumPy's promotion of float32 with int64
    assert_close(got.to_host(), np.concatenate([a, b]).astype(np.float64), 0, "promoted cat")
    np.testing.assert_array_equal(nc.cat([nc.tensor(a), nc.zeros(0)]).to_host(), a)
    with pytest.raises(nc.ShapeError):
        nc.cat([nc.tensor(a), nc.tensor(a.T)])
    with pytest.raises(nc.ShapeError):
        nc.cat([])
    with pytest.raises(nc.ShapeError):
        nc.cat([nc.tensor(a)], dim=2)
    with pytest.raises(nc.ShapeError):
        nc.cat([nc.tensor(np.float32(1))])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dtype, dim, rng, canaries):
    parts = [_data(rng, (7, 13), dtype) for _ in range(3)]
    got = nc.stack([nc.tensor(p) for p in parts], dim)
    np.testing.assert_array_equal(got.to_host(), np.stack(parts, dim))
    with pytest.raises(nc.ShapeError):
        nc.stack([nc.tensor(parts[0]), nc.tensor(parts[1][:1])])


def test_cat_and_stack_grads(rng):
    a, b, c = rng.standard_normal((3, 2)), rng.standard_normal((3, 5)), rng.standard_normal((3, 1))
    check(lambda x, y, z: nc.cat([x, y, z], dim=1), a, b, c)
    check(lambda x, y: nc.stack([x, y * 2.0], dim=1), a, rng.standard_normal((3, 2)))
    check(lambda x, y: nc.cat([x.T, y.T]), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_where(dtype, rng, canaries):
    cond = rng.standard_normal((7, 13)) > 0
    a, b = _data(rng, (7, 13), dtype), _data(rng, (1, 13), dtype)
    got = nc.where(nc.tensor(cond), nc.tensor(a), nc.tensor(b))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.to_host(), np.where(cond, a, b))
    np.testing.assert_array_equal(nc.where(nc.tensor(a) > 0, nc.tensor(a), 0).to_host(), np.where(a > 0, a, 0))
    scalar = nc.where(nc.tensor(cond), 1.5, nc.tensor(a))
    np.testing.assert_allclose(scalar.to_host(), np.where(cond, 1.5, a).astype(scalar.dtype))
    # a non-bool condition means "nonzero", as a bool conversion would
    half = np.where(rng.standard_normal(13) > 0, 0.5, 0.0)
    np.testing.assert_array_equal(nc.where(nc.tensor(half), nc.tensor(a[0]), nc.tensor(b[0])).to_host(),
                                  np.where(half != 0, a[0], b[0]))


def test_where_grads(rng):
    cond = nc.tensor(rng.standard_normal((4, 5)) > 0)
    check(lambda a, b: nc.where(cond, a, b), rng.standard_normal((4, 5)), rng.standard_normal((1, 5)))
    check(lambda a: nc.where(cond, a, 0.0), rng.standard_normal((4, 5)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum(dtype, name, rng, canaries):
    a, b = _data(rng, (13, 1), dtype), _data(rng, (31,), dtype)
    got = getattr(nc, name)(nc.tensor(a), nc.tensor(b))
    np.testing.assert_array_equal(got.to_host(), getattr(np, name)(a, b))
    np.testing.assert_array_equal(getattr(nc.tensor(a), name)(nc.tensor(b)).to_host(), getattr(np, name)(a, b))


def test_maximum_propagates_nan(canaries):
    a = nc.tensor(np.array([np.nan, 1.0, 2.0], np.float32))
    b = nc.tensor(np.array([0.0, np.nan, 1.0], np.float32))
    np.testing.assert_array_equal(nc.maximum(a, b).to_host(), [np.nan, np.nan, 2.0])
    np.testing.assert_array_equal(nc.minimum(a, b).to_host(), [np.nan, np.nan, 1.0])


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_grads_and_ties(name, rng):
    check(lambda x, y: getattr(nc, name)(x, y), rng.standard_normal((3, 7)), rng.standard_normal((1, 7)))
    # PyTorch: on a tie each side gets half the gradient
    x = nc.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = nc.tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    getattr(nc, name)(x, y).sum().backward()
    winner_x = [0.5, 0.0, 1.0] if name == "maximum" else [0.5, 1.0, 0.0]
    np.testing.assert_array_equal(x.grad.to_host(), winner_x)
    np.testing.assert_array_equal(y.grad.to_host(), 1.0 - np.array(winner_x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp(dtype, rng, canaries):
    x = _data(rng, (7, 13), dtype)
    t = nc.tensor(x)
    np.testing.assert_array_equal(t.clamp(-3, 4).to_host(), np.clip(x, -3, 4))
    np.testing.assert_array_equal(t.clamp(min=-2).to_host(), np.maximum(x, -2))
    np.testing.assert_array_equal(nc.clamp(t, max=5).to_host(), np.minimum(x, 5))
    np.testing.assert_array_equal(t.clamp(4, -3).to_host(), np.full_like(x, -3))  # min > max gives max
    low = _data(rng, (1, 13), dtype)
    np.testing.assert_array_equal(t.clamp(nc.tensor(low), 20).to_host(), np.minimum(np.maximum(x, low), 20))
    with pytest.raises(nc.ShapeError):
        t.clamp()


def test_clamp_int_with_float_bounds_promotes(canaries):
    got = nc.tensor(np.array([-2, 0, 3], np.int64)).clamp(-0.5, 2.5)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.to_host(), [-0.5, 0.0, 2.5])


def test_clamp_nan_stays(canaries):
    got = nc.tensor(np.array([np.nan, -5.0, 5.0])).clamp(-1, 1).to_host()
    assert np.isnan(got[0]) and got[1:].tolist() == [-1.0, 1.0]


def test_clamp_grads(rng):
    x = rng.standard_normal((5, 7))
    x[np.abs(np.abs(x) - 0.5) < 0.05] = 0.0  # keep finite differences away from the kinks
    check(lambda t: t.clamp(-0.5, 0.5), x)
    check(lambda t: t.clamp(min=-0.5), x)
    check(lambda t: t.clamp(max=0.5), x)
    low, high = rng.uniform(-1, -0.2, (1, 7)), rng.uniform(0.2, 1, (5, 1))
    check(lambda t, lo, hi: nc.clamp(t, lo, hi), x * 2, low, high)
    # PyTorch: a value on a bound passes its gradient through
    t = nc.tensor(np.array([-1.0, 0.0, 1.0, 2.0]), requires_grad=True)
    t.clamp(-1, 1).sum().backward()
    np.testing.assert_array_equal(t.grad.to_host(), [1.0, 1.0, 1.0, 0.0])
