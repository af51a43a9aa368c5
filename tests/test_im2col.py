"""im2col / col2im against float64 NumPy, both layouts, both col2im forms, with canaries."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import settings
from netcl.ops.im2col import _layer, col2im, im2col, im2col_into
from util import assert_close

# (input NCHW, kh, kw, stride, padding, dilation)
CASES = [
    ((2, 3, 9, 11), 3, 3, 1, 1, 1),
    ((1, 4, 13, 7), 5, 3, (2, 3), (2, 1), (1, 2)),
    ((3, 5, 10, 10), 1, 1, 1, 0, 1),
    ((2, 3, 15, 15), 7, 7, 4, 3, 3),
    ((1, 1, 28, 28), 5, 5, 1, 0, 1),            # LeNet conv1, one image
    ((1, 2, 31, 33), 11, 11, 4, 2, 1),
    ((1, 7, 5, 5), 3, 3, 1, 3, 1),              # windows entirely in the padding
    ((2, 13, 8, 1), 3, 1, (2, 1), (1, 0), 1),   # one input column
    ((1, 3, 23, 21), 7, 7, 2, 3, 1),            # a 7×7 stride-2 stem
    ((2, 5, 14, 13), 3, 3, 2, 1, 1),            # a strided 3×3 layer, even and odd sizes
    ((1, 2, 17, 16), 3, 3, (3, 2), 1, (2, 1)),  # stride with dilation in one axis only
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def im2col_ref(x, kh, kw, stride, padding, dilation):
    """(N·Ho·Wo, C·kh·kw), float64, straight from the definition."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, ho, wo, c, kh, kw))
    for u in range(kh):
        for v in range(kw):
            patch = xp[:, :, u * dh:u * dh + sh * (ho - 1) + 1:sh, v * dw:v * dw + sw * (wo - 1) + 1:sw]
            out[..., u, v] = patch.transpose(0, 2, 3, 1)
    return out.reshape(n * ho * wo, c * kh * kw)


def col2im_ref(cols, input_shape, kh, kw, stride, padding, dilation):
    """Adds each column entry into the input element it came from (np.add.at over the index map)."""
    n, c, h, w = input_shape
    index = np.arange(n * c * h * w, dtype=np.float64).reshape(input_shape)
    # im2col of (index + 1) tells, for every column entry, which input element it read (0 = padding)
    where = im2col_ref(index + 1, kh, kw, stride, padding, dilation).astype(np.int64) - 1
    out = np.zeros(n * c * h * w)
    inside = where >= 0
    np.add.at(out, where[inside], np.asarray(cols, np.float64)[inside])
    return out.reshape(input_shape)



@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_im2col_matches_reference(case, transposed, dtype, rng, device, canaries):
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no float64 on this device")
    shape, kh, kw, st, pd, dl = case
    x = rng.uniform(-2, 2, shape).astype(dtype)
    cols = im2col(nc.Tensor.from_host(x, device), kh, kw, stride=st, padding=pd, dilation=dl, transposed=transposed)
    expected = im2col_ref(x, kh, kw, st, pd, dl)
    expected = expected.T if transposed else expected
    assert cols.shape == expected.shape
    np.testing.assert_array_equal(cols.to_host(), expected.astype(dtype))  # a pure copy: exact


@pytest.mark.parametrize("runs", [0, 1, 3, 16, 512], ids=["interleaved", "runs1", "runs3", "runs16", "runs512"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("transposed", [False, True])
def test_im2col_kernel_forms_agree(case, runs, transposed, rng, device, canaries):
    """Both forms of the one-pass kernel (the device picks one), whatever the run length (output rows for
    the transposed layout, entries for the row layout: 1 and 3 stop and start runs inside a plane)."""
    shape, kh, kw, st, pd, dl = case
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    layer = _layer(shape, kh, kw, st, pd, dl, "float32")
    expected = im2col_ref(x, kh, kw, st, pd, dl)
    expected = expected.T if transposed else expected
    out = nc.Tensor.empty(expected.shape, np.float32, device)
    im2col_into(nc.Tensor.from_host(x, device), layer, out, transposed=transposed, runs=runs)
    np.testing.assert_array_equal(out.to_host(), expected.astype(np.float32))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "gather"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_col2im_matches_reference(case, transposed, dtype, deterministic, rng, device, canaries):
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no float64 on this device")
    shape, kh, kw, st, pd, dl = case
    expected_cols = im2col_ref(np.zeros(shape), kh, kw, st, pd, dl)
    g = rng.uniform(-2, 2, expected_cols.shape)
    g_dev = g.T if transposed else g
    out = col2im(nc.Tensor.from_host(np.ascontiguousarray(g_dev).astype(dtype), device), shape, kh, kw,
                 stride=st, padding=pd, dilation=dl, transposed=transposed, deterministic=deterministic)
    assert out.shape == tuple(shape)
    tol = 1e-6 if dtype == "float32" else 1e-13
    assert_close(out.to_host(), col2im_ref(g.astype(dtype), shape, kh, kw, st, pd, dl), tol, "col2im")


def test_col2im_is_the_adjoint_of_im2col(rng, device):
    shape, kh, kw, st, pd, dl = (2, 3, 12, 9), 3, 4, (2, 1), (1, 2), (2, 1)
    x = rng.standard_normal(shape)
    cols = im2col(nc.Tensor.from_host(x, device), kh, kw, st, pd, dl).to_host()
    g = rng.standard_normal(cols.shape)
    gx = col2im(nc.Tensor.from_host(g, device), shape, kh, kw, st, pd, dl).to_host()
    assert np.isclose(np.sum(cols * g), np.sum(x * gx), rtol=1e-12)


def test_heavy_overlap_atomic_scatter(rng, device, canaries):
    """Stride 1 with a 9×9 window: up to 81 work-items add into one element at the same time."""
    shape, k = (2, 2, 24, 24), 9
    g = rng.uniform(-1, 1, im2col_ref(np.zeros(shape), k, k, 1, 4, 1).shape).astype(np.float32)
    out = col2im(nc.Tensor.from_host(g, device), shape, k, k, padding=4, deterministic=False)
    assert_close(out.to_host(), col2im_ref(g, shape, k, k, 1, 4, 1), 1e-6, "atomic col2im")


def test_deterministic_switch_selects_gather(rng, device, monkeypatch):
    shape, k = (1, 3, 17, 17), 5
    g = nc.Tensor.from_host(rng.standard_normal(im2col_ref(np.zeros(shape), k, k, 1, 2, 1).shape)
                            .astype(np.float32), device)
    gather = col2im(g, shape, k, k, padding=2, deterministic=True).to_host()
    monkeypatch.setattr(settings, "_chosen", {})  # use_deterministic below ends with the test
    monkeypatch.setenv("NETCL_DETERMINISTIC", "1")
    for _ in range(3):
        np.testing.assert_array_equal(col2im(g, shape, k, k, padding=2).to_host(), gather)
    monkeypatch.setenv("NETCL_DETERMINISTIC", "0")
    nc.use_deterministic(True)
    np.testing.assert_array_equal(col2im(g, shape, k, k, padding=2).to_host(), gather)


def test_non_contiguous_input(rng, device):
    x = rng.standard_normal((3, 2, 6, 7)).astype(np.float32)
    t = nc.Tensor.from_host(x.transpose(1, 0, 2, 3).copy(), device).permute(1, 0, 2, 3)
    assert not t.is_contiguous()
    np.testing.assert_array_equal(im2col(t, 3, 2, padding=1).to_host(), im2col_ref(x, 3, 2, 1, 1, 1))


def test_errors_name_the_shapes(device):
    x = nc.Tensor.from_host(np.zeros((1, 2, 5, 5), np.float32), device)
    with pytest.raises(nc.ShapeError, match=r"\(2, 5, 5\)"):
        im2col(nc.Tensor.from_host(np.zeros((2, 5, 5), np.float32), device), 3, 3)
    with pytest.raises(nc.ShapeError, match="larger than the padded input"):
        im2col(x, 7, 3)
    with pytest.raises(nc.ShapeError, match="kernel_w"):
        im2col(x, 3, 0)
    with pytest.raises(nc.ShapeError, match="stride"):
        im2col(x, 3, 3, stride=0)
    with pytest.raises(nc.DTypeError, match="int32"):
        im2col(nc.Tensor.from_host(np.zeros((1, 2, 5, 5), np.int32), device), 3, 3)
    cols = im2col(x, 3, 3)
    with pytest.raises(nc.ShapeError, match=r"\(9, 18\).*\(1, 2, 6, 5\)"):
        col2im(cols, (1, 2, 6, 5), 3, 3)
    with pytest.raises(nc.ShapeError, match="transposed"):
        col2im(cols, (1, 2, 5, 5), 3, 3, transposed=True)


def test_bench_layer_row(device):
    """One row of `netcl bench im2col` on a small layer: both kernels agree and the figures are sane."""
    from netcl.bench.im2col import copy_probe, measure
    row = measure("tiny", (2, 3, 13, 11), 3, 2, device, 1, copy_probe(device, quick=True))
    assert row["cols_shape"] == [27, 2 * 6 * 5] and not row["large"]
    for key in ("one_pass_gbps", "caffe_gbps", "copy_gbps", "speedup_vs_caffe", "col2im_gather_ms"):
        assert row[key] > 0, key


# layers without padding, at least one chunk per output row: stride 1 (a vector load), 2, 3 and 4
# (gathered lane by lane), dilation, a 1x1 kernel, a batch, and inputs whose last row's vector load would run past
# the input (the clamped load)
CHUNK_CASES = [
    ((1, 1, 28, 28), 5, 5, 1, 0, 1),
    ((2, 3, 17, 29), 3, 5, 2, 0, (2, 1)),
    ((1, 2, 40, 41), 11, 11, 4, 0, 1),
    ((3, 1, 13, 11), 1, 1, 1, 0, 1),
    ((1, 5, 31, 31), 3, 3, 3, 0, 2),
    ((2, 4, 21, 21), 7, 7, 2, 0, 1),
    ((1, 3, 9, 16), 2, 1, (1, 2), 0, 1),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("offset", [0, 3], ids=["aligned", "offset3"])
@pytest.mark.parametrize("per_item", [1, 3, None], ids=["chunks1", "chunks3", "auto"])
@pytest.mark.parametrize("case", CHUNK_CASES)
def test_im2col_chunk_form(case, per_item, offset, dtype, rng, device):
    """The aligned-chunk form, forced on small layers: chunks straddling output rows, planes and samples,
    an output that starts off the vector alignment (a head and a tail written entry by entry), and
    canaries on both sides of the matrix."""
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no float64 on this device")
    shape, kh, kw, st, pd, dl = case
    x = rng.uniform(-2, 2, shape).astype(dtype)
    layer = _layer(shape, kh, kw, st, pd, dl, dtype)
    expected = im2col_ref(x, kh, kw, st, pd, dl).T.astype(dtype)
    if layer.out_w < 32 // np.dtype(dtype).itemsize:
        pytest.skip("fewer output columns than one chunk")
    canary = np.array(-7.25, dtype)
    padded = nc.Tensor.from_host(np.full(expected.size + offset + 37, canary, dtype), device)
    out = padded[offset:offset + expected.size].reshape(expected.shape)
    im2col_into(nc.Tensor.from_host(x, device), layer, out, transposed=True, runs=per_item, chunks=True)
    host = padded.to_host()
    np.testing.assert_array_equal(host[offset:offset + expected.size].reshape(expected.shape), expected)
    assert (host[:offset] == canary).all() and (host[offset + expected.size:] == canary).all()


def test_chunk_form_choice(device):
    """Only unpadded layers in the transposed layout, with a matrix beyond the last-level cache, on a CPU."""
    from netcl.ops.im2col import chunk_form
    big = _layer((1, 64, 224, 224), 7, 7, 2, 0, 1, "float32")   # cv4: 149 MB
    expected = (device.kind == "cpu" and big.n * big.out_h * big.out_w * 64 * 49 * 4 > device.cache_bytes
                and device.base_align_bytes >= 32)
    assert chunk_form(device, big, "float32", True) == expected
    assert not chunk_form(device, big, "float32", False)
    assert not chunk_form(device, _layer((1, 64, 224, 224), 7, 7, 2, 3, 1, "float32"), "float32", True)
    assert not chunk_form(device, _layer((1, 1, 28, 28), 5, 5, 1, 0, 1, "float32"), "float32", True)
    with pytest.raises(ValueError, match="padding"):
        im2col_into(nc.Tensor.empty((1, 1, 9, 9), np.float32, device), _layer((1, 1, 9, 9), 3, 3, 1, 1, 1,
                    "float32"), nc.Tensor.empty((9, 81), np.float32, device), chunks=True)
