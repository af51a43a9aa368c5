"""The cold start's deferrals (netcl.runtime.first_step): during a process's first training step a product
whose own kernel is not built runs on a GEMM kernel that is, an implicit-GEMM convolution on a built row
tile, and a convolution pass on a strategy whose kernels the process holds, each with the reference's
result, and each builds its own after the step; what ends the first step; the switches that turn
deferral off."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import settings
from netcl.ops import gemm as gemm_mod
from netcl.ops import gemm_standin
from netcl.runtime import first_step, kernels, timing
from util import assert_close


@pytest.fixture
def cold(monkeypatch, device):
    """A process in its first step, with no GEMM kernel built and none in the disk cache yet."""
    monkeypatch.setenv("NETCL_DEFER_BUILDS", "1")
    monkeypatch.setattr(settings, "_chosen", {})
    monkeypatch.delenv("NETCL_DETERMINISTIC", raising=False)
    monkeypatch.setattr(kernels, "is_built", lambda *a, **k: False)
    device.clear_state()  # no kernel made yet in this "process", and its first step begins
    assert first_step.in_progress(device)
    yield
    device.clear_state()  # nothing made during the cold step serves the later tests
    first_step.end(device)


def _product(rng, device, M, N, K, trans_b=False):
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
    out = gemm_mod.gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), trans_b=trans_b)
    ref = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    assert_close(out.to_host(), ref, 1e-5, f"{M}x{N}x{K} trans_b={trans_b}")


def _plan_of(device, M, N, K):
    return next(p for key, p in device.state.table(gemm_mod.PLANS).items() if key[0][1:4] == (M, N, K))


def test_a_product_borrows_the_built_kernel_until_the_first_step_ends(cold, device, rng):
    _product(rng, device, 131, 127, 129)  # the first product builds its own kernel
    assert _plan_of(device, 131, 127, 129).deferred is None
    builds = kernels.build_stats(device)["source_builds"] + kernels.build_stats(device)["binary_loads"]
    _product(rng, device, 7, 13, 31)  # another shape class: borrows, builds nothing
    assert kernels.build_stats(device)["source_builds"] + kernels.build_stats(device)["binary_loads"] == builds
    borrowed = _plan_of(device, 7, 13, 31)
    assert borrowed.deferred is not None and borrowed.product.kernel.program == _plan_of(device, 131, 127, 129).product.kernel.program
    first_step.end(device)
    _product(rng, device, 7, 13, 31)  # its first use after the step: its own kernel
    own = _plan_of(device, 7, 13, 31)
    assert own is not borrowed and own.deferred is None


def test_a_process_that_never_trains_revisits_a_borrowed_kernel(cold, device, rng):
    _product(rng, device, 131, 127, 129)
    _product(rng, device, 7, 13, 31)
    borrowed = _plan_of(device, 7, 13, 31)
    for _ in range(first_step.PATIENCE):
        _product(rng, device, 7, 13, 31)
    assert _plan_of(device, 7, 13, 31) is borrowed
    _product(rng, device, 7, 13, 31)
    assert _plan_of(device, 7, 13, 31) is not borrowed and first_step.in_progress(device)


def test_a_transposed_b_does_not_borrow_a_kernel_that_reads_b_in_place(cold, device, rng):
    _product(rng, device, 9, 11, 5)  # tiny: B read in place
    (tp, _), = gemm_standin.lenders(device, "float")
    assert tp["PACK_B"] == 0
    _product(rng, device, 9, 11, 5, trans_b=True)
    assert _plan_of(device, 9, 11, 5).deferred is None


@pytest.mark.parametrize("switch", ["NETCL_DEFER_BUILDS=0", "NETCL_DETERMINISTIC=1"])
def test_deferral_can_be_turned_off(switch, cold, device, rng, monkeypatch):
    name, value = switch.split("=")
    monkeypatch.setenv(name, value)
    _product(rng, device, 131, 127, 129)
    _product(rng, device, 7, 13, 31)
    assert _plan_of(device, 7, 13, 31).deferred is None


def test_an_optimizer_step_or_a_timing_ends_the_first_step(cold, device):
    p = nc.tensor(np.zeros(3, np.float32), device=device, requires_grad=True)
    p.grad = nc.tensor(np.ones(3, np.float32), device=device)
    nc.optim.SGD([p], lr=0.5).step()
    assert not first_step.in_progress(device)
    np.testing.assert_allclose(p.to_host(), [-0.5] * 3)
    first_step.restart(device)
    timing.timed_call(lambda: None, device)
    assert not first_step.in_progress(device)


def test_implicit_gemm_runs_a_built_row_tile_during_the_first_step(cold, device, rng):
    from netcl.ops import conv_implicit_gemm
    from netcl.ops.conv_common import ConvLayer
    from util import conv2d_ref

    def forward(k):  # rows = k output channels: 5 -> the 16-row tile, 50 -> the 64-row one
        layer = ConvLayer(n=3, c=4, h=9, w=7, k=k, r=3, s=3)
        x = rng.standard_normal((3, 4, 9, 7)).astype(np.float32)
        w = rng.standard_normal((k, 4, 3, 3)).astype(np.float32)
        out = nc.Tensor.empty((3, k, 7, 5), np.float32, device)
        conv_implicit_gemm.run_pass("forward", nc.Tensor.from_host(w, device), nc.Tensor.from_host(x, device),
                                    out, layer)
        assert_close(out.to_host(), conv2d_ref(x, w), 1e-5, f"implicit GEMM forward, {k} channels")

    def row_tiles():
        return sorted(dict(key[3])["TM"] for key, _ in kernels.built_variants(device) if key[1] == "igemm_forward")

    forward(5)
    forward(50)  # the cold step: the 16-row kernel serves 50 rows
    assert row_tiles() == [16]
    first_step.end(device)
    forward(50)
    assert row_tiles() == [16, 64]


def test_the_cold_step_prefers_a_strategy_whose_kernels_it_holds(cold, device):
    from netcl.ops import conv_online
    from netcl.ops.conv_common import ConvLayer
    layer = ConvLayer(n=2, c=3, h=8, w=8, k=4, r=3, s=3)
    trial = conv_online.Trial("direct_blocked", ["im2col", "implicit_gemm"])
    assert conv_online._untimed_choice(trial, "backward_weight", layer, device) == "direct_blocked"
    conv_online._online(device).ran[("backward_weight", "float32")] = {"implicit_gemm", "im2col"}
    # im2col ran for another layer, but its lowering kernel is specialized to that layer's shape
    assert conv_online._untimed_choice(trial, "backward_weight", layer, device) == "implicit_gemm"
    assert conv_online._untimed_choice(trial, "forward", layer, device) == "direct_blocked"
    first_step.end(device)
    assert conv_online._untimed_choice(trial, "backward_weight", layer, device) == "direct_blocked"
    conv_online.clear(device)
