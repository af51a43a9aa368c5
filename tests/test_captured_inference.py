"""Captured inference (netcl.training.CapturedInference): a replayed forward must compute, bit for bit, what
the forward as written computes, for the captured shape only, and follow parameters changed in place."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import fusion
from util import randomize_batchnorm


@pytest.fixture(autouse=True)
def fixed_kernels(monkeypatch):
    # Bit-for-bit comparisons need the same kernels on both sides: no cold-start stand-ins, no strategy
    # that a timing could change between the two.
    monkeypatch.setenv("NETCL_DEFER_BUILDS", "0")
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "im2col")


class InvertedResidual(nc.nn.Module):
    """MobileNetV2's block: 1×1 expand Conv-BN-ReLU6, 3×3 depthwise Conv-BN-ReLU6, 1×1 linear Conv-BN, + x."""

    def __init__(self, channels: int, expand: int, stride: int):
        super().__init__()
        hidden = channels * expand
        nn = nc.nn
        self.conv = nn.Sequential(
            nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()),
            nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
                          nn.BatchNorm2d(hidden), nn.ReLU6()),
            nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))
        self.residual = stride == 1

    def forward(self, x):
        return fusion.run(list(self.conv) + ([fusion.Residual(x)] if self.residual else []), x)


def small_mobilenet():
    nn = nc.nn
    return nn.Sequential(nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                                       nn.ReLU6()),
                         InvertedResidual(8, 3, 1), InvertedResidual(8, 2, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


MODELS = {"resnet8": (lambda: nc.models.resnet8(num_classes=7, in_channels=3, seed=1), (3, 13, 13)),
          "mobilenet-like": (small_mobilenet, (3, 15, 15))}


def eager(model, x):
    with nc.no_grad():
        return model(x).to_host()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_captured_inference_equals_eager_inference_bit_for_bit(name, rng):
    make, image = MODELS[name]
    nc.manual_seed(3)
    model = make()
    randomize_batchnorm(model, rng)
    model.eval()
    infer = nc.training.CapturedInference(model)
    inputs = [rng.standard_normal((2,) + image).astype(np.float32) for _ in range(6)]
    outputs = [infer(nc.tensor(x)) for x in inputs]
    assert infer.replaying and infer.replays == 3 and infer.launches > 5, infer.status
    assert infer.status.startswith("replaying"), infer.status
    for x, out in zip(inputs, outputs):  # earlier outputs stay valid: each call returns a tensor of its own
        np.testing.assert_array_equal(out.to_host(), eager(model, nc.tensor(x)))


def test_the_warm_up_measures_each_convolution_and_the_replay_runs_the_winners(device, rng, monkeypatch,
                                                                               private_cache):
    """Unforced, the warm-up calls go on while the convolutions measure their candidates (one per call, on
    the real input); the recording then holds each layer's fastest, stored as an "inference" plan, and
    replays what the forward as written now computes, bit for bit. A second capture of the same model
    measures nothing."""
    from netcl.ops import conv_chooser, conv_online
    from netcl.runtime import tuning_db as db
    monkeypatch.delenv("NETCL_CONV_STRATEGY")
    monkeypatch.delenv("NETCL_CONV_PLAN_MODE", raising=False)
    monkeypatch.setattr(conv_online, "MARGIN", 1e9)  # every applicable strategy is a candidate
    conv_chooser.clear_memory_cache(device)
    try:
        nc.manual_seed(3)
        model = small_mobilenet()
        randomize_batchnorm(model, rng)
        model.eval()
        x = nc.tensor(rng.standard_normal((1, 3, 15, 15)).astype(np.float32), device=device)
        infer = nc.training.CapturedInference(model)
        while not infer.replaying and infer.calls < 40:
            infer(x)
        assert infer.replaying, infer.status
        assert infer.eager_calls > 1 + conv_online.MAX_CANDIDATES * conv_online.RUNS  # the trials ran first
        assert conv_online.measuring(device) == 0
        plans = db.entries(device)["conv_plans"]
        assert plans and all(entry["mode"] == "inference" for entry in plans.values())
        assert any(len(entry["measured_ms"]) > 1 for entry in plans.values())
        replayed = infer(x).to_host()
        np.testing.assert_array_equal(replayed, eager(model, x))
        again = nc.training.CapturedInference(model)
        for _ in range(4):
            again(x)
        assert again.replaying and again.eager_calls == again.warmup, again.status
        np.testing.assert_array_equal(again(x).to_host(), replayed)
    finally:
        conv_chooser.clear_memory_cache(device)


def test_the_folded_patterns_of_the_small_mobilenet():
    """Conv-BN-ReLU6 and the linear Conv-BN fold in inference (the replay records the folded forward)."""
    model = small_mobilenet()
    block = model[1].conv
    model.eval()
    with nc.no_grad():
        groups = [name for name, _ in fusion.plan(list(block[0]))] + [name for name, _ in fusion.plan(list(block))]
        with_input = [name for name, _ in fusion.plan(list(block) + [fusion.Residual(None)])]
    assert groups[0] == "conv+bn+relu6 (eval: folded)", groups
    assert groups[-1] == "conv+bn (eval: folded)", groups
    assert with_input[-1] == "conv+bn+residual (eval: folded)", with_input


def test_a_folded_conv_bn_plus_shortcut_equals_float64(device, rng, canaries):
    """Conv2d, BatchNorm2d, Residual in inference: BN folded into the convolution, the shortcut added in
    its epilogue, against the unfolded float64 computation."""
    conv = nc.nn.Conv2d(6, 5, 1, bias=False, device=device)
    bn = nc.nn.BatchNorm2d(5, device=device)
    holder = nc.nn.Sequential(conv, bn)
    randomize_batchnorm(holder, rng)
    holder.eval()
    x_h = rng.standard_normal((3, 6, 7, 5)).astype(np.float32)
    r_h = rng.standard_normal((3, 5, 7, 5)).astype(np.float32)
    with nc.no_grad():
        y = fusion.run([conv, bn, fusion.Residual(nc.tensor(r_h, device=device))], nc.tensor(x_h, device=device))
    w = conv.weight.to_host().astype(np.float64)[:, :, 0, 0]
    z = np.einsum("kc,nchw->nkhw", w, x_h.astype(np.float64))
    mean, var = (t.to_host().astype(np.float64)[None, :, None, None] for t in (bn.running_mean, bn.running_var))
    gamma, beta = (t.to_host().astype(np.float64)[None, :, None, None] for t in (bn.weight, bn.bias))
    ref = (z - mean) / np.sqrt(var + bn.eps) * gamma + beta + r_h
    np.testing.assert_allclose(y.to_host(), ref, rtol=1e-5, atol=1e-5)


def test_other_shapes_run_as_written_and_the_captured_shape_keeps_replaying(rng):
    model = nc.models.resnet8(num_classes=4, in_channels=3, seed=2)
    randomize_batchnorm(model, rng)
    model.eval()
    infer = nc.training.CapturedInference(model)
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    for _ in range(4):
        infer(nc.tensor(x))
    assert infer.replays == 1, infer.status
    eager_before = infer.eager_calls
    for shape in ((2, 3, 12, 12), (1, 3, 9, 9)):
        other = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(infer(nc.tensor(other)).to_host(), eager(model, nc.tensor(other)))
    assert infer.eager_calls == eager_before + 2 and infer.replays == 1
    np.testing.assert_array_equal(infer(nc.tensor(x)).to_host(), eager(model, nc.tensor(x)))
    assert infer.replays == 2


def test_parameters_changed_in_place_are_folded_anew_and_replaced_ones_record_again(rng):
    model = nc.models.resnet8(num_classes=4, in_channels=3, seed=4)
    model.eval()
    infer = nc.training.CapturedInference(model)
    x = nc.tensor(rng.standard_normal((2, 3, 10, 10)).astype(np.float32))
    for _ in range(4):
        infer(x)
    assert infer.replaying
    randomize_batchnorm(model, rng)  # in place: the same storage, new values
    np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))
    assert infer.replays == 2
    model.fc.weight = nc.tensor(rng.standard_normal(model.fc.weight.shape).astype(np.float32))
    np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))
    assert not infer.replaying and "storage" in infer.status, infer.status
    for _ in range(3):
        infer(x)
    assert infer.replaying, infer.status
    np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))


def test_replays_check_the_folds_only_after_a_parameter_buffer_or_eps_changed(rng, monkeypatch):
    checks = []
    check = fusion.FoldedConvBN.current

    def counted(self, conv, bn):
        checks.append(bn)
        return check(self, conv, bn)
    monkeypatch.setattr(fusion.FoldedConvBN, "current", counted)
    model = nc.models.resnet8(num_classes=4, in_channels=3, seed=5)
    randomize_batchnorm(model, rng)
    model.eval()
    folds = sum(isinstance(m, nc.nn.BatchNorm2d) for m in model.modules())
    infer = nc.training.CapturedInference(model)
    x = nc.tensor(rng.standard_normal((1, 3, 11, 11)).astype(np.float32))
    for _ in range(4):
        infer(x)
    assert infer.replaying, infer.status
    checks.clear()
    outputs = [infer(x).to_host() for _ in range(3)]
    assert checks == []  # nothing written since the recording: the replays leave every check out
    for out in outputs:
        np.testing.assert_array_equal(out, eager(model, x))
    first_bn = next(m for m in model.modules() if isinstance(m, nc.nn.BatchNorm2d))
    for change in (lambda: setattr(first_bn, "eps", 1e-2), lambda: randomize_batchnorm(model, rng)):
        change()
        checks.clear()
        out = infer(x).to_host()
        assert len(checks) == folds, "a replay after a change checks every fold"
        np.testing.assert_array_equal(out, eager(model, x))
        checks.clear()
        infer(x)
        assert checks == []
    assert infer.replays >= 7, infer.status


class PlainAttributeWeight(nc.nn.Module):
    """A 3×3 filter kept as a plain attribute (a tensor that needs no gradient is not registered)."""

    def __init__(self, rng):
        super().__init__()
        self.filter = nc.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))

    def forward(self, x):
        return nc.nn.functional.conv2d(x, self.filter, padding=1, strategy="winograd")


def test_a_weight_outside_the_parameters_written_in_place_is_transformed_anew(rng):
    from netcl.ops.elementwise import copy_into
    model = PlainAttributeWeight(rng)
    assert not list(model.parameters()) and not list(model.buffers())
    infer = nc.training.CapturedInference(model)
    x = nc.tensor(rng.standard_normal((1, 3, 9, 9)).astype(np.float32))
    for _ in range(4):
        infer(x)
    assert infer.replaying, infer.status
    copy_into(model.filter, nc.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32)))
    # Winograd's transformed filter is kept with the weight: a replay must see the write and make it again
    np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))
    assert infer.replays >= 2, infer.status


def test_train_mode_runs_as_written_and_reused_output_is_overwritten(rng):
    model = small_mobilenet()
    randomize_batchnorm(model, rng)
    model.eval()
    infer = nc.training.CapturedInference(model, reuse_output=True)
    a, b = (nc.tensor(rng.standard_normal((2, 3, 11, 11)).astype(np.float32)) for _ in range(2))
    for _ in range(3):
        infer(a)
    first = infer(a)
    second = infer(b)
    assert second is first  # documented: the recorded output tensor, overwritten by each replay
    np.testing.assert_array_equal(first.to_host(), eager(model, b))
    model.train()
    in_train = infer(a)
    assert in_train is not first and not infer.replaying


def test_a_forward_reading_a_result_on_the_host_is_never_replayed(rng):
    class Looking(nc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nc.nn.Linear(6, 3)

        def forward(self, x):
            y = self.fc(x)
            if float(y.sum().item()) > 1e30:  # a decision on the host: a replay could not take it again
                raise AssertionError("unreachable")
            return y

    model = Looking().eval()
    infer = nc.training.CapturedInference(model)
    x = nc.tensor(rng.standard_normal((4, 6)).astype(np.float32))
    for _ in range(6):
        np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))
    assert infer.replays == 0 and infer.recordings == 1, infer.status
    assert "cannot be recorded" in infer.status, infer.status


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_captured_inference_of_the_imagenet_models_equals_eager(name, rng):
    """The torchvision models at a small size: Bottleneck's conv+bn+residual+relu and MobileNetV2's
    folded linear bottleneck plus its input are in what is recorded."""
    nc.manual_seed(5)
    model = getattr(nc.models, name)(num_classes=6)
    randomize_batchnorm(model, rng)
    model.eval()
    if name == "mobilenet_v2":
        block = model.features[2 + 1]  # the second block of the 24-channel stage: stride 1, same channels
        assert block.use_res_connect
        with nc.no_grad():
            groups = [g for g, _ in fusion.plan(list(block.conv) + [fusion.Residual(None)])]
        assert groups[-1] == "conv+bn+residual (eval: folded)", groups
    infer = nc.training.CapturedInference(model)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    outputs = [infer(nc.tensor(x)) for _ in range(4)]
    assert infer.replays == 1, infer.status
    expected = eager(model, nc.tensor(x))
    for out in outputs:
        np.testing.assert_array_equal(out.to_host(), expected)


def test_a_replaced_module_records_again(rng):
    """A sub-module swapped for another (its parameters never seen by the recording) ends the replay."""
    model = nc.models.resnet8(num_classes=4, in_channels=3, seed=6)
    randomize_batchnorm(model, rng)
    model.eval()
    infer = nc.training.CapturedInference(model)
    x = nc.tensor(rng.standard_normal((1, 3, 9, 9)).astype(np.float32))
    for _ in range(4):
        infer(x)
    assert infer.replaying, infer.status
    model.fc = nc.nn.Linear(model.fc.in_features, 4)
    np.testing.assert_array_equal(infer(x).to_host(), eager(model, x))
    assert not infer.replaying, infer.status
    for _ in range(3):
        out = infer(x)
    assert infer.replaying, infer.status
    np.testing.assert_array_equal(out.to_host(), eager(model, x))
