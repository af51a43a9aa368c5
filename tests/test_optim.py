"""Optimizers against hand-written float64 updates with PyTorch's semantics, several steps each."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from util import assert_close, assert_close_to_scale


def _sgd_ref(p, grads, lr, momentum=0.0, weight_decay=0.0, nesterov=False, dampening=0.0):
    p = p.astype(np.float64).copy()
    buf = None
    for g in grads:
        g = g.astype(np.float64) + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p -= lr * g
    return p, buf


def _sgd_scale(p, grads, **settings):
    """The SGD recurrence on magnitudes (every term positive): what float32 rounding is relative to.

    A parameter that ends small by cancellation is then not held to 1e-6 of itself.
    """
    return _sgd_ref(np.abs(p), [np.abs(g) for g in grads], **{**settings, "lr": -settings["lr"]})


def _adam_ref(p, grads, lr, b1, b2, eps, weight_decay):
    """The parameter after Adam's steps, and |p0| + the sum of the steps' magnitudes (the rounding scale)."""
    p = p.astype(np.float64).copy()
    scale = np.abs(p)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64) + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
        p -= step
        scale = scale + np.abs(step)
    return p, scale


@pytest.mark.parametrize("settings", [
    dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.01, momentum=0.5, weight_decay=0.1, dampening=0.3), dict(lr=0.02, weight_decay=0.01),
    dict(lr=0.03, momentum=0.9, weight_decay=5e-4, nesterov=True),
])
@pytest.mark.parametrize("shape", [(1,), (7, 13), (31,)])
def test_sgd_matches_pytorch_semantics(device, rng, canaries, settings, shape):
    p0 = rng.uniform(-2, 2, size=shape).astype(np.float32)
    grads = [rng.uniform(-2, 2, size=shape).astype(np.float32) for _ in range(4)]
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.SGD([p], **settings)
    for g in grads:
        p.grad = nc.tensor(g, device=device)
        opt.step()
    ref, buf = _sgd_ref(p0, grads, **settings)
    p_scale, buf_scale = _sgd_scale(p0, grads, **settings)
    assert_close_to_scale(p.to_host(), ref, p_scale, 1e-6, f"SGD {settings}")
    if buf is not None:
        assert_close_to_scale(opt.state_dict()["state"][0]["momentum_buffer"], buf, buf_scale, 1e-6,
                              "momentum buffer")


@pytest.mark.parametrize("settings", [dict(lr=1e-3), dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)])
def test_adam_matches_pytorch_semantics(device, rng, canaries, settings):
    p0 = rng.uniform(-2, 2, size=(13, 5)).astype(np.float32)
    grads = [rng.uniform(-2, 2, size=p0.shape).astype(np.float32) for _ in range(5)]
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.Adam([p], **settings)
    for g in grads:
        p.grad = nc.tensor(g, device=device)
        opt.step()
    full = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    full.update(settings)
    ref, scale = _adam_ref(p0, grads, full["lr"], *full["betas"], full["eps"], full["weight_decay"])
    assert_close_to_scale(p.to_host(), ref, scale, 1e-6, f"Adam {settings}")


def test_sgd_float64_is_exact(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    p0 = rng.uniform(-2, 2, size=(9,))
    grads = [rng.uniform(-2, 2, size=(9,)) for _ in range(3)]
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    for g in grads:
        p.grad = nc.tensor(g, device=device)
        opt.step()
    assert_close(p.to_host(), _sgd_ref(p0, grads, 0.1, 0.9, 0.01, True)[0], 1e-13, "SGD float64")


def test_parameters_without_grad_are_skipped_and_state_round_trips(device, rng):
    a = nc.tensor(np.ones(3, np.float32), device=device, requires_grad=True)
    b = nc.tensor(np.ones(3, np.float32), device=device, requires_grad=True)
    opt = nc.optim.SGD([a, b], lr=0.5, momentum=0.9)
    a.grad = nc.tensor(np.full(3, 2.0, np.float32), device=device)
    opt.step()
    assert np.allclose(a.to_host(), 0.0) and np.allclose(b.to_host(), 1.0)
    state = opt.state_dict()
    fresh = nc.optim.SGD([a, b], lr=0.1, momentum=0.9)
    fresh.load_state_dict(state)
    assert fresh.param_groups[0]["lr"] == 0.5
    a.grad = nc.tensor(np.full(3, 1.0, np.float32), device=device)
    fresh.step()
    assert np.allclose(a.to_host(), -0.5 * (0.9 * 2 + 1))


def test_bad_hyperparameters(device):
    p = nc.tensor(np.ones(2, np.float32), device=device, requires_grad=True)
    with pytest.raises(nc.ShapeError, match="lr"):
        nc.optim.SGD([p], lr=-1)
    with pytest.raises(nc.ShapeError, match="nesterov"):
        nc.optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(nc.ShapeError, match="betas"):
        nc.optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(nc.ShapeError, match="empty"):
        nc.optim.SGD([], lr=0.1)


@pytest.mark.parametrize("width", [1, 8])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_fused_launch_over_many_tensors(device, rng, canaries, monkeypatch, kind, width):
    """Ten tensors of odd sizes (width 8: two launches, 8 + 2), one without a gradient, a second group."""
    import netcl.optim.optimizer as optimizer_module
    monkeypatch.setattr(optimizer_module, "fused_tensors_per_launch", lambda device: width)
    shapes = [(1,), (7,), (13, 3), (31,), (2, 5, 3), (33,), (1, 1), (17,), (9,), (5, 7)]
    hosts = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes]
    params = [nc.tensor(h, device=device, requires_grad=True) for h in hosts]
    extra = nc.tensor(np.ones(4, np.float32), device=device, requires_grad=True)
    groups = [{"params": params}, {"params": [extra], "lr": 0.5}]
    opt = (nc.optim.SGD(groups, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True) if kind == "sgd"
           else nc.optim.Adam(groups, lr=0.01, weight_decay=0.01))
    grads = [[rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes] for _ in range(3)]
    for step in grads:
        for k, (p, g) in enumerate(zip(params, step)):
            p.grad = None if k == 3 else nc.tensor(g, device=device)
        extra.grad = nc.tensor(np.ones(4, np.float32), device=device)
        opt.step()
    for k, (p, h) in enumerate(zip(params, hosts)):
        seq = [step[k] for step in grads]
        if k == 3:
            assert np.array_equal(p.to_host(), h), "a parameter without a gradient is left alone"
        elif kind == "sgd":
            settings = dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)
            assert_close_to_scale(p.to_host(), _sgd_ref(h, seq, **settings)[0], _sgd_scale(h, seq, **settings)[0],
                                  1e-6, f"tensor {k}")
        else:
            assert_close_to_scale(p.to_host(), *_adam_ref(h, seq, 0.01, 0.9, 0.999, 1e-8, 0.01), 1e-6, f"tensor {k}")
    ones = [np.ones(4)] * 3
    if kind == "sgd":
        settings = dict(lr=0.5, momentum=0.9, weight_decay=0.01, nesterov=True)
        expected, scale = _sgd_ref(np.ones(4), ones, **settings)[0], _sgd_scale(np.ones(4), ones, **settings)[0]
    else:
        expected, scale = _adam_ref(np.ones(4), ones, 0.5, 0.9, 0.999, 1e-8, 0.01)
    assert_close_to_scale(extra.to_host(), expected, scale, 1e-6, "second group with its own lr")


def _adamw_ref(p, grads, lr, b1, b2, eps, weight_decay):
    """torch.optim.AdamW written out: p ← p·(1 − lr·wd), then Adam's step on the undecayed gradient."""
    p = p.astype(np.float64).copy()
    scale = np.abs(p)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        p *= 1 - lr * weight_decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
        p -= step
        scale = scale + np.abs(step) + np.abs(lr * weight_decay * p)
    return p, scale


@pytest.mark.parametrize("settings", [dict(), dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.3),
                                      dict(lr=0.02, weight_decay=0.0)])
@pytest.mark.parametrize("shape", [(1,), (7, 13), (31,)])
def test_adamw_matches_pytorch_semantics(device, rng, canaries, settings, shape):
    p0 = rng.uniform(-2, 2, size=shape).astype(np.float32)
    grads = [rng.uniform(-2, 2, size=shape).astype(np.float32) for _ in range(5)]
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.AdamW([p], **settings)
    assert opt.param_groups[0]["weight_decay"] == settings.get("weight_decay", 1e-2)  # PyTorch's default
    for g in grads:
        p.grad = nc.tensor(g, device=device)
        opt.step()
    full = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    full.update(settings)
    ref, scale = _adamw_ref(p0, grads, full["lr"], *full["betas"], full["eps"], full["weight_decay"])
    assert_close_to_scale(p.to_host(), ref, scale, 1e-6, f"AdamW {settings}")


def test_sgd_positional_arguments_follow_pytorch(device, rng):
    """SGD(p, 0.1, 0.9, 0, 5e-4) is lr, momentum, dampening, weight_decay — as in torch.optim.SGD."""
    p0 = rng.uniform(-2, 2, size=(7,)).astype(np.float32)
    grads = [rng.uniform(-2, 2, size=(7,)).astype(np.float32) for _ in range(3)]
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.SGD([p], 0.1, 0.9, 0.25, 5e-4, False)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["dampening"], group["weight_decay"], group["nesterov"]) == (
        0.1, 0.9, 0.25, 5e-4, False)
    for g in grads:
        p.grad = nc.tensor(g, device=device)
        opt.step()
    settings = dict(lr=0.1, momentum=0.9, dampening=0.25, weight_decay=5e-4)
    assert_close_to_scale(p.to_host(), _sgd_ref(p0, grads, **settings)[0], _sgd_scale(p0, grads, **settings)[0],
                          1e-6, "positional SGD")


def test_zero_grad_set_to_none_or_in_place(device, rng):
    p = nc.tensor(rng.uniform(-1, 1, size=(13,)).astype(np.float32), device=device, requires_grad=True)
    opt = nc.optim.SGD([p], lr=0.1)
    grad = nc.tensor(rng.uniform(-1, 1, size=(13,)).astype(np.float32), device=device)
    p.grad = grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and np.array_equal(grad.to_host(), np.zeros(13, np.float32))
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_adam_state_dict_round_trip_continues_identically(device, rng, tmp_path, kind):
    """Saved through nc.save and loaded into a fresh optimizer, Adam's moments and step count continue."""
    p0 = rng.uniform(-2, 2, size=(7, 3)).astype(np.float32)
    grads = [rng.uniform(-2, 2, size=p0.shape).astype(np.float32) for _ in range(4)]
    a = nc.tensor(p0, device=device, requires_grad=True)
    b = nc.tensor(p0, device=device, requires_grad=True)
    make = getattr(nc.optim, kind)
    straight = make([a], lr=0.01, weight_decay=0.1)
    for g in grads:
        a.grad = nc.tensor(g, device=device)
        straight.step()
    first = make([b], lr=0.01, weight_decay=0.1)
    for g in grads[:2]:
        b.grad = nc.tensor(g, device=device)
        first.step()
    nc.save(first.state_dict(), tmp_path / "opt.ncl")
    second = make([b], lr=0.5, weight_decay=0.1)
    second.load_state_dict(nc.load(tmp_path / "opt.ncl"))
    assert second.param_groups[0]["lr"] == 0.01 and second.param_groups[0]["betas"] == (0.9, 0.999)
    for g in grads[2:]:
        b.grad = nc.tensor(g, device=device)
        second.step()
    assert np.array_equal(a.to_host(), b.to_host())


def test_add_param_group_rejects_a_parameter_twice(device):
    p = nc.tensor(np.ones(2, np.float32), device=device, requires_grad=True)
    q = nc.tensor(np.ones(3, np.float32), device=device, requires_grad=True)
    opt = nc.optim.SGD([p], lr=0.1, momentum=0.5)
    opt.add_param_group({"params": q, "lr": 0.2})
    assert opt.param_groups[1]["lr"] == 0.2 and opt.param_groups[1]["momentum"] == 0.5
    with pytest.raises(nc.ShapeError, match="two groups"):
        opt.add_param_group({"params": [p]})
