"""gemm / gemm_batched against float64 NumPy: odd shapes, every transpose combination, views with offsets
and leading dimensions, beta != 0, broadcast batches, every kernel variant, float64, bad inputs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import netcl as nc
from netcl.ops.gemm import gemm, gemm_batched, params_for, shape_class
from util import activation_ref, assert_close, assert_close_to_scale

SHAPES = [(1, 1, 1), (7, 13, 10), (31, 33, 65), (13, 127, 7), (65, 1, 33), (1, 500, 31), (33, 10, 129)]
TRANS = list(itertools.product((False, True), (False, True)))

# Every code path of the template: direct B with column tail, packed A/B, both grid orders,
# work-groups larger than 1, scalar (VW=1) tiles, K unrolling with a remainder, local-memory tiles.
VARIANTS = [
    {"MR": 4, "VW": 8, "NV": 2, "PACK_B": 0, "ORDER": "nm"},
    {"MR": 3, "VW": 4, "NV": 1, "PACK_B": 1, "ORDER": "mn", "WG_M": 2, "WG_N": 3, "KU": 3},
    {"MR": 5, "VW": 2, "NV": 2, "PACK_A": 1, "PACK_B": 1, "ORDER": "nm", "KU": 2},
    {"MR": 2, "VW": 1, "NV": 3, "WG_N": 4},
    {"MR": 4, "VW": 4, "NV": 1, "LOCAL": 1, "WG_M": 4, "WG_N": 4, "KC": 8},
    {"MR": 2, "VW": 2, "NV": 2, "LOCAL": 1, "WG_M": 3, "WG_N": 2, "KC": 5, "ORDER": "mn"},
]


def _operands(rng, M, N, K, ta, tb, dtype=np.float32):
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(dtype)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(dtype)
    return a, b, (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)


def _magnitude(a, b, ta, tb):
    """|op(a)| @ |op(b)|: the size of the summed terms, which bounds float32 rounding where the sum cancels."""
    return np.abs(a.T if ta else a).astype(np.float64) @ np.abs(b.T if tb else b).astype(np.float64)


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("ta,tb", TRANS)
def test_gemm_shapes_and_transposes(M, N, K, ta, tb, rng, device, canaries):
    a, b, ref = _operands(rng, M, N, K, ta, tb)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    A, B, C = (nc.Tensor.from_host(x, device) for x in (a, b, c0))
    out = gemm(A, B, trans_a=ta, trans_b=tb)
    assert out.shape == (M, N)
    assert_close(out.to_host(), ref, 1e-5, f"gemm {M}x{N}x{K} ta={ta} tb={tb}")
    same = gemm(A, B, C, alpha=-0.5, beta=1.25, trans_a=ta, trans_b=tb)
    assert same is C
    # alpha*ab + beta*c can cancel (a 1x1x1 product is one number): judge it against the terms' magnitude
    assert_close_to_scale(C.to_host(), -0.5 * ref + 1.25 * c0, 0.5 * _magnitude(a, b, ta, tb) + 1.25 * np.abs(c0),
                          1e-5, "alpha/beta")


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
@pytest.mark.parametrize("ta,tb", TRANS)
def test_kernel_variants(variant, ta, tb, rng, device, canaries):
    # the last two shapes exceed the size below which packing is skipped; the last one's B rows (256 bytes
    # apart) share few cache sets, so it is packed even with a unit column stride
    for M, N, K in ((1, 1, 1), (13, 31, 33), (34, 17, 7), (97, 77, 130), (40, 64, 130)):
        a, b, ref = _operands(rng, M, N, K, ta, tb)
        c0 = rng.standard_normal((M, N)).astype(np.float32)
        C = nc.Tensor.from_host(c0, device)
        gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), C, alpha=2.0, beta=-1.0,
             trans_a=ta, trans_b=tb, params=VARIANTS[variant])
        assert_close_to_scale(C.to_host(), 2.0 * ref - c0, 2.0 * _magnitude(a, b, ta, tb) + np.abs(c0), 1e-5,
                              f"variant {VARIANTS[variant]} {M}x{N}x{K}")


def test_views_with_offsets_and_leading_dims(rng, device, canaries):
    M, N, K = 13, 21, 17
    big_a = rng.standard_normal((K + 5, M + 9)).astype(np.float32)   # used transposed, as a slice
    big_b = rng.standard_normal((K + 3, 2 * N + 4)).astype(np.float32)  # every other column
    big_c = rng.standard_normal((M + 4, N + 7)).astype(np.float32)
    A, B, C = (nc.Tensor.from_host(x, device) for x in (big_a, big_b, big_c))
    a_view = A[2:2 + K, 3:3 + M]
    b_view = B[1:1 + K, 0:2 * N:2]
    c_view = C[3:3 + M, 5:5 + N]
    gemm(a_view, b_view, c_view, alpha=1.0, beta=0.5, trans_a=True)
    ref = big_a[2:2 + K, 3:3 + M].T.astype(np.float64) @ big_b[1:1 + K, 0:2 * N:2] + 0.5 * big_c[3:3 + M, 5:5 + N]
    expected = big_c.astype(np.float64)
    expected[3:3 + M, 5:5 + N] = ref
    assert_close(C.to_host(), expected, 1e-5, "strided views (outside the C view must be untouched)")
    # a transposed C: its columns are the unit-stride direction
    ct = nc.Tensor.from_host(np.zeros((N, M), np.float32), device).transpose(0, 1)
    gemm(a_view, b_view, ct, trans_a=True)
    assert_close(ct.to_host(), ref - 0.5 * big_c[3:3 + M, 5:5 + N], 1e-5, "transposed C")


@pytest.mark.parametrize("M,N,K,variant", [(9, 11, 70, None), (40, 200, 300, 2)])  # the second packs A and B
def test_repeated_layout_with_new_operands(M, N, K, variant, rng, device, canaries):
    """A launch plan is reused for a layout it has seen: each call's buffers, offsets, alpha and beta must
    reach the kernels, including a buffer that the pool hands out again and operands that swap places."""
    params = None if variant is None else VARIANTS[variant]
    hosts = [rng.standard_normal((M + 2, K)).astype(np.float32) for _ in range(2)]
    A = [nc.Tensor.from_host(h, device) for h in hosts]
    hb = rng.standard_normal((K, N)).astype(np.float32)
    B = nc.Tensor.from_host(np.ascontiguousarray(hb.T), device).transpose(0, 1)  # packed when it is read
    for step, (i, row, alpha, beta) in enumerate([(0, 0, 1.0, 0.0), (1, 0, 1.0, 0.0), (0, 2, -2.0, 0.0),
                                                  (1, 1, 0.5, 1.5), (1, 1, 0.5, 1.5)]):
        c0 = rng.standard_normal((M, N)).astype(np.float32)
        C = nc.Tensor.from_host(c0, device)
        gemm(A[i][row:row + M], B, C, alpha=alpha, beta=beta, params=params)
        ref = alpha * hosts[i][row:row + M].astype(np.float64) @ hb + beta * c0
        assert_close(C.to_host(), ref, 1e-5, f"call {step}: operand {i}, first row {row}, alpha {alpha}, beta {beta}")
        del C  # the next C may be the same pooled buffer


@pytest.mark.parametrize("ta,tb", TRANS)
def test_batched_with_broadcast(ta, tb, rng, device, canaries):
    batch, M, N, K = 3, 11, 19, 23
    a = rng.standard_normal((batch, K, M) if ta else (batch, M, K)).astype(np.float32)
    b = rng.standard_normal((1, N, K) if tb else (1, K, N)).astype(np.float32)
    c0 = rng.standard_normal((batch, M, N)).astype(np.float32)
    A, B, C = (nc.Tensor.from_host(x, device) for x in (a, b, c0))
    gemm_batched(A, B, C, alpha=0.5, beta=2.0, trans_a=ta, trans_b=tb)
    opa = a.transpose(0, 2, 1) if ta else a
    opb = b.transpose(0, 2, 1) if tb else b
    assert_close(C.to_host(), 0.5 * np.matmul(opa.astype(np.float64), opb) + 2.0 * c0, 1e-5, "batched")
    # broadcast A instead, into a fresh output
    a1 = rng.standard_normal((1, M, K)).astype(np.float32)
    b3 = rng.standard_normal((batch, K, N)).astype(np.float32)
    out = gemm_batched(nc.Tensor.from_host(a1, device), nc.Tensor.from_host(b3, device))
    assert out.shape == (batch, M, N)
    assert_close(out.to_host(), np.matmul(a1.astype(np.float64), b3), 1e-5, "broadcast A")


@pytest.mark.parametrize("activation", ["none", "relu", "relu6", "hardswish"])
@pytest.mark.parametrize("variant", [None, 1, 3, 4])
def test_epilogue_bias_residual_activation(activation, variant, rng, device, canaries):
    """act(alpha·A@B + beta·C + bias[row] + residual) stored by the product: the float64 reference on odd
    sizes (full vector tiles and the element-wise column tail, a transposed A, a batch), and each part
    alone. A product of one row per column block and of few rows never goes to the dot-product kernel."""
    params = None if variant is None else VARIANTS[variant]
    for batch, M, N, K, ta in ((2, 13, 37, 9, False), (1, 7, 64, 33, True), (3, 5, 3, 17, False)):
        a = rng.standard_normal((batch, K, M) if ta else (batch, M, K)).astype(np.float32)
        b = rng.standard_normal((batch, K, N)).astype(np.float32)
        c0 = rng.standard_normal((batch, M, N)).astype(np.float32)
        bias = rng.uniform(-7, 7, M).astype(np.float32)
        residual = rng.uniform(-3, 3, (batch, M, N)).astype(np.float32)
        A, B, C, BIAS, RES = (nc.Tensor.from_host(x, device) for x in (a, b, c0, bias, residual))
        product = np.matmul((a.transpose(0, 2, 1) if ta else a).astype(np.float64), b)
        z = 0.5 * product + 2.0 * c0 + bias[None, :, None] + residual
        gemm_batched(A, B, C, alpha=0.5, beta=2.0, trans_a=ta, params=params, bias=BIAS, residual=RES,
                     activation=activation)
        what = f"{activation} {params} {batch}x{M}x{N}x{K} ta={ta}"
        assert_close(C.to_host(), activation_ref(z, activation), 1e-5, what)
        out = gemm_batched(A, B, trans_a=ta, params=params, bias=BIAS)
        assert_close(out.to_host(), product + bias[None, :, None], 1e-5, what + " bias alone")
        out = gemm_batched(A, B, trans_a=ta, params=params, residual=RES, activation=activation)
        assert_close(out.to_host(), activation_ref(product + residual, activation), 1e-5, what + " no bias")


def test_epilogue_operands_are_checked(rng, device):
    A = nc.Tensor.from_host(rng.standard_normal((1, 4, 3)).astype(np.float32), device)
    B = nc.Tensor.from_host(rng.standard_normal((1, 3, 5)).astype(np.float32), device)
    with pytest.raises(nc.ShapeError, match="bias"):
        gemm_batched(A, B, bias=nc.Tensor.from_host(np.zeros(5, np.float32), device))
    with pytest.raises(nc.ShapeError, match="residual"):
        gemm_batched(A, B, residual=nc.Tensor.from_host(np.zeros((1, 5, 4), np.float32), device))
    with pytest.raises(nc.ShapeError, match="activation"):
        gemm_batched(A, B, activation="tanh")


def test_large_k_and_m(rng, device, canaries):
    for M, N, K in ((3, 5, 4097), (4097, 3, 2)):
        a, b, ref = _operands(rng, M, N, K, False, False)
        out = gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device))
        assert_close(out.to_host(), ref, 1e-5, f"{M}x{N}x{K}")


@pytest.mark.parametrize("vw,nv", [(16, 2), (16, 3), (8, 3)])
def test_wide_panels_of_a_transposed_b_with_long_k(vw, nv, rng, device, canaries):
    """gemm_pack_bt with 32-48 columns a panel over a long K (LeNet's conv2 weight gradient at batch 128:
    50x500x8192): a private 16xNR staging tile overflowed PoCL's worker stack and crashed the process."""
    M, N, K = 50, 500, 8192  # 512 work-items along K: PoCL chose a large work-group
    a, b, ref = _operands(rng, M, N, K, False, True)
    out = gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), trans_b=True,
               params={"MR": 6, "VW": vw, "NV": nv, "WG_M": 8, "PACK_B": 1, "ORDER": "mn"})
    assert_close(out.to_host(), ref, 1e-5, f"{M}x{N}x{K} VW={vw} NV={nv}")


def test_empty_k(device, canaries):
    a = nc.Tensor.from_host(np.zeros((4, 0), np.float32), device)
    b = nc.Tensor.from_host(np.zeros((0, 6), np.float32), device)
    assert np.array_equal(gemm(a, b).to_host(), np.zeros((4, 6)))
    c = nc.Tensor.from_host(np.full((4, 6), 2.0, np.float32), device)
    gemm(a, b, c, beta=0.5)
    assert np.array_equal(c.to_host(), np.full((4, 6), 1.0))


@pytest.mark.parametrize("ta,tb", TRANS)
def test_float64(ta, tb, rng, device, canaries):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    a, b, ref = _operands(rng, 37, 29, 65, ta, tb, np.float64)
    c0 = rng.standard_normal((37, 29))
    C = nc.Tensor.from_host(c0, device)
    gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), C, beta=-3.0, trans_a=ta, trans_b=tb)
    assert C.dtype == np.float64
    assert_close(C.to_host(), ref - 3.0 * c0, 1e-12, "float64")


def test_matmul_operator(rng, device, canaries):
    a, b, ref = _operands(rng, 9, 14, 33, False, False)
    out = nc.Tensor.from_host(a, device) @ nc.Tensor.from_host(b, device)
    assert_close(out.to_host(), ref, 1e-5, "a @ b")


def test_bad_inputs(device):
    a = nc.Tensor.from_host(np.ones((3, 4), np.float32), device)
    b = nc.Tensor.from_host(np.ones((5, 6), np.float32), device)
    with pytest.raises(nc.ShapeError) as info:
        gemm(a, b)
    assert "(3, 4)" in str(info.value) and "(5, 6)" in str(info.value)
    with pytest.raises(nc.ShapeError):
        gemm(a, b, trans_a=True)
    with pytest.raises(nc.ShapeError) as info:
        gemm(a, nc.Tensor.from_host(np.ones((4, 2), np.float32), device), c=nc.Tensor.from_host(np.ones((3, 3), np.float32), device))
    assert "(3, 3)" in str(info.value) and "(3, 2)" in str(info.value)
    with pytest.raises(nc.ShapeError):
        gemm(nc.Tensor.from_host(np.ones(4, np.float32), device), b)
    with pytest.raises(nc.DTypeError) as info:
        gemm(a, nc.Tensor.from_host(np.ones((4, 2), np.float64), device))
    assert "float32" in str(info.value) and "float64" in str(info.value)
    with pytest.raises(nc.DTypeError):
        gemm(nc.Tensor.from_host(np.ones((3, 4), np.int32), device), nc.Tensor.from_host(np.ones((4, 2), np.int32), device))
    with pytest.raises(nc.DTypeError):
        gemm(a, np.ones((4, 2), np.float32))
    x = nc.Tensor.from_host(np.ones((2, 3, 4), np.float32), device)
    with pytest.raises(nc.ShapeError) as info:
        gemm_batched(x, nc.Tensor.from_host(np.ones((3, 4, 5), np.float32), device))
    assert "(2, 3, 4)" in str(info.value) and "(3, 4, 5)" in str(info.value)


def test_parameters_come_from_the_database(device):
    assert shape_class(2048, 2048, 2048) == "large"
    assert shape_class(20, 36864, 25) == "small_k"
    assert shape_class(64, 500, 800) == "small_mn"
    assert shape_class(512, 49, 4608) == "small_n"  # many rows, few columns: ResNet's 7x7 layers at batch 1
    assert shape_class(49, 512, 4608) == "small_mn"
    assert shape_class(64, 10, 500) == "tiny"
    # a Winograd layer's products at batch 1: many small ones in one launch
    assert shape_class(128, 49, 128, 36) == "batched"
    assert shape_class(128, 49, 128, 36, batched=False) == "small_n"
    assert shape_class(256, 16, 256, 36) == "batched"
    assert shape_class(64, 784, 64, 16) == "small_k"    # each product more than tiny alone
    assert shape_class(64, 1568, 64, 36) == "small_k"
    assert shape_class(128, 49, 128, 4) == "small_n"    # a short batch: as many launches' worth of work
    assert shape_class(8, 8, 8, 36) == "tiny"           # tiny as a whole
    p = params_for(device, np.float32, 512, 512, 512)
    assert {"MR", "VW", "NV"} <= set(p)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [None] + list(range(len(VARIANTS))))
def test_exhaustive_sweep(variant, rng, device, canaries):
    """Every transpose combination over a grid of edge-heavy sizes, for the tuned and every fixed variant."""
    params = None if variant is None else VARIANTS[variant]
    sizes = (1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 65, 127, 129)
    for (M, N, K), (ta, tb) in itertools.product(itertools.product(sizes, sizes, (1, 10, 64, 500)), TRANS):
        if rng.random() > 0.15:  # a fresh random seventh of the grid each run
            continue
        a, b, ref = _operands(rng, M, N, K, ta, tb)
        out = gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), trans_a=ta, trans_b=tb,
                   params=params).to_host()
        # Measured against |op(a)| @ |op(b)|: with a handful of outputs, cancellation can make a correct
        # float32 result look inaccurate relative to the (small) exact one.
        scale = np.linalg.norm(np.abs(a.T if ta else a).astype(np.float64) @ np.abs(b.T if tb else b))
        err = np.linalg.norm(out - ref) / scale
        assert np.all(np.isfinite(out)) and err <= 1e-6, f"{params} {M}x{N}x{K} ta={ta} tb={tb}: error {err:.2e}"


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_few_rows_against_a_matrix_read_along_k(M, dtype, rng, device, canaries):
    """x @ w.T for a Linear layer's weight at a small batch (kernels/gemm_dot.cl): views with leading
    dimensions, K and N off every vector and block size, beta = 0 over a C full of NaN (never read), beta !=
    0, and a transposed C."""
    if dtype == np.float64 and not device.has_fp64:
        pytest.skip("device has no float64")
    from netcl.ops.gemm import DOT_MAX_ROWS
    assert M <= DOT_MAX_ROWS
    N, K = 37, 29
    big_a = rng.standard_normal((M + 2, K + 3)).astype(dtype)
    big_w = rng.standard_normal((N + 1, K + 6)).astype(dtype)
    A, W = nc.Tensor.from_host(big_a, device), nc.Tensor.from_host(big_w, device)
    a, w = A[1:1 + M, 2:2 + K], W[1:, 3:3 + K]
    ref = big_a[1:1 + M, 2:2 + K].astype(np.float64) @ big_w[1:, 3:3 + K].astype(np.float64).T
    tol = 1e-12 if dtype == np.float64 else 1e-5
    C = nc.Tensor.from_host(np.full((M, N), np.nan, dtype), device)
    gemm(a, w, C, trans_b=True)
    assert_close(C.to_host(), ref, tol, f"{M} rows, beta 0 over NaN")
    c0 = rng.standard_normal((M, N)).astype(dtype)
    C = nc.Tensor.from_host(c0, device)
    gemm(a, w, C, alpha=0.75, beta=-2.0, trans_b=True)
    assert_close_to_scale(C.to_host(), 0.75 * ref - 2.0 * c0,
                          0.75 * np.abs(big_a[1:1 + M, 2:2 + K]) @ np.abs(big_w[1:, 3:3 + K]).T + 2.0 * np.abs(c0),
                          tol, f"{M} rows, alpha and beta")
    ct = nc.Tensor.from_host(np.zeros((N, M), dtype), device).transpose(0, 1)
    gemm(a, w, ct, trans_b=True)
    assert_close(ct.to_host(), ref, tol, f"{M} rows into a transposed C")
