"""BatchNorm1d/2d: forward and backward against float64 NumPy on odd sizes with canaries, PyTorch's
running-statistics semantics (momentum, momentum=None, track_running_stats, num_batches_tracked), eval,
the fused ReLU and residual, finite differences in float64, state_dict keys and bad inputs."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from bn_reference import batch_norm_ref, grad_x_scale, running_update_ref
from nn_reference import finite_difference
from util import assert_close, assert_close_to_scale

SHAPES = [(7, 3, 5, 5), (13, 7), (5, 4, 9), (3, 1, 1, 1), (3, 13, 31, 1), (31, 2, 7, 3)]


def _t(a, device, grad=False):
    return nc.tensor(np.ascontiguousarray(a), device=device, requires_grad=grad)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True), (False, True),
                                           ("relu6", False), ("relu6", True)])
def test_batch_norm_training_forward_backward(device, rng, canaries, shape, relu, residual):
    c = shape[1]
    x_h = rng.uniform(-2, 3, size=shape).astype(np.float32)
    w_h = rng.uniform(0.5, 2, size=c).astype(np.float32) * rng.choice([-1, 1], size=c).astype(np.float32)
    if relu == "relu6":
        w_h *= 4  # past ReLU6's upper bound
    b_h = rng.uniform(-1, 1, size=c).astype(np.float32)
    r_h = rng.uniform(-1, 1, size=shape).astype(np.float32) if residual else None
    x, w, b = _t(x_h, device, True), _t(w_h, device, True), _t(b_h, device, True)
    r = _t(r_h, device, True) if residual else None
    y = F.batch_norm(x, None, None, w, b, training=True, relu=relu is True, relu6=relu == "relu6", residual=r)
    y_ref, grad = batch_norm_ref(x_h, w_h, b_h, relu=relu, residual=r_h)
    assert_close(y.to_host(), y_ref, 1e-5, "batch_norm forward")
    gy = rng.uniform(-1, 1, size=shape).astype(np.float32)
    y.backward(_t(gy, device))
    gx, gw, gb, gr = grad(gy)
    tol = 1e-4
    # the input gradient's terms cancel (to 6e-5 of their size with 3 values a channel): bound its error
    # by their magnitude, not by the result's
    assert_close_to_scale(x.grad.to_host(), gx, grad_x_scale(x_h, w_h, gy), 1e-5, "grad x")
    assert_close(w.grad.to_host(), gw, tol, "grad weight")
    assert_close(b.grad.to_host(), gb, tol, "grad bias")
    if residual:
        assert_close(r.grad.to_host(), gr, tol, "grad residual")


@pytest.mark.parametrize("cls,shape", [(nc.nn.BatchNorm2d, (7, 3, 5, 3)), (nc.nn.BatchNorm1d, (13, 5)),
                                       (nc.nn.BatchNorm1d, (5, 3, 7))])
@pytest.mark.parametrize("momentum", [0.1, 0.3, None])
def test_running_statistics_follow_pytorch(device, rng, cls, shape, momentum):
    bn = cls(shape[1], momentum=momentum, device=device)
    rm, rv = np.zeros(shape[1]), np.ones(shape[1])
    for step in range(1, 4):
        x_h = rng.normal(step, 2.0, size=shape).astype(np.float32)
        y = bn(_t(x_h, device))
        factor = 1.0 / step if momentum is None else momentum
        rm, rv = running_update_ref(rm, rv, x_h, factor)
        assert_close(y.to_host(), batch_norm_ref(x_h, None, None)[0], 1e-5, "training output")
        assert_close(bn.running_mean.to_host(), rm, 1e-5, f"running_mean after {step}")
        assert_close(bn.running_var.to_host(), rv, 1e-5, f"running_var after {step}")
        assert int(bn.num_batches_tracked.to_host()) == step
        assert bn.num_batches_tracked.dtype == np.int64
    bn.eval()
    x_h = rng.normal(0, 1, size=shape).astype(np.float32)
    y = bn(_t(x_h, device))
    assert_close(y.to_host(), batch_norm_ref(x_h, None, None, mean=rm, var=rv)[0], 1e-5, "eval output")
    assert int(bn.num_batches_tracked.to_host()) == 3, "eval must not count batches"
    assert_close(bn.running_mean.to_host(), rm, 1e-6, "eval must not move running_mean")


def test_eval_backward_treats_running_statistics_as_constants(device, rng, canaries):
    bn = nc.nn.BatchNorm2d(5, device=device)
    bn.load_state_dict({"running_mean": rng.normal(size=5), "running_var": rng.uniform(0.5, 2, 5),
                        "weight": rng.normal(size=5), "bias": rng.normal(size=5), "num_batches_tracked": np.int64(4)})
    bn.eval()
    x_h = rng.normal(size=(3, 5, 7, 7)).astype(np.float32)
    x = _t(x_h, device, True)
    y = bn(x)
    y_ref, grad = batch_norm_ref(x_h, bn.weight.to_host(), bn.bias.to_host(), mean=bn.running_mean.to_host(),
                                 var=bn.running_var.to_host())
    assert_close(y.to_host(), y_ref, 1e-5, "eval forward")
    gy = rng.normal(size=y.shape).astype(np.float32)
    y.backward(_t(gy, device))
    gx, gw, gb, _ = grad(gy)
    assert_close(x.grad.to_host(), gx, 1e-5, "eval grad x")
    assert_close(bn.weight.grad.to_host(), gw, 1e-5, "eval grad weight")
    assert_close(bn.bias.grad.to_host(), gb, 1e-5, "eval grad bias")


def test_track_running_stats_false_always_uses_batch_statistics(device, rng):
    bn = nc.nn.BatchNorm2d(3, affine=False, track_running_stats=False, device=device)
    assert bn.running_mean is None and bn.weight is None
    assert list(bn.state_dict()) == []
    x_h = rng.normal(2, 3, size=(4, 3, 5, 5)).astype(np.float32)
    for mode in (bn.train, bn.eval):
        mode()
        assert_close(bn(_t(x_h, device)).to_host(), batch_norm_ref(x_h, None, None)[0], 1e-5, "batch statistics")


def test_state_dict_keys_and_numpy_round_trip(device, rng):
    bn = nc.nn.BatchNorm2d(4, device=device)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    assert [n for n, _ in bn.named_parameters()] == ["weight", "bias"]
    state = {k: rng.normal(size=4).astype(np.float32) for k in ("weight", "bias", "running_mean")}
    state["running_var"] = rng.uniform(0.5, 2, 4).astype(np.float32)
    state["num_batches_tracked"] = np.array(17, np.int64)
    bn.load_state_dict(state)
    back = {k: v.to_host() for k, v in bn.state_dict().items()}
    for k, v in state.items():
        np.testing.assert_array_equal(back[k], v)
    assert back["num_batches_tracked"].dtype == np.int64
    with pytest.raises(nc.NetclError, match="missing keys.*running_var"):
        bn.load_state_dict({k: v for k, v in state.items() if k != "running_var"})


def test_gradients_finite_differences_float64(device, rng):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    shape = (3, 2, 3, 1)
    x_h, r_h = rng.normal(size=shape), rng.normal(size=shape)
    w_h, b_h = rng.normal(size=2), rng.normal(size=2)
    gy = rng.normal(size=shape)

    def f(x, w, b, r):
        with nc.no_grad():
            y = F.batch_norm(_t(x, device), None, None, _t(w, device), _t(b, device), training=True, relu=True,
                             residual=_t(r, device))
            return float(np.sum(y.to_host() * gy))

    tensors = [_t(a, device, True) for a in (x_h, w_h, b_h, r_h)]
    F.batch_norm(tensors[0], None, None, tensors[1], tensors[2], training=True, relu=True,
                 residual=tensors[3]).backward(_t(gy, device))
    hosts = [x_h, w_h, b_h, r_h]
    for k, name in enumerate(("x", "weight", "bias", "residual")):
        def partial(v, k=k):
            args = list(hosts)
            args[k] = v
            return f(*args)
        assert_close(tensors[k].grad.to_host(), finite_difference(partial, hosts[k]), 1e-6, f"grad {name}")


def test_bad_inputs(device):
    bn = nc.nn.BatchNorm2d(3, device=device)
    with pytest.raises(nc.ShapeError, match="more than 1 value per channel"):
        bn(nc.zeros((1, 3, 1, 1), device=device))
    with pytest.raises(nc.ShapeError, match="4D input"):
        bn(nc.zeros((2, 3), device=device))
    with pytest.raises(nc.ShapeError, match="3 channels|has 4 channels"):
        bn(nc.zeros((2, 4, 3, 3), device=device))
    with pytest.raises(nc.ShapeError, match="2D or 3D"):
        nc.nn.BatchNorm1d(3, device=device)(nc.zeros((2, 3, 4, 4), device=device))
    with pytest.raises(nc.ShapeError, match="momentum"):
        nc.nn.BatchNorm2d(3, momentum=2.0)
    with pytest.raises(nc.ShapeError, match="num_features"):
        nc.nn.BatchNorm2d(0)
    with pytest.raises(nc.ShapeError, match="running_mean"):
        F.batch_norm(nc.zeros((2, 3), device=device), None, None, training=False)


@pytest.mark.parametrize("item_runs", [True, False])
@pytest.mark.parametrize("shape", [(13, 7), (3, 5, 7, 9), (65, 2, 3, 1)])
@pytest.mark.parametrize("relu", [True, "relu6"])
def test_both_kernel_geometries(device, rng, canaries, monkeypatch, item_runs, shape, relu):
    """The CPU form (one sequential loop per channel and per row) and the GPU form (interleaved items,
    tree reductions) compute the same thing on whatever device runs the tests."""
    from netcl.ops import batchnorm
    monkeypatch.setattr(batchnorm, "_item_runs", lambda device: item_runs)
    c = shape[1]
    x_h = rng.uniform(-2, 3, size=shape).astype(np.float32)
    w_h, b_h = rng.normal(size=c).astype(np.float32) * 4, rng.normal(size=c).astype(np.float32)
    r_h = rng.normal(size=shape).astype(np.float32)
    x, w, b, r = (_t(a, device, True) for a in (x_h, w_h, b_h, r_h))
    y = F.batch_norm(x, None, None, w, b, training=True, relu=relu is True, relu6=relu == "relu6", residual=r)
    y_ref, grad = batch_norm_ref(x_h, w_h, b_h, relu=relu, residual=r_h)
    assert_close(y.to_host(), y_ref, 1e-5, "forward")
    gy = rng.normal(size=shape).astype(np.float32)
    y.backward(_t(gy, device))
    for t, ref, what in zip((x, w, b, r), grad(gy), ("x", "weight", "bias", "residual")):
        assert_close(t.grad.to_host(), ref, 1e-4, f"grad {what}")


def test_relu6_fuses_after_batch_norm_and_into_a_folded_convolution(device, rng, canaries, unfused):
    """Conv2d, BatchNorm2d, ReLU6 (MobileNetV2's unit): BN + ReLU6 is one kernel in training, and in
    inference the BatchNorm folds into the convolution with ReLU6 in its epilogue; both equal the steps
    run one by one, gradients included."""
    from netcl.nn import fusion
    conv = nc.nn.Conv2d(3, 5, 3, padding=1, bias=False, device=device)
    bn = nc.nn.BatchNorm2d(5, device=device)
    bn.weight = _t(rng.uniform(20, 30, size=5).astype(np.float32), device, True)  # well past the clamp at 6
    seq = nc.nn.Sequential(conv, bn, nc.nn.ReLU6())
    steps = list(seq)
    assert [n for n, _ in fusion.plan(steps)] == [None, "bn+relu6"]
    x_h = rng.normal(size=(2, 3, 7, 5)).astype(np.float32)
    for mode in ("train", "eval"):
        getattr(seq, mode)()
        outs, grads = [], []
        for fused in (True, False):
            with contextlib.nullcontext() if fused else unfused():
                x = _t(x_h, device, True)
                y = seq(x)
                y.backward(_t(np.ones(y.shape, np.float32), device))
            outs.append(y.to_host())
            grads.append(x.grad.to_host())
            conv.weight.grad = None
        assert np.any(outs[0] == 6) and np.any(outs[0] == 0)
        assert_close(outs[0], outs[1], 1e-5, f"{mode}: fused vs unfused")
        assert_close(grads[0], grads[1], 1e-5, f"{mode}: fused vs unfused input gradient")
    with nc.no_grad():
        assert [n for n, _ in fusion.plan(steps)] == ["conv+bn+relu6 (eval: folded)"]
        y = seq(_t(x_h, device)).to_host()
    z = conv(_t(x_h, device))
    ref, _ = batch_norm_ref(z.to_host(), bn.weight.to_host(), bn.bias.to_host(), mean=bn.running_mean.to_host(),
                            var=bn.running_var.to_host(), relu="relu6")
    assert_close(y, ref, 1e-5, "folded eval vs float64")


def test_hardswish_folds_into_a_convolution_for_inference(device, rng, canaries):
    """Conv2d, BatchNorm2d, Hardswish (MobileNetV3's unit) in inference: the BatchNorm folds into the
    convolution with Hardswish in its epilogue; with gradients wanted the steps run one by one."""
    from netcl.nn import fusion
    conv = nc.nn.Conv2d(3, 5, 3, padding=1, bias=False, device=device)
    bn = nc.nn.BatchNorm2d(5, device=device)
    bn.weight = _t(rng.uniform(3, 6, size=5).astype(np.float32), device, True)  # across -3 and 3
    seq = nc.nn.Sequential(conv, bn, nc.nn.Hardswish())
    seq.eval()
    steps = list(seq)
    assert [n for n, _ in fusion.plan(steps)] == [None, None, None]
    x_h = rng.normal(size=(2, 3, 7, 5)).astype(np.float32)
    with nc.no_grad():
        assert [n for n, _ in fusion.plan(steps)] == ["conv+bn+hardswish (eval: folded)"]
        y = seq(_t(x_h, device)).to_host()
    unfused = seq(_t(x_h, device)).to_host()
    z, _ = batch_norm_ref(conv(_t(x_h, device)).to_host(), bn.weight.to_host(), bn.bias.to_host(),
                          mean=bn.running_mean.to_host(), var=bn.running_var.to_host())
    assert np.any(z < -3) and np.any(z > 3)
    ref = z * np.clip(z + 3, 0, 6) / 6
    assert_close(y, ref, 1e-5, "folded eval vs float64")
    assert_close(unfused, ref, 1e-5, "unfused eval vs float64")
    with pytest.raises(nc.ShapeError, match="one fused activation"):
        from netcl.ops.batchnorm import batch_norm_apply
        batch_norm_apply(_t(z.astype(np.float32), device), None, None, None, bn.bias, relu=True, hardswish=True)


@pytest.mark.parametrize("tail", ["relu", "relu6", "residual", "residual+relu"])
def test_a_biased_convolution_fuses_its_epilogue_in_inference(device, rng, canaries, tail):
    """Conv2d with a bias followed by a shortcut and/or ReLU (a graph whose exporter folded BatchNorm into
    the convolution): under no_grad one epilogue pass adds the bias [and the shortcut] and applies the
    activation; the result is the float64 reference's, and with gradients wanted the steps run one by one."""
    from netcl.nn import fusion
    from util import conv2d_ref
    conv = nc.nn.Conv2d(3, 5, 3, padding=1, device=device)
    conv.bias = _t(rng.uniform(-4, 4, size=5).astype(np.float32), device, True)
    x_h = (3 * rng.normal(size=(2, 3, 7, 5))).astype(np.float32)
    shortcut_h = rng.normal(size=(2, 5, 7, 5)).astype(np.float32)
    steps = [conv]
    if "residual" in tail:
        steps.append(fusion.Residual(_t(shortcut_h, device)))
    if tail.endswith("relu6"):
        steps.append(nc.nn.ReLU6())
    elif tail.endswith("relu"):
        steps.append(nc.nn.ReLU())
    expected = conv2d_ref(x_h.astype(np.float64), conv.weight.to_host().astype(np.float64), padding=(1, 1))
    expected += conv.bias.to_host().astype(np.float64)[None, :, None, None]
    if "residual" in tail:
        expected += shortcut_h
    if tail.endswith("relu6"):
        expected = np.clip(expected, 0, 6)
    elif tail.endswith("relu"):
        expected = np.maximum(expected, 0)
    with nc.no_grad():
        assert [n for n, _ in fusion.plan(steps)] == [f"conv+{tail} (inference)"]
        y = fusion.run(steps, _t(x_h, device)).to_host()
    assert_close(y, expected, 1e-5, f"conv+{tail}")
    assert fusion.plan(steps)[0][0] != f"conv+{tail} (inference)"  # gradients wanted: not this fusion


@pytest.fixture(params=["runs", "interleaved"])
def split_blocks(request, monkeypatch):
    """Reductions cut into many small blocks (rows and row segments) whose partial results a second kernel
    merges, in the CPU form (a run per item) or the GPU form (interleaved items, tree sums)."""
    from netcl.ops import batchnorm
    monkeypatch.setattr(batchnorm, "MIN_BLOCK", 4)
    monkeypatch.setattr(batchnorm, "BLOCKS_PER_UNIT", 1000)
    monkeypatch.setattr(batchnorm, "_item_runs", lambda device: request.param == "runs")
    return request.param


@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (2, 3, 1, 1), (5, 3, 37), (1, 2, 61, 3), (13, 7)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_reductions_match_float64(device, rng, canaries, split_blocks, shape, dtype):
    """Statistics, running statistics and gradients merged from many blocks of odd sizes equal the float64
    reference."""
    if dtype == np.float64 and not device.has_fp64:
        pytest.skip("device has no float64")
    c = shape[1]
    x_h = rng.uniform(-2, 3, size=shape).astype(dtype)
    w_h, b_h = rng.normal(size=c).astype(dtype) * 3, rng.normal(size=c).astype(dtype)
    rm_h, rv_h = rng.normal(size=c), rng.uniform(0.5, 2, size=c)
    bn = nc.nn.BatchNorm2d(c, momentum=0.3, device=device, dtype=dtype) if len(shape) == 4 else \
        nc.nn.BatchNorm1d(c, momentum=0.3, device=device, dtype=dtype)
    bn.load_state_dict({"weight": w_h, "bias": b_h, "running_mean": rm_h, "running_var": rv_h,
                        "num_batches_tracked": np.int64(0)})
    x = _t(x_h, device, True)
    y = bn(x)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    y_ref, grad = batch_norm_ref(x_h, w_h, b_h)
    assert_close(y.to_host(), y_ref, tol, "forward")
    rm, rv = running_update_ref(rm_h, rv_h, x_h, 0.3)
    assert_close(bn.running_mean.to_host(), rm, tol, "running_mean")
    assert_close(bn.running_var.to_host(), rv, tol, "running_var")
    gy = rng.normal(size=shape).astype(dtype)
    y.backward(_t(gy, device))
    gx, gw, gb, _ = grad(gy)
    assert_close_to_scale(x.grad.to_host(), gx, grad_x_scale(x_h, w_h, gy), tol, "grad x")
    assert_close(bn.weight.grad.to_host(), gw, 10 * tol, "grad weight")
    assert_close(bn.bias.grad.to_host(), gb, 10 * tol, "grad bias")


@pytest.mark.parametrize("geometry", ["default", "split"])
@pytest.mark.parametrize("item_runs", [True, False])
def test_statistics_keep_the_variance_of_data_with_a_large_mean(device, rng, monkeypatch, geometry, item_runs):
    """float32 data at 1000 with a spread of 0.05: E[x^2] - E[x]^2 would lose every digit of the variance
    (the GPU form accumulates in float32 too); the shifted sums and the blocks' merge keep it."""
    from netcl.ops.batchnorm import batch_norm_stats
    from netcl.ops import batchnorm
    monkeypatch.setattr(batchnorm, "_item_runs", lambda device: item_runs)
    if geometry == "split":
        monkeypatch.setattr(batchnorm, "MIN_BLOCK", 64)
        monkeypatch.setattr(batchnorm, "BLOCKS_PER_UNIT", 1000)
    shape = (6, 3, 41, 37)
    x_h = (1000 + 0.05 * rng.normal(size=shape) + np.arange(3)[None, :, None, None] * 0.5).astype(np.float32)
    mean, var = batch_norm_stats(_t(x_h, device))
    x64 = x_h.astype(np.float64)
    assert_close(mean.to_host(), x64.mean((0, 2, 3)), 4e-7, "mean (a few float32 steps at 1000)")
    assert_close(var.to_host(), x64.var((0, 2, 3)), 1e-4, "variance")


@pytest.mark.parametrize("item_runs", [True, False])
def test_training_step_is_bit_identical_run_to_run(device, rng, monkeypatch, item_runs):
    """No atomics and a fixed merge order: the same input gives the same bits, statistics and gradients."""
    from netcl.ops import batchnorm
    monkeypatch.setattr(batchnorm, "_item_runs", lambda device: item_runs)
    monkeypatch.setattr(batchnorm, "MIN_BLOCK", 256)
    shape = (3, 4, 45, 47)
    x_h, gy_h = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    runs = []
    for _ in range(2):
        bn = nc.nn.BatchNorm2d(4, device=device)
        x = _t(x_h, device, True)
        y = nc.nn.functional.relu(bn(x))
        y.backward(_t(gy_h, device))
        runs.append([t.to_host() for t in (y, bn.running_mean, bn.running_var, x.grad, bn.weight.grad,
                                           bn.bias.grad)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)


def test_an_empty_batch_has_undefined_statistics_and_an_empty_output(device):
    from netcl.ops.batchnorm import batch_norm_stats
    x = nc.zeros((0, 3, 4, 4), device=device)
    mean, var = batch_norm_stats(x)
    assert np.all(np.isnan(mean.to_host())) and np.all(np.isnan(var.to_host()))
    assert F.batch_norm(x, None, None, training=True).shape == (0, 3, 4, 4)
