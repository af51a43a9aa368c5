"""float64 NumPy reference of batch normalization (with the fused ReLU and residual) and its gradients."""
from __future__ import annotations

import numpy as np


def channel_axes(ndim: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, ndim))


def per_channel(v, ndim: int):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm_ref(x, weight, bias, eps=1e-5, mean=None, var=None, relu=False, residual=None):
    """(y, grad_fn). mean/var None: the batch's statistics (biased variance), which the gradient flows
    through; given: constants (eval). relu: False, True or "relu6" (clamped at 6, no gradient at either
    bound). grad_fn(gy) -> (gx, gw, gb, gr)."""
    x = np.asarray(x, np.float64)
    axes, nd = channel_axes(x.ndim), x.ndim
    batch = mean is None
    mu = x.mean(axes) if batch else np.asarray(mean, np.float64)
    sigma2 = x.var(axes) if batch else np.asarray(var, np.float64)
    w = np.ones(x.shape[1]) if weight is None else np.asarray(weight, np.float64)
    b = np.zeros(x.shape[1]) if bias is None else np.asarray(bias, np.float64)
    invstd = 1.0 / np.sqrt(sigma2 + eps)
    xhat = (x - per_channel(mu, nd)) * per_channel(invstd, nd)
    z = xhat * per_channel(w, nd) + per_channel(b, nd)
    if residual is not None:
        z = z + np.asarray(residual, np.float64)
    y = np.maximum(z, 0) if relu else z
    if relu == "relu6":
        y = np.minimum(y, 6)
    mask = ((z > 0) & (z < 6)) if relu == "relu6" else (z > 0)

    def grad(gy):
        dz = np.asarray(gy, np.float64) * mask if relu else np.asarray(gy, np.float64)
        gb = dz.sum(axes)
        gw = (dz * xhat).sum(axes)
        if batch:
            m = x.size // x.shape[1]
            gx = per_channel(w * invstd, nd) * (dz - (per_channel(gb, nd) + xhat * per_channel(gw, nd)) / m)
        else:
            gx = dz * per_channel(w * invstd, nd)
        return gx, gw, gb, (dz if residual is not None else None)

    return y, grad


def running_update_ref(running_mean, running_var, x, factor):
    """PyTorch's running statistics after one training batch with the given averaging factor."""
    x = np.asarray(x, np.float64)
    axes = channel_axes(x.ndim)
    m = x.size // x.shape[1]
    unbiased = x.var(axes) * m / (m - 1)
    return (1 - factor) * running_mean + factor * x.mean(axes), (1 - factor) * running_var + factor * unbiased


def grad_x_scale(x, weight, gy, eps=1e-5):
    """Per element, the magnitude of the terms batch normalization's input gradient sums (batch
    statistics): |w·invstd|·(|gy| + (Σ|gy| + |x̂|·Σ|gy·x̂|)/m), the ReLU's mask ignored (an upper bound).
    With few values per channel those terms cancel to far less than each: (3, 1, 1, 1) left a gradient
    of 6e-5 from terms of about 1, so float32's rounding of them is 4e-4 of the result."""
    x = np.asarray(x, np.float64)
    axes, nd = channel_axes(x.ndim), x.ndim
    w = np.ones(x.shape[1]) if weight is None else np.abs(np.asarray(weight, np.float64))
    invstd = 1.0 / np.sqrt(x.var(axes) + eps)
    xhat = np.abs((x - per_channel(x.mean(axes), nd)) * per_channel(invstd, nd))
    g = np.abs(np.asarray(gy, np.float64))
    m = x.size // x.shape[1]
    return per_channel(w * invstd, nd) * (g + (per_channel(g.sum(axes), nd) + xhat * per_channel((g * xhat).sum(axes), nd)) / m)
