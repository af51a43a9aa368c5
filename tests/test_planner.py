"""The conv2d planner: applicability and workspace straight from the strategies, budget, overrides,
measured plans reused across processes, damaged stores, and `netcl plan`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import netcl as nc
from netcl import settings
from netcl.ops import conv2d_planner as planner
from netcl.ops import conv_chooser
from netcl.ops import conv_registry
from netcl.ops.conv_common import ConvStrategy
from netcl.ops.conv2d_planner import plan_conv2d, plan_conv2d_layer
from netcl.ops.conv_common import PASSES, ConvLayer
from netcl.ops.conv_registry import strategies

REPO = Path(__file__).resolve().parent.parent

# Layers that exercise the applicability rules: 1×1, 3×3 stride 1 and 2, 5×5, dilation, groups, padding.
LAYERS = [
    ((2, 8, 7, 7), (5, 8, 1, 1), 1, 0, 1, 1),
    ((3, 4, 13, 13), (6, 4, 3, 3), 1, 1, 1, 1),
    ((1, 4, 17, 17), (7, 4, 3, 3), 2, 1, 1, 1),
    ((2, 20, 12, 12), (50, 20, 5, 5), 1, 0, 1, 1),
    ((1, 6, 15, 15), (4, 3, 3, 3), 1, 2, 2, 2),
    ((1, 1, 28, 28), (20, 1, 5, 5), 1, 0, 1, 1),
]


@pytest.fixture(autouse=True)
def fresh_planner(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("NETCL_CONV_STRATEGY", "NETCL_CONV_WORKSPACE_LIMIT", "NETCL_CONV_PLAN_MODE", "NETCL_CACHE"):
        monkeypatch.delenv(var, raising=False)
    # the timing rules' minimum span and second session are for real plans, not for these checks
    monkeypatch.setitem(planner.MEASURE_TIMING, "min_time_s", 0.05)
    monkeypatch.setattr(planner, "MEASURE_SERIES", 1)
    conv_chooser.clear_memory_cache()
    yield
    conv_chooser.clear_memory_cache()


class FakeLowering(ConvStrategy):
    """A strategy that declares an im2col-sized workspace and computes with the direct kernels."""

    def __init__(self, name="im2col"):
        self.name = name

    def why_not(self, layer, pass_, device=None):
        return "it is only for stride 1" if layer.stride_h != 1 else None

    def workspace_bytes(self, layer, pass_, device=None):
        return layer.n * layer.out_h * layer.out_w * layer.c * layer.r * layer.s * layer.itemsize

    def forward(self, x, w, layer):
        return strategies()["direct"].forward(x, w, layer)

    def backward_data(self, grad_y, w, layer):
        return strategies()["direct"].backward_data(grad_y, w, layer)

    def backward_weight(self, x, grad_y, layer):
        return strategies()["direct"].backward_weight(x, grad_y, layer)


def _with_lowering(monkeypatch):
    """The real im2col when it is registered, else the fake one."""
    registry = strategies()
    if "im2col" not in registry:
        monkeypatch.setitem(conv_registry._registry, "im2col", FakeLowering())
    return strategies()["im2col"]


def _layer(spec):
    return ConvLayer.from_shapes(*spec)


@pytest.mark.parametrize("spec", LAYERS)
@pytest.mark.parametrize("pass_", PASSES)
def test_candidates_report_the_strategies_own_rules_and_workspace(spec, pass_, device):
    layer = _layer(spec)
    plan = plan_conv2d_layer(layer, pass_, device=device)
    registry = strategies()
    assert [c.strategy for c in plan.candidates] == list(registry)
    for c in plan.candidates:
        why = registry[c.strategy].why_not(layer, pass_, device)
        assert c.applicable == (why is None)
        assert c.why_not == why
        if c.applicable:
            assert c.workspace_bytes == registry[c.strategy].workspace_bytes(layer, pass_, device)
            assert c.predicted_ms > 0 and np.isfinite(c.predicted_ms)
        else:
            assert c.workspace_bytes is None and c.why_not
        assert c.measured_ms is None
    chosen = plan.candidate(plan.strategy)
    assert chosen.applicable and chosen.within_budget
    assert plan.reason.endswith(".") and plan.strategy in plan.reason


def test_direct_serves_everything(device):
    for spec in LAYERS:
        for pass_ in PASSES:
            plan = plan_conv2d(*spec, device=device, pass_=pass_)
            assert plan.candidate("direct").applicable and plan.candidate("direct").workspace_bytes == 0


def test_public_signature_and_errors(device):
    plan = plan_conv2d((1, 3, 9, 9), (4, 3, 3, 3), stride=1, padding=0, dilation=1, groups=1, dtype="float32",
                       device=device, pass_="backward_weight", mode="heuristic", budget_bytes=None)
    assert plan.pass_ == "backward_weight" and plan.mode == "heuristic"
    with pytest.raises(nc.ShapeError, match="pass_"):
        plan_conv2d((1, 3, 9, 9), (4, 3, 3, 3), pass_="sideways")
    with pytest.raises(nc.ShapeError, match="mode"):
        plan_conv2d((1, 3, 9, 9), (4, 3, 3, 3), mode="guess")
    with pytest.raises(nc.ShapeError, match="channels"):
        plan_conv2d((1, 3, 9, 9), (4, 2, 3, 3))


def test_budget_below_lowering_workspace_is_never_exceeded(device, monkeypatch):
    im2col = _with_lowering(monkeypatch)
    layer = ConvLayer.from_shapes((4, 20, 12, 12), (50, 20, 5, 5))
    need = im2col.workspace_bytes(layer, "forward")
    assert need > 0
    # Make the lowering the model's favourite so that the budget has to overrule it.
    from netcl.ops import conv_cost
    real = conv_cost.predict_ms

    def favour_im2col(name, *a, **k):
        ms, calibrated = real(name, *a, **k)
        return (0.01 if name == "im2col" else 1000.0 + ms), calibrated
    monkeypatch.setattr(conv_cost, "predict_ms", favour_im2col)
    free = plan_conv2d_layer(layer, "forward", device=device)
    assert free.strategy == "im2col" and "budget" not in free.reason
    budget = need - 1
    plan = plan_conv2d_layer(layer, "forward", device=device, budget_bytes=budget)
    assert plan.strategy != "im2col"
    assert plan.candidate(plan.strategy).workspace_bytes <= budget
    assert not plan.candidate("im2col").within_budget
    assert "budget" in plan.reason and "im2col" in plan.reason


def test_budget_from_environment(device, monkeypatch):
    im2col = _with_lowering(monkeypatch)
    layer = ConvLayer.from_shapes((2, 4, 13, 13), (6, 4, 3, 3))
    monkeypatch.setenv("NETCL_CONV_WORKSPACE_LIMIT", "1K")
    plan = plan_conv2d_layer(layer, "forward", device=device)
    assert plan.budget_bytes == 1024
    assert (plan.inputs.budget_bytes, plan.inputs.budget_from) == (1024, "NETCL_CONV_WORKSPACE_LIMIT")
    assert plan.candidate(plan.strategy).workspace_bytes <= 1024
    assert im2col.workspace_bytes(layer, "forward") > 1024 and not plan.candidate("im2col").within_budget
    monkeypatch.setenv("NETCL_CONV_WORKSPACE_LIMIT", "lots")
    conv_chooser.clear_memory_cache()
    with pytest.raises(nc.NetclError, match="NETCL_CONV_WORKSPACE_LIMIT"):
        plan_conv2d_layer(layer, "forward", device=device)


def test_plan_mode_setting_has_one_default(device, monkeypatch):
    """NETCL_CONV_PLAN_MODE unset and "online" mean the same: plans made outside training's trials use the
    heuristic; another mode is the mode of every plan whose caller names none."""
    layer = ConvLayer.from_shapes((2, 4, 13, 13), (6, 4, 3, 3))
    assert settings.CONV_PLAN_MODE.get() == "online"
    assert plan_conv2d_layer(layer, "forward", device=device).mode == "heuristic"
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "online")
    assert plan_conv2d_layer(layer, "forward", device=device).mode == "heuristic"
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "exhaustive")
    assert planner.planning_mode() == "exhaustive"
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "sometimes")
    with pytest.raises(nc.SettingError, match="NETCL_CONV_PLAN_MODE"):
        plan_conv2d_layer(layer, "forward", device=device)


def test_default_budget_comes_from_the_device(device):
    assert planner.default_budget(device) == min(device.max_alloc_bytes, device.global_mem_bytes // 2)


def test_nothing_fits_the_budget_picks_the_smallest_workspace(device, monkeypatch):
    big, small = FakeLowering("im2col"), FakeLowering("mec")
    small.workspace_bytes = lambda layer, pass_, device=None: 64
    monkeypatch.setattr(conv_registry, "_registry", {"im2col": big, "mec": small})
    plan = plan_conv2d((1, 2, 9, 9), (3, 2, 3, 3), device=device, budget_bytes=8)
    assert plan.strategy == "mec" and "budget" in plan.reason


def test_no_applicable_strategy_raises_with_every_rule(device, monkeypatch):
    monkeypatch.setattr(conv_registry, "_registry", {"im2col": FakeLowering()})
    with pytest.raises(nc.ShapeError, match="only for stride 1"):
        plan_conv2d((1, 2, 9, 9), (3, 2, 3, 3), stride=2, device=device)


def test_caller_override_wins_and_is_the_reason(device, monkeypatch):
    monkeypatch.setitem(conv_registry._registry, "winograd", FakeLowering("winograd"))
    plan = plan_conv2d((2, 4, 13, 13), (6, 4, 3, 3), device=device, strategy="winograd")
    assert plan.strategy == "winograd" and "forced by the caller" in plan.reason and plan.source == "override"
    with pytest.raises(nc.ShapeError, match="winograd.*only for stride 1"):
        plan_conv2d((1, 4, 17, 17), (7, 4, 3, 3), stride=2, device=device, strategy="winograd")
    with pytest.raises(nc.ShapeError, match="unknown"):
        plan_conv2d((1, 4, 17, 17), (7, 4, 3, 3), device=device, strategy="fft")


def test_environment_override_wins_and_is_the_reason(device, monkeypatch):
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "direct")
    plan = plan_conv2d((2, 4, 13, 13), (6, 4, 3, 3), device=device, pass_="backward_data")
    assert plan.strategy == "direct" and "NETCL_CONV_STRATEGY=direct" in plan.reason
    assert (plan.inputs.forced, plan.inputs.forced_by) == ("direct", "NETCL_CONV_STRATEGY=direct")
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "nonsense")
    with pytest.raises(nc.ShapeError, match="nonsense"):
        plan_conv2d((2, 4, 13, 13), (6, 4, 3, 3), device=device)


def test_conv2d_auto_runs_the_planned_strategy(device, monkeypatch, rng):
    from netcl.ops.conv2d import conv2d
    from util import assert_close, conv2d_ref
    asked = []
    real = planner.plan_conv2d_layer

    def spy(layer, pass_, *a, **k):
        asked.append(pass_)
        assert k.get("device") is device
        return real(layer, pass_, *a, **k)
    monkeypatch.setattr(planner, "plan_conv2d_layer", spy)
    x = rng.uniform(-1, 1, (2, 3, 7, 7)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    y = conv2d(nc.tensor(x, device=device), nc.tensor(w, device=device), padding=1)
    assert asked == ["forward"]
    assert_close(y.to_host(), conv2d_ref(x, w, padding=(1, 1)), 1e-5)


def test_measure_mode_times_candidates_and_picks_the_fastest(device, monkeypatch):
    _with_lowering(monkeypatch)
    plan = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device, mode="measure")
    timed = [c for c in plan.candidates if c.measured_ms is not None]
    assert timed and all(c.applicable and c.measured_ms > 0 for c in timed)
    assert plan.candidate(plan.strategy).measured_ms == min(c.measured_ms for c in timed)
    assert plan.source == "measured" and "measured" in plan.reason
    exhaustive = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device, mode="exhaustive")
    assert all(c.measured_ms is not None for c in exhaustive.candidates if c.applicable)


_CHILD = """
import json, sys
from netcl.ops.conv2d_planner import plan_conv2d
p = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), padding=1, pass_=sys.argv[2], mode=sys.argv[1])
print(json.dumps({"source": p.source, "strategy": p.strategy, "reason": p.reason,
                  "measured": {c.strategy: c.measured_ms for c in p.candidates}}))
"""


def _child(tmp_path, mode, pass_="forward"):
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, pass_], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_measured_plan_is_reused_by_a_later_process(tmp_path):
    first, _ = _child(tmp_path, "measure")
    assert first["source"] == "measured"
    second, _ = _child(tmp_path, "heuristic")
    assert second["source"] == "cache" and second["strategy"] == first["strategy"]
    assert second["measured"] == first["measured"]
    assert "earlier run" in second["reason"]
    other_pass, _ = _child(tmp_path, "heuristic", "backward_weight")
    assert other_pass["source"] == "model"


def test_damaged_plan_store_is_ignored_with_a_warning(tmp_path):
    first, _ = _child(tmp_path, "measure")
    store = tmp_path / "cache" / "tuning" / "tuning.json"
    assert "conv_plans" in store.read_text() and "conv_calibration" in store.read_text()
    store.write_text("{not json")
    again, stderr = _child(tmp_path, "heuristic")
    assert again["source"] == "model" and "damaged" in stderr
    remeasured, _ = _child(tmp_path, "measure")
    assert remeasured["source"] == "measured"
    assert json.loads(store.read_text())


def test_plan_context_includes_version_kernels_tuning_and_strategy_set(device, monkeypatch):
    names = tuple(strategies())
    base = planner.plan_context(device, names)
    assert planner.plan_context(device, names + ("toy",)) != base
    monkeypatch.setattr(planner.db, "identity", lambda d: "retuned")
    assert planner.plan_context(device, names) != base
    monkeypatch.undo()
    monkeypatch.setattr(nc, "__version__", "999.0")
    assert planner.plan_context(device, names) != base
    monkeypatch.undo()
    # an edited kernel template is measured again, not ranked by its predecessor's times
    monkeypatch.setattr("netcl.runtime.kernels.convolution_templates_digest", lambda: "edited")
    assert planner.plan_context(device, names) != base


def _args(**kw):
    base = dict(network="lenet", batch=128, input=None, weight=None, stride="1", padding="0", dilation="1",
                groups=1, pass_="all", mode="heuristic", budget=None, device=None, json=True)
    base.update(kw)
    return SimpleNamespace(**base)


def test_plan_command_lenet_is_fast_and_complete(capsys):
    from netcl.cli.plan import run as plan_command
    start = time.perf_counter()
    out = plan_command(_args())
    assert time.perf_counter() - start < 0.5
    assert [(l["name"], l["pass"]) for l in out["layers"]] == [(n, p) for n in ("conv1", "conv2") for p in PASSES]
    for layer in out["layers"]:
        assert {"name", "pass", "strategy", "reason", "candidates"} <= set(layer)
        assert {"strategy", "applicable", "why_not", "workspace_bytes", "predicted_ms", "measured_ms"} \
            <= set(layer["candidates"][0])
    json.dumps(out)
    text = capsys.readouterr().out
    assert text.count("-> ") == 6 and "*" in text


def test_plan_command_mec_and_conv():
    from netcl.cli.plan import run as plan_command
    out = plan_command(_args(network="mec", batch=1, pass_="forward"))
    assert [l["name"] for l in out["layers"]] == [f"cv{i}" for i in range(1, 13)]
    out = plan_command(_args(network="conv", input="2x3x9x9", weight="4x3x3x3", stride="2",
                             padding="1x0", pass_="backward_data"))
    assert len(out["layers"]) == 1 and "stride (2, 2), padding (1, 0)" in out["layers"][0]["layer"]


def test_the_benchmark_layer_tables_plan_without_running_a_kernel(device):
    """Every layer the planner benchmark judges (held-out sets included, whose kernels are not square,
    grouped or dilated) gets a heuristic plan for each pass among at least two applicable strategies,
    with a reason, and without running a kernel."""
    from netcl.cli.conv_layers import held_out_layers, second_held_out_layers
    from netcl.runtime.observers import watching_launches
    launched = []
    with watching_launches(device, launched.append):
        for name, layer in held_out_layers(3) + second_held_out_layers(2):
            for pass_ in PASSES:
                plan = plan_conv2d_layer(layer, pass_, "heuristic", device=device)
                applicable = [c.strategy for c in plan.candidates if c.applicable]
                assert plan.strategy in applicable and plan.reason, (name, pass_)
                assert len(applicable) >= 2, (name, pass_, applicable)  # a choice to make: direct and more
    assert not launched


def test_plan_command_resnet20_explains_every_layer_and_pass(capsys):
    from netcl.cli.plan import run as plan_command
    out = plan_command(_args(network="resnet20", batch=32))
    names = [l["name"] for l in out["layers"]]
    assert names[0] == "conv1" and "layer3.0.downsample.0" in names and len(names) == 8 * 3
    shapes = {l["name"]: l["layer"] for l in out["layers"]}
    assert "input (32, 3, 32, 32)" in shapes["conv1"]
    assert "weight (64, 32, 1, 1), stride (2, 2)" in shapes["layer3.0.downsample.0"]
    assert "input (32, 64, 8, 8)" in shapes["layer3.0.conv2"]
    assert all(l["reason"].endswith(".") for l in out["layers"])
    assert out["calibrated"] is False and "not calibrated" in out["calibration"]
    assert "uncalibrated fallback" in out["layers"][0]["reason"]
    assert "not calibrated" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["plan", "conv", "--input", "2x3x9", "--weight", "4x3x3x3"],
    ["plan", "conv", "--input", "2xAx9x9", "--weight", "4x3x3x3"],
    ["plan", "conv", "--weight", "4x3x3x3"],
    ["plan", "conv", "--input", "2x3x9x9", "--weight", "4x2x3x3"],
    ["plan", "conv", "--input", "2x3x9x9", "--weight", "4x3x3x3", "--stride", "0"],
    ["plan", "lenet", "--batch", "0"],
    ["plan", "lenet", "--budget", "-5"],
])
def test_plan_cli_rejects_bad_arguments(argv, capsys):
    from netcl.cli.main import main
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_plan_cli_json(capsys):
    from netcl.cli.main import main
    assert main(["plan", "conv", "--input", "1x3x9x9", "--weight", "4x3x3x3", "--pass", "forward", "--json"]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    out = json.loads(text[-1])
    assert out["device"] and out["layers"][0]["pass"] == "forward"
    decided = out["layers"][0]["decided_by"]
    assert set(decided) == {"mode", "forced", "forced_by", "budget_bytes", "budget_from", "deterministic",
                            "first_step", "stored_plan", "calibration", "trials"}
    assert decided["mode"] == "heuristic" and decided["forced"] is None and decided["trials"] == "off"
    assert decided["budget_bytes"] == out["layers"][0]["budget_bytes"]
    assert any(line.startswith("  decided by: mode heuristic; no strategy forced") for line in text)


def test_the_inputs_of_a_choice_are_what_the_plan_was_made_with(device, monkeypatch):
    layer = ConvLayer.from_shapes((2, 4, 13, 13), (6, 4, 3, 3))
    inputs = conv_chooser.chooser(device).inputs(layer, "forward", device)
    assert inputs == plan_conv2d_layer(layer, "forward", device=device).inputs
    assert inputs.mode == "heuristic" and inputs.stored_plan is None and inputs.budget_from == "the device's memory"
    forced = conv_chooser.chooser(device).inputs(layer, "forward", device, strategy="direct", training=True)
    assert (forced.mode, forced.forced, forced.forced_by, forced.trials) == ("heuristic", "direct", "the caller", "off")
    training = conv_chooser.chooser(device).inputs(layer, "forward", device, training=True)
    assert (training.mode, training.trials) == ("online", "not started")
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    assert conv_chooser.chooser(device).inputs(layer, "forward", device, training=True).trials == "off"
    monkeypatch.setenv("NETCL_DETERMINISTIC", "1")
    assert plan_conv2d_layer(layer, "forward", budget_bytes=4096, device=device).inputs.deterministic


def test_measured_plan_reused_in_process_without_disk_cache(device, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE", "0")
    _with_lowering(monkeypatch)
    measured = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device, mode="measure")
    assert measured.source == "measured"
    again = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device)
    assert again.source == "cache" and again.strategy == measured.strategy


def test_cached_measurements_all_over_a_new_budget_fall_back_to_the_model(device, monkeypatch):
    _with_lowering(monkeypatch)
    layer = ConvLayer.from_shapes((2, 3, 9, 9), (4, 3, 3, 3))
    names = tuple(strategies())
    fitting = [n for n in names if strategies()[n].why_not(layer, "forward") is None
               and strategies()[n].workspace_bytes(layer, "forward") == 0]
    planner.store_plan(device, layer, "forward", names, {"mode": "measure", "measured_ms": {"im2col": 0.5}})
    plan = plan_conv2d_layer(layer, "forward", device=device, budget_bytes=0)
    assert plan.strategy in fitting and plan.source == "model"
    assert "predicted" in plan.reason and "inf ms" not in plan.reason
    assert plan.candidate("im2col").measured_ms is None or not plan.candidate("im2col").within_budget


def test_measure_mode_with_one_candidate_times_nothing(device, monkeypatch):
    monkeypatch.setattr(conv_registry, "_registry", {"direct": strategies()["direct"], "im2col": FakeLowering()})
    monkeypatch.setattr(planner, "time_strategies", lambda *a, **k: pytest.fail("nothing to compare"))
    plan = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device, mode="measure", budget_bytes=0)
    assert plan.strategy == "direct" and plan.source == "model"
    assert not plan.candidate("im2col").within_budget and "budget" in plan.reason


def test_calibration_entry_with_wrong_types_is_tolerated(device):
    from netcl.ops import conv_profile
    conv_profile.update(device, "float32", lambda d: d.update(
        {"bandwidth_gbs": "fast", "launch_ms": -1, "class_gflops": {"large": "x"}, "samples": [1, 2]}))
    conv_chooser.clear_memory_cache()
    plan = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device)
    assert all(c.predicted_ms > 0 for c in plan.candidates if c.applicable)
    assert not plan.calibrated
    conv_profile.update(device, "float32", lambda d: d.update(
        {"samples": {"direct|forward": ["a", [1.0, 0.5, 3.0, "sig"], [None, 1, 2]]}}))
    conv_chooser.clear_memory_cache()
    calibrated = plan_conv2d((2, 3, 9, 9), (4, 3, 3, 3), device=device)
    direct = calibrated.candidate("direct")
    assert direct.calibrated and calibrated.calibrated
    assert direct.predicted_ms == pytest.approx(2.0 * plan.candidate("direct").predicted_ms)  # 3 / (1 + 0.5)
