"""float64 NumPy references and a finite-difference gradient checker for the layer tests."""
from __future__ import annotations

import numpy as np

import netcl as nc


def pool_ref(x, k, s, p, d, op, count_include_pad=True, ceil_mode=False, p_end=None):
    """(y, grad_fn) of 2-D max/avg pooling in float64; grad_fn(gy) -> gx. ``p_end``: the bottom/right
    padding (default ``p``); ceil_mode rounds output sizes up, dropping a last window that starts in the end
    padding, and count_include_pad then divides by the taps inside the padded input."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, s, p, d
    ph_end, pw_end = p if p_end is None else p_end

    def out(size, kk, st, p0, p1, dd):
        span = size + p0 + p1 - dd * (kk - 1) - 1
        if not ceil_mode:
            return span // st + 1
        o = -(-span // st) + 1
        return o - 1 if (o - 1) * st >= size + p0 else o

    ho, wo = out(h, kh, sh, ph, ph_end, dh), out(w, kw, sw, pw, pw_end, dw)
    # room for windows reaching past the end padding (ceil_mode): marked outside the padded input
    extra_h = max(0, (ho - 1) * sh + dh * (kh - 1) + 1 - (h + ph + ph_end))
    extra_w = max(0, (wo - 1) * sw + dw * (kw - 1) + 1 - (w + pw + pw_end))
    fill = -np.inf if op == "max" else 0.0
    widths = ((ph, ph_end + extra_h), (pw, pw_end + extra_w))
    xp = np.pad(x, ((0, 0), (0, 0)) + widths, constant_values=fill)
    valid = np.pad(np.ones((h, w)), widths)
    padded = np.pad(np.ones((h + ph + ph_end, w + pw + pw_end)), ((0, extra_h), (0, extra_w)))
    taps, counts, padded_counts, where = [], [], [], []
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            taps.append(xp[:, :, rows, cols])
            counts.append(valid[rows, cols])
            padded_counts.append(padded[rows, cols])
            where.append((rows, cols))
    stack = np.stack(taps, -1)
    if op == "max":
        choice = stack.argmax(-1)  # first maximum, as the kernel
        y = stack.max(-1)
    else:
        divisor = np.sum(padded_counts if count_include_pad else counts, axis=0)
        y = stack.sum(-1) / divisor

    def grad(gy):
        gy = np.asarray(gy, np.float64)
        gxp = np.zeros_like(xp, dtype=np.float64)
        for t, (rows, cols) in enumerate(where):
            contribution = gy * (choice == t) if op == "max" else gy / divisor
            gxp[:, :, rows, cols] += contribution
        return gxp[:, :, ph:ph + h, pw:pw + w]

    return y, grad


def cross_entropy_ref(logits, target, reduction="mean"):
    """(loss, d loss / d logits) in float64."""
    z = np.asarray(logits, np.float64)
    m = z.max(1, keepdims=True)
    lse = m + np.log(np.exp(z - m).sum(1, keepdims=True))
    n = z.shape[0]
    loss = (lse[:, 0] - z[np.arange(n), target]).sum()
    grad = np.exp(z - lse)
    grad[np.arange(n), target] -= 1
    if reduction == "mean":
        return loss / n, grad / n
    return loss, grad


def finite_difference(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function f (NumPy float64 in, float out) at x."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f(x)
        flat[i] = old - eps
        down = f(x)
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


def scalar_through(layer_fn, gy: np.ndarray, device):
    """f(x) = <layer_fn(x), gy>, evaluated on the device in float64 (for finite differences)."""
    def f(x):
        with nc.no_grad():
            y = layer_fn(nc.tensor(x, device=device)).to_host()
        return float(np.sum(y * gy))
    return f
