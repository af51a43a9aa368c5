"""Per-device calibration and measured training plans: stored, and reused by a later process; the
timing helper they share."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv2d_planner as planner
from netcl.ops import conv_chooser
from netcl.ops import conv_cost, conv_online, conv_profile
from netcl.ops.conv2d import conv2d, conv2d_inference
from netcl.ops.conv_common import ConvLayer
from netcl.runtime import timing
from netcl.runtime import tuning_db as db
from netcl.tuning import conv_prebuild
from util import assert_close, conv2d_ref

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("NETCL_CONV_STRATEGY", "NETCL_CONV_WORKSPACE_LIMIT", "NETCL_CONV_PLAN_MODE", "NETCL_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(planner.MEASURE_TIMING, "min_time_s", 0.05)
    monkeypatch.setattr(planner, "MEASURE_SERIES", 1)
    conv_chooser.clear_memory_cache()
    yield
    conv_chooser.clear_memory_cache()


def _child(tmp_path, code, *argv):
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    # the parent's device: in a fresh cache the child has no measured figures to pick the fastest by
    env.setdefault("NETCL_DEVICE", str(nc.default_device().index))
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CALIBRATE = """
import json, netcl as nc
from netcl.ops.conv_common import ConvLayer
from netcl.tuning.conv import calibrate
layer = ConvLayer.from_shapes((2, 4, 9, 9), (6, 4, 3, 3), padding=1)
out = calibrate(nc.default_device(), quick=True, progress=False, layers=[layer])
print(json.dumps(out))
"""

_PROFILE = """
import json, netcl as nc
from netcl.ops import conv_profile
from netcl.ops.conv2d_planner import plan_conv2d
d = nc.default_device()
p = plan_conv2d((2, 4, 9, 9), (6, 4, 3, 3), padding=1)
print(json.dumps({"profile": conv_profile.device_profile(d).as_dict(), "summary": conv_profile.calibration_summary(d),
                  "reason": p.reason, "calibrated": p.calibrated}))
"""


def test_calibration_is_stored_and_reused_by_a_second_process(tmp_path):
    made = _child(tmp_path, _CALIBRATE)
    assert made["timings"] >= 6 and made["basics"]["bandwidth_gbs"] > 0 and made["coefficients"]
    assert made["prebuilt"]["jobs"] >= 2 and made["prebuilt"]["seconds"] >= 0  # GEMM classes, the layer
    assert all(v["large"] > 0 for v in [made["basics"]["class_gflops"]])
    used = _child(tmp_path, _PROFILE)
    profile = used["profile"]
    assert profile["source"] == "measured" and profile["calibration"] == "netcl tune conv"
    assert profile["coefficients"] == made["coefficients"]
    # the GEMM's rate surface measured by the calibration prices the products of the second process
    assert made["basics"]["gemm_surface_points"] >= 1
    assert profile["gemm_surface_points"] == made["basics"]["gemm_surface_points"]
    # the model's own leave-one-layer-out score is stored with the calibration, and the second process
    # fits a residual model for every strategy and pass the first one measured
    assert made["residual"]["choices"] == 3 and 0 <= made["residual"]["hits"] <= 3
    assert profile["residual_models"] == len(made["coefficients"])
    assert profile["bandwidth_gbs"] == pytest.approx(made["basics"]["bandwidth_gbs"], rel=1e-3)
    assert used["calibrated"] and "fallback" not in used["reason"] and used["summary"].startswith("calibrated")
    store = json.loads((tmp_path / "cache" / "tuning" / "tuning.json").read_text())
    families = next(iter(store["devices"].values()))
    assert "conv_calibration" in families  # beside the GEMM tuning, in the one per-device store


def test_uncalibrated_plans_say_they_use_the_fallback(device):
    plan = planner.plan_conv2d((2, 4, 9, 9), (6, 4, 3, 3), padding=1, device=device)
    assert not plan.calibrated and "uncalibrated fallback" in plan.reason
    assert "not calibrated" in planner.calibration_summary(device)


def test_measured_plans_refine_the_calibration(device):
    layer = ConvLayer.from_shapes((2, 3, 9, 9), (4, 3, 3, 3), padding=1)
    plan = planner.plan_conv2d_layer(layer, "forward", "measure", device=device)
    assert plan.source == "measured"
    entry = conv_profile.stored(device)
    timed = [c.strategy for c in plan.candidates if c.measured_ms is not None]
    assert sorted(k.split("|")[0] for k in entry["samples"]) == sorted(timed)
    assert entry["calibrated_by"] == "measured plans"
    for name in timed:
        row = entry["samples"][f"{name}|forward"][-1]
        assert row[2] == pytest.approx(plan.candidate(name).measured_ms, rel=1e-3) and row[3] == layer.signature()
    conv_chooser.clear_memory_cache()
    again = planner.plan_conv2d((2, 5, 11, 11), (4, 5, 3, 3), padding=1, device=device)
    assert again.calibrated and all(c.calibrated for c in again.candidates if c.strategy in timed)


def test_fit_recovers_two_coefficients_and_falls_back_to_one_scale():
    rows = [(a, o, 3.0 * a + 0.5 * o) for a, o in ((1, 1), (2, 0.5), (0.3, 4), (5, 2), (1, 8))]
    a, b = conv_cost.fit(rows)
    assert a == pytest.approx(3.0, rel=1e-6) and b == pytest.approx(0.5, rel=1e-6)
    one = conv_cost.fit([(1.0, 1.0, 4.0)])
    assert one == (2.0, 2.0)
    assert conv_cost.fit([("x", 1, 2), (1, 1, -1)]) is None


def test_predictions_stay_within_the_ratios_measured(device):
    """Samples of tiny layers, whose time is all launches and traffic (arith near zero) and noisy, leave
    the arithmetic coefficient free to reach its bound; a layer that is mostly arithmetic is then priced
    no further from the model than the samples' own measured / modelled ratios, not a thousand times."""
    from netcl.ops.conv_common import CostTerms
    rows = [[6.1e-05, 0.300158, 0.393174, "n1c5h7w10k7r1s1st1x1p0x0d4x8g1float32"],
            [5.5e-05, 0.300142, 1.062815, "n1c5h7w9k7r1s1st1x1p0x0d4x8g1float32"],
            [0.000375, 0.300966, 0.344493, "n1c4h15w29k5r1s2st1x1p0x0d8x4g1float32"],
            [0.000188, 0.30064, 0.61058, "n1c4h15w25k5r1s1st1x1p0x0d8x4g1float32"]]
    a, b = conv_cost.fit([r[:3] for r in rows])
    assert a > 100 * b  # the noise is "explained" by the term the samples barely exercise
    profile = conv_profile.profile_from_entry(device, "float32", {"samples": {"im2col|forward": rows}})
    lowest, highest = profile.ratio_ranges["im2col|forward"]
    assert lowest == pytest.approx(0.344493 / (0.000375 + 0.300966)) and highest == pytest.approx(1.062815 / 0.300197)
    terms = CostTerms(kernel_flops=10.0 * profile.gemm_gflops * 1e6, bytes_moved=1e6, launches=3)  # 10 ms
    arith, other = conv_cost.split_ms(terms, profile)
    assert arith > other
    predicted, calibrated = conv_cost.predict_ms("im2col", "forward", terms, profile)
    assert calibrated and lowest * (arith + other) <= predicted <= highest * (arith + other) * (1 + 1e-9)
    assert a * arith > 30 * predicted


def _features(n=8, channels=16, groups=1, pixels=196, taps=9, stride=1):
    return (math.log(n), math.log(channels), math.log(channels), math.log(pixels), math.log(taps),
            math.log(stride), math.log(groups))


def test_the_residual_model_learns_what_the_two_terms_miss():
    """Strategy "slow_when_grouped" runs 4x slower on grouped layers, which neither term sees: the
    residual model finds it in the groups feature, and leave-one-layer-out scores every choice right;
    without the layer features the same choices miss."""
    rng = np.random.default_rng()
    samples = {"steady|forward": [], "slow_when_grouped|forward": []}
    for index in range(24):
        groups = 32 if index % 2 else 1
        arith, other = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.2, 0.6))
        features = _features(groups=groups, channels=int(rng.integers(4, 64)))
        layer = f"n8layer{index}"
        samples["steady|forward"].append((arith, other, 1.6 * (arith + other), features, layer))
        slow = (arith + other) * (4.0 if groups > 1 else 1.0)
        samples["slow_when_grouped|forward"].append((arith, other, slow, features, layer))
    score = conv_cost.score_residual(samples)
    assert score["choices"] == 24 and score["hits"] == 24 and score["geomean_slowdown"] == 1.0, score
    blind = {key: [row[:3] + (None,) + row[4:] for row in rows] for key, rows in samples.items()}
    blind_score = conv_cost.score_residual(blind)
    assert blind_score["hits"] < score["hits"], blind_score


def test_residual_model_follows_a_feature_and_stays_within_what_it_saw():
    """Times that grow as batch^0.5 beyond the two terms: the residual model recovers the trend inside the
    measured batches (weakly ridged), never predicts past the residuals it saw, ignores a feature all
    samples share and skips rows without features."""
    rng = np.random.default_rng()
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        arith, other = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.1, 0.3))
        rows.append((arith, other, (arith + other) * n ** 0.5, _features(n=n)))
    a, b = conv_cost.fit([r[:3] for r in rows])
    residual = conv_cost.fit_residual(a, b, rows, ridge=1e-6)
    for arith, other, measured, features in rows:
        assert (a * arith + b * other) * residual.correction(arith, other, features) == pytest.approx(measured, rel=0.05)
    logs = [math.log(t / (a * x + b * o)) for x, o, t, _ in rows]
    far = residual.correction(1.0, 0.2, _features(n=4096))
    assert math.log(far) <= max(logs) + 1e-9
    # a layer beyond the measured batches is priced as the largest measured one, not extrapolated
    assert far == pytest.approx(residual.correction(1.0, 0.2, _features(n=64)), rel=1e-12)
    assert math.isfinite(residual.correction(1.0, 0.2, _features(n=8, taps=49)))  # taps never varied
    assert conv_cost.fit_residual(a, b, [r[:3] + (None,) for r in rows]) is None


def test_calibration_shortens_its_timed_rounds_to_keep_to_its_budget(device, monkeypatch):
    """Passes that project past the budget get shorter timed rounds (never below SHORTEST);
    within the budget every pass gets full-length ones. The timing itself is faked: 20 ms a pass."""
    from netcl.tuning import conv as tune_conv
    asked = []

    def fake_time_strategies(impls, layer, pass_, device, rng=None, **timing_rules):
        asked.append(timing_rules)
        time.sleep(0.02)
        return {name: 1.0 for name in impls}

    monkeypatch.setattr(conv_profile, "measure_basics", lambda *a, **k: {})
    monkeypatch.setattr(planner, "time_strategies", fake_time_strategies)
    monkeypatch.setattr(conv_prebuild, "compile_ahead", lambda *a, **k: {})
    layers = [ConvLayer.from_shapes((2, 4, 9, 9), (6, 4, 3, 3), padding=1),
              ConvLayer.from_shapes((1, 3, 7, 7), (5, 3, 1, 1))]
    relaxed = tune_conv.calibrate(device, progress=False, layers=layers, budget_s=60.0)
    assert relaxed["rounds_scale"] == 1.0 and all(t == tune_conv.TIMING for t in asked)
    asked.clear()
    rushed = tune_conv.calibrate(device, progress=False, layers=layers, budget_s=0.001)
    assert rushed["rounds_scale"] < 1.0 and rushed["budget_seconds"] == 0.001
    assert asked[0] == tune_conv.TIMING and len(asked) == 6
    for rules in asked[1:]:
        assert rules["min_time_s"] == tune_conv.SHORTEST["min_time_s"]
        assert rules["time_budget_s"] == tune_conv.SHORTEST["time_budget_s"]
        assert rules["statistic"] == tune_conv.TIMING["statistic"]
    assert conv_profile.stored(device)["rounds_scale"] == rushed["rounds_scale"]


def test_rounds_scale_is_the_ratio_of_the_time_left_to_the_time_taken():
    from netcl.tuning.conv import TIMING, rounds_scale, shortened
    assert rounds_scale(seconds_left=50.0, passes_left=10, mean_pass_s=1.0) == 1.0
    assert rounds_scale(seconds_left=5.0, passes_left=10, mean_pass_s=1.0) == pytest.approx(0.5)
    assert rounds_scale(seconds_left=-3.0, passes_left=10, mean_pass_s=1.0) == 0.0
    half = shortened(TIMING, 0.75)
    assert half["min_time_s"] == pytest.approx(0.75 * TIMING["min_time_s"]) and half["warmup"] == TIMING["warmup"]


def test_a_profile_is_built_from_an_edited_entry_with_the_ridge_asked_for(device):
    """conv_profile.profile_from_entry (the offline planner benchmark's entry point): the measured basics
    and the samples of the entry it is given, not the database's, fitted with the ridge strength asked for
    (a huge one leaves only the mean residual, a tiny one follows the batch trend)."""
    rng = np.random.default_rng()
    rows = []
    for n in (1, 2, 4, 8, 16, 32):
        layer = ConvLayer.from_shapes((n, 16, 14, 14), (16, 16, 3, 3), padding=1)
        arith, other = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.1, 0.3))
        rows.append([arith, other, (arith + other) * n ** 0.5, layer.signature()])
    entry = {"bandwidth_gbs": 20.0, "launch_ms": 0.01, "class_gflops": {"large": 50.0},
             "samples": {"im2col|forward": rows}}
    loose = conv_profile.profile_from_entry(device, "float32", entry, ridge=1e-6)
    stiff = conv_profile.profile_from_entry(device, "float32", entry, ridge=1e9)
    assert loose.source == "measured" and loose.bandwidth_gbs == 20.0 and loose.launch_ms == 0.01
    assert loose.coefficients["im2col|forward"][2] == 6 and set(loose.coefficients) == {"im2col|forward"}
    features = conv_cost.signature_features(rows[-1][3])
    small, large = (loose.residuals["im2col|forward"].correction(1.0, 0.2, conv_cost.signature_features(r[3]))
                    for r in (rows[0], rows[-1]))
    assert large > 2 * small
    flat = stiff.residuals["im2col|forward"]
    assert np.abs(flat.beta).max() < 1e-6  # no trend: the mean, and the local part next to measured layers
    far = conv_cost.Residual(**{**flat.__dict__, "seen": flat.seen + 100.0})  # no measured layer near
    assert far.correction(1.0, 0.2, features) == pytest.approx(math.exp(flat.mean), rel=1e-6)
    assert not conv_profile.profile_from_entry(device, "float32", {**entry, "samples": {}}).coefficients


def test_the_residual_carries_what_the_trend_missed_to_the_layers_next_to_it(monkeypatch):
    """The residual's local part: where a power law explains every measured time the model follows it;
    a layer measured 2x slower than the trend raises its own prediction (by more than the linear part
    alone would) and hardly moves the prediction of layers far from it."""
    def rows(bump):
        out = []
        for n in (1, 2, 4, 8, 16, 32, 64):
            features = conv_cost.layer_features(ConvLayer.from_shapes((n, 16, 14, 14), (16, 16, 3, 3), padding=1))
            arith, other = 0.1 * n, 0.05
            out.append((arith, other, (arith + other) * n ** 0.3 * (bump if n == 8 else 1.0), features))
        return out

    def predicted(samples):
        residual = conv_cost.fit_residual(1.0, 1.0, samples)
        return [(a + o) * residual.correction(a, o, f) for a, o, _, f in samples]
    plain, bumped = predicted(rows(1.0)), predicted(rows(2.0))
    assert all(p == pytest.approx(m, rel=0.05) for p, (_, _, m, _) in zip(plain, rows(1.0)))
    assert bumped[3] > 1.25 * plain[3] and bumped[-1] < 1.05 * plain[-1]
    monkeypatch.setattr(conv_cost, "LOCAL_SHRINK", 1e9)  # the linear part alone
    assert predicted(rows(2.0))[3] < bumped[3] / 1.1


def test_a_layer_signature_gives_the_layer_back():
    layer = ConvLayer.from_shapes((8, 64, 28, 27), (64, 1, 3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                                  groups=64, dtype="float64")
    assert ConvLayer.from_signature(layer.signature()) == layer
    assert conv_cost.signature_features(layer.signature()) == conv_cost.layer_features(layer)
    assert ConvLayer.from_signature("n8c64") is None and conv_cost.signature_features("garbage") is None


_PLAN_AFTER_TRAINING = """
import json
from netcl.ops.conv2d_planner import plan_conv2d
p = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), padding=1, pass_="forward")
print(json.dumps({"source": p.source, "strategy": p.strategy, "reason": p.reason}))
"""


def test_training_measures_its_plan_over_the_first_steps_and_a_later_process_reuses_it(device, rng, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setattr(conv_online, "MARGIN", 1e9)  # every applicable strategy is a candidate
    layer = ConvLayer.from_shapes((2, 3, 9, 9), (4, 3, 3, 3), padding=1)
    x = rng.uniform(-1, 1, (2, 3, 9, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    heuristic = planner.plan_conv2d_layer(layer, "forward", "heuristic", device=device).strategy
    before = conv_online.stats(device)
    steps = 1 + conv_online.MAX_CANDIDATES * conv_online.RUNS
    for step in range(steps):
        X = nc.Tensor.from_host(x, device, requires_grad=True)
        W = nc.Tensor.from_host(w, device, requires_grad=True)
        y = conv2d(X, W, padding=1)
        y.sum().backward()
        assert_close(y.to_host(), conv2d_ref(x, w, padding=(1, 1)), 1e-4)  # every candidate's result is used
        if step == 0:
            assert db.lookup(device, "conv_plans", f"{layer.signature()}|forward") is None  # no measuring yet
        if step == 1:
            assert conv_online.measuring(device) == 3  # what a benchmark's warm-up waits for
            assert conv_chooser.chooser(device).inputs(layer, "forward", device, training=True).trials == "measuring"
    assert conv_online.measuring(device) == 0
    decided = conv_chooser.chooser(device).inputs(layer, "forward", device, training=True)
    assert (decided.mode, decided.trials, decided.stored_plan) == ("online", "done", "training")
    entry = db.lookup(device, "conv_plans", f"{layer.signature()}|forward")
    assert entry["mode"] == "training" and len(entry["measured_ms"]) >= 2 and heuristic in entry["measured_ms"]
    assert entry["cost_s"] >= 0 and entry["runs"] == conv_online.RUNS * len(entry["measured_ms"])
    after = conv_online.stats(device)
    assert after["trials_done"] - before["trials_done"] == 3  # all three passes measured
    winner = min(entry["measured_ms"], key=entry["measured_ms"].get)
    assert planner.plan_conv2d_layer(layer, "forward", device=device).strategy == winner
    later = _child(tmp_path, _PLAN_AFTER_TRAINING)
    assert later["source"] == "training" and later["strategy"] == winner and "earlier run" in later["reason"]


def test_training_trials_leave_the_losers_binaries_unwritten(device, rng, monkeypatch):
    """Programs that only losing candidates ran get no binary; every program the training then runs keeps
    its own, and the launches stop being watched once the trials are over."""
    from netcl.runtime import binaries
    from netcl.runtime.observers import watching_launches
    monkeypatch.setattr(conv_online, "MARGIN", 1e9)
    conv_online.clear(device)
    built = []
    remember = binaries.remember
    monkeypatch.setattr(binaries, "remember", lambda path, *rest: (built.append(path), remember(path, *rest)))
    # a geometry no other test builds for, so that the candidates' specialised kernels are new here
    shape_x, shape_w = (3, 5, 13, 11), (7, 5, 3, 5)
    x = rng.uniform(-1, 1, shape_x).astype(np.float32)
    w = rng.uniform(-1, 1, shape_w).astype(np.float32)

    def step():
        X = nc.Tensor.from_host(x, device, requires_grad=True)
        W = nc.Tensor.from_host(w, device, requires_grad=True)
        y = conv2d(X, W, padding=(1, 2))
        y.sum().backward()
        return y
    for _ in range(1 + conv_online.MAX_CANDIDATES * conv_online.RUNS):
        step()
    assert conv_online.measuring(device) == 0 and not device.state.observers
    waiting = {path: program.int_ptr for path, program in binaries.unsaved_programs().items() if path in built}
    used = set()
    with watching_launches(device, lambda kernel: used.add(kernel.program.int_ptr)):
        y = step()
    assert_close(y.to_host(), conv2d_ref(x, w, padding=(1, 2)), 1e-4)
    assert set(waiting.values()) <= used  # every binary still to be written is of a program in use
    assert len(waiting) < len(built)  # and some built during the trials were the losers' alone
    binaries.discard_unsaved()


def test_inference_and_heuristic_mode_do_not_measure(device, rng, monkeypatch):
    monkeypatch.setattr(conv_online, "MARGIN", 1e9)
    x = nc.Tensor.from_host(rng.uniform(-1, 1, (2, 3, 9, 9)).astype(np.float32), device)
    w = nc.Tensor.from_host(rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32), device)
    for _ in range(4):
        conv2d(x, w, padding=1)  # nothing requires grad: inference
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    W = nc.Tensor.from_host(w.to_host(), device, requires_grad=True)
    for _ in range(4):
        conv2d(x, W, padding=1).sum().backward()
    assert db.entries(device).get("conv_plans") is None


def test_inference_measures_its_forward_inside_the_choosers_block(device, rng, monkeypatch):
    """Inside ``measuring_inference`` the forward pass of inference (the fused conv2d_inference and a plain
    conv2d without a gradient alike) measures its candidates over its calls, each result used, and stores
    an "inference" plan, apart from training's, that later inference runs; outside the block nothing is
    measured; a training trial of the same layer does not take the inference plan, it measures its own."""
    monkeypatch.setattr(conv_online, "MARGIN", 1e9)  # every applicable strategy is a candidate
    shape_x, shape_w = (2, 5, 11, 9), (6, 5, 3, 3)
    layer = ConvLayer.from_shapes(shape_x, shape_w, padding=1)
    x, w = rng.uniform(-1, 1, shape_x).astype(np.float32), rng.uniform(-1, 1, shape_w).astype(np.float32)
    b = rng.uniform(-1, 1, shape_w[0]).astype(np.float32)
    X, W, B = (nc.Tensor.from_host(a, device) for a in (x, w, b))
    expected = np.maximum(conv2d_ref(x, w, padding=(1, 1)) + b[None, :, None, None], 0.0)
    choice = conv_chooser.chooser(device)
    measuring_before = conv_online.calls_measuring(device)
    for _ in range(2):
        conv2d_inference(X, W, B, padding=1, activation="relu")
    assert conv_online.calls_measuring(device) == measuring_before  # no block open: the heuristic's choice
    with choice.measuring_inference():
        for call in range(1 + conv_online.MAX_CANDIDATES * conv_online.RUNS):
            y = conv2d_inference(X, W, B, padding=1, activation="relu") if call % 2 else conv2d(X, W, B, padding=1)
            assert_close(y.to_host(), expected if call % 2 else expected + np.minimum(
                conv2d_ref(x, w, padding=(1, 1)) + b[None, :, None, None], 0.0), 1e-4)
            if call == 1:
                assert choice.inputs(layer, "forward", device).trials == "measuring"
                assert conv_online.trial_state(layer, "forward", device, "inference") == "measuring"
    assert conv_online.measuring(device) == 0
    assert conv_online.trial_state(layer, "forward", device) == "not started"  # training's trial is another
    entry = db.lookup(device, "conv_plans", f"{layer.signature()}|forward|inference")
    assert entry["mode"] == "inference" and len(entry["measured_ms"]) >= 2
    assert db.lookup(device, "conv_plans", f"{layer.signature()}|forward") is None
    winner = min(entry["measured_ms"], key=entry["measured_ms"].get)
    plan = planner.plan_conv2d_layer(layer, "forward", device=device, inference=True)
    assert (plan.strategy, plan.source) == (winner, "inference")
    assert planner.plan_conv2d_layer(layer, "forward", device=device).source == "model"  # training's plan
    XG, WG = (nc.Tensor.from_host(a, device, requires_grad=True) for a in (x, w))
    conv2d(XG, WG, padding=1).sum().backward()
    assert conv_online.trial_state(layer, "forward", device) == "measuring"


def test_compare_rotates_warms_up_and_names_its_statistic(device):
    calls = {"fast": 0, "slow": 0}

    def runner(name, seconds):
        def run():
            calls[name] += 1
            time.sleep(seconds)
        return run
    results = timing.compare({"fast": runner("fast", 0.001), "slow": runner("slow", 0.004)}, device,
                             warmup=2, min_runs=3, max_runs=4, time_budget_s=0.5, settle_below_s=0.0)
    fast, slow = results["fast"], results["slow"]
    assert fast.statistic == "median" and len(fast.samples) >= 3 and len(slow.samples) >= 3
    # two warm-up runs, one settling run before the first sample, then the samples
    assert calls["fast"] == 2 + 1 + len(fast.samples) and fast.ms < slow.ms
    assert timing.sample(runner("fast", 0.001), device, repeats=3, statistic="min").seconds >= 0.001
    with pytest.raises(ValueError, match="statistic"):
        timing.sample(lambda: None, device, statistic="mode")
    failing = timing.compare({"bad": lambda: 1 / 0}, device, errors=(ZeroDivisionError,))
    assert isinstance(failing["bad"], ZeroDivisionError)


@pytest.mark.slow
def test_tune_conv_quick_is_bounded_and_calibrates(tmp_path):
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "netcl", "tune", "conv", "--quick", "--json"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tuned"] == "conv" and out["seconds"] <= 30 and out["timings"] >= 4 * 3 * 3
    print(f"tune conv --quick: {out['seconds']} s calibrating, {time.perf_counter() - start:.1f} s in all")
    used = _child(tmp_path, _PROFILE)
    assert used["calibrated"] and used["profile"]["calibration"] == "netcl tune conv"


def test_compare_times_a_much_slower_runner_in_rounds_of_its_own(device):
    order = []

    def runner(name, seconds):
        def run():
            order.append(name)
            time.sleep(seconds)
        return run
    results = timing.compare({"slow": runner("slow", 0.03), "a": runner("a", 0.001), "b": runner("b", 0.0015)},
                             device, warmup=2, min_runs=3, max_runs=3, time_budget_s=0.0, settle_below_s=0.0)
    after_warmup = order[6:]
    first_slow = after_warmup.index("slow")
    assert set(after_warmup[:first_slow]) == {"a", "b"} and set(after_warmup[first_slow:]) == {"slow"}
    assert all(len(results[n].samples) == 3 for n in ("slow", "a", "b"))
    assert list(results) == ["slow", "a", "b"]


def test_an_isolated_runner_gets_its_minimum_samples_and_no_more(device):
    """Spans and budgets that keep close rivals going (min_time_s, time_budget_s) do not repeat a runner
    isolated for being far slower: it cannot be the fastest."""
    def runner(seconds):
        return lambda: time.sleep(seconds)
    results = timing.compare({"slow": runner(0.05), "a": runner(0.001), "b": runner(0.001)}, device,
                             warmup=1, min_runs=3, max_runs=40, time_budget_s=1.0, contention=10.0,
                             settle_below_s=0.0, min_time_s=0.1)
    assert len(results["slow"].samples) == 3
    assert len(results["a"].samples) > 3 and len(results["b"].samples) > 3
