"""`netcl bench imagenet` (netcl.bench.imagenet): its rounds, rates and peak-memory measurement, and one
quick run of the whole benchmark at a small image size."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import netcl as nc
from netcl.bench import imagenet
from netcl.bench.reference_worker import peak_over_baseline


def test_rotate_measures_every_side_once_a_round_in_rotating_order():
    calls = []
    seconds = {"netcl": iter([1.0, 2.0, 1.0]), "torch": iter([2.0, 2.0, 4.0]), "onnxruntime": iter([0.5, 1.0, 0.5])}

    def side(name):
        def measure():
            calls.append(name)
            return next(seconds[name])
        return measure
    samples = imagenet.rotate({name: side(name) for name in seconds}, rounds=3, quiet_s=0.0)
    assert calls == ["netcl", "torch", "onnxruntime", "torch", "onnxruntime", "netcl",
                     "onnxruntime", "netcl", "torch"]
    figures = imagenet.summarize(samples, batch=4)
    assert figures["netcl"]["images_per_second"] == 4.0  # median 1 s per batch of 4
    assert figures["torch"]["ratio"] == 2.0  # per-round ratios 2, 1, 4
    assert figures["onnxruntime"]["ratio"] == 0.5 and "ratio" not in figures["netcl"]


def test_a_layer_is_rated_against_the_bound_its_arithmetic_intensity_gives():
    rates = {"gemm_gflops": 400.0, "copy_gbps": 40.0}  # ridge point: 10 FLOP per byte
    compute = imagenet._rate(flops=2e9, nbytes=1e8, ms=10.0, rates=rates)  # 20 FLOP/B
    assert compute["bound"] == "compute" and compute["gflops"] == pytest.approx(200.0)
    assert compute["share"] == pytest.approx(0.5)
    memory = imagenet._rate(flops=5e8, nbytes=1e8, ms=5.0, rates=rates)  # 5 FLOP/B
    assert memory["bound"] == "memory" and memory["gbps"] == pytest.approx(20.0)
    assert memory["share"] == pytest.approx(0.5)
    assert imagenet._rate(0, 4e6, 1.0, rates)["bound"] == "memory"


def test_batch_lists_parse_and_bad_ones_are_refused():
    import argparse
    assert imagenet.parse_batches("1,8, 32") == (1, 8, 32)
    for bad in ("", "0", "1,x", "-2"):
        with pytest.raises(argparse.ArgumentTypeError, match="--batch"):
            imagenet.parse_batches(bad)


def test_peak_over_baseline_sees_what_the_steps_hold():
    held = []
    size = 64 << 20

    def build():
        return (lambda: held.append(np.ones(size // 8))), (lambda: None)
    result = peak_over_baseline(build, warmup=1, steps=2)
    assert result["peak_memory_bytes"] >= 2 * size  # three arrays of 64 MiB held at the end, at least two after the reset
    assert result["baseline_bytes"] > 0 and isinstance(result["peak_reset"], bool)


def test_the_shape_trace_sees_each_layers_input_and_leaves_the_modules_as_they_were():
    model = nc.models.resnet8(num_classes=3, in_channels=3, seed=0)
    model.train()
    x = nc.tensor(np.zeros((2, 3, 16, 16), np.float32))
    with imagenet._ShapeTrace(model, x) as trace, nc.no_grad():
        model(x)
    shapes = {name: shape for name, _, shape, _ in trace.calls}
    assert shapes["conv1"] == (2, 3, 16, 16) and shapes["layer2.0.conv2"] == (2, 32, 8, 8)
    assert [name for name, _, _, reads_input in trace.calls if reads_input] == ["conv1"]
    assert shapes["fc"] == (2, 64)
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.skipif(not hasattr(nc.models, "resnet18"), reason="nc.models.resnet18 has not landed")
def test_bench_imagenet_quick_reports_every_figure(tmp_path):
    """The whole benchmark, once, at 32×32 (batch 2 keeps two values a channel in the last stage's
    BatchNorms), without references (PyTorch is never in the default suite)."""
    env = dict(os.environ, NETCL_REFERENCE_PYTHON=sys.executable, NETCL_CONV_PLAN_MODE="heuristic")
    out = subprocess.run([sys.executable, "-m", "netcl", "bench", "imagenet", "--model", "resnet18", "--batch", "2",
                          "--quick", "--image-size", "32", "--json"], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "imagenet" and result["image_size"] == 32
    assert result["device_rates"]["gemm_gflops"] > 0 and result["device_rates"]["copy_gbps"] > 0
    (entry,) = result["results"]
    assert entry["model"] == "resnet18" and entry["batch"] == 2
    assert entry["inference_images_per_second"] > 0 and entry["training_images_per_second"] > 0
    assert entry["inference_ms_per_batch"] == pytest.approx(2e3 / entry["inference_images_per_second"])
    assert entry["inference_status"].startswith("replaying"), entry["inference_status"]
    assert entry["training_status"].startswith("replaying"), entry["training_status"]
    # weights, gradients and momentum of 11.7M parameters are in a training step's peak
    assert entry["peak_memory_bytes"] > 3 * 11_000_000 * 4
    assert entry["inference_peak_memory_bytes"] > 11_000_000 * 4
    if not any("PyTorch is not installed" in note for note in result["notes"]):
        assert entry["training_ratio_to_torch"] > 0  # an interpreter with torch is what the test got
    convs = [row for row in entry["layers"] if row["name"] == "layer1.0.conv1"]
    assert [row["pass"] for row in convs] == ["forward", "backward_data", "backward_weight"]
    assert [(row["pass"], row["in_training"]) for row in entry["layers"] if row["name"] == "conv1"] == [
        ("forward", True), ("backward_data", False), ("backward_weight", True)]
    assert "backward_data*" in out.stdout and "not run in a training step" in out.stdout
    for row in entry["layers"]:
        assert row["ms"] > 0 and row["strategy"] and row["pass"]
        assert ("gflops" in row) == (row["bound"] == "compute") and row["share"] > 0
    names = {row["name"] for row in entry["layers"]}
    assert {"conv1", "bn1", "maxpool", "layer4.1.conv2", "fc"} <= names
    assert "per layer, resnet18 at batch 2" in out.stdout
    assert "the layers' forward passes one by one" in out.stdout and "the replayed inference" in out.stdout


def test_bench_imagenet_refuses_a_bad_batch_list():
    out = subprocess.run([sys.executable, "-m", "netcl", "bench", "imagenet", "--batch", "8,x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--batch" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("model", imagenet.MODELS)
@pytest.mark.skipif(not os.environ.get("NETCL_REFERENCE_PYTHON"), reason="NETCL_REFERENCE_PYTHON names no PyTorch")
def test_bench_imagenet_runs_the_same_network_as_its_pytorch_reference(model):
    """The reference worker's PyTorch architectures take the netcl state_dict key for key (strictly) and
    compute the same eval-mode outputs."""
    if not hasattr(nc.models, model):
        pytest.skip(f"nc.models.{model} has not landed")
    out = subprocess.run([sys.executable, "-m", "netcl", "bench", "imagenet", "--model", model, "--batch", "2",
                          "--quick", "--image-size", "32", "--json"], capture_output=True, text=True,
                         env=dict(os.environ, NETCL_CONV_PLAN_MODE="heuristic"), timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    (entry,) = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    assert entry["max_difference_to_torch"] < 1e-4
    assert entry["inference_ratio_to_torch"] > 0 and entry["training_ratio_to_torch"] > 0
    assert entry["torch_peak_memory_bytes"] > 0
