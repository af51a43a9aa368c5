"""nc.optim.lr_scheduler against PyTorch's schedules written out in closed form (the formulas of
torch.optim.lr_scheduler's documentation), stepped as a training loop steps them: optimizer.step(), then
scheduler.step(); the constructor has already applied step 0."""
from __future__ import annotations

import bisect
import math

import numpy as np
import pytest

import netcl as nc
from netcl.optim import lr_scheduler


def _optimizer(device, kind="sgd", lrs=(0.1,), **settings):
    groups = [{"params": [nc.tensor(np.ones(3, np.float32), device=device, requires_grad=True)], "lr": lr}
              for lr in lrs]
    return nc.optim.SGD(groups, lr=lrs[0], **settings) if kind == "sgd" else nc.optim.Adam(groups, lr=lrs[0])


def _run(optimizer, scheduler, steps):
    """The rates in force for steps 0..steps-1 (what each optimizer.step() used), per group."""
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in optimizer.param_groups])
        assert scheduler.get_last_lr() == seen[-1]
        scheduler.step()
    return np.array(seen)


def _assert_rates(actual, expected, what):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-15, err_msg=what)


def test_step_lr(device):
    opt = _optimizer(device, lrs=(0.1, 0.03))
    sched = lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    rates = _run(opt, sched, 13)
    expected = [[base * 0.5 ** (t // 3) for base in (0.1, 0.03)] for t in range(13)]
    _assert_rates(rates, expected, "StepLR")
    assert sched.last_epoch == 13


def test_multistep_lr_counts_repeated_milestones(device):
    opt = _optimizer(device)
    sched = lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 5, 9], gamma=0.1)
    rates = _run(opt, sched, 12)[:, 0]
    _assert_rates(rates, [0.1 * 0.1 ** bisect.bisect_right([2, 5, 5, 9], t) for t in range(12)], "MultiStepLR")


@pytest.mark.parametrize("T_max,eta_min", [(7, 0.0), (13, 1e-3), (1, 0.01)])
def test_cosine_annealing_lr_follows_the_closed_form_past_t_max(device, T_max, eta_min):
    opt = _optimizer(device, lrs=(0.1, 0.02))
    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=T_max, eta_min=eta_min)
    steps = 2 * T_max + 3
    rates = _run(opt, sched, steps)
    expected = [[eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / T_max)) / 2 for base in (0.1, 0.02)]
                for t in range(steps)]
    np.testing.assert_allclose(rates, expected, rtol=1e-9, atol=1e-12)


def test_lambda_lr_per_group(device):
    opt = _optimizer(device, lrs=(0.1, 0.5))
    sched = lr_scheduler.LambdaLR(opt, [lambda e: 0.9 ** e, lambda e: 1.0 / (e + 1)])
    rates = _run(opt, sched, 9)
    _assert_rates(rates, [[0.1 * 0.9 ** t, 0.5 / (t + 1)] for t in range(9)], "LambdaLR")


def _one_cycle_reference(t, total, max_lr, pct_start=0.3, div=25.0, final_div=1e4, three_phase=False,
                         strategy="cos", base_m=0.85, max_m=0.95):
    """PyTorch's OneCycleLR rate and momentum at step t, written out phase by phase."""
    def anneal(a, b, pct):
        return b + (a - b) / 2 * (math.cos(math.pi * pct) + 1) if strategy == "cos" else (b - a) * pct + a
    initial = max_lr / div
    low = initial / final_div
    up = pct_start * total - 1
    if three_phase:
        phases = [(up, initial, max_lr, max_m, base_m), (2 * pct_start * total - 2, max_lr, initial, base_m, max_m),
                  (total - 1, initial, low, max_m, max_m)]
    else:
        phases = [(up, initial, max_lr, max_m, base_m), (total - 1, max_lr, low, base_m, max_m)]
    start = 0.0
    for i, (end, lr_a, lr_b, m_a, m_b) in enumerate(phases):
        if t <= end or i == len(phases) - 1:
            pct = (t - start) / (end - start)
            return anneal(lr_a, lr_b, pct), anneal(m_a, m_b, pct)
        start = end


@pytest.mark.parametrize("settings", [dict(), dict(pct_start=0.25, anneal_strategy="linear"),
                                      dict(three_phase=True, div_factor=10.0, final_div_factor=100.0),
                                      dict(base_momentum=0.8, max_momentum=0.9)])
def test_one_cycle_lr_with_sgd_momentum(device, settings):
    total = 37
    opt = _optimizer(device, momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=total, **settings)
    ref_kw = dict(pct_start=settings.get("pct_start", 0.3), div=settings.get("div_factor", 25.0),
                  final_div=settings.get("final_div_factor", 1e4), three_phase=settings.get("three_phase", False),
                  strategy=settings.get("anneal_strategy", "cos"), base_m=settings.get("base_momentum", 0.85),
                  max_m=settings.get("max_momentum", 0.95))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 / ref_kw["div"], rel=1e-12)  # the constructor's step 0
    for t in range(total):
        lr, momentum = _one_cycle_reference(t, total, 0.2, **ref_kw)
        group = opt.param_groups[0]
        assert group["lr"] == pytest.approx(lr, rel=1e-12, abs=1e-15), t
        assert group["momentum"] == pytest.approx(momentum, rel=1e-12), t
        sched.step()
    with pytest.raises(nc.ShapeError, match="total_steps"):
        sched.step()  # one past the end, as PyTorch refuses


def test_one_cycle_lr_cycles_adam_beta1_and_epochs_form(device):
    opt = _optimizer(device, kind="adam")
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.01, epochs=3, steps_per_epoch=7, cycle_momentum=True)
    assert sched.total_steps == 21
    for t in range(21):
        lr, momentum = _one_cycle_reference(t, 21, 0.01)
        assert opt.param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12, abs=1e-15)
        assert opt.param_groups[0]["betas"] == pytest.approx((momentum, 0.999), rel=1e-12)
        sched.step()


def test_scheduled_rate_reaches_the_update(device, rng):
    """The kernel uses the scheduled lr: SGD's step equals lr_t · grad with StepLR halving the rate."""
    p0 = rng.uniform(-1, 1, size=(7,)).astype(np.float32)
    g = rng.uniform(-1, 1, size=(7,)).astype(np.float32)
    p = nc.tensor(p0, device=device, requires_grad=True)
    opt = nc.optim.SGD([p], lr=0.4)
    sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    expected = p0.astype(np.float64)
    for t in range(3):
        p.grad = nc.tensor(g, device=device)
        opt.step()
        sched.step()
        expected = expected - 0.4 * 0.5 ** t * g
    np.testing.assert_allclose(p.to_host(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=23, three_phase=True),
    lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=9, eta_min=0.001),
    lambda opt: lr_scheduler.MultiStepLR(opt, [3, 6], gamma=0.3),
    lambda opt: lr_scheduler.StepLR(opt, 4, gamma=0.7),
], ids=["onecycle", "cosine", "multistep", "step"])
def test_state_dict_round_trip_through_a_checkpoint(device, tmp_path, make):
    """Resume: a fresh optimizer and scheduler loaded from nc.save'd state continue the same sequence."""
    opt = _optimizer(device, momentum=0.9)
    sched = make(opt)
    straight = _run(opt, sched, 20)
    opt = _optimizer(device, momentum=0.9)
    sched = make(opt)
    first = _run(opt, sched, 8)
    nc.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, tmp_path / "ck.ncl")
    state = nc.load(tmp_path / "ck.ncl")
    opt = _optimizer(device, lrs=(0.5,), momentum=0.1)
    opt.load_state_dict(state["optimizer"])
    sched = make(opt)  # construction applies step 0 ...
    sched.load_state_dict(state["scheduler"])  # ... and loading puts the schedule back where it was
    opt.load_state_dict(state["optimizer"])
    rest = _run(opt, sched, 12)
    _assert_rates(np.concatenate([first, rest]), straight, "resumed schedule")
    assert sched.last_epoch == 20


def test_resuming_with_last_epoch_needs_initial_lr(device):
    opt = _optimizer(device)
    with pytest.raises(nc.ShapeError, match="initial_lr"):
        lr_scheduler.StepLR(opt, 2, last_epoch=5)
    with pytest.raises(nc.ShapeError, match="step_size"):
        lr_scheduler.StepLR(opt, 0)
    with pytest.raises(nc.ShapeError, match="momentum or betas"):
        lr_scheduler.OneCycleLR(_FakeOptimizer(), max_lr=0.1, total_steps=10)


class _FakeOptimizer:
    """An optimizer without momentum or betas (OneCycleLR's cycle_momentum cannot apply)."""
    defaults = {"lr": 0.1}

    def __init__(self):
        self.param_groups = [{"lr": 0.1, "params": []}]
