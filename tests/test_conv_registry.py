"""The strategy protocol and registry from outside: a toy strategy registered by this test is planned,
forced and run, then unregistered; every pass plans for the device it is asked about (a second device,
or a second context on the same device)."""
from __future__ import annotations


import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv2d_planner as planner
from netcl.ops import conv_chooser
from netcl.ops import conv_registry
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import PASSES, ConvLayer, ConvStrategy, CostTerms
from netcl.runtime.device import Device
from util import assert_close, conv2d_grads_ref, conv2d_ref


@pytest.fixture(autouse=True)
def fresh_planner(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("NETCL_CONV_STRATEGY", "NETCL_CONV_WORKSPACE_LIMIT", "NETCL_CONV_PLAN_MODE"):
        monkeypatch.delenv(var, raising=False)
    conv_chooser.clear_memory_cache()
    yield
    conv_chooser.clear_memory_cache()


class ToyStrategy(ConvStrategy):
    """Stride-1 layers only, computed by the direct kernels; its cost terms claim almost nothing, so the
    planner prefers it wherever it applies. It counts its runs."""

    name = "toy"

    def __init__(self):
        self.runs = []

    def why_not(self, layer, pass_, device=None):
        return None if (layer.stride_h, layer.stride_w) == (1, 1) else "the toy only knows stride 1"

    def cost_terms(self, layer, pass_, device=None):
        return CostTerms(kernel_flops=1.0, launches=0)

    def _direct(self, pass_, a, b, layer):
        self.runs.append(pass_)
        return getattr(conv_registry.strategies()["direct"], pass_)(a, b, layer)

    def forward(self, x, w, layer):
        return self._direct("forward", x, w, layer)

    def backward_data(self, grad_y, w, layer):
        return self._direct("backward_data", grad_y, w, layer)

    def backward_weight(self, x, grad_y, layer):
        return self._direct("backward_weight", x, grad_y, layer)


@pytest.fixture
def toy():
    strategy = conv_registry.register(ToyStrategy())
    conv_chooser.clear_memory_cache()
    yield strategy
    conv_registry.unregister("toy")
    conv_chooser.clear_memory_cache()


def test_a_registered_strategy_is_planned_forced_and_run(toy, device, rng, canaries, monkeypatch):
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")  # the plan, not training's trials
    layer = ConvLayer.from_shapes((2, 3, 7, 7), (4, 3, 3, 3), padding=1)
    for pass_ in PASSES:
        plan = planner.plan_conv2d_layer(layer, pass_, device=device)
        assert plan.strategy == "toy" and "toy" in plan.reason
    strided = planner.plan_conv2d((1, 3, 9, 9), (4, 3, 3, 3), stride=2, device=device)
    assert strided.strategy != "toy" and strided.candidate("toy").why_not == "the toy only knows stride 1"
    x = rng.uniform(-1, 1, (2, 3, 7, 7)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    gy = rng.uniform(-1, 1, (2, 4, 7, 7)).astype(np.float32)
    for strategy in ("auto", "toy"):
        toy.runs.clear()
        X = nc.Tensor.from_host(x, device, requires_grad=True)
        W = nc.Tensor.from_host(w, device, requires_grad=True)
        y = conv2d(X, W, padding=1, strategy=strategy)
        y.backward(nc.Tensor.from_host(gy, device))
        assert sorted(toy.runs) == sorted(PASSES)
        gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, (1, 1), (1, 1), (1, 1), 1)
        assert_close(y.to_host(), conv2d_ref(x, w, padding=(1, 1)), 1e-5)
        assert_close(X.grad.to_host(), gx_ref, 1e-4)
        assert_close(W.grad.to_host(), gw_ref, 1e-4)
    with pytest.raises(nc.ShapeError, match="toy only knows stride 1"):
        conv2d(nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device), stride=2, strategy="toy")


def test_unregistered_strategy_is_gone(device):
    conv_registry.register(ToyStrategy())
    assert "toy" in conv_registry.strategies()
    conv_registry.unregister("toy")
    conv_chooser.clear_memory_cache()
    assert "toy" not in conv_registry.strategies()
    plan = planner.plan_conv2d((2, 3, 7, 7), (4, 3, 3, 3), padding=1, device=device)
    assert plan.strategy != "toy" and plan.candidate("toy") is None
    with pytest.raises(nc.ShapeError, match="unknown conv2d strategy 'toy'"):
        conv2d(nc.zeros((1, 3, 5, 5), device=device), nc.zeros((2, 3, 3, 3), device=device), strategy="toy")


def test_register_rejects_an_object_without_the_protocol():
    class Half:
        name = "half"

        def forward(self, x, w, layer):
            return x
    with pytest.raises(nc.ShapeError, match="why_not"):
        conv_registry.register(Half())
    assert "half" not in conv_registry.strategies()


def _second_device(device):
    """Another device where there is one, else a second context on the same device."""
    others = [d for d in nc.devices() if d is not device and d.identity != device.identity]
    return others[0] if others else Device(device.cl_device, index=device.index)


def test_conv2d_plans_for_the_tensors_device(device, rng, monkeypatch):
    other = _second_device(device)
    assert other is not device and other.context is not device.context
    seen = []
    real = planner.plan_conv2d_layer

    def spy(layer, pass_, *a, **k):
        seen.append((pass_, k.get("device")))
        return real(layer, pass_, *a, **k)
    monkeypatch.setattr(planner, "plan_conv2d_layer", spy)
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    x = rng.uniform(-1, 1, (2, 3, 9, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 3, 3, 3)).astype(np.float32)
    X = nc.Tensor.from_host(x, other, requires_grad=True)
    W = nc.Tensor.from_host(w, other, requires_grad=True)
    y = conv2d(X, W, padding=1)
    y.sum().backward()
    assert y.device is other and X.grad.device is other
    assert [p for p, _ in seen] == list(PASSES) and all(d is other for _, d in seen)
    assert_close(y.to_host(), conv2d_ref(x, w, padding=(1, 1)), 1e-5)


def test_why_not_and_workspace_answer_for_the_device_asked(device):
    small = Device(device.cl_device, index=device.index)
    small.max_alloc_bytes = 4096  # as a device with a tiny allocation limit would report
    layer = ConvLayer.from_shapes((2, 8, 16, 16), (8, 8, 3, 3), padding=1)
    on_small = planner.plan_conv2d_layer(layer, "forward", device=small)
    on_default = planner.plan_conv2d_layer(layer, "forward", device=device)
    assert on_default.candidate("im2col").applicable
    assert not on_small.candidate("im2col").applicable and "4,096" in on_small.candidate("im2col").why_not
    assert not on_small.candidate("winograd").applicable
    registry = conv_registry.strategies()
    assert registry["mec"].why_not(layer, "forward", small) and not registry["mec"].why_not(layer, "forward", device)
