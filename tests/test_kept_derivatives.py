"""A weight's derivatives kept for inference (netcl.ops.kept): Winograd's transformed filters, MEC's
rearranged weight and direct_blocked's packed weight are made once while no gradient is recorded and made
again only after the weight was written in place or replaced; a replayed CapturedInference remakes them
after an optimizer step. Every output must equal the one a fresh model with the same values computes, bit
for bit."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.elementwise import copy_into
from netcl.runtime.observers import watching_launches

TRANSFORMS = {"winograd": ("wino_filter_transform8", "wino_filter_transform"), "mec": ("transpose_tiles",),
              "direct_blocked": ("conv_blocked_pack",)}


@pytest.fixture(autouse=True)
def fixed_kernels(monkeypatch):
    monkeypatch.setenv("NETCL_DEFER_BUILDS", "0")  # the same kernels on both sides of a comparison


def make_model(strategy: str, seed: int = 3):
    rng = np.random.default_rng(seed)
    model = nc.nn.Sequential(
        nc.nn.Conv2d(3, 8, 3, padding=1, strategy=strategy),
        nc.nn.ReLU(),
        nc.nn.Conv2d(8, 5, 3, padding=1, strategy=strategy),
    )
    for p in model.parameters():
        copy_into(p, nc.tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3))
    return model


def inference(model, x: np.ndarray) -> np.ndarray:
    with nc.no_grad():
        return model(nc.tensor(x)).to_host()


def fresh_reference(strategy: str, model, x: np.ndarray) -> np.ndarray:
    copy = make_model(strategy)
    copy.load_state_dict({k: v.to_host() for k, v in model.state_dict().items()})
    copy.eval()
    return inference(copy, x)


def transform_launches(device, strategy: str, fn) -> int:
    names = []
    with watching_launches(device, lambda kernel: names.append(kernel.function_name)):
        fn()
    return sum(names.count(name) for name in TRANSFORMS[strategy])


@pytest.mark.parametrize("strategy", sorted(TRANSFORMS))
def test_kept_in_inference_made_again_after_a_write(device, rng, strategy):
    model = make_model(strategy)
    model.eval()
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    first = transform_launches(device, strategy, lambda: inference(model, x))
    assert first >= 2  # one per convolution (MEC may transpose its output too)
    assert transform_launches(device, strategy, lambda: inference(model, x)) == first - 2
    np.testing.assert_array_equal(inference(model, x), fresh_reference(strategy, model, x))
    conv = model[0]
    copy_into(conv.weight, nc.tensor(rng.standard_normal(conv.weight.shape).astype(np.float32)))  # counted write
    assert transform_launches(device, strategy, lambda: inference(model, x)) == first - 1
    np.testing.assert_array_equal(inference(model, x), fresh_reference(strategy, model, x))
    conv.weight = nc.tensor(rng.standard_normal(conv.weight.shape).astype(np.float32), requires_grad=True)
    np.testing.assert_array_equal(inference(model, x), fresh_reference(strategy, model, x))


@pytest.mark.parametrize("strategy", sorted(TRANSFORMS))
def test_training_makes_them_at_every_call(device, rng, strategy):
    model = make_model(strategy)
    x = nc.tensor(rng.standard_normal((2, 3, 7, 8)).astype(np.float32))
    for _ in range(2):
        assert transform_launches(device, strategy, lambda: model(x).sum().backward()) >= 2


@pytest.mark.parametrize("strategy", sorted(TRANSFORMS))
def test_a_replay_after_optimizer_steps_uses_the_new_weights(rng, strategy):
    model = make_model(strategy)
    optimizer = nc.optim.SGD(model.parameters(), lr=0.1)
    infer = nc.training.CapturedInference(model)
    x_eval = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    for round_ in range(3):
        model.eval()
        for _ in range(4):
            out = infer(nc.tensor(x_eval)).to_host()
        np.testing.assert_array_equal(out, fresh_reference(strategy, model, x_eval))
        model.train()
        optimizer.zero_grad()
        model(nc.tensor(rng.standard_normal((2, 3, 10, 10)).astype(np.float32))).sum().backward()
        optimizer.step()
    assert infer.replaying and infer.replays >= 6, infer.status
