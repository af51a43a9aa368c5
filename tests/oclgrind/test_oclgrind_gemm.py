"""GEMM under the simulator: every tile configuration the tuner can pick, in every float dtype, on products
with ragged edges (M, N, K not multiples of any tile), all transpose combinations, beta ≠ 0, batched with
a broadcast operand, and operands large enough that the host packs them (gemm_pack_a / _b / _bt).

The candidate space comes from netcl.tuning.gemm at run time (a `candidates(dtype)` function when it has
one, else its staged lists of register tiles, work-group shapes, packing/unrolling extras and local-memory
variants), plus the built-in defaults of the tuning database, so new candidates are covered without edits.
Every value of every stage is run at least once; stages are combined round-robin rather than as a full
product (the product has ~900 members, each a separate build on a slow simulator).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import netcl as nc
from netcl.ops import gemm as gemm_mod
from netcl.ops.gemm import gemm, gemm_batched
from netcl.runtime import tuning_db as db
from util import assert_close

pytestmark = pytest.mark.oclgrind


def tuner_candidates(device, dtype: str) -> list[dict]:
    """Normalized, de-duplicated parameter sets the tuner (or the built-in table) can choose for dtype: the
    tiles counted in this device's lanes and in AVX-512's (a CPU's widest), each meeting the groups and
    extras in turn."""
    from netcl.tuning import gemm as tuner
    lane_counts = sorted({gemm_mod.native_lanes(device, dtype), 16 if dtype == "float32" else 8})
    stages = [[t for lanes in lane_counts for t in tuner._tiles(lanes, False)], tuner._groups(False),
              tuner._extras(False)]
    longest = max(len(s) for s in stages)
    found = []
    for i in range(longest):
        merged = {}
        for stage in stages:
            merged.update(stage[i % len(stage)])
        found.append(merged)
    found += list(tuner._local_variants(dtype))
    for kind in db.BUILTIN.values():
        entry = kind.get("gemm", {}).get(dtype)
        if entry:
            found.append(entry)
    unique = {}
    for params in found:
        p = gemm_mod.normalize(params)
        unique[tuple(sorted(p.items()))] = p
    return list(unique.values())


def _dtypes(device):
    return ["float32"] + (["float64"] if device.has_fp64 else [])


# (M, N, K): ragged against every tile; 1-sized dimensions; one with K below the unroll factor
SHAPES = [(13, 19, 7), (1, 5, 3), (6, 1, 9), (9, 26, 1)]


def _check(device, rng, dtype, M, N, K, ta, tb, params, beta=0.0):
    a = rng.uniform(-1, 1, (K, M) if ta else (M, K)).astype(dtype)
    b = rng.uniform(-1, 1, (N, K) if tb else (K, N)).astype(dtype)
    c0 = rng.uniform(-1, 1, (M, N)).astype(dtype)
    C = nc.Tensor.from_host(c0, device) if beta else None
    out = gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device), C, alpha=1.5, beta=beta,
               trans_a=bool(ta), trans_b=bool(tb), params=params)
    ref = 1.5 * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b) + beta * c0
    assert_close(out.to_host(), ref, 1e-5 if dtype == "float32" else 1e-12,
                 f"gemm {M}x{N}x{K} trans=({ta},{tb}) beta={beta} {params}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_tuner_candidate(dtype, device, rng):
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no float64 on this device")
    configs = [p for p in tuner_candidates(device, dtype) if p["WG_M"] * p["WG_N"] <= device.max_work_group_size]
    assert configs, "the tuner exposes no GEMM candidates"
    for i, params in enumerate(configs):
        # each configuration meets every transpose combination on one ragged shape, and beta ≠ 0 once
        for j, (ta, tb) in enumerate(itertools.product((0, 1), repeat=2)):
            M, N, K = SHAPES[(i + j) % len(SHAPES)]
            _check(device, rng, dtype, M, N, K, ta, tb, params, beta=0.5 if j == 3 else 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_packed_operands(dtype, device, rng):
    """Operands above the host's 'fits in L1' threshold get packed: A by gemm_pack_a (transposed A),
    B by gemm_pack_b (a strided B) or gemm_pack_bt (a transposed B)."""
    if dtype == "float64" and not device.has_fp64:
        pytest.skip("no float64 on this device")
    item = np.dtype(dtype).itemsize
    K = 8200 // (67 * item) * 4 + 3            # 67 x K above 32 KiB
    cpu = gemm_mod.normalize(db.BUILTIN["cpu"]["gemm"][dtype])
    for params in (cpu, {**cpu, "PACK_A": 1, "PACK_B": 1, "KU": 2}):
        for ta, tb in ((1, 1), (1, 0), (0, 1)):
            _check(device, rng, dtype, 67, 11, K, ta, tb, params)
        # a B with a column stride (every other column of a wider matrix): gemm_pack_b
        b_wide = rng.uniform(-1, 1, (K, 22)).astype(dtype)
        a = rng.uniform(-1, 1, (5, K)).astype(dtype)
        B = nc.Tensor.from_host(b_wide, device)[:, ::2]
        out = gemm(nc.Tensor.from_host(a, device), B, params=params)
        assert_close(out.to_host(), a.astype(np.float64) @ b_wide[:, ::2], 1e-5, "strided B")


def test_batched_broadcast_and_default_params(device, rng):
    for dtype in _dtypes(device):
        a = rng.uniform(-1, 1, (3, 7, 5)).astype(dtype)
        b = rng.uniform(-1, 1, (1, 5, 9)).astype(dtype)
        out = gemm_batched(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device))
        assert_close(out.to_host(), np.einsum("bmk,kn->bmn", a.astype(np.float64), b[0]), 1e-5, "batched")
        x = nc.Tensor.from_host(a[0], device)
        y = nc.Tensor.from_host(b[0], device)
        assert_close((x @ y).to_host(), a[0].astype(np.float64) @ b[0], 1e-5, "matmul")


def test_few_rows_read_along_k(device, rng):
    """kernels/gemm_dot.cl: a Linear layer's product at a small batch, with K and N tails, beta 0 and not."""
    for dtype in _dtypes(device):
        for m, n, k in ((1, 9, 19), (3, 5, 8), (7, 6, 3)):
            a = rng.uniform(-1, 1, (m, k)).astype(dtype)
            w = rng.uniform(-1, 1, (n, k)).astype(dtype)
            c0 = rng.uniform(-1, 1, (m, n)).astype(dtype)
            A, W = nc.Tensor.from_host(a, device), nc.Tensor.from_host(w, device)
            ref = a.astype(np.float64) @ w.T
            assert_close(gemm(A, W, trans_b=True).to_host(), ref, 1e-5, "few rows")
            C = nc.Tensor.from_host(c0, device)
            gemm(A, W, C, alpha=2.0, beta=0.5, trans_b=True)
            assert_close(C.to_host(), 2.0 * ref + 0.5 * c0, 1e-5, "few rows, beta")
