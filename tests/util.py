"""Helpers for tests: error measures and float64 references."""
from __future__ import annotations

import numpy as np

import netcl as nc


def rel_l2(actual, expected) -> float:
    """Relative L2 error ||a - e|| / ||e|| (computed in float64; 0-norm references compare absolutely)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"shape {a.shape} != expected {e.shape}")
    if not np.all(np.isfinite(a)):
        raise AssertionError("result contains NaN or Inf")
    denom = np.linalg.norm(e)
    return float(np.linalg.norm(a - e) / (denom if denom > 0 else 1.0))


def assert_close(actual, expected, tol: float, what: str = "") -> None:
    err = rel_l2(actual, expected)
    e = np.asarray(expected)
    if np.any(e != 0) and not np.any(np.asarray(actual) != 0):
        raise AssertionError(f"{what}: result is all zeros")
    assert err <= tol, f"{what}: relative L2 error {err:.3e} > {tol:.1e}"


def assert_close_to_scale(actual, expected, scale, tol: float, what: str = "") -> None:
    """||actual - expected|| <= tol * ||scale||, where scale holds the magnitudes of the summed terms."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected {e.shape}")
    if not np.all(np.isfinite(a)):
        raise AssertionError(f"{what}: result contains NaN or Inf")
    err = float(np.linalg.norm(a - e) / np.linalg.norm(np.asarray(scale, dtype=np.float64)))
    assert err <= tol, f"{what}: error {err:.3e} of the terms' magnitude > {tol:.1e}"


def activation_ref(z, activation):
    """An inference epilogue's activation (netcl.runtime.cl_activation.ACTIVATIONS) in NumPy."""
    if activation == "relu":
        return np.maximum(z, 0)
    if activation == "relu6":
        return np.clip(z, 0, 6)
    if activation == "hardswish":
        return z * np.clip(z + 3, 0, 6) / 6
    return z


def conv2d_ref(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """float64 NCHW cross-correlation by summing shifted slices (one per kernel tap)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (s - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, k, ho, wo))
    kg = k // groups
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = w[g * kg:(g + 1) * kg]
        for i in range(r):
            for j in range(s):
                patch = xg[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
                y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, wg[:, :, i, j])
    return y


def conv2d_grads_ref(x, w, grad_y, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """float64 (grad_x, grad_w) of conv2d_ref for an upstream gradient grad_y."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    gy = np.asarray(grad_y, np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho, wo = gy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    kg = k // groups
    for g in range(groups):
        cs, ks = slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)
        for i in range(r):
            for j in range(s):
                hs = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
                ws = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
                gw[ks, :, i, j] += np.einsum("nkhw,nchw->kc", gy[:, ks], xp[:, cs, hs, ws])
                gxp[:, cs, hs, ws] += np.einsum("nkhw,kc->nchw", gy[:, ks], w[ks, :, i, j])
    return gxp[:, :, ph:ph + h, pw:pw + wd], gw


def randomize_batchnorm(model, rng):
    """Running statistics and affine parameters away from their defaults, so folding them changes values."""
    for module in model.modules():
        if isinstance(module, nc.nn.BatchNorm2d):
            n = module.num_features
            module.load_state_dict({"weight": rng.uniform(0.5, 1.5, n).astype(np.float32),
                                    "bias": rng.uniform(-0.5, 0.5, n).astype(np.float32),
                                    "running_mean": rng.uniform(-0.3, 0.3, n).astype(np.float32),
                                    "running_var": rng.uniform(0.5, 2.0, n).astype(np.float32)}, strict=False)


def check_forced_conv(strategy, xs, ws, args, rng, device, dtype="float32", bias=False, tolerances=(1e-5, 1e-4),
                      what=""):
    """conv2d forced onto ``strategy`` on fresh random operands, its output and every gradient (the bias's
    too, with ``bias``) against the float64 reference; ``args`` = (stride, padding, dilation, groups), each
    a pair but groups."""
    from netcl.ops.conv2d import conv2d
    stride, padding, dilation, groups = args
    x = rng.uniform(-1, 1, xs).astype(dtype)
    w = rng.uniform(-1, 1, ws).astype(dtype)
    b = rng.uniform(-1, 1, ws[0]).astype(dtype) if bias else None
    expected = conv2d_ref(x, w, *args) + (b[None, :, None, None] if bias else 0)
    gy = rng.uniform(-1, 1, expected.shape).astype(dtype)
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    W = nc.Tensor.from_host(w, device, requires_grad=True)
    B = nc.Tensor.from_host(b, device, requires_grad=True) if bias else None
    y = conv2d(X, W, B, stride=stride, padding=padding, dilation=dilation, groups=groups, strategy=strategy)
    y.backward(nc.Tensor.from_host(gy, device))
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    assert y.shape == expected.shape
    assert_close(y.to_host(), expected, tolerances[0], f"forward of {what}")
    assert_close(X.grad.to_host(), gx_ref, tolerances[1], f"grad input of {what}")
    assert_close(W.grad.to_host(), gw_ref, tolerances[1], f"grad weight of {what}")
    if bias:
        assert_close(B.grad.to_host(), gy.astype(np.float64).sum(axis=(0, 2, 3)), tolerances[1], f"grad bias of {what}")


def assert_finite_differences(objective, x, w, gx, gw, rng, entries=6, step=1e-6, tol=1e-6):
    """gx and gw (the gradients of objective(x, w) the code computed) against central differences in
    float64, at ``entries`` random entries of each."""
    for array, grad, which in ((x, gx, "input"), (w, gw, "weight")):
        for index in [tuple(int(rng.integers(0, d)) for d in array.shape) for _ in range(entries)]:
            plus, minus = array.copy(), array.copy()
            plus[index] += step
            minus[index] -= step
            pair = (plus, w) if which == "input" else (x, plus)
            other = (minus, w) if which == "input" else (x, minus)
            numeric = (objective(*pair) - objective(*other)) / (2 * step)
            assert abs(numeric - grad[index]) <= tol * max(1.0, abs(numeric)), (which, index, numeric, grad[index])
