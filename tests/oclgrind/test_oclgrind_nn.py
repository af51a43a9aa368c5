"""The layer kernels of kernels/batchnorm.cl, activation.cl, adaptive_pool.cl and loss.cl's options under
the simulator: every kernel and the fused variants (ReLU, residual, running statistics, cumulative average,
eval), each result checked against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from util import assert_close

pytestmark = pytest.mark.oclgrind


def _t(a, device, grad=False):
    return nc.Tensor.from_host(np.ascontiguousarray(a), device, requires_grad=grad)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("item_runs", [False, True], ids=["interleaved", "cpu-runs"])
def test_batch_norm_variants(device, rng, monkeypatch, item_runs, split):
    # the CPU geometry (one item per block summing vector runs, then a scalar tail) checked here too, and
    # the reductions cut into blocks whose partial results the merge kernels combine
    monkeypatch.setattr("netcl.ops.batchnorm._item_runs", lambda _device: item_runs)
    if split:
        monkeypatch.setattr("netcl.ops.batchnorm.MIN_BLOCK", 4)
        monkeypatch.setattr("netcl.ops.batchnorm.BLOCKS_PER_UNIT", 1000)
    x_h = rng.normal(size=(3, 2, 5, 7)).astype(np.float32)
    m = x_h.size // 2
    r_h = rng.normal(size=x_h.shape).astype(np.float32)
    mean, var = x_h.mean((0, 2, 3)), x_h.var((0, 2, 3))
    for momentum, relu, residual in ((0.1, False, False), (None, True, True)):
        bn = nc.nn.BatchNorm2d(2, momentum=momentum, device=device)
        x = _t(x_h, device, grad=True)
        r = _t(r_h, device, grad=True) if residual else None
        y = bn(x, relu=relu, residual=r)
        z = (x_h - mean.reshape(1, 2, 1, 1)) / np.sqrt(var.reshape(1, 2, 1, 1) + 1e-5) + (r_h if residual else 0)
        assert_close(y.to_host(), np.maximum(z, 0) if relu else z, 1e-5, "bn forward")
        y.sum().backward()
        assert np.all(np.isfinite(x.grad.to_host()))
        factor = 1.0 if momentum is None else momentum
        assert_close(bn.running_var.to_host(), (1 - factor) + factor * var * m / (m - 1), 1e-5, "running_var")
        assert int(bn.num_batches_tracked.to_host()) == 1
    bn.eval()
    x = _t(x_h, device, grad=True)
    bn(x).sum().backward()  # eval backward: running statistics as constants
    assert_close(x.grad.to_host(), np.broadcast_to(1 / np.sqrt(bn.running_var.to_host() + 1e-5).reshape(1, 2, 1, 1),
                                                   x_h.shape), 1e-5, "eval grad")
    x1 = _t(rng.normal(size=(5, 3)).astype(np.float32), device)
    assert nc.nn.BatchNorm1d(3, affine=False, device=device)(x1).shape == (5, 3)


def test_activation_kernels(device, rng):
    x_h = rng.uniform(-3, 3, size=(5, 7)).astype(np.float32)
    for layer in (nc.nn.LeakyReLU(0.2), nc.nn.GELU(), nc.nn.GELU("tanh")):
        x = _t(x_h, device, grad=True)
        layer(x).sum().backward()
        assert np.all(np.isfinite(x.grad.to_host()))
    a, b = _t(x_h, device, grad=True), _t(-x_h[::-1].copy(), device, grad=True)
    y = F.add_relu(a, b)
    assert_close(y.to_host(), np.maximum(x_h + -x_h[::-1], 0), 1e-6, "add_relu")
    y.sum().backward()
    for dim, log in ((1, False), (0, True)):
        x = _t(x_h, device, grad=True)
        out = F.log_softmax(x, dim) if log else F.softmax(x, dim)
        (out * out).sum().backward()
        assert np.all(np.isfinite(x.grad.to_host()))


def test_adaptive_pool_kernels(device, rng):
    x_h = rng.normal(size=(2, 3, 5, 7)).astype(np.float32)
    for size in (1, (2, 3)):
        x = _t(x_h, device, grad=True)
        y = F.adaptive_avg_pool2d(x, size)
        y.sum().backward()
        assert_close(x.grad.to_host().sum(), float(np.prod(y.shape)), 1e-5, "gradient mass")
    assert_close(F.adaptive_avg_pool2d(_t(x_h, device), 1).to_host()[..., 0, 0], x_h.mean((2, 3)), 1e-6, "global")


def test_loss_options(device, rng):
    x_h = rng.uniform(-2, 2, size=(6, 4)).astype(np.float32)
    t_h = np.array([0, 3, -100, 2, 1, 3])
    w_h = rng.uniform(0.5, 2, 4).astype(np.float32)
    for kwargs in ({"weight": w_h, "label_smoothing": 0.1}, {"reduction": "none"}, {"reduction": "sum"}):
        x = _t(x_h, device, grad=True)
        loss = F.cross_entropy(x, t_h, **kwargs)
        loss.backward(None if loss.ndim == 0 else _t(np.ones(6, np.float32), device))
        assert np.all(np.isfinite(x.grad.to_host()))
    x = _t(x_h, device, grad=True)
    F.nll_loss(x, t_h, weight=w_h).backward()
    keep = t_h != -100
    expected = -(w_h[t_h[keep]] * x_h[keep, t_h[keep]]).sum() / w_h[t_h[keep]].sum()
    assert_close(F.nll_loss(_t(x_h, device), t_h, weight=w_h).to_host(), expected, 1e-5, "nll")


@pytest.mark.parametrize("item_runs", [False, True], ids=["interleaved", "cpu-runs"])
def test_folded_conv_bn_epilogue(device, rng, monkeypatch, item_runs):
    # the CPU form folds a run of each channel's 18 weights per item: vector steps, then the tail
    monkeypatch.setattr("netcl.ops.batchnorm._item_runs", lambda _device: item_runs)
    conv = nc.nn.Conv2d(2, 3, 3, padding=1, device=device)
    bn = nc.nn.BatchNorm2d(3, device=device)
    x = _t(rng.normal(size=(2, 2, 5, 5)).astype(np.float32), device)
    bn(conv(x))  # running statistics away from 0 / 1
    seq = nc.nn.Sequential(conv, bn, nc.nn.ReLU()).eval()
    with nc.no_grad():
        folded = seq(x).to_host()
        unfused = np.maximum(bn(conv(x)).to_host(), 0)
    assert_close(folded, unfused, 1e-5, "folded conv + bn + relu")
