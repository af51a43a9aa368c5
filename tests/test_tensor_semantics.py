"""PyTorch's semantics: true division, bool comparisons, the bool dtype, Python numbers' dtypes."""
import operator

import numpy as np
import pytest

import netcl as nc
from test_autograd import check
from util import assert_close

COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
               "ge": operator.ge}


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [1, 7, 31])
def test_true_division_of_ints_gives_float32(dtype, n, rng, canaries):
    a = rng.integers(-50, 50, n).astype(dtype)
    b = rng.integers(1, 9, n).astype(dtype) * rng.choice([-1, 1], n).astype(dtype)
    ta, tb = nc.tensor(a), nc.tensor(b)
    for got, expected in [(ta / tb, a / b), (ta / 2, a / 2), (7 / tb, 7 / b), (ta / 2.5, a / 2.5)]:
        assert got.dtype == np.float32
        assert_close(got.to_host(), expected.astype(np.float64), 1e-6, "int division")
    np.testing.assert_allclose((nc.tensor([7, 8, 9]) / 2).to_host(), [3.5, 4.0, 4.5])


def test_division_keeps_float_dtypes(rng, canaries):
    x = rng.standard_normal(13)
    assert (nc.tensor(x) / 3).dtype == np.float64
    assert (nc.tensor(x.astype(np.float32)) / nc.tensor(np.arange(1, 14))).dtype == np.float64  # NumPy's promotion
    assert (nc.tensor(x.astype(np.float32)) / 3).dtype == np.float32


# every operator on one float and one int dtype, the other dtypes on one operator (each pair is a kernel build)
@pytest.mark.parametrize("op, dtype", [(op, dt) for op in sorted(COMPARISONS) for dt in (np.float32, np.int64)]
                         + [("le", np.float64), ("ne", np.int32)])
def test_comparisons_give_bool(op, dtype, rng, canaries):
    a = rng.integers(-3, 4, (7, 13)).astype(dtype)
    b = rng.integers(-3, 4, (1, 13)).astype(dtype)
    ta, tb = nc.tensor(a), nc.tensor(b)
    fn = COMPARISONS[op]
    for got, expected in [(fn(ta, tb), fn(a, b)), (fn(ta, 1), fn(a, 1)), (fn(ta, 0.5), fn(a, 0.5)),
                          (fn(ta[:, ::2], tb[:, ::2]), fn(a[:, ::2], b[:, ::2]))]:
        assert got.dtype == np.bool_
        host = got.to_host()
        assert host.dtype == np.bool_
        np.testing.assert_array_equal(host, expected)


def test_comparisons_with_nan(canaries):
    t = nc.tensor(np.array([np.nan, 1.0, 2.0], np.float32))
    np.testing.assert_array_equal((t == t).to_host(), [False, True, True])
    np.testing.assert_array_equal((t != t).to_host(), [True, False, False])
    np.testing.assert_array_equal((t < 1.5).to_host(), [False, True, False])


def test_bool_tensor_sum_cast_and_masks(rng, canaries):
    x = rng.standard_normal((13, 31))
    mask = nc.tensor(x) > 0
    s = mask.sum()
    assert s.dtype == np.int64 and s.item() == int((x > 0).sum())
    np.testing.assert_array_equal(mask.sum(axis=1).to_host(), (x > 0).sum(axis=1))
    assert mask.float().dtype == np.float32 and mask.astype(np.float64).dtype == np.float64
    np.testing.assert_array_equal(mask.float().to_host(), (x > 0).astype(np.float32))
    np.testing.assert_array_equal(mask.long().to_host(), (x > 0).astype(np.int64))
    assert_close(mask.mean().to_host(), (x > 0).mean(), 1e-6, "mean of a mask")
    np.testing.assert_array_equal((nc.tensor(x) * mask).to_host(), x * (x > 0))
    assert (mask * 1.5).dtype == np.float32 and (mask + 1).dtype == np.int64
    back = nc.tensor(x > 0)
    assert back.dtype == np.bool_ and np.array_equal(back.to_host(), x > 0)


def test_cast_to_bool_is_nonzero(canaries):
    t = nc.tensor(np.array([0.0, 0.5, -2.0, np.nan], np.float32))
    np.testing.assert_array_equal(t.bool().to_host(), [False, True, True, True])
    np.testing.assert_array_equal(nc.tensor(np.array([0, 3, -1], np.int32)).bool().to_host(), [False, True, True])
    assert nc.zeros(3, dtype=bool).to_host().tolist() == [False] * 3
    assert nc.ones(5, dtype=nc.bool).to_host().tolist() == [True] * 5
    assert nc.full((2,), True, dtype=np.bool_).sum().item() == 2


def test_logical_and_bitwise_operators(rng, canaries):
    a, b = rng.standard_normal(31) > 0, rng.standard_normal(31) > 0
    ta, tb = nc.tensor(a), nc.tensor(b)
    np.testing.assert_array_equal((ta & tb).to_host(), a & b)
    np.testing.assert_array_equal((ta | tb).to_host(), a | b)
    np.testing.assert_array_equal((ta ^ tb).to_host(), a ^ b)
    np.testing.assert_array_equal((~ta).to_host(), ~a)
    assert (ta & tb).dtype == np.bool_
    i = rng.integers(-100, 100, 13)
    np.testing.assert_array_equal((nc.tensor(i) & 6).to_host(), i & 6)
    np.testing.assert_array_equal((~nc.tensor(i)).to_host(), ~i)
    np.testing.assert_array_equal(abs(nc.tensor(i)).to_host(), np.abs(i))
    with pytest.raises(nc.DTypeError):
        nc.tensor(np.ones(3, np.float32)) & nc.tensor(np.ones(3, np.float32))


def test_python_numbers_dtypes():
    assert nc.tensor([0.1, 0.2]).dtype == nc.float32
    assert nc.tensor([[1.0, 2], [3, 4]]).dtype == np.float32
    assert nc.tensor(0.5).dtype == np.float32 and nc.tensor(0.5).shape == ()
    assert nc.tensor([1, 2, 3]).dtype == np.int64 and nc.tensor(3).dtype == np.int64
    assert nc.tensor([True]).dtype == np.bool_
    assert nc.tensor(np.array([0.1, 0.2])).dtype == np.float64
    assert nc.tensor([0.1, 0.2], dtype=np.float64).dtype == np.float64
    assert nc.tensor(np.zeros(3, np.float16)).dtype == np.float32
    assert nc.tensor(np.zeros(3, np.int16)).dtype == np.int32
    layer = nc.nn.Linear(2, 3)
    assert layer(nc.tensor([[0.1, 0.2]])).shape == (1, 3)  # a Python-float batch runs in a float32 layer


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_floor_division_and_remainder_round_like_python(dtype, rng, canaries):
    a = rng.integers(-60, 60, (7, 13)).astype(dtype)
    b = (rng.integers(1, 9, (1, 13)) * rng.choice([-1, 1], (1, 13))).astype(dtype)
    if np.dtype(dtype).kind == "f":
        a, b = a / 4, b / 3  # non-integral operands
    ta, tb = nc.tensor(a), nc.tensor(b)
    for got, expected in [(ta // tb, a // b), (ta % tb, a % b), (ta // 3, a // 3), (ta % -3, a % -3),
                          (17 // tb, 17 // b), (17 % tb, 17 % b)]:
        assert got.dtype == np.dtype(dtype)
        tol = 0 if np.dtype(dtype).kind == "i" else 1e-5
        np.testing.assert_allclose(got.to_host(), expected.astype(dtype), rtol=tol, atol=tol)
    assert (nc.tensor(np.float32([1.0])) // 0.1).item() == 9.0  # PyTorch's and Python's answer, not 10


def test_integer_division_by_zero_does_not_trap(canaries):
    # x86 traps on an integer division by zero; the kernels define it as 0 (NumPy's answer) instead
    a = nc.tensor(np.array([5, -5, 0], np.int64))
    np.testing.assert_array_equal((a // 0).to_host(), [0, 0, 0])
    np.testing.assert_array_equal((a % 0).to_host(), [0, 0, 0])
    assert (a / 0).dtype == np.float32 and np.isinf((a / 0).to_host()[:2]).all()


def test_remainder_gradient(rng):
    a = rng.uniform(0.1, 0.9, (4, 5)) + rng.integers(-3, 3, (4, 5))
    b = rng.uniform(1.2, 1.8, (1, 5))
    check(lambda x, y: x % y, a, b)
