"""The tuning database (round trip, damaged files, unknown devices, the cache switch) and the GEMM tuner."""
from __future__ import annotations

import json
import types
import warnings

import numpy as np
import pytest

import netcl as nc
from netcl.ops import gemm as gemm_module
from netcl.runtime import tuning_db as db
from netcl.runtime.device_state import DeviceState
from netcl.tuning import gemm as tuner
from util import assert_close


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private tuning database (compiled kernels stay in the shared cache: no rebuilds)."""
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    monkeypatch.setattr(db, "db_path", lambda: tmp_path / "tuning" / "tuning.json")
    (tmp_path / "tuning").mkdir()
    return tmp_path


FAKE = "Fake Platform|Fake Device|0.0|OpenCL 1.2"


def test_round_trip_and_identity(tmp_cache):
    before = db.identity(FAKE)
    assert db.lookup(FAKE, "mec") is None
    assert db.lookup(FAKE, "mec", default={"T": 4}) == {"T": 4}
    db.store(FAKE, "mec", {"T": 12, "measured": [1.5, 2.5]})
    db.store(FAKE, "gemm", {"MR": 3, "gflops": 42.0}, key="float32/large")
    assert db.lookup(FAKE, "mec") == {"T": 12, "measured": [1.5, 2.5]}
    assert db.lookup(FAKE, "gemm", "float32/large") == {"MR": 3, "gflops": 42.0}
    assert db.source(FAKE, "mec") == "user"
    after = db.identity(FAKE)
    assert after != before
    assert db.identity("Another|device|1|x") != after
    on_disk = json.loads(db.db_path().read_text())
    assert on_disk["devices"][FAKE]["mec"]["*"]["T"] == 12
    # a lookup returns a copy: changing it does not change the database
    db.lookup(FAKE, "mec")["T"] = 99
    assert db.lookup(FAKE, "mec")["T"] == 12
    db.forget(FAKE, "mec")
    assert db.lookup(FAKE, "mec") is None and db.lookup(FAKE, "gemm", "float32/large")["MR"] == 3


def test_unknown_device_gets_builtin_defaults(tmp_cache):
    assert db.lookup(FAKE, "gemm", "float32") == db.BUILTIN["any"]["gemm"]["float32"]
    assert db.source(FAKE, "gemm", "float32") == "builtin"
    fake_cpu = types.SimpleNamespace(identity=FAKE, kind="cpu", state=DeviceState())
    assert db.lookup(fake_cpu, "gemm", "float32") == db.BUILTIN["cpu"]["gemm"]["float32"]
    assert gemm_module.params_for(fake_cpu, np.float32, 300, 300, 300) == \
        gemm_module.normalize(db.BUILTIN["cpu"]["gemm"]["float32"])
    assert db.source(fake_cpu, "nothing") == "none"


@pytest.mark.parametrize("lanes, expected", [(16, 16), (8, 8), (4, 4), (1, 8), (0, 8)])
def test_builtin_cpu_tiles_take_the_devices_vector_width(tmp_cache, lanes, expected):
    """The built-in CPU tile for large products keeps its shape in vectors and takes the device's own width
    (AVX-512: 16 floats); a device that reports no usable width keeps 256-bit vectors; a tuned entry is
    used as stored."""
    identity = f"Fake Platform|Fake CPU with {lanes} lanes|0.0|OpenCL 1.2"  # parameters are memoized per identity
    fake_cpu = types.SimpleNamespace(identity=identity, kind="cpu", state=DeviceState(),
                                     native_vector_width={"float32": lanes, "float64": lanes // 2})
    builtin = db.BUILTIN["cpu"]["gemm"]["float32"]
    p = gemm_module.params_for(fake_cpu, np.float32, 300, 300, 300)
    assert p["VW"] == expected and (p["MR"], p["NV"]) == (builtin["MR"], builtin["NV"])
    assert gemm_module.params_for(fake_cpu, np.float32, 64, 10, 500)["VW"] == 8  # small classes: 256-bit tiles
    tuned = {**builtin, "VW": 4, "MR": 3}
    db.store(identity, "gemm", tuned, key="float32/large")
    p = gemm_module.params_for(fake_cpu, np.float32, 300, 300, 300)
    assert (p["VW"], p["MR"]) == (4, 3)
    gpu = types.SimpleNamespace(identity="Other|gpu|1|x", kind="gpu", native_vector_width={"float32": 16},
                                state=DeviceState())
    assert gemm_module.params_for(gpu, np.float32, 300, 300, 300)["VW"] == db.BUILTIN["any"]["gemm"]["float32"]["VW"]


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", '{"devices": {"x": 5}}'])
def test_damaged_file_is_ignored_with_a_warning(tmp_cache, content):
    db.store(FAKE, "mec", {"T": 3})
    db.db_path().write_text(content)
    with pytest.warns(RuntimeWarning, match="tuning database"):
        assert db.lookup(FAKE, "mec") is None
    assert db.lookup(FAKE, "gemm", "float64") == db.BUILTIN["any"]["gemm"]["float64"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        db.store(FAKE, "mec", {"T": 5})  # a damaged file is replaced by the next store
    assert db.lookup(FAKE, "mec") == {"T": 5}


def test_cache_off_keeps_entries_in_process(tmp_cache, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE", "0")
    db.store(FAKE, "mec", {"T": 7})
    assert db.lookup(FAKE, "mec") == {"T": 7}
    assert not db.db_path().exists()
    db.forget(FAKE)
    assert db.lookup(FAKE, "mec") is None


def test_gemm_uses_stored_parameters(tmp_cache, device, rng, canaries):
    stored = {"MR": 3, "VW": 4, "NV": 1, "WG_M": 2, "WG_N": 1, "PACK_B": 1, "ORDER": "mn", "gflops": 1.0}
    db.store(device, "gemm", stored, key="float32/small_mn")
    p = gemm_module.params_for(device, np.float32, 20, 500, 300)
    assert (p["MR"], p["VW"], p["NV"], p["WG_M"], p["ORDER"]) == (3, 4, 1, 2, "mn")
    a = rng.standard_normal((20, 300)).astype(np.float32)
    b = rng.standard_normal((300, 500)).astype(np.float32)
    out = gemm_module.gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device))
    assert_close(out.to_host(), a.astype(np.float64) @ b, 1e-5, "gemm with stored parameters")
    assert gemm_module.expected_gflops(device, np.float32, 20, 500, 300) == 1.0
    assert gemm_module.expected_gflops(device, np.float32, 500, 500, 500) is None
    # an invalid stored value falls back to the built-in parameters with a warning
    db.store(device, "gemm", {"MR": 0, "VW": 5}, key="float32/small_mn")
    with pytest.warns(RuntimeWarning, match="gemm parameters"):
        p = gemm_module.params_for(device, np.float32, 20, 500, 300)
    assert p["MR"] >= 1


def test_small_n_products_fall_back_to_the_small_mn_entry(tmp_cache, device, rng):
    """A device tuned before the small_n class existed serves those products with its small_mn tile, not
    its large one; once small_n is tuned, its own entry wins."""
    small_mn = {"MR": 3, "VW": 4, "NV": 1, "WG_M": 2, "WG_N": 1, "PACK_B": 1, "ORDER": "mn", "gflops": 1.0}
    large = {"MR": 5, "VW": 8, "NV": 2, "WG_M": 1, "WG_N": 1, "PACK_B": 1, "ORDER": "nm", "gflops": 2.0}
    db.store(device, "gemm", small_mn, key="float32/small_mn")
    db.store(device, "gemm", large, key="float32")
    assert gemm_module.params_for(device, np.float32, 300, 49, 500)["MR"] == 3
    assert gemm_module.params_for(device, np.float32, 300, 300, 500)["MR"] == 5
    db.store(device, "gemm", dict(small_mn, MR=7), key="float32/small_n")
    assert gemm_module.params_for(device, np.float32, 300, 49, 500)["MR"] == 7
    a = rng.standard_normal((301, 500)).astype(np.float32)
    b = rng.standard_normal((500, 49)).astype(np.float32)
    out = gemm_module.gemm(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device))
    assert_close(out.to_host(), a.astype(np.float64) @ b, 1e-5, "gemm with the small_n entry")


def test_batched_products_fall_back_to_their_own_class(tmp_cache, device, rng):
    """A device tuned before the batched class existed serves a batched launch with the tile of its
    products' own class (and that class's fallback), as before; once batched is tuned, its entry wins,
    and the launch computes the products with it."""
    small_mn = {"MR": 3, "VW": 4, "NV": 1, "WG_M": 2, "WG_N": 1, "PACK_B": 1, "ORDER": "mn", "gflops": 1.0}
    db.store(device, "gemm", small_mn, key="float32/small_mn")
    assert gemm_module.params_for(device, np.float32, 128, 49, 128, 36)["MR"] == 3  # small_n -> small_mn
    db.store(device, "gemm", dict(small_mn, MR=6, NV=2), key="float32/batched")
    assert gemm_module.params_for(device, np.float32, 128, 49, 128, 36)["MR"] == 6
    assert gemm_module.params_for(device, np.float32, 128, 49, 128, 4)["MR"] == 3   # a short batch: not batched
    a = rng.standard_normal((9, 67, 47)).astype(np.float32)
    b = rng.standard_normal((9, 47, 81)).astype(np.float32)
    assert gemm_module.shape_class(67, 81, 47, 9) == "batched"
    out = gemm_module.gemm_batched(nc.Tensor.from_host(a, device), nc.Tensor.from_host(b, device))
    assert_close(out.to_host(), a.astype(np.float64) @ b, 1e-5, "gemm_batched with the batched entry")


def test_tuner_times_batched_cases_as_one_launch(device, tmp_cache):
    case = tuner._Case(device, np.dtype(np.float32), 11, 19, 13, 9, rng=np.random.default_rng(0))
    assert case.name == "11x19x13x9" and case.flop == 2.0 * 11 * 19 * 13 * 9
    score, rates = tuner._score([case], {"MR": 2, "VW": 4, "NV": 1}, 1, 1e-5)
    assert score is not None and score > 0 and len(rates) == 1
    assert case.error() <= 1e-5  # every product of the batch computed


def test_tuner_rejects_wrong_results(device, tmp_cache):
    case = tuner._Case(device, np.dtype(np.float32), 9, 17, 13, rng=np.random.default_rng(0))
    score, rates = tuner._score([case], {"MR": 2, "VW": 4, "NV": 1}, 1, 1e-5)
    assert score is not None and score > 0 and len(rates) == 1
    case.ref = case.ref + 1.0  # no candidate can match a wrong reference
    score, reason = tuner._score([case], {"MR": 2, "VW": 4, "NV": 1}, 1, 1e-5)
    assert score is None and "relative L2 error" in reason


@pytest.mark.parametrize("dtype, lanes, narrow", [("float32", 16, 8), ("float64", 8, 4), ("float32", 8, None),
                                                   ("float64", 4, None)])
def test_register_tiles_include_256_bit_ones_when_the_reported_vector_is_wider(dtype, lanes, narrow):
    """A driver can compile for a narrower ISA than the device reports (the PoCL wheel: AVX2 code on an
    AVX-512 Zen 4), so the search must hold 256-bit tiles too; a 256-bit device gets no 128-bit ones."""
    for quick in (True, False):
        tiles = tuner._tiles(lanes, quick, dtype)
        widths = {t["VW"] for t in tiles}
        assert lanes in widths
        assert len(tiles) == len({tuple(sorted(t.items())) for t in tiles})  # each candidate built once
        if narrow:
            assert {t["MR"] * t["NV"] for t in tiles if t["VW"] == narrow} >= {8, 12}  # AVX2's budgets
        elif quick:
            assert widths == {lanes}


def test_tuner_stores_winners(device, tmp_cache, monkeypatch):
    small = {"large": [(40, 48, 40)], "small_k": [(24, 40, 8)], "small_mn": [(8, 40, 120)],
             "small_n": [(40, 8, 120)], "tiny": [(4, 10, 50)], "batched": [(16, 12, 20, 9)]}
    monkeypatch.setattr(tuner, "QUICK_SHAPES", small)
    monkeypatch.setattr(tuner, "_tiles", lambda lanes, quick, dtype: [{"MR": 2, "VW": 4, "NV": 1}])
    monkeypatch.setattr(tuner, "_groups", lambda quick: [{"WG_M": 2, "WG_N": 1, "ORDER": "mn"}])
    monkeypatch.setattr(tuner, "_extras", lambda quick: [{"PACK_B": 0, "PACK_A": 0, "KU": 1}])
    result = tuner.run_cli(types.SimpleNamespace(quick=True, json=True))
    assert "float32/large" in result["results"]
    for key in ("float32/large", "float32/small_k", "float32/small_mn", "float32/small_n", "float32/tiny",
                "float32/batched", "float32"):
        entry = db.lookup(device, "gemm", key)
        assert db.source(device, "gemm", key) == "user"
        assert entry["gflops"] > 0 and {"MR", "VW", "NV"} <= set(entry)
    assert gemm_module.expected_gflops(device, np.float32, 24, 40, 8) > 0


def test_leaders_are_chosen_head_to_head_not_by_their_search_scores(device, tmp_cache, monkeypatch):
    """The search's scores come from samples minutes apart; the choice is made by timing the leaders
    against each other, so a leader with one lucky search sample does not win."""
    from netcl.runtime import timing
    tiles = [{"MR": 2, "VW": 4, "NV": 1}, {"MR": 1, "VW": 4, "NV": 1}, {"MR": 4, "VW": 4, "NV": 1}]
    lucky, steady = ({"MR": 1, "VW": 4, "NV": 1}, {"MR": 4, "VW": 4, "NV": 1})
    monkeypatch.setattr(tuner, "_tiles", lambda lanes, quick, dtype: tiles)
    monkeypatch.setattr(tuner, "_groups", lambda quick: [])
    monkeypatch.setattr(tuner, "_extras", lambda quick: [])
    # By MR (the device's default tile, also a candidate, is neither): the lucky tile's search sample
    # looks best...
    search_scores = {1: 500.0, 2: 100.0, 4: 300.0}
    head_to_head_seconds = {1: 4e-3, 2: 3e-3, 4: 1e-3}  # ...but run against the others it is slower
    monkeypatch.setattr(tuner, "_score",
                        lambda cases, params, repeat, tol: (search_scores.get(params["MR"], 50.0), []))
    timed = []

    def fake_compare(runners, device_, **kwargs):
        timed.append(set(runners))
        return {key: timing.Timing([head_to_head_seconds.get(dict(key)["MR"], 8e-3)]) for key in runners}

    monkeypatch.setattr(timing, "compare", fake_compare)
    monkeypatch.setitem(tuner.QUICK_SHAPES, "large", [(40, 48, 40), (24, 32, 16)])
    result = tuner.tune_class(device, "float32", "large", quick=True, log=lambda line: None)
    assert {k: result["params"][k] for k in lucky} == steady
    assert len(timed) == 2 and all(len(keys) == tuner.LEADERS for keys in timed)  # each leader, each product
    flop_per_call = [2 * 40 * 48 * 40, 2 * 24 * 32 * 16]
    per_product = [f * tuner.calls_per_sample(f) / 1e-3 / 1e9 for f in flop_per_call]
    assert result["gflops"] == pytest.approx(np.exp(np.mean(np.log(per_product))), abs=0.01)  # 2 decimals
    assert list(result["rates"].values()) == pytest.approx(per_product, abs=0.01)  # the head to head's


def test_head_to_head_times_every_leader_on_the_device(device, tmp_cache):
    cases = [tuner._Case(device, np.dtype(np.float32), 13, 31, 7, rng=np.random.default_rng(0))]
    leaders = [tuple(sorted({"MR": mr, "VW": 4, "NV": 1}.items())) for mr in (1, 2)]
    rates = tuner._settle(cases, leaders, repeat=1)
    assert set(rates) == set(leaders)
    for overall, per_case in rates.values():
        assert 0 < overall < float("inf") and len(per_case) == 1
        assert per_case[0] == pytest.approx(overall, abs=0.006)
    assert cases[0].error() <= 1e-5  # the head-to-head runs computed the product, not garbage
