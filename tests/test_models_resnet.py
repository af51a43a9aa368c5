"""nc.models.resnet8/20/32: structure and PyTorch's names, initialization, a ResNet-8 training step against a
float64 NumPy reference (loss, running statistics, gradients by finite differences of the reference), eval
mode with BatchNorm folded into the convolutions, state_dict round trips through NumPy arrays, and the
fusion table's grouping and its equality with the unfused layers."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import fusion
from resnet_reference import cross_entropy_mean, resnet_forward_ref
from util import assert_close


def test_structure_names_and_parameter_counts(device):
    model = nc.models.resnet20(device=device)
    keys = list(model.state_dict())
    assert keys[:6] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                        "bn1.num_batches_tracked"]
    for key in ("layer2.0.conv1.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.num_batches_tracked",
                "layer3.2.bn2.running_var", "fc.weight", "fc.bias"):
        assert key in keys, key
    assert "layer1.0.downsample.0.weight" not in keys and "conv1.bias" not in keys
    assert keys[-2:] == ["fc.weight", "fc.bias"]
    counts = {name: sum(p.size for p in make(device=device).parameters())
              for name, make in (("8", nc.models.resnet8), ("20", nc.models.resnet20), ("32", nc.models.resnet32))}
    assert counts == {"8": 78042, "20": 272474, "32": 466906}
    assert nc.models.resnet8(num_classes=7, in_channels=1, device=device).fc.weight.shape == (7, 64)
    assert model.conv1.weight.shape == (16, 3, 3, 3)
    with pytest.raises(nc.ShapeError, match="num_classes"):
        nc.models.resnet8(num_classes=0)


def test_initialization_is_torchvisions(device):
    model = nc.models.resnet32(seed=3, device=device)
    w = model.layer3[4].conv2.weight.to_host()
    assert abs(w.std() / np.sqrt(2.0 / (64 * 9)) - 1) < 0.05 and abs(w.mean()) < 0.01
    assert np.all(model.layer2[0].bn1.weight.to_host() == 1) and np.all(model.layer2[0].bn1.bias.to_host() == 0)
    again = nc.models.resnet32(seed=3, device=device)
    np.testing.assert_array_equal(again.layer3[4].conv2.weight.to_host(), w)


RELU_MARGIN = 1e-4


def _batch(rng, n=3, c=3, size=8):
    return rng.normal(size=(n, c, size, size)).astype(np.float32), rng.integers(0, 10, size=n)


def test_resnet8_training_step_against_float64_reference(device, rng):
    model = nc.models.resnet8(seed=int(rng.integers(2**31)), device=device)  # replayable from the test's seed
    state = {k: v.to_host() for k, v in model.state_dict().items()}
    # A batch whose every ReLU input lies at least RELU_MARGIN from 0: nearer, float32 and the float64
    # reference may put it on opposite sides of the kink, where their gradients rightly differ (a ReLU
    # input within 1e-6 of 0 made netcl's conv1.weight gradient differ from the reference's by 1.3 %). About
    # 40 % of random batches qualify; 40 draws all fail with probability under 1e-8.
    for _ in range(40):
        x_h, t_h = _batch(rng)
        relu_inputs = []
        resnet_forward_ref(state, x_h, 1, True, relu_inputs=relu_inputs)
        if min(np.abs(z).min() for z in relu_inputs) >= RELU_MARGIN:
            break
    else:
        pytest.fail(f"no batch of 40 keeps every ReLU input {RELU_MARGIN} from 0")
    loss = nc.nn.CrossEntropyLoss()(model(nc.tensor(x_h, device=device)), nc.tensor(t_h, device=device))
    loss.backward()
    moved = {}
    ref_loss = cross_entropy_mean(resnet_forward_ref(state, x_h, 1, True, moved), t_h)
    assert abs(loss.item() - ref_loss) <= 1e-4 * abs(ref_loss)
    after = model.state_dict()
    for key, value in moved.items():
        assert_close(after[key].to_host(), value, 1e-5, key)
    assert int(after["layer3.0.downsample.1.num_batches_tracked"].to_host()) == 1

    def ref_of(key, index, delta):
        s = dict(state)
        s[key] = state[key].astype(np.float64).copy()
        s[key][index] += delta
        return cross_entropy_mean(resnet_forward_ref(s, x_h, 1, True), t_h)

    def derivative_of(key, index, tolerance):
        """The reference's central difference at the largest step whose forward and backward quotients agree.

        A ReLU kink within the step makes the one-sided quotients differ by the jump in slope (and spoils the
        central one); each step a tenth of the one before moves past a kink a small distance away. Steps down to
        1e-8 keep float64 round-off below 1e-7 of the quotient. None where every step straddles a kink."""
        at_zero = ref_of(key, index, 0.0)
        for step in (1e-5, 1e-6, 1e-7, 1e-8):
            up, down = ref_of(key, index, step), ref_of(key, index, -step)
            if abs((up - at_zero) - (at_zero - down)) / step <= tolerance:
                return (up - down) / (2 * step)
        return None

    params = dict(model.named_parameters())
    for key in ("conv1.weight", "layer1.0.conv2.weight", "layer2.0.downsample.0.weight", "layer3.0.bn2.weight",
                "layer2.0.bn1.bias", "fc.weight", "fc.bias"):
        grad = params[key].grad.to_host()
        picks = [np.unravel_index(i, grad.shape) for i in rng.choice(grad.size, size=min(2, grad.size),
                                                                     replace=False)]
        picks.append(np.unravel_index(np.argmax(np.abs(grad)), grad.shape))
        scale = np.abs(grad).max()
        judged = [(grad[i], numeric) for i in picks
                  if (numeric := derivative_of(key, i, 2e-4 * scale + 1e-7)) is not None]
        assert len(judged) >= 2, (key, picks)
        ours, numeric = np.array(judged).T
        assert np.max(np.abs(ours - numeric)) <= 2e-3 * scale + 1e-6, (key, ours, numeric)


def test_eval_folds_batch_norm_and_matches_reference(device, rng, unfused):
    model = nc.models.resnet8(device=device)
    for _ in range(2):  # move the running statistics away from 0 / 1
        model(nc.tensor(_batch(rng)[0] * 2 + 1, device=device))
    model.eval()
    steps = [model.conv1, model.bn1, model.relu]
    assert fusion.plan(steps)[0][0] == "bn+relu" or fusion.plan(steps)[0][0] is None  # gradients wanted: no fold
    with nc.no_grad():
        assert fusion.plan(steps)[0][0] == "conv+bn+relu (eval: folded)"
    block = model.layer2[0]
    state = {k: v.to_host() for k, v in model.state_dict().items()}
    x_h, _ = _batch(rng)
    with nc.no_grad():
        y = model(nc.tensor(x_h, device=device)).to_host()
    assert_close(y, resnet_forward_ref(state, x_h, 1, False), 1e-4, "eval logits")
    with unfused(), nc.no_grad():  # the same eval pass without any fusion
        one_by_one = model(nc.tensor(x_h, device=device)).to_host()
    assert_close(y, one_by_one, 1e-5, "folded vs unfused eval")
    assert int(model.bn1.num_batches_tracked.to_host()) == 2
    fused = nc.nn.utils.fuse_conv_bn_eval(block.conv1, block.bn1)
    h = nc.tensor(rng.normal(size=(2, 16, 9, 9)).astype(np.float32), device=device)
    assert_close(fused(h).to_host(), block.bn1(block.conv1(h)).to_host(), 1e-5, "fuse_conv_bn_eval")


def test_state_dict_round_trip_through_numpy(device, rng):
    source = nc.models.resnet8(seed=1, device=device)
    source(nc.tensor(_batch(rng)[0], device=device))
    arrays = {k: v.to_host() for k, v in source.state_dict().items()}
    target = nc.models.resnet8(seed=2, device=device)
    target.load_state_dict(arrays)
    for key, value in target.state_dict().items():
        np.testing.assert_array_equal(value.to_host(), arrays[key])
    assert target.layer1[0].bn1.num_batches_tracked.to_host().dtype == np.int64
    x = nc.tensor(_batch(rng)[0], device=device)
    source.eval(), target.eval()
    # not bitwise: the planner may run another convolution strategy for the second model
    assert_close(target(x).to_host(), source(x).to_host(), 1e-5, "same weights, same outputs")
    arrays.pop("fc.bias")
    with pytest.raises(nc.NetclError, match="missing keys.*fc.bias"):
        target.load_state_dict(arrays)


def test_fusion_table_groups_and_equals_unfused(device, rng):
    lenet = nc.models.lenet(device=device)
    groups = [name for name, _ in fusion.plan(list(lenet))]
    assert groups.count("relu+maxpool") == 2
    block = nc.models.resnet8(device=device).layer2[0]
    chain = [block.conv1, block.bn1, block.relu, block.conv2, block.bn2, fusion.Residual(None), block.relu]
    assert [n for n, _ in fusion.plan(chain)] == [None, "bn+relu", None, "bn+residual+relu"]
    block.eval()
    with nc.no_grad():
        assert [n for n, _ in fusion.plan(chain)] == ["conv+bn+relu (eval: folded)",
                                                      "conv+bn+residual+relu (eval: folded)"]
    assert [n for n, _ in fusion.plan(chain)] == [None, "bn+relu", None, "bn+residual+relu"]
    assert [n for n, _ in fusion.plan(chain[5:])] == ["residual+relu"]
    block.train()
    for mode in ("train", "eval"):
        getattr(block, mode)()
        x_h = rng.normal(size=(3, 16, 8, 8)).astype(np.float32)
        outs = []
        for fused in (True, False):
            x = nc.tensor(x_h, device=device, requires_grad=True)
            if fused:
                y = block(x)
            else:  # the same block, one module at a time
                shortcut = block.downsample[1](block.downsample[0](x))
                h = block.relu(block.bn1(block.conv1(x)))
                y = block.relu(block.bn2(block.conv2(h)) + shortcut)
            y.backward(nc.tensor(np.linspace(-1, 1, y.size).reshape(y.shape).astype(np.float32), device=device))
            outs.append((y.to_host(), x.grad.to_host(), block.conv1.weight.grad.to_host()))
            block.zero_grad()
        for a, b, what in zip(outs[0], outs[1], ("output", "grad x", "grad conv1")):
            assert_close(a, b, 1e-5, f"{mode} fused vs unfused {what}")
