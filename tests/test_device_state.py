"""Per-device execution state (netcl.runtime.device_state) and the launch observers (netcl.runtime.observers):
each observer does what it says and only while its block runs, clearing a device's state changes no
result, and netcl's caches keep no Device alive."""
from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_memory
from netcl.ops.elementwise import copy_into
from netcl.ops.gemm import gemm
from netcl.runtime import first_step, kernels
from netcl.runtime.device import Device
from netcl.runtime.observers import builds_only, watching_launches
from netcl.runtime.recording import KernelLaunch, Recording
from util import assert_close


def _strided_copy(device, src, dst) -> None:
    copy_into(dst[::2], src)  # strided: a kernel launch, not the driver's memcpy


def test_builds_only_builds_the_kernels_and_launches_nothing(device, rng):
    a = rng.standard_normal((9, 7)).astype(np.float32)
    b = rng.standard_normal((7, 11)).astype(np.float32)
    canary = np.full((9, 11), 5.0, np.float32)
    c = nc.tensor(canary, device=device)
    src = nc.tensor(rng.standard_normal(13).astype(np.float32), device=device)
    dst = nc.tensor(np.full(26, 7.0, np.float32), device=device)
    with builds_only(device):
        assert any(observer.builds_only for observer in device.state.observers)
        gemm(nc.tensor(a, device=device), nc.tensor(b, device=device), c=c, beta=0.0)  # prepared launches
        _strided_copy(device, src, dst)  # a plain launch
    assert not any(observer.builds_only for observer in device.state.observers)  # open trials may watch
    assert np.array_equal(c.to_host(), canary) and np.all(dst.to_host() == 7.0)
    made = {name for (_, name, _, _) in device.state.kernels}
    assert "gemm_tiled" in made  # built inside, for the launches after the block
    gemm(nc.tensor(a, device=device), nc.tensor(b, device=device), c=c, beta=0.0)
    assert_close(c.to_host(), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_a_recording_records_its_threads_commands_and_refuses_a_download(device, rng):
    x = nc.tensor(rng.standard_normal(17).astype(np.float32), device=device)
    other = nc.tensor(rng.standard_normal(17).astype(np.float32), device=device)
    with Recording(device) as recording:
        with pytest.raises(RuntimeError, match="already being made"):
            Recording(device).__enter__()
        y = x * 2.0 + 1.0
        worker = threading.Thread(target=lambda: (other * 3.0).to_host())  # another thread: not recorded
        worker.start()
        worker.join()
        launches = recording.launches
        assert recording.unusable is None
        y.to_host()
    assert launches >= 1 and all(command.kernel.function_name for command in recording.commands
                                 if isinstance(command, KernelLaunch))
    assert "reads" in recording.unusable and recording not in device.state.observers
    before = len(recording.commands)
    (x * 2.0).to_host()
    assert len(recording.commands) == before  # the block is over


def test_the_watcher_sees_every_threads_launches_on_its_device_only(device, rng):
    x = nc.tensor(rng.standard_normal(11).astype(np.float32), device=device)
    second = Device(device.cl_device, index=device.index)  # another context on the same device
    y = nc.tensor(rng.standard_normal(11).astype(np.float32), device=second)
    seen = []
    with watching_launches(device, seen.append):
        (x + 1.0).to_host()
        worker = threading.Thread(target=lambda: (x - 1.0).to_host())
        worker.start()
        worker.join()
        (y + 1.0).to_host()  # the second device's launch is not this watcher's business
    assert len(seen) == 2 and all(kernel.context == device.context for kernel in seen)
    (x + 2.0).to_host()
    assert len(seen) == 2


def _small_conv_net_step(device, seed: int):
    rng = np.random.default_rng(seed)
    nc.manual_seed(seed)
    model = nc.nn.Sequential(nc.nn.Conv2d(3, 6, 3, padding=1), nc.nn.ReLU(), nc.nn.MaxPool2d(2),
                             nc.nn.Conv2d(6, 5, 3, stride=2), nc.nn.ReLU(), nc.nn.Flatten(), nc.nn.Linear(20, 4))
    x = nc.tensor(rng.standard_normal((3, 3, 10, 10)).astype(np.float32), device=device, requires_grad=True)
    y = nc.tensor(rng.integers(0, 4, 3).astype(np.int64), device=device)
    loss = nc.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return [loss.to_host(), x.grad.to_host()] + [p.grad.to_host() for p in model.parameters()]


def test_clearing_a_devices_state_changes_no_result(device, monkeypatch, private_cache):
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")  # online trials would time, and so choose anew
    device.clear_state()  # plans made from the session's tuning database must not carry over
    first_step.end(device)
    before = _small_conv_net_step(device, seed=5)
    state = device.state
    assert state.kernels and conv_memory.memory(device).plans
    device.clear_state()
    assert device.state is state and not state.kernels and not state.programs and not conv_memory.memory(device).plans
    assert not state.first_step_over  # a fresh process's phase
    first_step.end(device)  # as the tests' process does at its start (tests/conftest.py)
    after = _small_conv_net_step(device, seed=5)
    assert state.kernels
    for was, now in zip(before, after):
        np.testing.assert_array_equal(was, now)


def test_netcls_caches_keep_no_device_alive(device, rng):
    from netcl.distributed import bucket_reduce
    temporary = Device(device.cl_device, index=device.index)
    a = rng.standard_normal((5, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    x = nc.tensor(a, device=temporary, requires_grad=True)
    weight = nc.tensor(w, device=temporary, requires_grad=True)
    out = nc.nn.functional.conv2d(x, weight, padding=1)
    out.sum().backward()
    (x.detach()[:, :, ::2] * 2.0).to_host()  # a strided op: meta buffers
    gemm(nc.tensor(a.reshape(45, 27), device=temporary), nc.tensor(a.reshape(27, 45), device=temporary)).to_host()
    bucket_reduce.kernels_read_host_memory(temporary)
    kernels.build_stats(temporary)
    assert temporary.state.kernels and temporary.state.meta_buffers
    gone = weakref.ref(temporary)
    del temporary, x, weight, out
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]


def test_the_convolution_chooser_forgets_its_memory_in_one_call(device, private_cache):
    """Profiles, plans and training trials are one object per device (netcl.ops.conv_memory), which the
    device's chooser drops whole; the next plan is the same."""
    from netcl.ops import conv2d_planner as planner, conv_chooser, conv_online
    from netcl.ops.conv_common import ConvLayer
    conv_chooser.chooser(device).clear(device)  # profiles read from the session's tuning database go
    layer = ConvLayer.from_shapes((2, 3, 9, 7), (5, 3, 3, 3), padding=1)
    first = planner.plan_conv2d_layer(layer, "forward", "heuristic", device=device).strategy
    conv_online.trial_state(layer, "forward", device)
    remembered = conv_memory.memory(device)
    assert remembered.plans and remembered.profiles and remembered.trials is not None
    assert device.state.entry(conv_memory.CHOICE, dict) is remembered
    conv_chooser.chooser(device).clear(device)
    fresh = conv_memory.memory(device)
    assert fresh is not remembered and not fresh.plans and not fresh.profiles and fresh.trials is None
    assert planner.plan_conv2d_layer(layer, "forward", "heuristic", device=device).strategy == first
