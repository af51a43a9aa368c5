"""Per-channel bias (netcl.ops.bias): the in-place add and its gradient against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.bias import add_bias_, bias_grad
from util import assert_close

SHAPES = [((1, 1, 1, 1), 1), ((7, 13, 5, 3), 1), ((2, 31, 1, 1), 1), ((3, 20, 24, 24), 1), ((1, 7, 130), 1),
          ((13, 7), 1), ((1, 500), 1), ((64, 10), 1), ((5, 3, 2), 2), ((130,), 0)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_bias_add_and_grad_match_numpy(device, rng, canaries, shape, axis, dtype):
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("device has no float64")
    y0 = rng.standard_normal(shape).astype(dtype)
    b0 = rng.standard_normal(shape[axis]).astype(dtype)
    y = nc.tensor(y0, device=device)  # from_host allocates through Tensor.empty: guarded by canaries
    b = nc.tensor(b0, device=device)
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    add_bias_(y, b, axis)
    tol = 1e-6 if dtype == "float32" else 1e-14
    assert_close(y.to_host(), y0.astype(np.float64) + b0.astype(np.float64).reshape(bshape), tol, "bias add")
    axes = tuple(d for d in range(len(shape)) if d != axis)
    g = bias_grad(nc.tensor(y0, device=device), axis)
    assert g.shape == (shape[axis],)
    assert_close(g.to_host(), y0.astype(np.float64).sum(axis=axes), 1e-5 if dtype == "float32" else 1e-13,
                 "bias grad")


def test_bias_grad_is_deterministic(device, rng):
    gy = nc.tensor(rng.standard_normal((64, 20, 24, 24)).astype(np.float32), device=device)
    first = bias_grad(gy).to_host()
    for _ in range(3):
        assert np.array_equal(bias_grad(gy).to_host(), first)


def test_bias_ops_reject_mismatches(device):
    y = nc.zeros((2, 3, 4), device=device)
    with pytest.raises(nc.ShapeError, match="does not match"):
        add_bias_(y, nc.zeros((4,), device=device), 1)
    with pytest.raises(nc.ShapeError, match="contiguous"):
        add_bias_(y.permute((0, 2, 1)), nc.zeros((4,), device=device), 1)
    with pytest.raises(nc.ShapeError, match="does not match"):
        bias_grad(y, 5)
