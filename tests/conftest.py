"""Shared fixtures: the device under test, fresh random data with a printed seed, and canaries.

``canaries``: while active, every tensor netcl allocates gets guard elements before and after it
(filled with a sentinel) and lives at a non-zero offset in its buffer; at the end of the test every
guard must be intact. This catches out-of-bounds writes and kernels that ignore offsets.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import shutil
import tempfile

import numpy as np
import pytest

import netcl as nc
from netcl import dtypes, settings
from netcl.runtime import binaries, cache, first_step, memory
from netcl.runtime.device import resolve_device
from netcl.tensor import Tensor, _check_shape

# Child processes (CLI runs, mpiexec workers, fresh-process checks) must import the netcl under test,
# not whichever copy pip last installed: the repository root goes first on their module path.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _REPO_ROOT])

# Tests plan, measure and tune on purpose, on layers and under conditions chosen to test (monkeypatched
# timers, forced device kinds): none of it may reach the user's tuning database, whose calibration it
# would skew. The session gets a cache directory of its own (shared by pytest-xdist's workers, which
# inherit the environment), reusing the user's compiled kernels, which are keyed by their source.
def _cache_sharing_kernels(new_root, kernels_from) -> None:
    """Make ``new_root`` a cache directory whose compiled kernels and rendered templates are those of
    ``kernels_from`` (keyed by their source, so sharing them changes no result) and whose tuning
    database and plans start empty."""
    for shared in ("kernels", "templates"):
        source = (kernels_from / shared).resolve()
        try:
            source.mkdir(parents=True, exist_ok=True)
            os.symlink(source, os.path.join(new_root, shared))
        except OSError:
            pass  # an unwritable cache or no symbolic links: the new cache builds its kernels afresh


if settings.CACHE.get() and "NETCL_TEST_CACHE_DIR" not in os.environ:
    _session_cache = tempfile.mkdtemp(prefix="netcl-tests-")
    atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)
    _cache_sharing_kernels(_session_cache, cache.cache_root())
    os.environ["NETCL_TEST_CACHE_DIR"] = os.environ["NETCL_CACHE_DIR"] = _session_cache

# Tests check the kernels a process keeps running: products borrowing another's kernel during a cold
# first step are the subject of tests/test_first_step.py alone (and of the fresh-process runs).
first_step.end(nc.default_device())

GUARD = 37  # elements on each side; odd so that guarded tensors are misaligned for vector loads
SENTINEL = {np.dtype(np.float32): np.float32(-7.654321e29), np.dtype(np.float64): np.float64(-7.654321e29),
            np.dtype(np.int32): np.int32(-123456789), np.dtype(np.int64): np.int64(-123456789012),
            np.dtype(np.bool_): np.uint8(0xA5)}  # bool guards are bytes no kernel writes (it writes 0 or 1)
GUARD_HOST_DTYPE = {np.dtype(np.bool_): np.dtype(np.uint8)}


@pytest.fixture(scope="session")
def device():
    return nc.default_device()


def _binaries_pay(device) -> bool:
    """Whether the driver hands over a program's binary about as cheaply as it loads one back (Intel's CPU
    runtime has it at hand; PoCL compiles the program's kernels again, which costs far more than the
    load): one program, built under a build option no other build uses (so no driver cache answers), is
    fetched and loaded back, each timed."""
    import time

    import pyopencl as cl

    from netcl.runtime import kernels
    options = list(kernels.build_options()) + [f"-DNETCL_BINARY_PROBE={time.time_ns()}"]
    program = cl.Program(device.context, kernels.render("conv_depthwise.cl")).build(options=options)
    start = time.perf_counter()
    try:
        [binary] = program.get_info(cl.program_info.BINARIES)
    except cl.Error:
        return False
    fetch_s = time.perf_counter() - start
    start = time.perf_counter()
    cl.Program(device.context, [device.cl_device], [binary]).build(options=options)
    return fetch_s < 4 * (time.perf_counter() - start)


@pytest.fixture(scope="session")
def binary_writing():
    """{"pays": bool} once decided (_binaries_pay): whether this session writes the binaries of the
    programs its tests build. Where fetching a binary compiles the program again (PoCL), writing
    thousands of them would take about as long as building them, while the driver's own kernel cache
    already makes the next run's builds cheap."""
    return {}


@pytest.fixture(autouse=True)
def binaries_per_test(monkeypatch, binary_writing, device):
    """The programs a test builds wait for their binaries apart from every other test's, so a test that
    writes binaries (netcl.runtime.binaries.save_binaries) writes only its own; at its end they are
    written where that is cheap and forgotten where it is not (see binary_writing)."""
    monkeypatch.setattr(binaries, "_unsaved", {})
    yield
    if not binaries.pending():
        return
    if "pays" not in binary_writing:
        binary_writing["pays"] = _binaries_pay(device)
    if binary_writing["pays"]:
        binaries.save_binaries()
    else:
        binaries.discard_unsaved()


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache directory of the test's own: pytest-xdist's other workers store measured plans and
    calibration samples in the session's tuning database meanwhile, and the planner reads it anew
    whenever it changes. Compiled kernels are shared with the session's cache."""
    root = tmp_path / "private-cache"
    root.mkdir()
    _cache_sharing_kernels(root, cache.cache_root())
    monkeypatch.setenv("NETCL_CACHE_DIR", str(root))
    return root


@pytest.fixture
def rng(request):
    """A generator with a fresh seed each run; the seed is printed on failure (NETCL_TEST_SEED replays)."""
    seed = int(os.environ.get("NETCL_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed} (replay with NETCL_TEST_SEED={seed})")
    return np.random.default_rng(seed)


class Canaries:
    def __init__(self):
        self.guarded = []

    def empty(self, cls, shape, dtype=np.float32, device=None):
        shape = _check_shape(shape)
        dt = dtypes.as_dtype(dtype)
        dev = resolve_device(device)
        n = math.prod(shape)
        buf = memory.allocate(dev, (n + 2 * GUARD) * dt.itemsize)
        host = np.full(n + 2 * GUARD, SENTINEL[dt], dtype=GUARD_HOST_DTYPE.get(dt, dt))
        memory.upload(dev, buf, host)
        self.guarded.append((buf, n, dt, dev, shape))
        return cls(buf, shape, dt, dev, offset=GUARD)

    def check(self):
        for buf, n, dt, dev, shape in self.guarded:
            host = np.empty(n + 2 * GUARD, dtype=GUARD_HOST_DTYPE.get(dt, dt))
            memory.download(dev, buf, host)
            head, tail = host[:GUARD], host[GUARD + n:]
            bad = np.flatnonzero(head != SENTINEL[dt]).tolist() + [GUARD + n + i for i in np.flatnonzero(tail != SENTINEL[dt])]
            if bad:
                raise AssertionError(f"out-of-bounds write around a tensor of shape {shape} ({dt}): "
                                     f"guard elements {bad[:10]} changed")


@pytest.fixture
def canaries(monkeypatch):
    guard = Canaries()
    monkeypatch.setattr(Tensor, "empty", classmethod(guard.empty))
    yield guard
    monkeypatch.undo()
    guard.check()


@pytest.fixture
def unfused(monkeypatch):
    """A context manager inside which every chain of layers (Sequential, the models' blocks, an ONNX
    model's groups) runs its steps one by one instead of through netcl.nn.fusion's table."""
    from netcl.nn import fusion

    @contextlib.contextmanager
    def steps_one_by_one():
        with monkeypatch.context() as patch:
            patch.setattr(fusion, "run", lambda steps, x: functools.reduce(lambda h, step: step(h), steps, x))
            yield
    return steps_one_by_one
