"""CapturedStep's states (netcl.training.replay): Warming, Comparing, Replaying, Disabled, and the step
events that move it between them. What each step computes is tests/test_replay.py's subject."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.training import replay as captured


@pytest.fixture(autouse=True)
def one_strategy(monkeypatch):
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "im2col")


@pytest.fixture
def data(rng):
    """Batches of 7 samples of 11 features, 4 classes."""
    def batch(n=7):
        return (nc.tensor(rng.standard_normal((n, 11)).astype(np.float32)),
                nc.tensor(rng.integers(0, 4, n).astype(np.int64)))
    return batch


def small_step(**kwargs):
    model = nc.nn.Sequential(nc.nn.Linear(11, 5), nc.nn.ReLU(), nc.nn.Linear(5, 4))
    return captured.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), **kwargs)


def states(step, batches):
    """The state's name after each of the batches."""
    names = []
    for x, y in batches:
        step(x, y)
        names.append(step.state.name)
    return names


def test_warming_then_comparing_then_replaying(data):
    step = small_step(warmup=2)
    assert isinstance(step.state, captured.Warming)
    assert states(step, [data() for _ in range(2)]) == ["warming", "warming"]
    assert step.recordings == 0 and step.replays == 0
    step(*data())  # the third step is recorded: one recording, nothing to compare it with yet
    assert isinstance(step.state, captured.Comparing) and step.state.previous is not None
    assert step.recordings == 1
    step(*data())  # the fourth agrees with the third
    assert isinstance(step.state, captured.Replaying) and step.replaying and step.launches > 3
    assert step.status == f"replaying {step.launches} launches (recorded at step 4)"
    step(*data())
    assert step.replays == 1 and step.recordings == 2 and step.eager_steps == 0


def test_disabled_from_the_start_stays_disabled(data):
    step = small_step(enabled=False, warmup=0)
    assert isinstance(step.state, captured.Disabled) and step.state.reason == "replay disabled"
    assert states(step, [data() for _ in range(4)]) == ["disabled"] * 4
    assert step.recordings == 0 and step.replays == 0 and step.status == "replay disabled"


def test_recordings_that_never_agree_end_disabled(data):
    step = small_step(warmup=0, attempts=3)
    drift = iter(range(1, 100))
    step.loss_fn = lambda out, y: nc.nn.functional.cross_entropy(out + nc.rand(*out.shape, seed=next(drift)), y)
    assert states(step, [data() for _ in range(5)]) == ["comparing", "comparing", "disabled", "disabled",
                                                         "disabled"]
    assert step.recordings == 3 and "gave up after 3 recordings" in step.state.reason
    assert step.status == step.state.reason


def test_an_unusable_recording_is_forgotten(data):
    step = small_step(warmup=0, attempts=4)
    looked = []

    def loss_with_a_look(out, y):
        loss = nc.nn.functional.cross_entropy(out, y)
        if len(looked) < 1:
            looked.append(loss.item())  # the host reads a result: that recording cannot be replayed
        return loss

    step.loss_fn = loss_with_a_look
    step(*data())
    assert isinstance(step.state, captured.Comparing) and step.state.previous is None
    assert step.status.startswith("not replayed: the step cannot be recorded")
    assert states(step, [data(), data(), data()]) == ["comparing", "replaying", "replaying"]


def test_the_rule_keeps_eval_steps_out_of_a_comparison(data):
    step = small_step(warmup=1)  # SGD's momentum buffers are made at the first step
    step(*data())
    step(*data())
    previous = step.state.previous
    step.model.eval()
    step(*data())
    step.model.train()
    assert step.state.previous is previous and step.recordings == 1  # it ran as written
    step(*data())
    assert isinstance(step.state, captured.Replaying)


def test_steps_after_a_measured_step_run_as_written(data, monkeypatch):
    """The rule's planner input: a step as written that ran a layer under measurement keeps the next one
    from being recorded."""
    measured = {"calls": 0, "steps": 3}
    monkeypatch.setattr(captured.CapturedStep, "_conv_calls_measuring", staticmethod(lambda device: measured["calls"]))
    step = small_step(warmup=1)
    forward = step.model.forward

    def measuring_forward(x):
        if measured["steps"] > 0:
            measured["calls"] += 1
            measured["steps"] -= 1
        return forward(x)
    step.model.forward = measuring_forward
    names, statuses = [], []
    for _ in range(7):
        names += states(step, [data()])
        statuses.append(step.status)
    # steps 1-3 are measured: 1 warms up, 2-4 run as written (each after a measured step), 5 and 6 are
    # recorded, 7 replays
    assert names == ["warming"] + ["comparing"] * 4 + ["replaying"] * 2, names
    assert all("convolution planner measures" in s for s in statuses[1:4]), statuses
    assert step.recordings == 2 and step.replays == 1


def test_a_replay_serves_fitting_steps_and_is_dropped_when_stale(data):
    step = small_step(warmup=1)
    for _ in range(4):
        step(*data())
    assert step.replaying and step.replays == 1
    step(*data(5))  # another batch size: as written, the replay stays for the next steps
    assert step.replaying and step.eager_steps == 1
    step.model.eval()
    step(*data())
    step.model.train()
    assert step.replaying and step.eager_steps == 2
    weight = step.model[0].weight
    weight.buffer = nc.tensor(weight.to_host()).buffer  # the recording's buffer is no longer the weight's
    step(*data())  # dropped, and this very step is recorded again
    assert isinstance(step.state, captured.Comparing) and step.recordings == 1
    assert "storage was replaced" in step.status
    step(*data())
    assert step.replaying
    step.optimizer.param_groups[0]["momentum"] = 0.0  # another SGD kernel: the recorded step is stale
    step(*data())
    assert isinstance(step.state, captured.Comparing) and "optimizer's kernels or buffers changed" in step.status
