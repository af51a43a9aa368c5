"""CrossEntropyLoss (class weights, ignore_index, reductions, label smoothing), NLLLoss and MSELoss against
float64 NumPy written from PyTorch's formulas, finite differences, canaries; and against PyTorch itself
when it is installed."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from nn_reference import finite_difference
from util import assert_close


def loss_ref(x, target, weight=None, ignore_index=-100, reduction="mean", smoothing=0.0, log_probs=False):
    """PyTorch's cross_entropy (log_probs=False) or nll_loss (True) in float64: (loss, d loss / d x)."""
    x = np.asarray(x, np.float64)
    n, c = x.shape
    w = np.ones(c) if weight is None else np.asarray(weight, np.float64)
    keep = target != ignore_index
    safe = np.where(keep, target, 0)

    def value(z):
        if log_probs:
            logp = z
        else:
            m = z.max(1, keepdims=True)
            logp = z - m - np.log(np.exp(z - m).sum(1, keepdims=True))
        w_t = w[safe] * keep
        rows = -(w_t * logp[np.arange(n), safe])
        if smoothing:
            rows = (1 - smoothing) * rows + smoothing / c * (-(logp * w).sum(1)) * keep
        if reduction == "none":
            return rows
        return rows.sum() / w_t.sum() if reduction == "mean" else rows.sum()

    out = value(x)
    if reduction == "none":
        return out, None
    return out, finite_difference(lambda z: value(z), x, 1e-6)


CASES = [  # n, c, weighted, ignore, reduction, smoothing
    (1, 1, False, False, "mean", 0.0), (7, 5, False, False, "sum", 0.0), (13, 10, True, False, "mean", 0.0),
    (13, 10, True, True, "mean", 0.0), (31, 7, False, True, "mean", 0.1), (31, 7, True, True, "mean", 0.25),
    (7, 13, True, True, "sum", 0.3), (7, 3, True, True, "none", 0.2), (64, 10, False, False, "none", 0.0),
]


@pytest.mark.parametrize("n,c,weighted,ignore,reduction,smoothing", CASES)
def test_cross_entropy_options(device, rng, canaries, n, c, weighted, ignore, reduction, smoothing):
    x_h = rng.uniform(-3, 3, size=(n, c)).astype(np.float32)
    t_h = rng.integers(0, c, size=n).astype(np.int64)
    ignore_index = int(t_h[0]) if ignore and n > 1 else -100  # a class index that is ignored
    w_h = rng.uniform(0.2, 2, size=c).astype(np.float32) if weighted else None
    loss_fn = nc.nn.CrossEntropyLoss(weight=None if w_h is None else nc.tensor(w_h, device=device),
                                     ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)
    x = nc.tensor(x_h, device=device, requires_grad=True)
    loss = loss_fn(x, nc.tensor(t_h, device=device))
    expected, grad = loss_ref(x_h, t_h, w_h, ignore_index, reduction, smoothing)
    assert_close(loss.to_host(), expected, 1e-5, "loss")
    if reduction == "none":
        gy = rng.uniform(-1, 1, size=n).astype(np.float32)
        loss.backward(nc.tensor(gy, device=device))
        grad = finite_difference(lambda z: float(loss_ref(z, t_h, w_h, ignore_index, "none", smoothing)[0] @ gy), x_h)
    else:
        loss.backward()
    assert_close(x.grad.to_host(), grad, 1e-4, "grad")


@pytest.mark.parametrize("weighted,reduction", [(False, "mean"), (True, "mean"), (True, "sum"), (True, "none")])
def test_nll_loss_after_log_softmax(device, rng, canaries, weighted, reduction):
    n, c = 13, 7
    x_h = rng.uniform(-3, 3, size=(n, c)).astype(np.float32)
    t_h = rng.integers(0, c, size=n).astype(np.int64)
    t_h[3] = -100
    w_h = rng.uniform(0.2, 2, size=c).astype(np.float32) if weighted else None
    x = nc.tensor(x_h, device=device, requires_grad=True)
    logp = nc.nn.LogSoftmax(dim=1)(x)
    loss = nc.nn.NLLLoss(weight=w_h, reduction=reduction)(logp, nc.tensor(t_h, device=device))
    ce = nc.nn.CrossEntropyLoss(weight=w_h, reduction=reduction)(x, nc.tensor(t_h, device=device))
    expected, _ = loss_ref(x_h, t_h, w_h, reduction=reduction)
    assert_close(loss.to_host(), expected, 1e-5, "nll(log_softmax) == cross_entropy reference")
    assert_close(ce.to_host(), expected, 1e-5, "cross_entropy")
    gy = rng.uniform(-1, 1, size=loss.shape).astype(np.float32)
    loss.backward(nc.tensor(gy, device=device))
    logp_h = logp.to_host().astype(np.float64)
    g_logp = finite_difference(lambda z: float(np.sum(loss_ref(z, t_h, w_h, reduction=reduction,
                                                               log_probs=True)[0] * gy)), logp_h)
    softmax = np.exp(logp_h)
    g_x = g_logp - softmax * g_logp.sum(1, keepdims=True)
    assert_close(x.grad.to_host(), g_x, 1e-4, "grad through log_softmax and nll")


def test_cross_entropy_finite_differences_float64_with_every_option(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    x_h = rng.normal(size=(7, 5))
    t_h = np.array([0, 4, 2, -1, 3, 1, 2])
    w_h = rng.uniform(0.5, 2, 5)
    x = nc.tensor(x_h, device=device, requires_grad=True)
    loss = F.cross_entropy(x, t_h, weight=w_h, ignore_index=-1, label_smoothing=0.15)
    loss.backward()
    expected, grad = loss_ref(x_h, t_h, w_h, -1, "mean", 0.15)
    assert abs(loss.item() - expected) <= 1e-12 * max(1.0, abs(expected))
    assert_close(x.grad.to_host(), grad, 1e-7, "float64 grad")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(device, rng, canaries, reduction):
    a_h, b_h = rng.normal(size=(7, 3, 5)).astype(np.float32), rng.normal(size=(7, 3, 5)).astype(np.float32)
    a = nc.tensor(a_h, device=device, requires_grad=True)
    loss = nc.nn.MSELoss(reduction=reduction)(a, nc.tensor(b_h, device=device))
    d = a_h.astype(np.float64) - b_h
    expected = {"mean": (d * d).mean(), "sum": (d * d).sum(), "none": d * d}[reduction]
    assert_close(loss.to_host(), expected, 1e-5, "mse")
    gy = np.ones(loss.shape, np.float32) if reduction == "none" else None
    loss.backward(None if gy is None else nc.tensor(gy, device=device))
    scale = 2 / d.size if reduction == "mean" else 2
    assert_close(a.grad.to_host(), scale * d, 1e-5, "mse grad")


def test_loss_bad_arguments(device):
    with pytest.raises(nc.ShapeError, match="first argument is the class weight"):
        nc.nn.CrossEntropyLoss("sum")
    with pytest.raises(nc.ShapeError, match="reduction"):
        nc.nn.CrossEntropyLoss(reduction="avg")
    with pytest.raises(nc.ShapeError, match="label_smoothing"):
        nc.nn.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(nc.ShapeError, match=r"weight must be a float32 tensor of shape \(3,\)"):
        F.cross_entropy(nc.zeros((2, 3), device=device), [0, 1], weight=np.ones(4, np.float32))
    with pytest.raises(nc.ShapeError, match="same shape"):
        nc.nn.MSELoss()(nc.zeros((2, 3), device=device), nc.zeros((3, 2), device=device))
    with pytest.raises(nc.ShapeError, match="size_average"):
        F.cross_entropy(nc.zeros((2, 3), device=device), [0, 1], size_average=True)


def test_matches_pytorch(device, rng):
    torch = pytest.importorskip("torch")
    x_h = rng.normal(size=(13, 6))
    t_h = rng.integers(0, 6, size=13)
    t_h[[2, 5]] = 4
    w_h = rng.uniform(0.3, 2, 6)
    for kwargs in ({}, {"weight": w_h}, {"ignore_index": 4}, {"weight": w_h, "ignore_index": 4,
                                                              "label_smoothing": 0.2},
                   {"label_smoothing": 0.1, "ignore_index": 4}, {"reduction": "sum", "weight": w_h,
                                                                  "label_smoothing": 0.3}):
        tx = torch.tensor(x_h, requires_grad=True)
        tkw = {k: (torch.tensor(v) if k == "weight" else v) for k, v in kwargs.items()}
        ref = torch.nn.functional.cross_entropy(tx, torch.tensor(t_h), **tkw)
        ref.backward()
        x = nc.tensor(x_h.astype(np.float32), device=device, requires_grad=True)
        ours = F.cross_entropy(x, t_h, **kwargs)
        ours.backward()
        assert_close(ours.to_host(), ref.detach().numpy(), 1e-5, f"loss {kwargs}")
        assert_close(x.grad.to_host(), tx.grad.numpy(), 1e-4, f"grad {kwargs}")


# ---- class indices out of range: nc.ClassIndexError ---------------------------------------------------
LOSSES = {"cross_entropy": (F.cross_entropy, False), "nll_loss": (F.nll_loss, True)}


def _inputs(device, rng, n, c, log_probs):
    x_h = rng.uniform(-2, 2, size=(n, c)).astype(np.float32)
    if log_probs:
        x_h = x_h - np.log(np.exp(x_h).sum(1, keepdims=True))
    return nc.tensor(x_h, device=device, requires_grad=True)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("bad", [12, 10, -1, -5])
def test_host_targets_out_of_range_raise_before_upload(device, rng, name, bad):
    loss_fn, log_probs = LOSSES[name]
    x = _inputs(device, rng, 7, 10, log_probs)
    t_h = rng.integers(0, 10, size=7)
    t_h[4], t_h[6] = bad, bad + 1
    with pytest.raises(nc.ClassIndexError, match=rf"{name}: class index {bad} at position 4 .* 10 classes") as info:
        loss_fn(x, t_h)
    error = info.value
    assert isinstance(error, IndexError)
    assert (error.index, error.num_classes, error.position, error.ignore_index) == (bad, 10, 4, -100)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("bad", [12, -5])
def test_device_targets_out_of_range_raise_at_the_next_host_read(device, rng, name, reduction, bad):
    loss_fn, log_probs = LOSSES[name]
    n, c = 131, 10  # the kernel's 64 work-items take rows l, l + 64, l + 128
    x = _inputs(device, rng, n, c, log_probs)
    t_h = rng.integers(0, c, size=n)
    # -100 is ignore_index; of the bad rows 70 comes first, though item 1 (row 129) finds its own first
    t_h[[5, 129, 70, 75]] = [-100, c + 3, bad, c + 7]
    loss = loss_fn(x, nc.tensor(t_h, device=device), reduction=reduction)  # no wait for the device here
    with pytest.raises(nc.ClassIndexError, match=rf"class index {bad} at position 70") as info:
        loss.to_host()
    assert (info.value.loss, info.value.index, info.value.num_classes, info.value.position) == (name, bad, c, 70)
    # the record is cleared once raised: a valid batch afterwards computes as usual
    t_h[[129, 70, 75]] = 0
    expected, _ = loss_ref(x.to_host(), t_h, None, -100, reduction, log_probs=log_probs)
    assert_close(loss_fn(x, nc.tensor(t_h, device=device), reduction=reduction).to_host(), expected, 1e-5, "loss")


@pytest.mark.parametrize("name", LOSSES)
def test_ignore_index_out_of_range_is_allowed(device, rng, name):
    loss_fn, log_probs = LOSSES[name]
    x = _inputs(device, rng, 9, 4, log_probs)
    for ignore_index in (-1, 4, 250):
        t_h = rng.integers(0, 4, size=9)
        t_h[[0, 7]] = ignore_index
        expected, _ = loss_ref(x.to_host(), t_h, None, ignore_index, "sum", log_probs=log_probs)
        for target in (t_h, nc.tensor(t_h, device=device)):  # host- and device-side checks
            value = loss_fn(x, target, ignore_index=ignore_index, reduction="sum").item()
            assert abs(value - expected) <= 1e-5 * abs(expected), (ignore_index, value, expected)


def test_bad_device_targets_raise_at_the_optimizer_step_before_any_update(device, rng):
    model = nc.nn.Linear(5, 3).to(device)
    optimizer = nc.optim.SGD(model.parameters(), lr=0.5)
    before = {k: v.to_host() for k, v in model.state_dict().items()}
    x = nc.tensor(rng.normal(size=(6, 5)).astype(np.float32), device=device)
    for loss_fn in (nc.nn.CrossEntropyLoss(), lambda y, t: nc.nn.NLLLoss()(F.log_softmax(y, 1), t)):
        loss = loss_fn(model(x), nc.tensor(np.array([0, 2, 1, 3, 0, 1]), device=device))
        loss.backward()  # backward does not wait for the check either
        with pytest.raises(nc.ClassIndexError, match="class index 3 at position 3 is out of range for 3 classes"):
            optimizer.step()
        optimizer.zero_grad()
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v.to_host(), before[k], err_msg=k)
