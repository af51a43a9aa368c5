"""nc.save / nc.load: round trips of nested checkpoints, atomic replacement, damage detection."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import serialization


def test_round_trip_nested_checkpoint(device, rng, tmp_path):
    model = nc.models.lenet(seed=0, device=device)
    blob = {"model_state": model.state_dict(), "step": 7, "lr": 0.5, "name": "lenet", "flags": [True, None],
            "pair": (1, 2.5), "by_index": {0: rng.standard_normal((3, 2)), 1: {"step": 3}},
            "int_labels": np.arange(5, dtype=np.int64), "scalar": np.float32(1.5)}
    path = tmp_path / "ck.ncl"
    nc.save(blob, path)
    back = nc.load(path, device=device)
    for key, value in model.state_dict().items():
        assert isinstance(back["model_state"][key], nc.Tensor)
        assert np.array_equal(back["model_state"][key].to_host(), value.to_host()), key
    assert back["step"] == 7 and back["lr"] == 0.5 and back["name"] == "lenet" and back["flags"] == [True, None]
    assert back["pair"] == (1, 2.5) and back["by_index"][1] == {"step": 3} and back["scalar"] == 1.5
    assert np.array_equal(back["by_index"][0], blob["by_index"][0]) and back["by_index"][0].dtype == np.float64
    assert np.array_equal(back["int_labels"], np.arange(5))


def test_overwrite_is_atomic_when_the_write_fails(device, tmp_path, monkeypatch):
    path = tmp_path / "ck.ncl"
    nc.save({"version": 1}, path)

    def crash(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(serialization.os, "replace", crash)
    with pytest.raises(nc.CheckpointError, match="disk full"):
        nc.save({"version": 2}, path)
    monkeypatch.undo()
    assert nc.load(path) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck.ncl"], "no temporary file is left behind"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_file_raises_checkpoint_error(device, tmp_path, damage):
    path = tmp_path / "ck.ncl"
    nc.save({"w": nc.ones((10, 10), device=device)}, path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-7]
    elif damage == "flip":
        data[-3] ^= 0x40
    elif damage == "garbage":
        data = bytearray(b"not a checkpoint at all, just text" * 3)
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(nc.CheckpointError) as info:
        nc.load(path)
    assert isinstance(info.value, nc.NetclError) and str(path) in str(info.value)


def test_missing_file_and_unsupported_values(tmp_path):
    with pytest.raises(nc.CheckpointError, match="cannot read"):
        nc.load(tmp_path / "nope.ncl")
    with pytest.raises(nc.CheckpointError, match="set"):
        nc.save({"bad": {1, 2}}, tmp_path / "x.ncl")


def test_zero_dimensional_values_keep_their_shape(tmp_path, device):
    """BatchNorm's num_batches_tracked is a 0-d tensor: it must load back 0-d, or load_state_dict refuses it."""
    nc.save({"t": nc.tensor(np.array(5, np.int64), device=device), "a": np.array(2.5)}, tmp_path / "s.ncl")
    loaded = nc.load(tmp_path / "s.ncl")
    assert loaded["t"].shape == () and loaded["t"].item() == 5
    assert loaded["a"].shape == () and loaded["a"] == 2.5
