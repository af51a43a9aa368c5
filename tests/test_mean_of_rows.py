"""MeanOfRows (kernels/mean_rows.cl), the device averaging of DistributedDataParallel's buckets, and the
buffers over host memory it reads on CPU drivers — vs float64 NumPy."""
import numpy as np
import pytest

import netcl as nc
from netcl.distributed import bucket_reduce
from netcl.ops.reduce import MeanOfRows
from netcl.runtime import memory
from netcl.tensor import Tensor


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, count, start", [(1, 1, 0), (2, 7, 3), (3, 13, 1), (2, 31, 0), (7, 4099, 5)])
def test_mean_of_rows_matches_numpy(dtype, rows, count, start, rng, canaries):
    if dtype == np.float64 and not nc.tensor([0.0]).device.has_fp64:
        pytest.skip("the device has no float64")
    width = start + count + 2  # each row a slice of a wider one, as a parameter's slice of a bucket
    data = rng.standard_normal((rows, width)).astype(dtype)
    whole = nc.tensor(data)
    view = whole._view((rows, count), (width, 1), whole.offset + start)
    average = MeanOfRows(view)
    for _ in range(2):  # launched again on the same rows, into another output, after the data changed
        out = Tensor.empty((count,), dtype, whole.device)
        average(out)
        picked = data[:, start:start + count]
        np.testing.assert_allclose(out.to_host(), picked.astype(np.float64).mean(axis=0),
                                   rtol=1e-6 if dtype == np.float32 else 1e-14, atol=1e-7)
        # the host path's formula, bit for bit: the rows summed in order, times 1/R
        np.testing.assert_array_equal(out.to_host(), np.sum(picked, axis=0) * dtype(1.0 / rows))
        data = rng.standard_normal((rows, width)).astype(dtype)
        memory.upload(whole.device, whole.buffer, data, whole.offset * data.itemsize)


def test_mean_of_rows_writes_a_parameter_shaped_grad(rng, canaries):
    data = rng.standard_normal((2, 60)).astype(np.float32)
    out = Tensor.empty((3, 4, 5), np.float32, nc.tensor([0.0]).device)
    MeanOfRows(nc.tensor(data))(out)
    np.testing.assert_array_equal(out.to_host(), ((data[0] + data[1]) * np.float32(0.5)).reshape(3, 4, 5))


def test_mean_of_rows_rejects_what_it_cannot_average():
    rows = nc.tensor(np.zeros((2, 6), np.float32))
    with pytest.raises(nc.ShapeError, match="2-D view with contiguous rows"):
        MeanOfRows(nc.tensor(np.zeros(6, np.float32)))
    with pytest.raises(nc.ShapeError, match="contiguous rows"):
        MeanOfRows(rows.transpose(0, 1))
    with pytest.raises(nc.DTypeError, match="float32 or float64"):
        MeanOfRows(nc.tensor(np.zeros((2, 6), np.int32)))
    average = MeanOfRows(rows)
    with pytest.raises(nc.ShapeError, match="6 elements"):
        average(nc.tensor(np.zeros(5, np.float32)))
    with pytest.raises(nc.ShapeError, match="6 elements"):
        average(nc.tensor(np.zeros((6, 2), np.float32))[:, 0])
    with pytest.raises(nc.DTypeError, match="same dtype"):
        average(nc.tensor(np.zeros(6, np.int32)))


def test_kernels_read_host_writes_over_host_arrays(rng):
    device = nc.tensor([0.0]).device
    shares = bucket_reduce.kernels_read_host_memory(device)
    assert shares == bucket_reduce.kernels_read_host_memory(device)  # measured once per device
    if device.kind == "cpu":
        assert shares, "a CPU driver's kernels should work in the host's memory"
    if not shares:
        pytest.skip(f"{device.describe()} keeps copies of host memory: DDP averages on the host")
    host = np.zeros((2, 13), np.float32)
    average = MeanOfRows(Tensor(memory.over_host_array(device, host), host.shape, host.dtype, device))
    out = Tensor.empty((13,), np.float32, device)
    for _ in range(3):  # what the host writes between launches is what the kernel reads: no map, no copy
        host[:] = rng.standard_normal(host.shape)
        average(out)
        np.testing.assert_array_equal(out.to_host(), (host[0] + host[1]) * np.float32(0.5))


def test_over_host_array_needs_contiguous_memory():
    device = nc.tensor([0.0]).device
    with pytest.raises(ValueError, match="contiguous"):
        memory.over_host_array(device, np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="non-empty"):
        memory.over_host_array(device, np.zeros(0, np.float32))


def test_a_driver_that_refuses_host_memory_buffers_averages_on_the_host(monkeypatch):
    device = nc.tensor([0.0]).device

    def refuse(device, array):
        raise nc.DeviceError("clCreateBuffer(CL_MEM_USE_HOST_PTR) failed: INVALID_VALUE")
    monkeypatch.setattr(memory, "over_host_array", refuse)
    assert bucket_reduce.probe_host_memory_sharing(device) is False  # the probe, uncached
