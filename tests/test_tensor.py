"""Tensor: host round trip, factories, views, broadcasting arithmetic and reductions vs float64 NumPy."""
import operator

import numpy as np
import pytest

import netcl as nc
from util import assert_close

SIZES = [1, 7, 13, 31, 63, 65, 257]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("n", SIZES)
def test_round_trip(dtype, n, rng, canaries):
    host = (rng.standard_normal(n) * 100).astype(dtype)
    t = nc.Tensor.from_host(host)
    assert t.shape == (n,) and t.dtype == np.dtype(dtype) and t.size == n and t.nbytes == host.nbytes
    np.testing.assert_array_equal(t.to_host(), host)
    np.testing.assert_array_equal(np.asarray(t), host)


def test_host_conversions():
    assert nc.tensor(np.arange(6.)).dtype == np.float64
    assert nc.tensor(np.zeros(3, np.uint8)).dtype == np.int32
    assert nc.tensor([1.5, 2.5]).dtype == np.float32  # Python floats are float32, as PyTorch's default
    assert nc.tensor([0.1, 0.2]).dtype == nc.float32 and nc.tensor(2.5).dtype == np.float32
    assert nc.tensor([1, 2]).dtype == np.int64 and nc.tensor(np.arange(3, dtype=np.int32)).dtype == np.int32
    assert nc.tensor([True, False]).dtype == np.bool_ and nc.tensor(np.ones(2, bool)).dtype == np.bool_
    assert nc.tensor(np.float64(2.5)).dtype == np.float64  # a NumPy float64 stays float64
    assert nc.tensor(np.ones(2, np.float32), dtype=np.float64).dtype == np.float64
    assert nc.tensor(np.float32(3.0)).item() == 3.0
    empty = nc.tensor(np.zeros((0, 3), np.float32))
    assert empty.shape == (0, 3) and empty.to_host().shape == (0, 3)


def test_factories(canaries):
    np.testing.assert_array_equal(nc.zeros((3, 5)).to_host(), np.zeros((3, 5), np.float32))
    np.testing.assert_array_equal(nc.ones(7, dtype=np.int64).to_host(), np.ones(7, np.int64))
    np.testing.assert_array_equal(nc.full((2, 3), 2.5).to_host(), np.full((2, 3), 2.5, np.float32))
    u = nc.rand(100_001, seed=3).to_host()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    g = nc.randn(100_001, seed=4).to_host()
    assert abs(g.mean()) < 0.02 and abs(g.std() - 1) < 0.02
    np.testing.assert_array_equal(nc.randn(33, seed=9).to_host(), nc.randn(33, seed=9).to_host())
    assert not np.array_equal(nc.randn(33).to_host(), nc.randn(33).to_host())
    assert nc.randn(3, 4, dtype=np.float64).dtype == np.float64


def test_views(rng, canaries):
    host = rng.standard_normal((5, 7, 13))
    t = nc.tensor(host)
    np.testing.assert_array_equal(t.reshape(35, 13).to_host(), host.reshape(35, 13))
    np.testing.assert_array_equal(t.reshape(-1).to_host(), host.reshape(-1))
    np.testing.assert_array_equal(t.permute(2, 0, 1).to_host(), host.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.transpose(0, 2).to_host(), host.swapaxes(0, 2))
    np.testing.assert_array_equal(t.T.to_host(), host.T)
    for index in [(1,), (slice(1, 4),), (Ellipsis, 3), (slice(None), slice(1, None, 3), slice(2, 11, 4)),
                  (-1, None, slice(None, None, 2)), (2, 3, 4), (slice(5, 1),)]:
        np.testing.assert_array_equal(t[index].to_host(), host[index], err_msg=str(index))
    view = t[1:4, ::2].permute(2, 1, 0)
    assert not view.is_contiguous()
    c = view.contiguous()
    assert c.is_contiguous()
    np.testing.assert_array_equal(c.to_host(), host[1:4, ::2].transpose(2, 1, 0))
    np.testing.assert_array_equal(view.reshape(-1).to_host(), host[1:4, ::2].transpose(2, 1, 0).reshape(-1))
    np.testing.assert_array_equal(t[None, 1].expand(3, 7, 13).to_host(), np.broadcast_to(host[None, 1], (3, 7, 13)))


BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((7,), (7,)), ((13, 1), (1, 31)), ((3, 1, 5), (7, 1)), ((1,), (2, 3)),
                                    ((31, 33), ())])
def test_binary_broadcast(op, shapes, rng, canaries):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = (rng.standard_normal(shapes[1]) + 3).astype(np.float32)
    ta, tb = nc.tensor(a), nc.tensor(b)
    expected = BINARY[op](a.astype(np.float64), b.astype(np.float64))
    assert_close(getattr(ta, f"__{'truediv' if op == 'div' else op}__")(tb).to_host(), expected, 1e-6, op)
    assert_close(BINARY[op](ta, 2.5).to_host(), BINARY[op](a.astype(np.float64), 2.5), 1e-6, op + " scalar")
    assert_close(BINARY[op](2.5, tb).to_host(), BINARY[op](2.5, b.astype(np.float64)), 1e-6, op + " rscalar")


def test_strided_operands(rng, canaries):
    a = rng.standard_normal((13, 31))
    b = rng.standard_normal((31, 13))
    ta, tb = nc.tensor(a), nc.tensor(b)
    assert_close((ta[::2, 1:] * tb.T[::2, 1:]).to_host(), a[::2, 1:] * b.T[::2, 1:], 1e-12, "strided mul")


def test_unary_and_pow(rng, canaries):
    x = rng.uniform(0.1, 3, (7, 13))
    t = nc.tensor(x)
    for name, ref in [("exp", np.exp), ("log", np.log), ("tanh", np.tanh), ("relu", lambda v: np.maximum(v - 1, 0))]:
        arg = t - 1 if name == "relu" else t
        assert_close(getattr(arg, name)().to_host(), ref(x), 1e-12, name)
    assert_close((t ** 2).to_host(), x ** 2, 1e-12, "pow")
    assert_close((2 ** t).to_host(), 2 ** x, 1e-12, "rpow")
    assert_close((-t).to_host(), -x, 0, "neg")


@pytest.mark.parametrize("shape", [(1,), (7,), (13, 31), (3, 5, 7), (4097,), (2, 5000)])
def test_reductions(shape, rng, canaries):
    x = rng.standard_normal(shape)
    t = nc.tensor(x.astype(np.float32))
    x32 = x.astype(np.float32).astype(np.float64)
    for axis in [None] + list(range(len(shape))) + ([(0, len(shape) - 1)] if len(shape) > 1 else []):
        # float32 accumulation: the error scales with the sum of magnitudes, not with the (possibly
        # cancelling) sum itself
        scale = np.abs(x32).sum(axis=axis, keepdims=True).max()
        count = x32.size // max(np.sum(x32, axis=axis, keepdims=True).size, 1)
        for keepdims in (False, True):
            err = np.abs(t.sum(axis, keepdims).to_host() - x32.sum(axis=axis, keepdims=keepdims)).max()
            assert err <= 1e-6 * scale, f"sum {axis}: error {err:.3e} for a sum of magnitudes {scale:.3e}"
            err = np.abs(t.mean(axis, keepdims).to_host() - x32.mean(axis=axis, keepdims=keepdims)).max()
            assert err <= 1e-6 * scale / count, f"mean {axis}: error {err:.3e}"
            np.testing.assert_array_equal(t.max(axis, keepdims).to_host(), x32.max(axis=axis, keepdims=keepdims))
    for axis in [None] + list(range(len(shape))):
        np.testing.assert_array_equal(t.argmax(axis).to_host(), x32.argmax(axis=axis))


def test_argmax_ties_and_ints():
    t = nc.tensor(np.array([[1, 5, 5], [7, 7, 2]], np.int64))
    np.testing.assert_array_equal(t.argmax(1).to_host(), [1, 0])
    assert t.sum().item() == 27 and t.sum().dtype == np.int64
    assert t.max().item() == 7


@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 13, 31), (33, 17, 65)])
def test_matmul(mkn, rng, canaries):
    m, k, n = mkn
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    assert_close((nc.tensor(a) @ nc.tensor(b)).to_host(), a @ b, 1e-12, "matmul f64")
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert_close((nc.tensor(a32) @ nc.tensor(b32)).to_host(), a @ b, 1e-5, "matmul f32")
    v = rng.standard_normal(k)
    assert_close((nc.tensor(a) @ nc.tensor(v)).to_host(), a @ v, 1e-12, "matvec")
    batch = rng.standard_normal((3, m, k))
    assert_close((nc.tensor(batch) @ nc.tensor(b)).to_host(), batch @ b, 1e-12, "batched")
