"""The PyTorch-style tensor functions under the simulator: bool outputs (one byte each, odd lengths so that
no write straddles a tensor's end), where, maximum/minimum, clamp, cat/stack, min/argmin over one and
several chunks, max/min with indices and their gradients, var. Results are checked against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc

pytestmark = pytest.mark.oclgrind


def _t(a, device, grad=False):
    return nc.Tensor.from_host(a, device, requires_grad=grad)


def test_bool_where_extrema_clamp(device, rng):
    a = rng.uniform(-2, 2, (3, 7)).astype(np.float32)
    b = rng.uniform(-2, 2, (1, 7)).astype(np.float32)
    A, B = _t(a, device, True), _t(b, device, True)
    mask = A > B
    assert mask.dtype == np.bool_ and np.array_equal(mask.to_host(), a > b)
    assert np.array_equal((~mask & (A < 1.0)).to_host(), ~(a > b) & (a < 1))
    assert mask.sum().item() == int((a > b).sum())
    assert np.array_equal(mask.float().to_host(), (a > b).astype(np.float32))
    assert np.array_equal((_t(np.arange(5), device) / 2).to_host(), np.arange(5) / 2)
    ints, divisors = np.arange(-7, 8), np.array([3, -2, 0] * 5)
    I, D = _t(ints, device), _t(divisors, device)
    with np.errstate(divide="ignore"):
        assert np.array_equal((I // D).to_host(), ints // divisors) and np.array_equal((I % D).to_host(), ints % divisors)
    np.testing.assert_allclose((A // B).to_host(), a // b)
    np.testing.assert_allclose((A % B).to_host(), a % b, rtol=1e-5, atol=1e-6)
    w = nc.where(mask, A, B)
    assert np.array_equal(w.to_host(), np.where(a > b, a, b))
    m = nc.maximum(A, B) + nc.minimum(A, B) + A.clamp(-1, 1)
    np.testing.assert_allclose(m.to_host(), np.maximum(a, b) + np.minimum(a, b) + np.clip(a, -1, 1), rtol=1e-6)
    (w.sum() + m.sum()).backward()
    assert A.grad.shape == a.shape and B.grad.shape == b.shape


def test_cat_stack_and_indexed_reductions(device, rng):
    parts = [rng.standard_normal((3, n)).astype(np.float32) for n in (1, 5, 2)]
    tensors = [_t(p, device, True) for p in parts]
    joined = nc.cat(tensors, 1)
    assert np.array_equal(joined.to_host(), np.concatenate(parts, 1))
    assert np.array_equal(nc.stack([tensors[0], tensors[0]], 2).to_host(), np.stack([parts[0], parts[0]], 2))
    values, indices = joined.max(dim=1)
    assert np.array_equal(indices.to_host(), np.concatenate(parts, 1).argmax(1))
    (values.sum() + joined.min(dim=0).values.sum() + joined.var(1).sum()).backward()
    assert all(t.grad.shape == p.shape for t, p in zip(tensors, parts))
    long = rng.uniform(-1, 1, (2, 4099)).astype(np.float32)
    L = _t(long, device)
    assert np.array_equal(L.argmin(1).to_host(), long.argmin(1))
    assert np.array_equal(L.min(axis=1).to_host(), long.min(1))
