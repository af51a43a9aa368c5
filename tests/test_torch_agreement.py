"""benchmarks/torch_agreement.py's smallest configuration (an imported ONNX ResNet-18 and nc.models.resnet18
against PyTorch float64) meets issues 46 and 47's numerical targets. Needs an interpreter with torch
(NETCL_REFERENCE_PYTHON, else this one); PyTorch runs in that process, never in the suite's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from netcl import settings

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "torch_agreement.py"


def _torch_python():
    python = settings.REFERENCE_PYTHON.get() or sys.executable
    try:
        found = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        found = False
    return python if found else None


@pytest.mark.slow
def test_quick_configuration_meets_the_targets(tmp_path):
    python = _torch_python()
    if python is None:
        pytest.skip("no interpreter with torch (set NETCL_REFERENCE_PYTHON)")
    out = tmp_path / "agreement.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--torch-python", python, "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=settings.child_environment())
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = [row for result in report["results"] for row in result["rows"]]
    assert {(row["model"], row["mode"]) for row in rows} == {
        ("resnet18 (ONNX import)", "eval"), ("resnet18 (ONNX import)", "train"),
        ("nc.models.resnet18", "eval"), ("nc.models.resnet18", "train")}
    for row in rows:
        if row["mode"] == "eval":
            assert row["netcl_error"] <= 1e-4, row
        else:
            assert row["tensors"] == 63  # the loss and ResNet-18's 62 parameters
            assert row["ratio"] <= 5.0, row
    (sgd,) = [result["sgd"] for result in report["results"] if "sgd" in result]
    assert len(sgd["netcl"]) == 10 and sgd["netcl"][-1] < 0.5 * sgd["netcl"][0], sgd
    assert done.returncode == 0, done.stdout[-3000:]
