"""BatchNorm folded into a convolution for inference is kept (netcl.nn.fusion.FoldedConvBN) and folded anew
only when a tensor it comes from was written in place or replaced; every in-place write counts in the
tensor's ``version``, a replayed training step's writes included. Outputs after fine-tuning (eager and
captured), load_state_dict and a changed eps must equal a fold computed fresh, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.elementwise import copy_into, fill
from netcl.ops.gemm import gemm
from netcl.runtime.observers import watching_launches
from util import randomize_batchnorm


@pytest.fixture(autouse=True)
def fixed_kernels(monkeypatch):
    # Bit-for-bit comparisons need the same kernels on both sides: no cold-start stand-ins, no strategy
    # that a timing could change between the two.
    monkeypatch.setenv("NETCL_DEFER_BUILDS", "0")
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "im2col")


def make_model():
    return nc.models.resnet8(num_classes=4, in_channels=3, seed=7)


def inference(model, x: np.ndarray) -> np.ndarray:
    with nc.no_grad():
        return model(nc.tensor(x)).to_host()


def fresh_reference(model, x: np.ndarray) -> np.ndarray:
    """The eval output of a new model holding the same values: every fold computed fresh."""
    copy = make_model()
    copy.load_state_dict({k: v.to_host() for k, v in model.state_dict().items()})
    for mine, theirs in zip(copy.modules(), model.modules()):
        if isinstance(mine, nc.nn.BatchNorm2d):
            mine.eps = theirs.eps  # not part of a state_dict
    copy.eval()
    return inference(copy, x)


def batch(rng, n=2):
    return (rng.standard_normal((n, 3, 10, 10)).astype(np.float32), rng.integers(0, 4, n).astype(np.int64))


def fold_launches(device, fn) -> int:
    names = []
    with watching_launches(device, lambda kernel: names.append(kernel.function_name)):
        fn()
    return names.count("bn_fold")


# ---- versions -----------------------------------------------------------------------------------------
def test_every_in_place_write_counts_in_the_version_views_included(device, rng):
    t = nc.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    view = t.reshape(12)
    assert t.version == view.version == 0
    fill(view, 1.5)
    assert t.version == view.version == 1 and t.detach().version == 1
    copy_into(t, nc.tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    assert view.version == 2
    gemm(nc.tensor(rng.standard_normal((3, 5)).astype(np.float32)),
         nc.tensor(rng.standard_normal((5, 4)).astype(np.float32)), c=t, beta=1.0)
    assert view.version == 3
    assert (t + 1.0).version == 0 and t.contiguous().version == 3  # new tensors start at 0; a view shares


def test_optimizer_steps_load_state_dict_and_training_forwards_count_writes(rng):
    model = make_model()
    opt = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    conv, bn = model.conv1, model.bn1
    x, y = batch(rng)
    versions = (conv.weight.version, bn.weight.version, bn.running_mean.version, bn.running_var.version)
    loss = nc.nn.CrossEntropyLoss()(model(nc.tensor(x)), nc.tensor(y))  # training: running statistics move
    assert (bn.running_mean.version, bn.running_var.version) == (versions[2] + 1, versions[3] + 1)
    loss.backward()
    opt.step()
    assert conv.weight.version == versions[0] + 1 and bn.weight.version == versions[1] + 1
    assert opt.state[id(conv.weight)]["momentum_buffer"].version >= 1
    before = conv.weight.version
    model.load_state_dict({"conv1.weight": conv.weight.to_host()}, strict=False)
    assert conv.weight.version == before + 1


def test_a_replayed_training_step_counts_its_writes_as_the_step_as_written_does(rng):
    model = make_model()
    opt = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = nc.training.CapturedStep(model, opt)
    x, y = batch(rng)
    tracked = [model.conv1.weight, model.fc.bias, model.bn1.running_mean, model.layer1[0].bn2.running_var]
    for _ in range(6):
        before = [t.version for t in tracked]
        step(nc.tensor(x), nc.tensor(y))
        assert [t.version for t in tracked] == [v + 1 for v in before], step.status
    assert step.replays >= 2, step.status


# ---- the kept fold ------------------------------------------------------------------------------------
def test_the_fold_is_kept_between_inferences_and_dropped_by_training(device, rng):
    model = make_model()
    randomize_batchnorm(model, rng)
    model.eval()
    x, y = batch(rng)
    pairs = sum(isinstance(m, nc.nn.BatchNorm2d) for m in model.modules())  # each follows a convolution
    assert fold_launches(device, lambda: inference(model, x)) == pairs
    assert fold_launches(device, lambda: inference(model, x)) == 0
    assert model.bn1.folded_conv is not None
    model.train()
    model(nc.tensor(x))
    assert model.bn1.folded_conv is None  # a second copy of the weights is not kept while training
    model.eval()
    assert fold_launches(device, lambda: inference(model, x)) == pairs
    model.bn1.eps = 1e-3
    assert fold_launches(device, lambda: inference(model, x)) == 1
    np.testing.assert_array_equal(inference(model, x), fresh_reference(model, x))


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_fine_tuned_then_evaluated_equals_a_fresh_fold(captured, rng):
    model = make_model()
    randomize_batchnorm(model, rng)
    opt = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = nc.training.CapturedStep(model, opt, enabled=captured)
    infer = nc.training.CapturedInference(model)
    x_eval = batch(rng)[0]
    for round_ in range(3):
        model.eval()
        for _ in range(4):  # replays from the second round on
            out = infer(nc.tensor(x_eval)).to_host()
        np.testing.assert_array_equal(out, fresh_reference(model, x_eval))
        np.testing.assert_array_equal(inference(model, x_eval), out)
        model.train()
        for _ in range(4):
            x, y = batch(rng)
            step(nc.tensor(x), nc.tensor(y))
    assert infer.replaying and infer.replays >= 6, infer.status
    assert step.replaying == captured, step.status


def test_load_state_dict_then_eval_equals_a_fresh_fold(rng):
    model = make_model()
    randomize_batchnorm(model, rng)
    model.eval()
    x = batch(rng)[0]
    infer = nc.training.CapturedInference(model)
    for _ in range(4):
        infer(nc.tensor(x))
    assert infer.replaying, infer.status
    other = make_model()
    randomize_batchnorm(other, rng)
    model.load_state_dict({k: v.to_host() for k, v in other.state_dict().items()})
    other.eval()
    expected = inference(other, x)
    np.testing.assert_array_equal(infer(nc.tensor(x)).to_host(), expected)
    assert infer.replays == 2, infer.status  # the same storage: the replay refolds, nothing is recorded anew
    np.testing.assert_array_equal(inference(model, x), expected)


def test_a_replaced_parameter_is_folded_from(rng):
    model = make_model()
    randomize_batchnorm(model, rng)
    model.eval()
    x = batch(rng)[0]
    inference(model, x)
    conv = model.layer1[0].conv1
    conv.weight = nc.tensor(rng.standard_normal(conv.weight.shape).astype(np.float32), requires_grad=True)
    np.testing.assert_array_equal(inference(model, x), fresh_reference(model, x))


def test_a_replay_enqueues_no_fold_while_nothing_changed(rng):
    model = make_model()
    randomize_batchnorm(model, rng)
    model.eval()
    infer = nc.training.CapturedInference(model)
    x = batch(rng)[0]
    for _ in range(4):
        infer(nc.tensor(x))
    assert infer.replaying, infer.status
    kernels = [c.kernel.function_name for c in infer._replay._commands if hasattr(c, "kernel")]
    assert "bn_fold" not in kernels and len(kernels) == infer.launches
