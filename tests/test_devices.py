"""Device discovery and selection, measured figures, the recorded vendors directory, and `netcl devices`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl.runtime import device as device_module
from netcl.runtime.device import Device, DeviceSelectorError
from netcl.runtime.device_figures import store_figures, stored_figures


def test_devices_have_the_documented_fields():
    found = nc.devices()
    assert found, "no OpenCL device"
    for d in found:
        assert d.kind in ("gpu", "cpu", "accelerator")
        assert d.name and d.platform and d.opencl_version.startswith("OpenCL")
        assert d.platform_vendor and d.platform_version.startswith("OpenCL")
        assert d.compute_units >= 1 and d.global_mem_bytes >= d.max_alloc_bytes > 0 and d.local_mem_bytes > 0
        assert isinstance(d.has_fp64, bool) and isinstance(d.has_fp16, bool)


def run_cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "netcl", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture
def keep_default():
    saved = device_module._default
    yield
    device_module._default = saved


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NETCL_CACHE", "1")
    return tmp_path / "cache"


def test_devices_json_lists_every_device():
    out = run_cli("devices", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(data["devices"]) == len(nc.devices())
    assert sum(entry["default"] for entry in data["devices"]) == 1
    first = data["devices"][0]
    for field in ("name", "platform", "platform_vendor", "platform_version", "kind", "opencl_version",
                  "compute_units", "global_mem_bytes", "max_alloc_bytes", "local_mem_bytes", "has_fp64", "has_fp16",
                  "driver_version", "gemm_gflops", "copy_gbps"):
        assert field in first


def _selectors_for(d: Device):
    """Selectors that must pick ``d`` when it is the first device they match: each field's words."""
    words = [d.platform.split()[0].upper(), d.platform_vendor.split()[-1].lower(), d.name.split()[-1].title(),
             d.platform_version.split()[-1], d.kind, f"{d.platform.split()[0]} {d.kind}", str(d.index)]
    return words


def test_selectors_match_platform_vendor_version_and_device_name(keep_default):
    for d in nc.devices():
        for selector in _selectors_for(d):
            expected = next(x for x in nc.devices() if all(w in x.selector_text() for w in selector.lower().split())) \
                if not selector.isdigit() else d
            assert nc.set_default_device(selector) is expected, selector
            assert expected.index <= d.index, selector  # the first match in platform order


def test_pocl_selector_finds_pocl(keep_default):
    pocl = [d for d in nc.devices() if "portable computing language" in d.platform.lower()]
    if not pocl:
        pytest.skip("no PoCL device here")
    assert nc.set_default_device("pocl") is pocl[0]  # PoCL's platform name does not contain "pocl"
    assert nc.set_default_device("PoCL") is pocl[0]


@pytest.mark.parametrize("selector", ["0", "__first_word__"])
def test_netcl_device_selects(selector):
    d0 = nc.devices()[0]
    if selector == "__first_word__":
        selector = d0.platform.split()[0].upper()  # case-insensitive
    code = "import netcl as nc; print(nc.default_device().index)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, NETCL_DEVICE=selector))
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == d0.index


def test_unknown_selector_raises_a_device_error_listing_the_devices(keep_default):
    for bad, why in (("no-such-device-xyz", "no device matches 'no-such-device-xyz'"), ("99", "out of range"),
                     ("7:7", "no device '7:7'")):
        with pytest.raises(nc.DeviceError, match=why) as info:
            nc.set_default_device(bad)
        assert isinstance(info.value, DeviceSelectorError) and info.value.selector == bad
        for d in nc.devices():
            assert d.describe() in str(info.value)
        assert info.value.available == tuple(d.describe() for d in nc.devices())


def test_cli_exits_2_on_an_unknown_device_with_the_list():
    out = run_cli("devices", env={"NETCL_DEVICE": "no-such-device-xyz"})
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "no device matches 'no-such-device-xyz' (NETCL_DEVICE)" in out.stderr
    for d in nc.devices():
        assert d.describe() in out.stderr and f"[{d.index}] {d.platform} / {d.name}" in out.stdout
    out = run_cli("bench", "lenet", "--device", "no-such-device-xyz")
    assert out.returncode == 2 and "no device matches" in out.stderr and "Traceback" not in out.stderr


class _Named(Device):
    """The same hardware under another identity, as a second driver would present it."""

    def __init__(self, cl_device, index, ident, kind=None):
        super().__init__(cl_device, index)
        self._ident = ident
        self.kind = kind or self.kind

    @property
    def identity(self):
        return self._ident


def test_default_prefers_gpu_then_fastest_measured_then_first(private_cache, monkeypatch, keep_default):
    base = nc.devices()[0].cl_device
    slow, fast = _Named(base, 0, "test|slow|1|x"), _Named(base, 1, "test|fast|1|x")
    monkeypatch.setattr(device_module, "devices", lambda: [slow, fast])
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)

    def fresh_default():
        device_module._default = None
        return nc.default_device()
    assert fresh_default() is slow  # nothing measured: the first
    store_figures(slow, {"gemm_gflops": 12.5, "copy_gbps": 10.0}, source="test")
    store_figures(fast, {"gemm_gflops": 90.0}, source="test")
    assert stored_figures(fast)["gemm_gflops"] == 90.0 and stored_figures(slow)["copy_gbps"] == 10.0
    assert fresh_default() is fast
    store_figures(fast, {"copy_gbps": 40.0}, source="test")  # a partial update keeps the GEMM rate
    assert stored_figures(fast)["gemm_gflops"] == 90.0 and fresh_default() is fast
    monkeypatch.setenv("PYOPENCL_CTX", "0")
    assert fresh_default() is slow  # a selector beats the measurements
    monkeypatch.delenv("PYOPENCL_CTX")
    gpu = _Named(base, 2, "test|gpu|1|x", kind="gpu")
    monkeypatch.setattr(device_module, "devices", lambda: [slow, fast, gpu])
    assert fresh_default() is gpu


def test_devices_bench_stores_figures_that_the_listing_shows(private_cache):
    out = run_cli("devices", "--bench", "--rounds", "1", "--json", env={"NETCL_DEVICE": "0"}, timeout=900)
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout.strip().splitlines()[-1])["devices"]
    for entry in measured:
        assert entry["gemm_gflops"] > 0.1 and entry["copy_gbps"] > 0.1, entry
    again = json.loads(run_cli("devices", "--json").stdout.strip().splitlines()[-1])["devices"]
    assert [e["gemm_gflops"] for e in again] == [e["gemm_gflops"] for e in measured]
    text = run_cli("devices").stdout
    assert text.count("measured: GEMM") == len(measured) and "GB/s" in text
    assert (private_cache / "devices" / "figures.json").exists()


def _system_icds() -> list[Path]:
    where = Path(os.environ.get("OCL_ICD_VENDORS", "/etc/OpenCL/vendors"))
    return sorted(where.glob("*.icd")) if where.is_dir() else [where] if where.suffix == ".icd" else []


def test_recorded_vendors_directory_is_used_unless_the_environment_says_otherwise(tmp_path):
    icds = _system_icds()
    if not icds:
        pytest.skip("no vendors directory to copy")
    vendors = tmp_path / "config" / "opencl" / "vendors"
    vendors.mkdir(parents=True)
    for icd in icds:
        shutil.copy(icd, vendors / icd.name)
    code = "import os, netcl as nc; n = len(nc.devices()); print(n, os.environ.get('OCL_ICD_VENDORS'))"
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_VENDORS"}
    env["NETCL_CONFIG_DIR"] = str(tmp_path / "config")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    count, used = out.stdout.split()
    assert used == str(vendors) and int(count) == len(nc.devices())
    env["OCL_ICD_VENDORS"] = str(tmp_path / "elsewhere")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.split()[1] == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("preset, cpus, expected", [
    ({}, "all", "1"),
    ({"POCL_AFFINITY": "0"}, "all", "0"),                 # the user's choice stays
    ({"POCL_MAX_PTHREAD_COUNT": "1"}, "all", None),       # a rank sharing its node: no pinning by index
    ({}, "first", None),                                   # a restricted process: no pinning by index
])
def test_pocl_threads_are_pinned_only_where_pinning_by_index_is_right(monkeypatch, preset, cpus, expected):
    for name in ("POCL_AFFINITY", "POCL_MAX_PTHREAD_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in preset.items():
        monkeypatch.setenv(name, value)
    every = set(range(os.cpu_count() or 1))
    allowed = every if cpus == "all" else {min(every)} | ({-1} if len(every) == 1 else set())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: allowed, raising=False)
    device_module._pin_pocl_threads()
    assert os.environ.get("POCL_AFFINITY") == expected


def _threads_on_one_cpu(env) -> int:
    """How many threads of a process that ran a product on PoCL may run on one CPU only."""
    code = ("import os, numpy as np, netcl as nc\n"
            "x = nc.tensor(np.ones((64, 64), np.float32)); (x @ x).to_host()\n"
            "for t in os.listdir('/proc/self/task'):\n"
            "    status = open(f'/proc/self/task/{t}/status').read().splitlines()\n"
            "    print([l.split()[1] for l in status if l.startswith('Cpus_allowed_list')][0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return sum(cpus.isdigit() for cpus in out.stdout.split())


def test_pocl_worker_threads_keep_a_core_each():
    if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        pytest.skip("pinning applies to Linux machines with several CPUs")
    if os.sched_getaffinity(0) != set(range(os.cpu_count())):
        pytest.skip("this process may not run on every CPU")
    try:
        device_module.resolve_device("pocl")
    except DeviceSelectorError:
        pytest.skip("PoCL's worker threads only")
    env = {k: v for k, v in os.environ.items() if k not in ("POCL_AFFINITY", "POCL_MAX_PTHREAD_COUNT")}
    env["NETCL_DEVICE"] = "pocl"
    assert _threads_on_one_cpu(env) >= 2
    env["POCL_AFFINITY"] = "0"
    assert _threads_on_one_cpu(env) == 0


def test_tensors_of_different_contexts_do_not_mix():
    other = Device(nc.default_device().cl_device, index=0)  # same hardware, separate context
    a = nc.tensor(np.ones(3, np.float32))
    b = nc.tensor(np.ones(3, np.float32), device=other)
    assert np.array_equal(b.to_host(), np.ones(3))
    with pytest.raises(nc.DeviceError, match="different devices"):
        a + b
    with pytest.raises(nc.DeviceError):
        a @ b.reshape(3, 1)
