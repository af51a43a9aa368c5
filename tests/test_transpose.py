"""netcl.ops.transpose: the batched strided transpose against NumPy on odd sizes, with split rows and
columns (the reorderings MEC uses), offsets, float64, canaries around the output, both kernel forms."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops import transpose as tr
from netcl.tensor import Tensor


def reference(src, rows, cols, sr, row_split, col_split, batches, batch_strides, dst_size):
    rlo, drh = row_split or (rows, 0)
    clo, dch, dcl = col_split or (cols, 0, rows)
    sb, db = batch_strides
    out = np.full(dst_size, np.nan)
    b, r, c = np.meshgrid(np.arange(batches), np.arange(rows), np.arange(cols), indexing="ij")
    out[b * db + (r // rlo) * drh + r % rlo + (c // clo) * dch + (c % clo) * dcl] = src[b * sb + r * sr + c]
    return out


@pytest.fixture(params=["direct", "local"])
def form(request, monkeypatch, device):
    """Run the CPU form or the GPU (local-memory) form whatever the device is."""
    kind = "cpu" if request.param == "direct" else "gpu"
    monkeypatch.setattr(device, "kind", kind)
    return request.param


@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 13), (31, 9), (33, 65), (8, 8)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_plain_transpose(rows, cols, dtype, form, rng, device, canaries):
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no fp64")
    a = rng.standard_normal((rows, cols)).astype(dtype)
    src = Tensor.from_host(a, device)
    dst = Tensor.empty((cols, rows), dtype, device)
    tr.transpose_into(dst, src, rows, cols, cols)
    np.testing.assert_array_equal(dst.to_host(), a.T)


@pytest.mark.parametrize("n, k, p, q", [(1, 1, 1, 1), (3, 7, 5, 2), (2, 13, 3, 7), (5, 33, 2, 31)])
def test_mec_output_permutation(n, k, p, q, form, rng, device, canaries):
    """O[p][n][q][k] -> y[n][k][p][q]: rows (n, q) split by q, one batch per p."""
    o = rng.standard_normal((p, n, q, k)).astype(np.float32)
    src = Tensor.from_host(o, device)
    dst = Tensor.empty((n, k, p, q), np.float32, device)
    tr.transpose_into(dst, src, rows=n * q, cols=k, src_row_stride=k, row_split=(q, k * p * q),
                      col_split=(k, 0, p * q), batches=p, batch_strides=(n * q * k, q))
    np.testing.assert_array_equal(dst.to_host(), o.transpose(1, 3, 0, 2))


@pytest.mark.parametrize("k, c, rs", [(1, 1, 1), (5, 3, 9), (17, 7, 25), (33, 13, 1)])
def test_mec_filter_packing(k, c, rs, form, rng, device, canaries):
    """w[k][c][rs] -> Wt[rs][c][k]: columns (c, rs) split by rs."""
    w = rng.standard_normal((k, c, rs)).astype(np.float32)
    src = Tensor.from_host(w, device)
    dst = Tensor.empty((rs, c, k), np.float32, device)
    tr.transpose_into(dst, src, rows=k, cols=c * rs, src_row_stride=c * rs, col_split=(rs, k, c * k))
    np.testing.assert_array_equal(dst.to_host(), w.transpose(2, 1, 0))


def test_offsets_strides_and_batches_against_the_index_formula(form, rng, device, canaries):
    rows, cols, batches, sr = 11, 19, 3, 23
    src_host = rng.standard_normal(batches * 300 + 5).astype(np.float32)
    base = Tensor.from_host(src_host, device)
    src = Tensor(base.buffer, (src_host.size - 5,), np.float32, device, (1,), base.offset + 5)  # an offset view
    row_split, col_split, batch_strides = (4, 100), (5, 20, 400), (300, 7)
    size = batches * 7 + 3 * 100 + 3 + 4 * 20 + 4 * 400 + 1
    dst = Tensor.from_host(np.full(size, np.nan, np.float32), device)
    tr.transpose_into(dst, src, rows, cols, sr, row_split, col_split, batches, batch_strides)
    want = reference(src_host[5:].astype(np.float64), rows, cols, sr, row_split, col_split, batches,
                     batch_strides, size)
    np.testing.assert_array_equal(dst.to_host(), want.astype(np.float32))


def test_mismatched_dtypes_are_refused(device):
    src = Tensor.from_host(np.zeros((2, 3), np.float32), device)
    dst = Tensor.from_host(np.zeros((3, 2), np.int32), device)
    with pytest.raises(nc.DTypeError, match="float32"):
        tr.transpose_into(dst, src, 2, 3, 3)
