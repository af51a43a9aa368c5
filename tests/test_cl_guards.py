"""netcl.runtime.cl_guards.beyond: a tail guard tested only in the work-group that straddles the bound
writes exactly the elements below it, for any local size, along either axis, and from a group offset."""
import numpy as np
import pyopencl as cl
import pytest

import netcl as nc
from netcl.runtime import kernels
from netcl.runtime.cl_guards import beyond

CANARY = -7

SOURCE = f"""
__kernel void flat(__global int* out, const long n)
{{
    const long i = get_global_id(0);
    if ({beyond('i', 'n')}) return;
    out[i] = (int) i + 1;
}}

__kernel void rows(__global int* out, const int cols, const int rows)
{{
    const int c = get_global_id(0), r = get_global_id(1);
    if ({beyond('c', 'cols')} || {beyond('r', 'rows', 1)}) return;
    out[r * cols + c] = r * 1000 + c;
}}

/* groups [0, first_group) belong to someone else, as in optim.cl's multi-tensor launches */
__kernel void offset(__global int* out, const long n, const long first_group)
{{
    if (get_group_id(0) < first_group) return;
    const long group_first = (get_group_id(0) - first_group) * (long) get_local_size(0);
    const long i = group_first + get_local_id(0);
    if ({beyond('i', 'n', group_first='group_first')}) return;
    out[i] = (int) i + 1;
}}
"""


@pytest.fixture(scope="module")
def program():
    return kernels.build_program(nc.default_device(), SOURCE)


def _run(program, name, shape, global_size, local_size, *scalars):
    device = nc.default_device()
    out = nc.tensor(np.full(int(np.prod(shape)) + 16, CANARY, np.int32), device=device)
    kernel = cl.Kernel(program, name)
    kernels.launch(device, kernel, global_size, local_size, out.buffer, *scalars)
    return out.to_host()


@pytest.mark.parametrize("n", [1, 7, 13, 31, 64, 65, 200])
@pytest.mark.parametrize("local", [1, 7, 64])
def test_flat_tail(program, n, local):
    got = _run(program, "flat", (n,), (n,), (local,), np.int64(n))
    assert np.array_equal(got[:n], np.arange(1, n + 1))
    assert np.all(got[n:] == CANARY)


@pytest.mark.parametrize("cols,rows,local", [(1, 1, (1, 1)), (13, 7, (4, 2)), (31, 5, (8, 4)), (64, 3, (64, 1))])
def test_two_axes(program, cols, rows, local):
    got = _run(program, "rows", (rows, cols), (cols, rows), local, np.int32(cols), np.int32(rows))
    want = (np.arange(rows)[:, None] * 1000 + np.arange(cols)[None, :]).ravel()
    assert np.array_equal(got[:rows * cols], want)
    assert np.all(got[rows * cols:] == CANARY)


@pytest.mark.parametrize("n,local,first_group", [(13, 4, 2), (64, 64, 1), (65, 8, 3)])
def test_group_offset(program, n, local, first_group):
    groups = first_group + -(-n // local)
    got = _run(program, "offset", (n,), (groups * local,), (local,), np.int64(n), np.int64(first_group))
    assert np.array_equal(got[:n], np.arange(1, n + 1))
    assert np.all(got[n:] == CANARY)
