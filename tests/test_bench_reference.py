"""The reference-process runner of the benchmarks (netcl.bench.reference) and `netcl bench resnet`."""
import json
import os
import subprocess
import sys

import pytest

import netcl as nc
from netcl.bench.reference import ReferenceError, ReferenceProcess, alternate, compare


def test_alternate_takes_turns_and_reports_the_median_ratio():
    calls = []
    ours = iter([1.0, 2.0, 1.0, 4.0, 1.0])
    theirs = iter([2.0, 2.0, 3.0, 4.0, 0.5])

    def netcl_seconds():
        calls.append("netcl")
        return next(ours)

    def reference_seconds():
        calls.append("reference")
        return next(theirs)
    r = alternate(netcl_seconds, reference_seconds, rounds=5, quiet_s=0.0)
    assert calls[:4] == ["netcl", "reference", "reference", "netcl"]  # who goes first alternates
    assert r["ratio"] == 1.0  # per-round ratios 2, 1, 3, 1, 0.5
    assert r["netcl_seconds"] == 1.0 and r["reference_seconds"] == 2.0 and len(r["rounds"]) == 5


class _FakeReference:
    def __init__(self, has_torch):
        self.has_torch, self.requests = has_torch, []

    def seconds(self, **request):
        self.requests.append(request)
        return 3.0


def test_compare_falls_back_to_netcl_alone_without_torch():
    times = iter([1.0, 5.0, 2.0])
    without = _FakeReference(has_torch=False)
    r = compare(lambda: next(times), without, {"model": "lenet"}, rounds=3, quiet_s=0.0)
    assert r == {"netcl_seconds": 2.0} and not without.requests
    with_torch = _FakeReference(has_torch=True)
    r = compare(lambda: 1.5, with_torch, {"model": "lenet", "batch": 7}, rounds=3, quiet_s=0.0)
    assert r["ratio"] == 2.0 and with_torch.requests == [{"model": "lenet", "batch": 7}] * 3


def test_reference_process_names_its_torch_device(monkeypatch):
    """NETCL_REFERENCE_DEVICE reaches the reference process, whose ready line names it; where that
    PyTorch sees no such device, a request says so instead of failing inside CUDA."""
    monkeypatch.setenv("NETCL_REFERENCE_DEVICE", "cuda")
    with ReferenceProcess() as ref:
        if not ref.has_torch:
            pytest.skip("PyTorch is not installed for the reference interpreter")
        assert ref.info["torch_device"] == "cuda"
        try:
            seconds = ref.seconds(model="lenet", mode="infer", batch=2, seconds=0.01, min_reps=1)
        except ReferenceError as exc:
            assert "sees no CUDA device" in str(exc)
        else:
            assert seconds > 0  # a PyTorch with CUDA ran it there


def test_reference_process_measures_numpy_in_another_process():
    with ReferenceProcess(python=sys.executable) as ref:
        assert ref.info["ready"] and ref.info["numpy"]
        first = ref.seconds(model="matmul", M=31, N=13, K=7, seconds=0.05, min_reps=3)
        again = ref.seconds(model="matmul", M=31, N=13, K=7, seconds=0.05, min_reps=3)
        assert 0 < first < 1 and 0 < again < 1
        with pytest.raises(ReferenceError, match="no_such_model"):
            ref.seconds(model="no_such_model", batch=1)
        if not ref.has_torch:
            assert "NETCL_REFERENCE_PYTHON" in ref.missing_torch_note()
        assert ref.seconds(model="matmul", M=7, N=7, K=7, seconds=0.01) > 0  # still answering after an error


def test_reference_worker_imports_no_opencl():
    code = ("import importlib.util as u, sys; spec = u.spec_from_file_location('worker', sys.argv[1]); "
            "spec.loader.exec_module(u.module_from_spec(spec)); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('netcl', 'pyopencl')))")
    from netcl.bench.reference import WORKER
    out = subprocess.run([sys.executable, "-c", code, str(WORKER)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_missing_interpreter_is_a_reference_error(tmp_path):
    with pytest.raises(ReferenceError, match="cannot start"):
        ReferenceProcess(python=str(tmp_path / "no-python"))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(nc.models, "resnet20"), reason="nc.models.resnet20 has not landed")
def test_bench_resnet_quick_reports_every_figure():
    out = subprocess.run([sys.executable, "-m", "netcl", "bench", "resnet", "--quick", "--json"], capture_output=True,
                         text=True, timeout=1800, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["train_iterations_per_second"]["32"] > 0 and r["inference_images_per_second"]["32"] > 0
    assert "layer3.2.conv2" in r["layers_ms"] and "layer2.0.downsample" in r["layers_ms"]
    assert all(t["forward"] > 0 for t in r["layers_ms"].values())
    assert r["ratio_to_torch"] or "PyTorch is not installed" in r["torch_note"]
    assert "ResNet-20 at 3x32x32" in out.stdout


def test_interleave_takes_every_sample_in_the_same_rounds(device):
    from netcl.bench.reference import interleave
    order = []

    class Recording(_FakeReference):
        def seconds(self, **request):
            order.append(request["model"])
            return 0.5
    runners = {"a": lambda: order.append("a"), "b": (lambda: order.append("b"), 3)}
    samples = interleave(runners, device, Recording(has_torch=False), {"numpy": {"model": "ref"}}, rounds=2,
                         warmup=1, quiet_s=0.0, wake_s=0.0)
    assert order[:5] == ["a", "b", "b", "b", "ref"]  # the warm-up: every runner and request once
    assert {k: len(v) for k, v in samples.items()} == {"a": 2, "b": 2, "numpy": 2}
    assert samples["numpy"] == [0.5] * 2
    # Each sample follows one untimed waking call; the reference goes last, then first; the order rotates.
    assert order[5:] == ["a", "a", "b", "b", "b", "b", "ref"] + ["ref", "b", "b", "b", "b", "a", "a"]
    with pytest.raises(ValueError, match="both sides"):
        interleave({"numpy": runners["a"]}, device, Recording(has_torch=False), {"numpy": {}}, rounds=1)


def test_bench_gemm_times_numpy_in_the_reference_process(device):
    from netcl.bench import gemm as bench_gemm
    with ReferenceProcess(python=sys.executable) as ref:
        row = bench_gemm.measure(13, 7, 31, repeat=2, device=device, ref=ref, textbook=False)
    assert row["rel_l2"] < 1e-5
    # 13x7x31 is a tiny product: on a loaded machine netcl's ratio to NumPy can round to 0.000
    assert row["numpy_gflops"] > 0 and row["netcl_pipelined_gflops"] > 0 and row["vs_numpy"] >= 0


def test_reference_process_runs_onnxruntime_on_an_onnx_file(device, rng, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import numpy as np
    model = nc.nn.Sequential(nc.nn.Conv2d(3, 5, 3, device=device), nc.nn.ReLU(), nc.nn.Flatten(),
                             nc.nn.Linear(5 * 25, 4, device=device))
    x = rng.standard_normal((3, 3, 7, 7)).astype(np.float32)
    nc.onnx.export(model, nc.tensor(x, device=device), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    runtime = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    expected = runtime.run(None, {"input": x})[0]
    with ReferenceProcess(python=sys.executable) as ref:
        assert ref.onnxruntime_version == ort.__version__
        request = {"model": "onnx", "path": str(tmp_path / "m.onnx"), "input": str(tmp_path / "x.npy")}
        assert ref.ask(**request, save_output=str(tmp_path / "y.npy")) == {"saved": str(tmp_path / "y.npy")}
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
        assert 0 < ref.seconds(**request, seconds=0.02, min_reps=2) < 1
        with pytest.raises(ReferenceError, match="reference onnx: .*"):
            ref.ask(model="onnx", path=str(tmp_path / "missing.onnx"), input=str(tmp_path / "x.npy"))


def test_bench_rejects_unknown_names_and_a_batch_without_a_model():
    for argv, message in ((["bench", "nothing"], "unknown benchmark 'nothing'"),
                          (["bench", "lenet", "--batch", "3"], "--batch is for `netcl bench imagenet`"),
                          (["bench", "model.onnx", "--batch", "1,8"], "takes one batch size, got 1,8"),
                          (["bench", "imagenet", "--batch", "0"], "--batch takes positive integers")):
        out = subprocess.run([sys.executable, "-m", "netcl", *argv], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_bench_an_onnx_model_against_onnxruntime(rng, tmp_path):
    pytest.importorskip("onnxruntime")
    import numpy as np
    model = nc.models.lenet(seed=int(rng.integers(1 << 30)))
    nc.onnx.export(model, nc.tensor(rng.standard_normal((2, 1, 28, 28)).astype(np.float32)), tmp_path / "lenet.onnx")
    out = subprocess.run([sys.executable, "-m", "netcl", "bench", str(tmp_path / "lenet.onnx"), "--batch", "3",
                          "--quick", "--json"], capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["input"] == [3, 1, 28, 28] and r["load_seconds"] > 0
    assert r["netcl_images_per_second"] > 0 and r["onnxruntime_images_per_second"] > 0
    assert r["max_relative_error"] < 1e-5 and r["ratio_to_onnxruntime"] > 0
    assert "netcl / onnxruntime" in out.stdout
