"""min/argmin, var/std, max/min(dim=) with indices, dim/axis spellings — vs float64 NumPy."""
import numpy as np
import pytest

import netcl as nc
from test_autograd import check
from util import assert_close


@pytest.mark.parametrize("shape", [(1,), (7,), (13, 31), (3, 5, 7), (2, 4099)])
def test_min_argmin(shape, rng, canaries):
    x = rng.standard_normal(shape).astype(np.float32)
    t = nc.tensor(x)
    assert t.min().item() == x.min() and t.argmin().item() == x.argmin()
    for axis in range(len(shape)):
        np.testing.assert_array_equal(t.min(axis).to_host(), x.min(axis))
        np.testing.assert_array_equal(t.min(axis=axis, keepdims=True).to_host(), x.min(axis, keepdims=True))
        np.testing.assert_array_equal(t.argmin(axis).to_host(), x.argmin(axis))
        np.testing.assert_array_equal(t.argmin(dim=axis, keepdim=True).to_host(), np.expand_dims(x.argmin(axis), axis))


def test_min_ties_ints_and_nan(canaries):
    t = nc.tensor(np.array([[5, 1, 1], [2, 7, 2]], np.int32))
    np.testing.assert_array_equal(t.argmin(1).to_host(), [1, 0])
    assert t.min().item() == 1 and t.min().dtype == np.int32
    f = nc.tensor(np.array([3.0, np.nan, -1.0], np.float32))
    assert np.isnan(f.min().item()) and f.argmin().item() == 1 and f.argmax().item() == 1


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape", [(7,), (13, 31), (3, 5, 7)])
def test_indexed_max_min(op, shape, rng, canaries):
    x = rng.standard_normal(shape)
    t = nc.tensor(x)
    for dim in range(-len(shape), len(shape)):
        for keepdim in (False, True):
            result = getattr(t, op)(dim=dim, keepdim=keepdim)
            values, indices = result
            assert result.values is values and result.indices is indices
            assert indices.dtype == np.int64
            ref_values = getattr(x, op)(dim, keepdims=keepdim)
            ref_indices = getattr(x, "arg" + op)(dim)
            np.testing.assert_array_equal(values.to_host(), ref_values)
            np.testing.assert_array_equal(indices.to_host(),
                                          np.expand_dims(ref_indices, dim) if keepdim else ref_indices)
    assert isinstance(getattr(t, op)(0), nc.Tensor), "the positional (NumPy) form returns the values"
    assert isinstance(getattr(t, op)(axis=0), nc.Tensor)


def test_indexed_max_gradient_goes_to_the_index(rng):
    check(lambda t: t.max(dim=1).values, rng.standard_normal((5, 7)))
    check(lambda t: t.min(dim=0, keepdim=True).values, rng.standard_normal((5, 7)))
    check(lambda t: t.min(axis=1), rng.standard_normal((5, 7)))
    # PyTorch: max(dim) sends the gradient to the returned index only; max() shares it among ties
    t = nc.tensor(np.array([[2.0, 2.0, 1.0]]), requires_grad=True)
    t.max(dim=1).values.sum().backward()
    np.testing.assert_array_equal(t.grad.to_host(), [[1.0, 0.0, 0.0]])
    t.grad = None
    t.max().backward()
    np.testing.assert_array_equal(t.grad.to_host(), [[0.5, 0.5, 0.0]])


def test_max_with_a_tensor_is_maximum(rng, canaries):
    a, b = rng.standard_normal(7), rng.standard_normal(7)
    np.testing.assert_array_equal(nc.tensor(a).max(nc.tensor(b)).to_host(), np.maximum(a, b))
    np.testing.assert_array_equal(nc.tensor(a).min(nc.tensor(b)).to_host(), np.minimum(a, b))


@pytest.mark.parametrize("shape", [(1,), (7,), (13, 31), (3, 5, 7)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_var_std(shape, dtype, rng, canaries):
    x = (rng.standard_normal(shape) * 3 + 5).astype(dtype)
    t = nc.tensor(x)
    ref = x.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    axes = [None] + list(range(len(shape))) + ([(0, len(shape) - 1)] if len(shape) > 1 else [])
    for axis in axes:
        for correction in (0, 1):
            n = ref.size if axis is None else int(np.prod([shape[a] for a in np.atleast_1d(axis)]))
            if n - correction <= 0:
                continue
            expected = ref.var(axis=axis, ddof=correction)
            got = t.var(axis, correction=correction)
            assert got.dtype == np.dtype(dtype)
            assert_close(got.to_host(), expected, tol, f"var {axis} c={correction}")
            assert_close(t.std(dim=axis, unbiased=bool(correction), keepdim=True).to_host(),
                         ref.std(axis=axis, ddof=correction, keepdims=True), tol, f"std {axis}")
    if ref.size > 1:
        assert_close(t.var().to_host(), ref.var(ddof=1), tol, "the default is unbiased")
    else:
        assert np.isnan(t.var().item()), "one element, correction 1: 0/0 as PyTorch"


def test_var_std_grads_and_errors(rng):
    x = rng.standard_normal((4, 7))
    check(lambda t: t.var(1), x)
    check(lambda t: t.std(dim=0, correction=0), x)
    check(lambda t: t.var(), x)
    with pytest.raises(nc.DTypeError):
        nc.tensor(np.arange(5)).var()


def test_dim_and_axis_spellings(rng, canaries):
    x = rng.standard_normal((3, 5))
    t = nc.tensor(x)
    assert_close(t.sum(dim=1).to_host(), x.sum(1), 1e-12, "sum dim")
    assert t.sum(dim=1, keepdim=True).shape == (3, 1) and t.mean(axis=0, keepdims=True).shape == (1, 5)
    assert t.mean(dim=(0, 1)).shape == () and t.argmax(dim=1).shape == (3,)
    with pytest.raises(nc.ShapeError):
        t.sum(axis=0, dim=1)
    with pytest.raises(nc.ShapeError):
        t.max(dim=(0, 1))
