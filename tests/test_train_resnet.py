"""`netcl train resnet*` on real MNIST (../shared/data/mnist), kept short: a ResNet-8 learns from a few
hundred images (the loss falls clearly), and --resume (BatchNorm buffers, momentum, the OneCycleLR position)
equals the uninterrupted run. The full targets (resnet8 --epochs 1 ≥ 98.5 %) are runs, not tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl import serialization
from netcl.cli.main import main
from netcl.training import cli as training
from netcl.training import recipes
from netcl.training.distributed import Ranks, local_batch_size

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
pytestmark = [
    pytest.mark.skipif(not (SHARED / "train-images-idx3-ubyte.gz").exists(),
                       reason="../shared/data/mnist is not present"),
    pytest.mark.skipif(not hasattr(nc.models, "resnet8"), reason="nc.models.resnet8 has not landed"),
]
QUIET = dict(progress=False, log=lambda *a, **k: None)


def test_tiny_resnet_learns_and_reports(tmp_path):
    summary = training.train("resnet8", epochs=4, batch_size=32, lr=0.2, data_dir=SHARED, out=tmp_path, seed=1,
                             train_limit=320, eval_limit=200, **QUIET)
    losses = [h["train_loss"] for h in summary["history"]]
    # The recipe's label smoothing ε puts the loss's floor at the entropy of the smoothed targets.
    eps, classes = recipes.recipe("resnet8")["label_smoothing"], 10
    target = np.full(classes, eps / classes)
    target[0] += 1 - eps
    floor = float(-(target * np.log(target)).sum())
    assert all(np.isfinite(losses)) and losses[-1] - floor < 0.8 * (losses[0] - floor), (losses, floor)
    assert summary["test_accuracy"] > 0.3, summary  # chance is 0.1
    assert summary["epochs"] == 4 and summary["images_per_second"] > 0
    state = serialization.load(summary["checkpoint"])
    assert state["model"] == "resnet8" and "layer2.0.downsample.1.running_var" in state["model_state"]
    assert state["scheduler"]["last_epoch"] == 40  # 10 batches per epoch, one OneCycleLR step each
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3, 4]


def test_resnet_resume_continues_exactly(tmp_path, monkeypatch):
    # conv2d's online planner runs other strategies on the first steps of a process; the straight and the
    # resumed run would then round differently. Fixed (heuristic) plans make them comparable bit for bit.
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    nc.use_deterministic(True)
    try:
        kw = dict(epochs=2, batch_size=16, data_dir=SHARED, seed=3, limit_steps=2, train_limit=64, eval_limit=32,
                  **QUIET)
        straight = training.train("resnet8", out=tmp_path / "a", **kw)
        training.train("resnet8", out=tmp_path / "b", stop_after=1, **kw)
        resumed = training.train("resnet8", out=tmp_path / "b", resume=True, **kw)
    finally:
        nc.use_deterministic(False)
    a = serialization.load(tmp_path / "a" / "checkpoint.ncl")
    b = serialization.load(tmp_path / "b" / "checkpoint.ncl")
    for key, value in a["model_state"].items():  # parameters and BatchNorm buffers alike
        assert np.array_equal(np.asarray(value), np.asarray(b["model_state"][key])), key
    for index, state in a["optimizer"]["state"].items():
        assert np.array_equal(state["momentum_buffer"], b["optimizer"]["state"][index]["momentum_buffer"])
    assert a["scheduler"] == b["scheduler"] and a["host_rng"] == b["host_rng"]
    assert resumed["train_loss"] == straight["train_loss"]


def test_cli_rejects_an_uneven_global_batch_and_unknown_model(tmp_path, capsys):
    assert main(["train", "resnet9", "--out", str(tmp_path)]) == 2
    with pytest.raises(nc.ShapeError, match="split evenly"):
        local_batch_size(63, Ranks(rank=0, world_size=2, distributed=True))
    assert local_batch_size(64, Ranks(rank=1, world_size=2, distributed=True)) == 32
