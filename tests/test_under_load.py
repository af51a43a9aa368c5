"""Under load: a training process and a planning process run at the same time against one cache directory
(NETCL_CACHE_DIR), both planning by measurement, so they compile the same kernels, time the same layers and
write the same plan, calibration and kernel-binary files concurrently. Both must finish with correct
results, and the cache must be intact afterwards: every JSON file parses, every kernel binary carries a
valid checksum, no temporary file is left behind, and a third process reads it all without a warning.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MNIST = Path("/work/shared/data/mnist")
TIMEOUT = 600


def _netcl(args, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "netcl"] + args, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _finish(proc, what):
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{what} did not finish within {TIMEOUT} s: {err[-2000:]}") from None
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}): {err[-3000:]}"
    assert "damaged" not in err, f"{what} found a damaged cache entry: {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def check_cache_intact(root: Path) -> dict:
    """Counts of the files checked; raises on anything half-written or damaged."""
    from netcl.runtime.binaries import MAGIC as _BINARY_MAGIC
    leftovers = [p for p in root.rglob("*") if p.is_file() and p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left in the cache: {leftovers}"
    counts = {"json": 0, "bin": 0}
    for path in root.rglob("*.json"):
        json.loads(path.read_text())
        counts["json"] += 1
    for path in root.rglob("*.bin"):
        blob = path.read_bytes()
        header = len(_BINARY_MAGIC) + 32
        assert blob.startswith(_BINARY_MAGIC) and len(blob) > header, f"{path} is not a kernel binary"
        assert hashlib.sha256(blob[header:]).digest() == blob[len(_BINARY_MAGIC):header], f"{path} is damaged"
        counts["bin"] += 1
    return counts


@pytest.mark.skipif(not (MNIST / "train-images-idx3-ubyte.gz").exists(), reason="no MNIST copy at " + str(MNIST))
def test_training_and_planning_share_a_cache(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "NETCL_CACHE_DIR": str(cache), "NETCL_CONV_PLAN_MODE": "measure", "PYTHONUNBUFFERED": "1"}
    env.pop("NETCL_CACHE", None)
    train = _netcl(["train", "lenet", "--epochs", "1", "--limit-steps", "30", "--batch-size", "32",
                    "--data-dir", str(MNIST), "--out", str(tmp_path / "run"), "--json"], env)
    plan = _netcl(["plan", "lenet", "--batch", "32", "--pass", "all", "--mode", "measure", "--json"], env)
    trained = _finish(train, "netcl train")
    planned = _finish(plan, "netcl plan")

    # training: 30 steps of LeNet learn far beyond chance (~75% here); the checkpoint scores the same
    assert 0.5 < trained["test_accuracy"] <= 1.0, trained
    assert 0.0 < trained["train_loss"] < 2.3, trained  # below ln 10, the loss of a uniform guess
    scored = _finish(_netcl(["eval", trained["checkpoint"], "--data-dir", str(MNIST), "--json"], env), "netcl eval")
    assert scored["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-9)

    # planning: every layer and pass got an applicable strategy that was measured
    assert planned["layers"] and {layer["pass"] for layer in planned["layers"]} == \
        {"forward", "backward_data", "backward_weight"}
    for layer in planned["layers"]:
        chosen = [c for c in layer["candidates"] if c["strategy"] == layer["strategy"]]
        assert chosen and chosen[0]["applicable"], layer
        assert chosen[0]["measured_ms"] is not None and chosen[0]["measured_ms"] > 0, layer

    counts = check_cache_intact(cache)
    assert counts["json"] > 0 and counts["bin"] > 0, counts
    # a third process reads the shared cache: same plans, no warning about damaged entries
    again = _finish(_netcl(["plan", "lenet", "--batch", "32", "--pass", "all", "--mode", "measure", "--json"], env),
                    "netcl plan (again)")
    assert [(x["name"], x["pass"]) for x in again["layers"]] == [(x["name"], x["pass"]) for x in planned["layers"]]
    check_cache_intact(cache)
