"""Regression tests for bugs the Oclgrind job found, each named after its bug. They check results on any
device; under Oclgrind (ci/oclgrind.sh) they also fail on the race, out-of-bounds access or uninitialized
read that the bug was."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.im2col import col2im
from util import assert_close

pytestmark = pytest.mark.oclgrind


def test_col2im_scatter_cas_loop_plain_read_race(device, rng):
    """col2im_scatter's float atomic add began its compare-and-swap loop with a plain (non-atomic) read of
    the target while other work-items' atomic_cmpxchg wrote it: a read-write data race (Oclgrind:
    "Read-write data race" at `seen.f = *p` against `atomic_cmpxchg`). Fixed by starting from a guess of
    0, which the first CAS corrects. Many taps land on each input element here (3×3 windows, stride 1,
    many channels), so work-items collide on every element."""
    dtypes = ["float32"] + (["float64"] if device.has_fp64 and device.has_int64_atomics else [])
    for dt in dtypes:
        shape = (2, 4, 5, 5)
        ho = wo = 5
        cols = rng.uniform(-1, 1, (2 * ho * wo, 4 * 9)).astype(dt)
        got = col2im(nc.Tensor.from_host(cols, device), shape, 3, 3, 1, 1, deterministic=False)
        c6 = cols.astype(np.float64).reshape(2, ho, wo, 4, 3, 3)
        ref = np.zeros((2, 4, 7, 7))
        for i in range(3):
            for j in range(3):
                ref[:, :, i:i + ho, j:j + wo] += c6[:, :, :, :, i, j].transpose(0, 3, 1, 2)
        assert_close(got.to_host(), ref[:, :, 1:6, 1:6], 1e-5, f"col2im scatter {dt}")
