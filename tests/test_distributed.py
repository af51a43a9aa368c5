"""nc.distributed and DistributedDataParallel, 2 ranks under the MPI wheel's mpiexec (one PoCL thread each).

The jobs run tests/distributed/worker.py, which saves each rank's results; the checks are here, against
NumPy (collectives) and against one process training on the whole global batch (DistributedDataParallel).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).parent / "distributed" / "worker.py"
RANKS = 2


def _find_mpiexec() -> str | None:
    """The launcher installed beside this Python (the MPI wheel's, matching the MPI mpi4py loads), else
    the first on PATH: a system Open MPI launcher would start singletons of an MPICH-linked mpi4py."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec") or shutil.which("mpirun")


MPIEXEC = _find_mpiexec()
# A failed job must end within this many seconds (the bound), and a healthy one well within it.
FAILURE_DEADLINE_SECONDS = 30

needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="nc.distributed's tests need mpi4py and mpiexec: pip install mpi4py mpich")

sys.path.insert(0, str(WORKER.parent))
import worker  # noqa: E402  (the worker's model, data and recipe, shared with the reference run)


def run_job(scenario: str, out: Path, seed: int, timeout: float = 120, **env_vars):
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT="1", PYTHONUNBUFFERED="1", **env_vars)
    started = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(RANKS), sys.executable, str(WORKER), scenario, str(out), str(seed)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def load_ranks(out: Path, scenario: str) -> list:
    return [dict(np.load(out / f"{scenario}-rank{r}.npz")) for r in range(RANKS)]


@pytest.fixture
def seed(rng):
    return int(rng.integers(0, 2**31))


@needs_mpi
def test_all_reduce_ops_and_broadcast(tmp_path, seed):
    proc, _ = run_job("collectives", tmp_path, seed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = load_ranks(tmp_path, "collectives")
    for size in (1, 7, 13, 31):
        for dtype in ("float32", "int32"):
            inputs = np.stack([r[f"input/{size}/{dtype}"].astype(np.float64) for r in ranks])
            assert not np.array_equal(inputs[0], inputs[1]) or size == 1  # the ranks reduce different data
            expected = {"sum": inputs.sum(0), "max": inputs.max(0), "min": inputs.min(0), "avg": inputs.mean(0)}
            for op, want in expected.items():
                if op == "avg" and dtype != "float32":
                    continue
                for r in ranks:
                    got = r[f"{op}/{size}/{dtype}"]
                    assert got.dtype == np.dtype(dtype)
                    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op} of {size} {dtype}")
                    assert r[f"same_object/{op}/{size}/{dtype}"], "all_reduce returns the tensor it reduced"
        for r in ranks:
            np.testing.assert_array_equal(r[f"broadcast/{size}"], np.full(size, RANKS - 1, np.float32))
    for rank, r in enumerate(ranks):
        want = np.arange(31, dtype=np.float32) + 100 * rank
        want[7:20] = sum(np.arange(7, 20, dtype=np.float32) + 100 * k for k in range(RANKS))
        np.testing.assert_array_equal(r["view/whole"], want)
    whole_node = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == os.cpu_count()
    if whole_node and os.cpu_count() >= RANKS and os.environ.get("NETCL_BIND_CORES", "1") != "0":
        # each rank pinned to a share of its own, and running there
        shares = [set(r["affinity"].tolist()) for r in ranks]
        assert all(shares) and not set.intersection(*shares), shares
        assert all(set(r["pinned"].tolist()) == share for r, share in zip(ranks, shares))


@needs_mpi
@pytest.mark.parametrize("choice, transport, averaging", [
    ("auto", "shared memory", "device"), ("shared-host", "shared memory", "host"), ("mpi", "mpi", "host")])
def test_ddp_equals_one_process_with_the_global_batch(tmp_path, seed, choice, transport, averaging):
    # One convolution strategy: the planner's online trials pick by timing, and a pick that changed
    # between the runs compared bit for bit below would change their rounding.
    proc, _ = run_job("equivalence", tmp_path, seed, NETCL_DDP_TRANSPORT=choice, NETCL_CONV_STRATEGY="im2col")
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "equivalence-rank0.json").read_text())
    assert meta["world_size"] == RANKS, "mpiexec started singletons: its MPI is not the one mpi4py loads"
    assert meta["transport"] == transport  # the ranks share this machine: shared memory unless told
    import netcl as nc
    from netcl.distributed import bucket_reduce
    if averaging == "device" and not bucket_reduce.kernels_read_host_memory(nc.tensor([0.0]).device):
        averaging = "host"  # this driver's kernels do not work in host memory (a GPU's)
    assert meta["averaging"] == averaging
    caps = [str(c) for c in worker.BUCKET_CAPS]
    assert len(meta["buckets"][caps[0]]) == 1 and len(meta["buckets"][caps[1]]) == 6  # one, and one per tensor
    # by default a small model's gradients go in buckets of a quarter of them, the first ready first:
    # fc2 and fc1's bias, fc1's weight (larger than a quarter: alone), the convolution's
    assert meta["buckets"]["default"] == [3 + 13 * 3 + 13, 5 * 3 * 3 * 13, 5 + 5 * 9]
    ranks = load_ranks(tmp_path, "equivalence")
    reference = worker.train(worker.small_convnet(seed), worker.global_batches(seed, RANKS), 0, 1)
    initial = {n: p.to_host() for n, p in worker.small_convnet(seed).named_parameters()}
    for cap in worker.BUCKET_CAPS:
        for name, want in reference.items():
            key = f"cap{cap}/module.{name}"
            assert not np.allclose(want, initial[name]), "the steps changed the parameters"
            for r in ranks:
                error = np.abs(r[key] - want).max() / np.abs(want).max()
                assert error <= 1e-5, f"{key}: relative difference {error:.2e} from the single process"
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=f"{key} differs between ranks")
    assert meta["replay"]["True"].startswith("replaying"), meta["replay"]
    for name in reference:  # a replayed step is the step as written, hooks and allreduces included
        for r in ranks:
            np.testing.assert_array_equal(r[f"replay1/module.{name}"], r[f"replay0/module.{name}"])
        assert not np.array_equal(ranks[0][f"replay1/module.{name}"], ranks[0][f"cap{caps[1]}/module.{name}"])
    for name in reference:  # several buckets reduce to the same values as one
        np.testing.assert_allclose(ranks[0][f"cap{worker.BUCKET_CAPS[1]}/module.{name}"],
                                   ranks[0][f"cap{worker.BUCKET_CAPS[0]}/module.{name}"], rtol=1e-6, atol=1e-7)


@needs_mpi
@pytest.mark.parametrize("choice", ["auto", "mpi"])
def test_ddp_buffers_no_sync_and_unused_parameters(tmp_path, seed, choice):
    # through MPI a bucket whose parameters one rank left unused is copied only at the pass's end
    proc, _ = run_job("semantics", tmp_path, seed, NETCL_DDP_TRANSPORT=choice)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = load_ranks(tmp_path, "semantics")
    # BatchNorm: ranks started from different weights and statistics and saw different batches; after
    # eval() they hold rank 0's running statistics and the same parameters
    bn_keys = [k for k in ranks[0] if k.startswith("bn/")]
    assert any("running_var" in k for k in bn_keys)
    for key in bn_keys:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    # no_sync: the first pass stays local, the second averages the sum of both passes
    inputs = [r["no_sync/inputs"].astype(np.float64) for r in ranks]  # d sum(x W^T + b) / dW: rows of x.sum(0)
    for r, x in zip(ranks, inputs):
        # a column sum of float32 values may cancel to near zero: its error is bounded by the summands'
        # magnitude (n·eps·Σ|x|), not by the result's
        summation = np.finfo(np.float32).eps * len(x[0]) * np.abs(x[0]).sum(0)
        np.testing.assert_allclose(r["no_sync/local_weight_grad"], np.tile(x[0].sum(0), (3, 1)), rtol=1e-5,
                                   atol=float(summation.max()))
    want = np.tile(np.mean([x.sum((0, 1)) for x in inputs], axis=0), (3, 1))
    summation = max(np.finfo(np.float32).eps * 2 * len(x[0]) * np.abs(x).sum((0, 1)).max() for x in inputs)
    for r in ranks:
        np.testing.assert_allclose(r["no_sync/weight_grad"], want, rtol=1e-5, atol=max(1e-6, float(summation)))
        np.testing.assert_allclose(r["no_sync/bias_grad"], np.full(3, 2 * worker.BATCH), rtol=1e-6)
    # a head one rank never used contributes zeros there: the other rank's gradient over the world size
    for head in range(RANKS):
        x = ranks[head]["heads/input"].astype(np.float64)
        for r in ranks:
            np.testing.assert_allclose(r[f"heads/head{head}.weight"], np.tile(x.sum(0), (3, 1)) / RANKS,
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(r[f"heads/head{head}.bias"], np.full(3, worker.BATCH / RANKS), rtol=1e-6)
    # one rank's device cannot average in place: every rank sums on the host, and the averages are right
    inputs = [r["heads/input"].astype(np.float64) for r in ranks]
    for r in ranks:
        assert r["mixed/averaging_on_host"], "the ranks did not agree on the host's sums"
        assert r["released/without_collector"], "a dropped DDP waits for the garbage collector"
        np.testing.assert_allclose(r["mixed/weight_grad"], np.tile(np.mean([x.sum(0) for x in inputs], 0), (3, 1)),
                                   rtol=1e-5, atol=1e-5)


@needs_mpi
def test_a_failing_rank_ends_the_job_with_a_message_on_every_rank(tmp_path, seed):
    proc, seconds = run_job("fail", tmp_path, seed, timeout=FAILURE_DEADLINE_SECONDS + 30)
    assert proc.returncode != 0
    assert seconds < FAILURE_DEADLINE_SECONDS, f"the failed job took {seconds:.1f} s to end"
    assert f"netcl rank {worker.FAILING_RANK}/{RANKS} failed: ValueError: deliberate failure for the test" \
        in proc.stderr, proc.stderr[-3000:]
    for r in range(RANKS):
        if r != worker.FAILING_RANK:
            assert f"netcl rank {r}/{RANKS}: stopping because rank {worker.FAILING_RANK}/{RANKS} failed" \
                in proc.stderr, proc.stderr[-3000:]
            assert not (tmp_path / f"fail-rank{r}-finished").exists()


def test_missing_mpi_is_a_one_line_error_naming_the_install(monkeypatch):
    import netcl as nc
    from netcl.distributed import process_group
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `from mpi4py import MPI` raise ImportError
    monkeypatch.setattr(process_group, "_group", None)
    with pytest.raises(nc.NetclError) as info:
        nc.distributed.init_process_group(backend="mpi")
    message = str(info.value)
    assert "pip install mpi4py mpich" in message and "\n" not in message
    with pytest.raises(nc.NetclError, match="init_process_group"):
        nc.distributed.get_rank()


def test_ddp_transport_choice(monkeypatch):
    from types import SimpleNamespace

    import netcl as nc
    from netcl.distributed import bucket_reduce
    spread = SimpleNamespace(local_size=1, size=2, mpi=None)  # two ranks on two nodes
    monkeypatch.setenv("NETCL_DDP_TRANSPORT", "carrier-pigeon")
    with pytest.raises(nc.NetclError, match="auto, mpi, shared or shared-host"):
        bucket_reduce.for_group(spread, None, [])
    monkeypatch.setenv("NETCL_DDP_TRANSPORT", "shared")
    with pytest.raises(nc.NetclError, match="every rank on one node"):
        bucket_reduce.for_group(spread, None, [])
    monkeypatch.setenv("NETCL_DDP_TRANSPORT", "shared-host")
    with pytest.raises(nc.NetclError, match="every rank on one node"):
        bucket_reduce.for_group(spread, None, [])
    monkeypatch.setenv("NETCL_DDP_TRANSPORT", "auto")
    comm = SimpleNamespace(Get_size=lambda: 2)
    assert bucket_reduce.for_group(spread, comm, [(5, np.float32)]).name == "mpi"


def test_a_shared_window_too_large_for_dev_shm_falls_back_to_mpi(monkeypatch):
    """A window larger than /dev/shm would fail with SIGBUS when first written, mid-training."""
    from types import SimpleNamespace

    import netcl as nc
    from netcl.distributed import bucket_reduce
    node = SimpleNamespace(local_size=2, size=2, mpi=SimpleNamespace(MIN="min"))  # two ranks on this node
    comm = SimpleNamespace(Get_size=lambda: 2, allreduce=lambda value, op: value)  # the other rank agrees
    specs = [(1 << 20, np.float32)]  # 4 MiB of gradients: a window of 12 MiB at least
    monkeypatch.setattr(bucket_reduce, "shared_memory_room", lambda: 5 << 20)
    monkeypatch.setenv("NETCL_DDP_TRANSPORT", "auto")
    with pytest.warns(UserWarning, match=r"through MPI instead.*5,242,880 bytes free.*12,582,912.*shm-size"):
        assert bucket_reduce.for_group(node, comm, specs).name == "mpi"
    for forced in ("shared", "shared-host"):
        monkeypatch.setenv("NETCL_DDP_TRANSPORT", forced)
        with pytest.raises(nc.NetclError, match=f"NETCL_DDP_TRANSPORT={forced}: .*/dev/shm"):
            bucket_reduce.for_group(node, comm, specs)
    room = bucket_reduce.shared_memory_room()
    assert room is None or room > 0


def test_bad_arguments_raise_typed_errors(monkeypatch):
    import netcl as nc
    from netcl.distributed import process_group
    monkeypatch.setattr(process_group, "_group", None)
    with pytest.raises(nc.NetclError, match="backend"):
        nc.distributed.init_process_group(backend="nccl")
    with pytest.raises(nc.NetclError, match="init_process_group"):
        nc.nn.parallel.DistributedDataParallel(nc.nn.Linear(3, 2))


def test_cores_per_rank_splits_the_node(monkeypatch):
    from netcl.distributed import process_group
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [process_group.cores_per_rank(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert process_group.cores_per_rank(4) == 2  # bound by the launcher: its cores are the rank's share


def test_bind_share_gives_each_local_rank_its_own_cores(monkeypatch):
    from netcl.distributed import process_group
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(7)), raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append(list(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    monkeypatch.delenv("NETCL_BIND_CORES", raising=False)
    shares = [process_group.bind_share(r, 3) for r in range(3)]
    assert shares == pinned == [[0, 1], [2, 3], [4, 5, 6]]
    assert process_group.bind_share(0, 1) is None  # a rank alone keeps the node
    assert process_group.bind_share(0, 8) is None  # more ranks than cores: nothing to split
    monkeypatch.setenv("NETCL_BIND_CORES", "0")
    assert process_group.bind_share(1, 3) is None
    monkeypatch.delenv("NETCL_BIND_CORES")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert process_group.bind_share(0, 2) is None  # the launcher bound it: its binding stands
    assert len(pinned) == 3


def test_cost_model_closed_forms():
    from netcl.distributed import cost_model as cm
    alpha, beta, mib = 5e-6, 1e-10, 2**20
    assert cm.ring_allreduce_seconds(10 * mib, 1, alpha, beta) == 0.0
    # N = 2: two steps of latency, and each rank sends and receives half the buffer twice (= b in all)
    assert cm.ring_allreduce_seconds(10 * mib, 2, alpha, beta) == pytest.approx(2 * alpha + 10 * mib * beta)
    # the bandwidth term tends to 2·b·β, the latency term grows linearly with N
    big = cm.ring_allreduce_seconds(10 * mib, 512, alpha, beta)
    assert big == pytest.approx(2 * 511 * alpha + 2 * 511 / 512 * 10 * mib * beta)
    assert cm.bucket_bytes(60 * mib, 25 * mib) == [25 * mib, 25 * mib, 10 * mib]
    cost = dict(model_bytes=60 * mib, ranks=8, alpha=alpha, beta=beta, copy_bytes_per_second=1e10)
    last = cm.ring_allreduce_seconds(10 * mib, 8, alpha, beta) + 2 * 10 * mib / 1e10
    # a long backward hides every bucket but the last; a zero-length one hides nothing
    assert cm.step_overhead_seconds(backward_seconds=10.0, **cost) == pytest.approx(last)
    everything = sum(cm.ring_allreduce_seconds(b, 8, alpha, beta) + 2 * b / 1e10 for b in cm.bucket_bytes(60 * mib, 25 * mib))
    assert cm.step_overhead_seconds(backward_seconds=0.0, **cost) == pytest.approx(everything)
    assert cm.scaling_efficiency(1.0, **cost) == pytest.approx(1.0 / (1.0 + last))
    assert cm.scaling_efficiency(1.0, **dict(cost, ranks=1)) == 1.0


def test_cli_without_mpi_says_what_to_install(tmp_path):
    (tmp_path / "mpi4py.py").write_text("raise ImportError(\"No module named 'mpi4py'\")\n")  # hides the real one
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "netcl", "train", "lenet", "--distributed", "--epochs", "1",
                           "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install mpi4py mpich" in lines[0], proc.stderr


@needs_mpi
def test_cli_failure_on_every_rank_ends_the_job(tmp_path):
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT="1")
    started = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(RANKS), sys.executable, "-m", "netcl", "train", "lenet", "--distributed",
                           "--epochs", "1", "--data-dir", str(tmp_path / "no-mnist-here"), "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=FAILURE_DEADLINE_SECONDS + 30)
    assert proc.returncode != 0 and time.monotonic() - started < FAILURE_DEADLINE_SECONDS
    assert "error: " in proc.stderr and f"/{RANKS} failed: " in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_post_accumulate_grad_hook_runs_once_after_the_last_contribution(rng):
    """The autograd hook DistributedDataParallel's buckets rest on: a weight used twice in one pass has its
    hook run once, when its .grad already holds both contributions; the end-of-pass callback runs last."""
    import netcl as nc
    from netcl.autograd import function as engine
    w_host, x_host = rng.standard_normal((7, 7)).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32)
    w = nc.tensor(w_host, requires_grad=True)
    b = nc.tensor(rng.standard_normal(7).astype(np.float32), requires_grad=True)
    x = nc.tensor(x_host)
    events = []

    def on_ready(t):
        events.append(("ready", "w" if t is w else "b", t.grad.to_host().copy()))
        if len(events) == 1:
            engine.queue_backward_callback(lambda: events.append(("end",)))

    handles = [engine.register_post_accumulate_grad_hook(w, on_ready),
               engine.register_post_accumulate_grad_hook(b, on_ready)]
    try:
        ((x @ w + b) @ w).sum().backward()  # w contributes through two products
        x64, w64 = x_host.astype(np.float64), w_host.astype(np.float64)
        h = x64 @ w64 + b.to_host().astype(np.float64)
        ones = np.ones((3, 7))
        grad_w = h.T @ ones + x64.T @ (ones @ w64.T)  # d/dw of sum((xw + b)w)
        kinds = [e[0] for e in events]
        assert kinds.count("ready") == 2 and kinds[-1] == "end" and kinds.count("end") == 1
        w_grad_at_hook = next(e[2] for e in events if e[:2] == ("ready", "w"))
        np.testing.assert_allclose(w_grad_at_hook, grad_w, rtol=1e-4, atol=1e-4)
    finally:
        for handle in handles:
            handle.remove()
    events.clear()
    w.grad = None
    ((x @ w + b) @ w).sum().backward()
    assert events == [] and w.grad is not None  # removed hooks run no more
    with pytest.raises(RuntimeError, match="outside a backward pass"):
        engine.queue_backward_callback(lambda: None)
