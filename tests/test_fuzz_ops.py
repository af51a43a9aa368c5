"""Fuzzed sweeps of gemm, im2col, col2im and pooling, in the manner of tests/test_fuzz_conv.py: seeded
random cases (a pure function of NETCL_FUZZ_SEED and the case index) checked against float64 NumPy, 64 of
each in the default suite and 5,136 more behind `slow`; a failure prints the case and the command that replays
it; NaN/Inf and all-zero results fail; every tensor sits between canary elements (tests/conftest.py).

gemm cases draw sizes (1..70), transposes, alpha/beta, operands that are offset views into larger
matrices, batches with a broadcast operand, and, for some of them, a parameter set from the GEMM
tuner's candidate space. im2col/col2im cases draw the geometry of a conv layer (kernel, stride, padding,
dilation), both layouts and, for col2im, the atomic scatter and the deterministic gather forms. Pooling
cases draw max/avg (count_include_pad either way, max with the fused ReLU), forward and backward.
"""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from netcl.ops.gemm import gemm, gemm_batched
from netcl.ops.im2col import col2im, im2col
from test_fuzz_conv import DEFAULT_LAYERS, SEED, SLOW_LAYERS, check_finite_nonzero, layer_rng
from util import assert_close

TOL = {"float32": 1e-5, "float64": 1e-12}


def _dtype(rng, device) -> str:
    return "float64" if device.has_fp64 and rng.random() < 0.15 else "float32"


def _run(kind: str, test: str, index: int, make, check, device) -> None:
    rng = layer_rng(kind, index)
    case = make(rng, device)
    try:
        check(case, rng, device)
    except AssertionError as exc:
        raise AssertionError(f"{kind} case #{index}: {case!r}: {exc}\nreplay: NETCL_FUZZ_SEED={SEED} "
                             f"python -m pytest 'tests/test_fuzz_ops.py::{test}[{index}]'") from None


def _view_of(host: np.ndarray, rng, device):
    """A device tensor equal to ``host`` that is a view at a non-zero offset into a larger matrix (half the
    time), so kernels must honour offsets and leading dimensions."""
    if rng.random() < 0.5:
        return nc.Tensor.from_host(host, device)
    pad_r, pad_c = (int(v) for v in rng.integers(1, 4, 2))
    big = np.zeros((host.shape[-2] + pad_r, host.shape[-1] + pad_c), host.dtype)
    big[pad_r:, pad_c:] = host
    return nc.Tensor.from_host(big, device)[pad_r:, pad_c:]


# ---- gemm ------------------------------------------------------------------------------------------------

_candidates: dict = {}


def _tuner_candidates(device, dtype):
    if dtype not in _candidates:
        import sys
        from pathlib import Path
        sys.path.insert(0, str(Path(__file__).parent / "oclgrind"))
        from test_oclgrind_gemm import tuner_candidates
        _candidates[dtype] = tuner_candidates(device, dtype)
    return _candidates[dtype]


def make_gemm(rng, device) -> dict:
    dt = _dtype(rng, device)
    m, n, k = (int(v) for v in rng.integers(1, 71, 3))
    case = {"M": m, "N": n, "K": k, "trans_a": bool(rng.random() < 0.5), "trans_b": bool(rng.random() < 0.5),
            "alpha": float(rng.choice([1.0, -0.5, 2.0])), "beta": float(rng.choice([0.0, 0.0, 1.0, -1.5])),
            "batch": int(rng.choice([0, 0, 0, 2, 3])), "dtype": dt, "params": None}
    if rng.random() < 0.15:  # each is a kernel build; tests/oclgrind runs every candidate anyway
        options = [p for p in _tuner_candidates(device, dt) if p["WG_M"] * p["WG_N"] <= device.max_work_group_size]
        case["params"] = options[int(rng.integers(len(options)))]
    return case


def check_gemm(case, rng, device):
    dt, M, N, K, ta, tb = case["dtype"], case["M"], case["N"], case["K"], case["trans_a"], case["trans_b"]
    alpha, beta = case["alpha"], case["beta"]
    if case["batch"]:
        B = case["batch"]
        a = rng.uniform(-1, 1, (B, K, M) if ta else (B, M, K)).astype(dt)
        b = rng.uniform(-1, 1, (1, N, K) if tb else (1, K, N)).astype(dt)  # broadcast over the batch
        c0 = rng.uniform(-1, 1, (B, M, N)).astype(dt)
        out = gemm_batched(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device),
                           nc.Tensor.from_host(c0, device) if beta else None, alpha, beta, ta, tb, case["params"])
        opa = np.swapaxes(a, 1, 2) if ta else a
        opb = np.swapaxes(b, 1, 2) if tb else b
        ref = alpha * np.matmul(opa.astype(np.float64), opb) + (beta * c0 if beta else 0)
    else:
        a = rng.uniform(-1, 1, (K, M) if ta else (M, K)).astype(dt)
        b = rng.uniform(-1, 1, (N, K) if tb else (K, N)).astype(dt)
        c0 = rng.uniform(-1, 1, (M, N)).astype(dt)
        C = _view_of(c0, rng, device) if beta else None
        out = gemm(_view_of(a, rng, device), _view_of(b, rng, device), C, alpha, beta, ta, tb, params=case["params"])
        ref = alpha * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b) + (beta * c0 if beta else 0)
    got = out.to_host()
    check_finite_nonzero(got, ref, "gemm")
    assert_close(got, ref, TOL[dt], "gemm")


@pytest.mark.parametrize("index", range(DEFAULT_LAYERS))
def test_gemm_fuzz(index, device, canaries):
    _run("gemm", "test_gemm_fuzz", index, make_gemm, check_gemm, device)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(DEFAULT_LAYERS, DEFAULT_LAYERS + SLOW_LAYERS))
def test_gemm_fuzz_slow(index, device, canaries):
    _run("gemm", "test_gemm_fuzz_slow", index, make_gemm, check_gemm, device)


# ---- im2col / col2im -------------------------------------------------------------------------------------

def make_lowering(rng, device) -> dict:
    r, s = (int(v) for v in rng.choice([1, 2, 3, 5], 2))
    sh, sw = (int(v) for v in rng.integers(1, 4, 2))
    ph, pw = (int(v) for v in rng.integers(0, 3, 2))
    dh, dw = (int(v) for v in rng.choice([1, 1, 2], 2))
    oh, ow = (int(v) for v in rng.integers(1, 7, 2))
    h = max(1, (oh - 1) * sh + dh * (r - 1) + 1 - 2 * ph + int(rng.integers(0, sh)))
    w = max(1, (ow - 1) * sw + dw * (s - 1) + 1 - 2 * pw + int(rng.integers(0, sw)))
    return {"input": (int(rng.integers(1, 4)), int(rng.integers(1, 5)), h, w), "kernel": (r, s),
            "stride": (sh, sw), "padding": (ph, pw), "dilation": (dh, dw), "transposed": bool(rng.random() < 0.5),
            "deterministic": bool(rng.random() < 0.5), "dtype": _dtype(rng, device)}


def _out_size(case):
    (n, c, h, w), (r, s) = case["input"], case["kernel"]
    (sh, sw), (ph, pw), (dh, dw) = case["stride"], case["padding"], case["dilation"]
    return (h + 2 * ph - dh * (r - 1) - 1) // sh + 1, (w + 2 * pw - dw * (s - 1) - 1) // sw + 1


def im2col_ref(x, case):
    """(N·Ho·Wo, C·R·S) float64 column matrix."""
    (n, c, h, w), (r, s) = x.shape, case["kernel"]
    (sh, sw), (ph, pw), (dh, dw) = case["stride"], case["padding"], case["dilation"]
    ho, wo = _out_size(case)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((n, ho, wo, c, r, s))
    for i in range(r):
        for j in range(s):
            cols[..., i, j] = xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                                 j * dw:j * dw + sw * (wo - 1) + 1:sw].transpose(0, 2, 3, 1)
    return cols.reshape(n * ho * wo, c * r * s)


def col2im_ref(cols, case):
    """The adjoint of im2col_ref: every column entry added back into the input element it came from."""
    (n, c, h, w), (r, s) = case["input"], case["kernel"]
    (sh, sw), (ph, pw), (dh, dw) = case["stride"], case["padding"], case["dilation"]
    ho, wo = _out_size(case)
    c6 = np.asarray(cols, np.float64).reshape(n, ho, wo, c, r, s)
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(r):
        for j in range(s):
            xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += \
                c6[..., i, j].transpose(0, 3, 1, 2)
    return xp[:, :, ph:ph + h, pw:pw + w]


def check_lowering(case, rng, device):
    dt, (r, s), tr = case["dtype"], case["kernel"], case["transposed"]
    geometry = (case["stride"], case["padding"], case["dilation"])
    x = rng.uniform(-1, 1, case["input"]).astype(dt)
    got = im2col(nc.Tensor.from_host(x, device), r, s, *geometry, transposed=tr).to_host()
    ref = im2col_ref(x, case)
    ref = ref.T if tr else ref
    check_finite_nonzero(got, ref, "im2col")
    assert np.array_equal(got, ref.astype(dt)), "im2col: the column matrix differs from the reference"
    cols = rng.uniform(-1, 1, ref.shape).astype(dt)
    back = col2im(nc.Tensor.from_host(cols, device), case["input"], r, s, *geometry, transposed=tr,
                  deterministic=case["deterministic"]).to_host()
    ref_back = col2im_ref(cols.T if tr else cols, case)
    check_finite_nonzero(back, ref_back, "col2im")
    assert_close(back, ref_back, TOL[dt], f"col2im ({'gather' if case['deterministic'] else 'scatter'})")


@pytest.mark.parametrize("index", range(DEFAULT_LAYERS))
def test_im2col_col2im_fuzz(index, device, canaries):
    _run("lowering", "test_im2col_col2im_fuzz", index, make_lowering, check_lowering, device)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(DEFAULT_LAYERS, DEFAULT_LAYERS + SLOW_LAYERS))
def test_im2col_col2im_fuzz_slow(index, device, canaries):
    _run("lowering", "test_im2col_col2im_fuzz_slow", index, make_lowering, check_lowering, device)


# ---- pooling ---------------------------------------------------------------------------------------------

def make_pool(rng, device) -> dict:
    kh, kw = (int(v) for v in rng.integers(1, 4, 2))
    dh, dw = (int(v) for v in rng.choice([1, 1, 2], 2))
    stride = None if rng.random() < 0.3 else tuple(int(v) for v in rng.integers(1, 4, 2))
    ph = int(rng.integers(0, (dh * (kh - 1) + 1) // 2 + 1))
    pw = int(rng.integers(0, (dw * (kw - 1) + 1) // 2 + 1))
    sh, sw = stride or (kh, kw)
    oh, ow = (int(v) for v in rng.integers(1, 7, 2))
    h = max(1, (oh - 1) * sh + dh * (kh - 1) + 1 - 2 * ph + int(rng.integers(0, sh)))
    w = max(1, (ow - 1) * sw + dw * (kw - 1) + 1 - 2 * pw + int(rng.integers(0, sw)))
    op = str(rng.choice(["max", "max_relu", "avg", "avg_nopad"]))
    return {"input": (int(rng.integers(1, 3)), int(rng.integers(1, 4)), h, w), "kernel": (kh, kw), "stride": stride,
            "padding": (ph, pw), "dilation": (dh, dw), "op": op, "dtype": _dtype(rng, device)}


def pool_ref(x, case):
    """(output, d sum(output) / d x) in float64; max ties go to the first tap in row-major order. A window
    lying entirely in the padding (possible with dilation) gives max -inf (PyTorch's value: the padding is
    -inf), fused-ReLU max 0, and average 0, with no gradient."""
    (kh, kw), (ph, pw), (dh, dw) = case["kernel"], case["padding"], case["dilation"]
    sh, sw = case["stride"] or case["kernel"]
    n, c, h, w = x.shape
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    op = case["op"]
    src = np.maximum(x, 0) if op == "max_relu" else x
    y = np.zeros((n, c, ho, wo))
    g = np.zeros((n, c, h, w))
    for i in range(ho):
        for j in range(wo):
            rows = [i * sh - ph + a * dh for a in range(kh)]
            cols = [j * sw - pw + b * dw for b in range(kw)]
            taps = [(r, q) for r in rows for q in cols if 0 <= r < h and 0 <= q < w]
            if op.startswith("max"):
                if not taps:
                    y[:, :, i, j] = 0.0 if op == "max_relu" else -np.inf
                    continue
                vals = np.stack([src[:, :, r, q] for r, q in taps], -1)
                best = vals.argmax(-1)
                y[:, :, i, j] = vals.max(-1)
                for t, (r, q) in enumerate(taps):
                    hit = best == t
                    if op == "max_relu":
                        hit &= vals.max(-1) > 0
                    g[:, :, r, q] += hit
            else:
                count = kh * kw if op == "avg" else max(len(taps), 1)
                for r, q in taps:
                    y[:, :, i, j] += x[:, :, r, q] / count
                    g[:, :, r, q] += 1.0 / count
    return y, g


def check_pool(case, rng, device):
    dt = case["dtype"]
    x = rng.uniform(-1, 1, case["input"]).astype(dt)
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    args = (case["kernel"], case["stride"], case["padding"])
    if case["op"].startswith("max"):
        y = F.max_pool2d(X, *args, dilation=case["dilation"], fused_relu=case["op"] == "max_relu")
    else:
        y = F.avg_pool2d(X, *args, dilation=case["dilation"], count_include_pad=case["op"] == "avg")
    y_ref, g_ref = pool_ref(x, case)
    got = y.to_host()
    empty = np.isneginf(y_ref)  # max over a window entirely in the padding
    assert np.array_equal(np.isneginf(got), empty), f"{case['op']} pool forward: -inf outside all-padding windows"
    got, y_ref = np.where(empty, 0.0, got), np.where(empty, 0.0, y_ref)
    check_finite_nonzero(got, y_ref, f"{case['op']} pool forward")
    assert_close(got, y_ref, TOL[dt], f"{case['op']} pool forward")
    y.sum().backward()
    grad = X.grad.to_host()
    check_finite_nonzero(grad, g_ref, f"{case['op']} pool backward")
    assert_close(grad, g_ref, TOL[dt], f"{case['op']} pool backward")


@pytest.mark.parametrize("index", range(DEFAULT_LAYERS))
def test_pool_fuzz(index, device, canaries):
    _run("pool", "test_pool_fuzz", index, make_pool, check_pool, device)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(DEFAULT_LAYERS, DEFAULT_LAYERS + SLOW_LAYERS))
def test_pool_fuzz_slow(index, device, canaries):
    _run("pool", "test_pool_fuzz_slow", index, make_pool, check_pool, device)
