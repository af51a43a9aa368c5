"""nn.Module bookkeeping: parameter registration, state_dict round trips, train/eval, zero_grad."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import netcl as nc


class Block(nc.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.fc = nc.nn.Linear(4, 3, device=device)
        self.scale = nc.tensor(np.ones(3, np.float32), device=device, requires_grad=True)
        self.register_buffer("running", nc.zeros((3,), device=device))
        self.drop = nc.nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.fc(x)) * self.scale


def test_registration_names_and_state_dict(device):
    model = nc.nn.Sequential(OrderedDict([("block", Block(device)), ("head", nc.nn.Linear(3, 2, device=device))]))
    names = [n for n, _ in model.named_parameters()]
    assert names == ["block.scale", "block.fc.weight", "block.fc.bias", "head.weight", "head.bias"]
    assert len(model.parameters()) == 5
    assert list(model.state_dict()) == names[:1] + ["block.running"] + names[1:]
    assert [n for n, _ in model.named_modules()] == ["", "block", "block.fc", "block.drop", "head"]


def test_load_state_dict_copies_in_place_and_checks(device, rng):
    a = nc.models.lenet(seed=1, device=device)
    b = nc.models.lenet(seed=2, device=device)
    weight = b.conv1.weight
    b.load_state_dict({k: v.to_host() for k, v in a.state_dict().items()})
    assert b.conv1.weight is weight, "parameters are updated in place (optimizers keep working)"
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(pa.to_host(), pb.to_host()), name
    state = a.state_dict()
    state["fc4.bias"] = np.zeros(11, np.float32)
    with pytest.raises(nc.ShapeError, match="fc4.bias"):
        b.load_state_dict(state)
    with pytest.raises(nc.CheckpointError, match="missing keys"):
        b.load_state_dict({"conv1.weight": a.conv1.weight})
    missing, unexpected = b.load_state_dict({"conv1.weight": a.conv1.weight, "extra": 1}, strict=False)
    assert "fc4.bias" in missing and unexpected == ["extra"]


def test_train_eval_and_zero_grad(device, rng):
    model = Block(device)
    assert model.training and model.drop.training
    model.eval()
    assert not model.training and not model.drop.training
    x = nc.tensor(rng.standard_normal((2, 4)).astype(np.float32), device=device)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    model.train()
    assert model.drop.training


def test_lenet_is_table_2(device):
    model = nc.models.lenet(seed=0, device=device)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes == {"conv1.weight": (20, 1, 5, 5), "conv1.bias": (20,), "conv2.weight": (50, 20, 5, 5),
                      "conv2.bias": (50,), "fc3.weight": (500, 800), "fc3.bias": (500,),
                      "fc4.weight": (10, 500), "fc4.bias": (10,)}
    assert sum(int(np.prod(s)) for s in shapes.values()) == 431080
    assert [n for n, _ in model.named_layers()] == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
                                                     "flatten", "fc3", "relu3", "drop3", "fc4"]
    with nc.no_grad():
        assert model(nc.zeros((3, 1, 28, 28), device=device)).shape == (3, 10)
    same = nc.models.lenet(seed=0, device=device)
    assert np.array_equal(same.fc3.weight.to_host(), model.fc3.weight.to_host())


def test_module_without_super_init_is_explained():
    class Broken(nc.nn.Module):
        def __init__(self):
            self.fc = nc.nn.Linear(2, 2)

    with pytest.raises(RuntimeError, match="super"):
        Broken()
