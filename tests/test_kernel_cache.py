"""The kernel pipeline: templates render with defaults, programs are built once and cached on disk,
the cache survives concurrent writers and damaged entries, and build failures carry their data."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import netcl as nc
from netcl.runtime import kernels

SCRIPT = textwrap.dedent("""
    import json, numpy as np, netcl as nc
    from netcl.runtime import kernels
    x = nc.tensor(np.arange(5, dtype=np.float32))
    y = (x * {factor} + 1).to_host()
    assert np.array_equal(y, np.arange(5) * {factor} + 1), y
    print(json.dumps(kernels.build_stats))
""")


def run_process(cache_dir, factor=3.0, extra_env=None):
    env = dict(os.environ, NETCL_CACHE_DIR=str(cache_dir), **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(factor=factor)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def binaries(cache_dir):
    return sorted(Path(cache_dir).glob("kernels/*/*.bin"))


def test_every_template_renders_with_defaults():
    for path in kernels.kernels_dir().glob("*.cl"):
        source = kernels.render(path.name)
        assert "__kernel" in source, path.name


def test_disk_cache_cold_then_warm(tmp_path):
    cold = run_process(tmp_path)
    assert cold["source_builds"] >= 1 and cold["binary_loads"] == 0
    assert binaries(tmp_path), "no binary written"
    warm = run_process(tmp_path)
    assert warm["source_builds"] == 0 and warm["binary_loads"] == cold["source_builds"]


def test_cache_off_writes_nothing(tmp_path):
    stats = run_process(tmp_path, extra_env={"NETCL_CACHE": "0"})
    assert stats["source_builds"] >= 1 and not binaries(tmp_path)


def test_damaged_entry_is_rebuilt(tmp_path):
    run_process(tmp_path)
    for path in binaries(tmp_path):
        path.write_bytes(path.read_bytes()[:100] + b"garbage")  # truncated + corrupted
    stats = run_process(tmp_path)
    assert stats["source_builds"] >= 1
    assert run_process(tmp_path)["source_builds"] == 0  # and the rebuilt entry is good again


def test_concurrent_processes_share_the_cache(tmp_path):
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT.format(factor=f)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for f in (2.0, 2.0, 5.0, 5.0)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert not list(Path(tmp_path).rglob("*.tmp")), "temporary files left behind"
    assert run_process(tmp_path, factor=2.0)["source_builds"] == 0


def test_build_error_carries_log_options_and_source(device):
    with pytest.raises(nc.KernelBuildError) as info:
        kernels.build_program(device, "__kernel void broken(__global float* x) { x[0] = undefined_name; }",
                              ("-cl-mad-enable", "-DNETCL_TEST=1"))
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, nc.NetclError)
    assert "undefined_name" in err.log
    assert "-DNETCL_TEST=1" in err.options
    assert err.source_path and "undefined_name" in Path(err.source_path).read_text()


def test_missing_template_is_a_build_error(device):
    with pytest.raises(nc.KernelBuildError, match="no_such_template"):
        kernels.get_kernel(device, "no_such_template.cl", "k")


def test_memoized_per_context(device):
    a = kernels.get_kernel(device, "elementwise.cl", "elementwise", EXPR="a0 * 2")
    b = kernels.get_kernel(device, "elementwise.cl", "elementwise", EXPR="a0 * 2")
    assert a is b


def test_binaries_are_written_after_the_builds_not_during_them(tmp_path, monkeypatch, device):
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(binary_cache, "IDLE_SECONDS", 1.0)
    source = f"__kernel void idle_saver(__global float* x) {{ x[0] = 1.0f; }}\n// {time.time_ns()}"
    kernels.build_program(device, source)
    assert not binaries(tmp_path), "the binary was fetched during the build (PoCL compiles it all again)"
    deadline = time.monotonic() + 30
    while not binaries(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(binaries(tmp_path)) == 1, "the idle saver wrote nothing"


def test_no_background_writes_while_held_back(tmp_path, monkeypatch, device):
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(binary_cache, "IDLE_SECONDS", 0.05)
    with binary_cache.held_back():
        kernels.build_program(device, f"__kernel void held(__global float* x) {{ x[0] = 2.0f; }}\n// {time.time_ns()}")
        time.sleep(0.5)
        assert not binaries(tmp_path), "a binary was written while held back"
    deadline = time.monotonic() + 30
    while not binaries(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(binaries(tmp_path)) == 1, "the saver did not resume after the hold"
