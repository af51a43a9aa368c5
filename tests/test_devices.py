"""Device discovery and selection, and `netcl devices`."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import netcl as nc
from netcl.runtime.device import Device


def test_devices_have_the_documented_fields():
    found = nc.devices()
    assert found, "no OpenCL device"
    for d in found:
        assert d.kind in ("gpu", "cpu", "accelerator")
        assert d.name and d.platform and d.opencl_version.startswith("OpenCL")
        assert d.compute_units >= 1 and d.global_mem_bytes >= d.max_alloc_bytes > 0 and d.local_mem_bytes > 0
        assert isinstance(d.has_fp64, bool) and isinstance(d.has_fp16, bool)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "netcl", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_devices_json_lists_every_device():
    out = run_cli("devices", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(data["devices"]) == len(nc.devices())
    first = data["devices"][0]
    for field in ("name", "platform", "kind", "opencl_version", "compute_units", "global_mem_bytes",
                  "max_alloc_bytes", "local_mem_bytes", "has_fp64", "has_fp16", "driver_version"):
        assert field in first


@pytest.mark.parametrize("selector", ["0", "__first_word__"])
def test_netcl_device_selects(selector):
    d0 = nc.devices()[0]
    if selector == "__first_word__":
        selector = d0.platform.split()[0].upper()  # case-insensitive substring
    code = "import netcl as nc; print(nc.default_device().index)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, NETCL_DEVICE=selector))
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == d0.index


def test_bad_selector_is_a_device_error():
    with pytest.raises(nc.DeviceError, match="no device matches"):
        nc.set_default_device("no-such-device-xyz")
    with pytest.raises(nc.DeviceError, match="out of range"):
        nc.set_default_device("99")
    out = run_cli("devices", env={"NETCL_DEVICE": "no-such-device-xyz"})
    assert out.returncode == 0  # listing devices never needs a valid default


def test_tensors_of_different_contexts_do_not_mix():
    other = Device(nc.default_device().cl_device, index=0)  # same hardware, separate context
    a = nc.tensor(np.ones(3, np.float32))
    b = nc.tensor(np.ones(3, np.float32), device=other)
    assert np.array_equal(b.to_host(), np.ones(3))
    with pytest.raises(nc.DeviceError, match="different devices"):
        a + b
    with pytest.raises(nc.DeviceError):
        a @ b.reshape(3, 1)
