"""End to end on real MNIST (../shared/data/mnist): LeNet learns (> 90% test accuracy in a few hundred
steps), checkpoint -> load -> eval reproduces the accuracy, --resume equals the uninterrupted run, and the
`netcl train` / `netcl eval` commands work with --data-dir and with NETCL_DATA."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl import serialization
from netcl.cli.main import main
from netcl.data.mnist import FILES, load_mnist
from netcl.training import cli as training
from netcl.data import DataLoader, TensorDataset
from netcl.training import recipes
from netcl.training.loop import evaluate
from netcl.training.progress import plot_curves

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
pytestmark = pytest.mark.skipif(not (SHARED / "train-images-idx3-ubyte.gz").exists(),
                                reason="../shared/data/mnist is not present")
EVAL_IMAGES = 2000


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("lenet")
    summary = training.train("lenet", epochs=1, batch_size=32, data_dir=SHARED, out=out, seed=0, limit_steps=200,
                             eval_limit=EVAL_IMAGES, progress=False, log=lambda *a, **k: None)
    return out, summary


def test_lenet_learns_mnist_in_a_few_hundred_steps(trained):
    out, summary = trained
    assert summary["test_accuracy"] > 0.90, summary
    assert summary["epochs"] == 1 and np.isfinite(summary["train_loss"]) and summary["train_loss"] < 1.0
    assert summary["images_per_second"] > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"][0]["test_accuracy"] == summary["test_accuracy"]


def test_checkpoint_load_eval_gives_the_same_accuracy(trained, device):
    out, summary = trained
    result = training.evaluate_checkpoint(out / "checkpoint.ncl", SHARED, limit=EVAL_IMAGES)
    assert result["test_accuracy"] == summary["test_accuracy"] and result["images"] == EVAL_IMAGES
    state = serialization.load(out / "checkpoint.ncl")
    model = nc.models.lenet(seed=123)
    model.load_state_dict(state["model_state"])
    x, y = load_mnist("test", SHARED)
    test_set = TensorDataset(x[:EVAL_IMAGES], y[:EVAL_IMAGES], recipes.transforms("lenet", train=False))
    assert evaluate(model, DataLoader(test_set, 250))["accuracy"] == summary["test_accuracy"]


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, monkeypatch):
    # conv2d's online planner runs other strategies on the first steps of a process; the straight and the
    # resumed run would then round differently. Fixed (heuristic) plans make them comparable bit for bit.
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    nc.use_deterministic(True)
    try:
        kw = dict(epochs=2, batch_size=32, data_dir=SHARED, seed=5, limit_steps=4, eval_limit=64, progress=False,
                  log=lambda *a, **k: None)
        straight = training.train("lenet", out=tmp_path / "a", **kw)
        training.train("lenet", out=tmp_path / "b", stop_after=1, **kw)
        assert serialization.load(tmp_path / "b" / "checkpoint.ncl")["epoch"] == 1
        resumed = training.train("lenet", out=tmp_path / "b", resume=True, **kw)
    finally:
        nc.use_deterministic(False)
    a = serialization.load(tmp_path / "a" / "checkpoint.ncl")
    b = serialization.load(tmp_path / "b" / "checkpoint.ncl")
    for key, value in a["model_state"].items():
        assert np.array_equal(value.to_host(), b["model_state"][key].to_host()), key
    for index, state in a["optimizer"]["state"].items():
        assert np.array_equal(state["momentum_buffer"], b["optimizer"]["state"][index]["momentum_buffer"])
    assert a["dropout"] == b["dropout"] and resumed["train_loss"] == straight["train_loss"]
    assert [h["epoch"] for h in b["history"]] == [1, 2]


def test_damaged_checkpoint_and_missing_resume(tmp_path):
    (tmp_path / "checkpoint.ncl").write_bytes(b"NETCLCK\x00" + b"\x01" * 60)
    with pytest.raises(nc.CheckpointError):
        training.evaluate_checkpoint(tmp_path / "checkpoint.ncl", SHARED)
    with pytest.raises(nc.CheckpointError, match="no checkpoint"):
        training.train("lenet", data_dir=SHARED, out=tmp_path / "empty", resume=True, progress=False)


def _subset(directory: Path, train: int, test: int) -> Path:
    """A user directory holding the first images of each split, as plain (not gzipped) IDX files."""
    directory.mkdir()
    for split, n in (("train", train), ("test", test)):
        x, y = load_mnist(split, SHARED)
        for stem, array, magic in zip(FILES[split], (x[:n], y[:n]), (0x803, 0x801)):
            header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
            (directory / stem).write_bytes(header + array.astype(np.uint8).tobytes())
    return directory


def test_cli_train_and_eval_with_data_dir_and_netcl_data(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    data = _subset(tmp_path / "mnist", 64, 300)
    code = main(["train", "lenet", "--epochs", "1", "--limit-steps", "2", "--batch-size", "16", "--data-dir",
                 str(data), "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert set(summary) >= {"test_accuracy", "train_loss", "epochs", "images_per_second", "checkpoint"}
    assert Path(summary["checkpoint"]).exists() and "epoch 1/1" in captured.err
    monkeypatch.setenv("NETCL_DATA", str(tmp_path))  # found in its mnist/ sub-directory
    code = main(["eval", summary["checkpoint"], "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["test_accuracy"] == summary["test_accuracy"] and result["images"] == 300


def test_cli_missing_data_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NETCL_DATA", raising=False)
    code = main(["train", "lenet", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and "DataError" in err and "--data-dir" in err and len(err.strip().splitlines()) == 1


def test_training_curves_png_only_with_matplotlib(tmp_path):
    history = [{"epoch": 1, "train_loss": 0.5, "test_accuracy": 0.9}, {"epoch": 2, "train_loss": 0.2,
                                                                         "test_accuracy": 0.95}]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert plot_curves(history, tmp_path / "curves.png") is None
        assert not (tmp_path / "curves.png").exists()
        return
    path = plot_curves(history, tmp_path / "curves.png")
    assert path and (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_distributed_two_ranks_then_resume_on_one(tmp_path):
    """`mpiexec -n 2 netcl train lenet --distributed`: rank 0 alone reports and writes (with the world size
    and per-rank throughput); the checkpoint then resumes in a single process (--resume with any N)."""
    import importlib.util
    import os
    import shutil
    import subprocess
    import sys
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        pytest.skip("needs mpi4py and mpiexec: pip install mpi4py mpich")
    data = _subset(tmp_path / "mnist", 256, 400)
    out = tmp_path / "run"
    args = ["train", "lenet", "--batch-size", "32", "--limit-steps", "3", "--data-dir", str(data), "--out", str(out),
            "--json"]
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "netcl", *args, "--epochs", "3", "--stop-after",
                           "2", "--distributed"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 alone prints its summary
    summary = json.loads(lines[0])
    assert summary["world_size"] == 2 and summary["epochs"] == 2
    assert summary["images_per_second"] == pytest.approx(2 * summary["images_per_second_per_rank"])
    assert proc.stderr.count("epoch 2/3: train loss") == 1
    state = serialization.load(out / "checkpoint.ncl")
    assert state["scheduler"]["last_epoch"] == 6 and state["epoch"] == 2
    assert summary["test_accuracy"] == pytest.approx(state["history"][-1]["test_accuracy"])
    # every test image scored once across the ranks: the accuracy is a multiple of 1/400
    assert abs(summary["test_accuracy"] * 400 - round(summary["test_accuracy"] * 400)) < 1e-9
    assert main(args + ["--epochs", "4", "--resume"]) == 1  # another schedule length: refused, one line
    assert main(args + ["--epochs", "3", "--resume"]) == 0
    resumed = serialization.load(out / "checkpoint.ncl")
    assert resumed["epoch"] == 3 and resumed["scheduler"]["last_epoch"] == 9
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
