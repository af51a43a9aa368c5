"""torchvision's ImageNet models in netcl: nc.models.resnet18/34/50 and nc.models.mobilenet_v2.

The state_dict keys and shapes equal torchvision's (tests/fixtures/torchvision_state_dicts.json, written by
PyTorch from the torchvision definitions); weights move both ways as NumPy arrays. On synthetic weights and
data (tests/torchvision_reference.py) each model's eval forward agrees with PyTorch float64 within 1e-4
relative, and its training step (batch statistics, cross-entropy) on the loss and the gradients within 5×
the error of PyTorch's own float32 run (tests/fixtures/torchvision_outputs.npz). Full-size 224×224 passes
are behind -m slow.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import netcl as nc
from netcl.nn import fusion
from torchvision_reference import (FULL_GRADIENTS, KEYED_MODELS, KEYS_FILE, NUMERIC_MODELS, OUTPUTS_FILE,
                                   model_seed, synthetic_batch, synthetic_state)
from util import rel_l2


@pytest.fixture(scope="module")
def torchvision_keys():
    return json.loads(KEYS_FILE.read_text())


@pytest.fixture(scope="module")
def torch_outputs():
    with np.load(OUTPUTS_FILE) as data:
        return {key: data[key] for key in data.files}


def build(builder: str, kwargs: dict, device):
    """The netcl model of a fixture configuration (``dropout`` is MobileNetV2's constructor argument, as in
    torchvision)."""
    kwargs = dict(kwargs)
    if builder == "mobilenet_v2":
        dropout = kwargs.pop("dropout", 0.2)
        return nc.models.MobileNetV2(**kwargs, dropout=dropout, device=device)
    return getattr(nc.models, builder)(**kwargs, device=device)


def key_shapes(model):
    return [[key, list(value.shape)] for key, value in model.state_dict().items()]


@pytest.mark.parametrize("name", sorted(KEYED_MODELS))
def test_state_dict_keys_and_shapes_are_torchvisions(device, torchvision_keys, name):
    builder, kwargs = KEYED_MODELS[name]
    assert key_shapes(getattr(nc.models, builder)(**kwargs, device=device)) == torchvision_keys[name]


def test_parameter_counts_are_torchvisions(device):
    counts = {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872}
    for name, count in counts.items():
        assert sum(p.size for p in getattr(nc.models, name)(device=device).parameters()) == count, name


@pytest.fixture(scope="module")
def synthetic_models():
    """name -> a function returning that configuration's model (built once for the module) with its
    synthetic weights and running statistics freshly loaded."""
    built = {}

    def load(name):
        if name not in built:
            builder, kwargs = NUMERIC_MODELS[name]
            built[name] = build(builder, kwargs, nc.default_device())
        model = built[name]
        model.load_state_dict(synthetic_state(key_shapes(model), model_seed(name)))
        model.zero_grad()
        return model
    return load


@pytest.mark.parametrize("name", sorted(NUMERIC_MODELS))
def test_eval_forward_matches_pytorch_float64(device, torch_outputs, synthetic_models, name):
    model = synthetic_models(name)
    model.eval()
    images, _ = synthetic_batch()
    expected = torch_outputs[f"{name}/eval_logits"]
    with nc.no_grad():  # inference: every BatchNorm folded into its convolution
        folded = model(nc.tensor(images, device=device)).to_host()
    unfolded = model(nc.tensor(images, device=device)).to_host()  # gradients wanted: eval BatchNorm kernels
    assert rel_l2(folded, expected) <= 1e-4, rel_l2(folded, expected)
    assert rel_l2(unfolded, expected) <= 1e-4, rel_l2(unfolded, expected)


def _within_five_times_pytorch_float32(ours, expected, f32_error, what, floor=1e-6):
    error = rel_l2(ours, expected)
    assert error <= 5 * float(f32_error) + floor, (f"{what}: relative error {error:.3e} > 5 × PyTorch float32's "
                                                   f"{float(f32_error):.3e}")


@pytest.mark.parametrize("name", sorted(NUMERIC_MODELS))
def test_training_step_matches_pytorch_float64(device, monkeypatch, torch_outputs, synthetic_models, name):
    # One strategy for every layer: the models' numerics are under test here, not the mix of strategies a
    # device's stored calibration picks (each strategy meets float64 on its own in test_conv_strategies.py).
    # Across mixes the rounding differs, and a pre-activation within rounding of a ReLU's kink can change
    # sides, which moves every gradient upstream of it by more than float32 rounding.
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "implicit_gemm")
    model = synthetic_models(name)
    model.train()
    images, targets = synthetic_batch()
    loss = nc.nn.functional.cross_entropy(model(nc.tensor(images, device=device)), targets)
    loss.backward()
    out = torch_outputs
    _within_five_times_pytorch_float32(float(loss.to_host()), out[f"{name}/train_loss"],
                                       out[f"{name}/train_loss/f32_error"], "loss")
    grads = {key: p.grad.to_host() for key, p in model.named_parameters()}
    for key in FULL_GRADIENTS[name]:
        _within_five_times_pytorch_float32(grads[key], out[f"{name}/grad/{key}"],
                                           out[f"{name}/grad_f32_error/{key}"], f"gradient of {key}", floor=1e-5)
    # every other gradient through its norm: | ||g|| - ||g64|| | <= ||g - g64||, so a gradient within 5× of
    # PyTorch float32's error has its norm within that too. A few gradients are zero but for rounding (a
    # BatchNorm's bias where a training-mode BatchNorm follows the next linear layer): the model's largest
    # norm sets a floor.
    norms = {key: float(out[f"{name}/grad_norm/{key}"]) for key in grads}
    floor = 1e-6 * max(norms.values())
    for key, grad in grads.items():
        allowed = (5 * float(out[f"{name}/grad_f32_error/{key}"]) + 1e-5) * norms[key] + floor
        assert abs(np.linalg.norm(grad) - norms[key]) <= allowed, key
    counts = [int(v.to_host()) for k, v in model.state_dict().items() if k.endswith("num_batches_tracked")]
    assert counts and set(counts) == {1}


def test_torchvision_state_dict_round_trip_through_numpy(device, rng):
    for make in (lambda seed: nc.models.resnet18(num_classes=5, seed=seed, device=device),
                 lambda seed: nc.models.mobilenet_v2(num_classes=5, width_mult=0.35, seed=seed, device=device)):
        source, target = make(1), make(2)
        arrays = {key: value.to_host() for key, value in source.state_dict().items()}
        target.load_state_dict(arrays)
        for key, value in target.state_dict().items():
            np.testing.assert_array_equal(value.to_host(), arrays[key])
            assert value.dtype == arrays[key].dtype, key
        x = nc.tensor(rng.normal(size=(2, 3, 32, 32)).astype(np.float32), device=device)
        source.eval(), target.eval()
        with nc.no_grad():
            assert rel_l2(target(x).to_host(), source(x).to_host()) <= 1e-5
        arrays.pop(next(iter(arrays)))
        with pytest.raises(nc.NetclError, match="missing keys"):
            target.load_state_dict(arrays)


def test_mobilenet_v2_structure(device):
    model = nc.models.mobilenet_v2(num_classes=10, width_mult=0.5, device=device)
    blocks = list(model.features)[1:-1]
    assert len(blocks) == 17
    assert [i for i, b in enumerate(blocks, start=1) if b.use_res_connect] == [3, 5, 6, 8, 9, 10, 12, 13, 15, 16]
    assert [i for i, b in enumerate(blocks, start=1) if b.stride == 2] == [2, 4, 7, 14]
    depthwise = blocks[1].conv[1][0]
    assert depthwise.groups == depthwise.in_channels == depthwise.out_channels == 48  # 16·0.5 → 8, ×6
    assert [nc.models.mobilenet.make_divisible(v) for v in (32 * 0.35, 16 * 0.35, 24 * 0.35, 1280.0)] == \
        [16, 8, 8, 1280]
    unit = list(model.features[0])
    assert [n for n, _ in fusion.plan(unit)] == [None, "bn+relu6"]
    model.eval()
    with nc.no_grad():
        assert [n for n, _ in fusion.plan(unit)] == ["conv+bn+relu6 (eval: folded)"]
        assert [n for n, _ in fusion.plan(list(blocks[0].conv))][-1] == "conv+bn (eval: folded)"
    assert model.extra_repr() == "width_mult=0.5"


def test_other_input_channels_and_classes(device, rng, monkeypatch):
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    x = nc.tensor(rng.normal(size=(2, 1, 32, 32)).astype(np.float32), device=device)
    for model in (nc.models.resnet18(num_classes=3, in_channels=1, device=device),
                  nc.models.mobilenet_v2(num_classes=3, width_mult=0.35, in_channels=1, device=device)):
        y = model(x)
        assert y.shape == (2, 3)
        y.sum().backward()
        assert all(p.grad is not None for p in model.parameters())


def test_model_arguments_are_checked(device):
    with pytest.raises(nc.ShapeError, match="num_classes"):
        nc.models.resnet50(num_classes=0, device=device)
    with pytest.raises(nc.ShapeError, match="in_channels"):
        nc.models.resnet18(in_channels=2.5, device=device)
    with pytest.raises(nc.ShapeError, match="width_mult"):
        nc.models.mobilenet_v2(width_mult=0, device=device)
    with pytest.raises(nc.ShapeError, match="num_classes"):
        nc.models.mobilenet_v2(num_classes=True, device=device)
    with pytest.raises(nc.ShapeError, match="block"):
        nc.models.ImageNetResNet(nc.nn.ReLU, [2, 2, 2, 2], device=device)
    with pytest.raises(nc.ShapeError, match="four stages"):
        nc.models.ImageNetResNet(nc.models.BasicBlock, [2, 2, 2], device=device)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50", "mobilenet_v2"])
def test_full_size_inference_at_224(device, rng, name):
    model = getattr(nc.models, name)(seed=0, device=device)
    model.eval()
    x = nc.tensor(rng.normal(size=(1, 3, 224, 224)).astype(np.float32), device=device)
    with nc.no_grad():
        folded = model(x).to_host()
    unfolded = model(x).to_host()
    assert folded.shape == (1, 1000) and np.all(np.isfinite(folded))
    assert rel_l2(folded, unfolded) <= 1e-4
