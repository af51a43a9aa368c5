"""Recorded and replayed training steps (netcl.runtime.recording, netcl.training.CapturedStep): a replay
must compute, bit for bit, what the step as written computes, and must refuse what it cannot repeat."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import netcl as nc
from netcl.autograd import function as autograd_engine
from netcl.runtime import memory
from netcl.runtime.recording import Recording, Replay, host_call, refresh_call


@pytest.fixture(autouse=True)
def one_strategy(monkeypatch):
    # The planner's online trials pick per process by timing; two runs compared bit for bit must not
    # depend on which strategy a timing favoured.
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "im2col")


def batches(seed: int, sizes, image=(1, 28, 28)):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n,) + image).astype(np.float32), rng.integers(0, 10, n).astype(np.int64))
            for n in sizes]


def run(make_model, make_optimizer, data, replay: bool, loss_fn=None, schedule=None, seed=None):
    """Train with CapturedStep; the losses, the parameters and the step object."""
    if seed is not None:
        nc.manual_seed(seed)
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    scheduler = schedule(optimizer) if schedule else None
    step = nc.training.CapturedStep(model, optimizer, loss_fn, enabled=replay)
    losses = []
    for x, y in data:
        losses.append(step(nc.tensor(x), nc.tensor(y)))
        if scheduler is not None:
            scheduler.step()
    return ([loss.item() for loss in losses],
            OrderedDict((k, v.to_host()) for k, v in model.state_dict().items()), step)


def assert_same(written, replayed):
    assert written[0] == replayed[0], "losses differ"
    for name, value in written[1].items():
        np.testing.assert_array_equal(replayed[1][name], value, err_msg=name)


def test_replayed_lenet_steps_equal_the_steps_as_written():
    """Dropout's own stream, momentum, a per-step learning-rate schedule and a smaller batch in the middle."""
    data = batches(1, [8] * 6 + [5] + [8] * 4)
    args = (lambda: nc.models.lenet(seed=3), lambda p: nc.optim.SGD(p, lr=0.05, momentum=0.9), data)
    schedule = lambda opt: nc.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # noqa: E731
    written = run(*args, replay=False, schedule=schedule)
    replayed = run(*args, replay=True, schedule=schedule)
    step = replayed[2]
    assert step.status.startswith("replaying") and step.launches > 10, step.status
    assert step.replays == 6 and step.eager_steps == 1  # 2 warm-up and 2 recorded steps; the 5-image batch
    assert_same(written, replayed)


class FreshDropoutNet(nc.nn.Module):
    """Dropout drawing from the global seed stream (seed=None), so each replay must draw anew."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nc.nn.Linear(13, 31), nc.nn.Linear(31, 10)

    def forward(self, x):
        return self.fc2(nc.nn.functional.dropout(self.fc1(x.flatten(1)).relu(), 0.3, True))


def test_adam_and_dropout_from_the_global_stream_replay_exactly():
    data = batches(2, [7] * 9, image=(13,))
    args = (FreshDropoutNet, lambda p: nc.optim.Adam(p, lr=1e-2), data)
    written = run(*args, replay=False, seed=11)
    replayed = run(*args, replay=True, seed=11)
    assert replayed[2].replays == 5, replayed[2].status
    assert_same(written, replayed)


def test_a_step_reading_results_on_the_host_is_never_replayed():
    def loss_with_a_look(out, y):
        loss = nc.nn.functional.cross_entropy(out, y)
        if loss.item() > 1e9:  # a decision on the host: a replay could not take it again
            raise AssertionError("unreachable")
        return loss

    data = batches(3, [7] * 9, image=(13,))
    args = (FreshDropoutNet, lambda p: nc.optim.SGD(p, lr=0.1), data)
    written = run(*args, replay=False, seed=5, loss_fn=loss_with_a_look)
    replayed = run(*args, replay=True, seed=5, loss_fn=loss_with_a_look)
    assert replayed[2].replays == 0
    assert "reads" in replayed[2].status and "gave up" in replayed[2].status, replayed[2].status
    assert_same(written, replayed)


def test_steps_that_enqueue_different_commands_are_not_replayed():
    calls = []

    def drifting_loss(out, y):  # a fixed seed that changes with every call: no two steps alike
        calls.append(1)
        noise = nc.rand(*out.shape, seed=len(calls))
        return nc.nn.functional.cross_entropy(out + noise * 0.01, y)

    model = FreshDropoutNet()
    step = nc.training.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.1), drifting_loss, attempts=3)
    for x, y in batches(4, [7] * 8, image=(13,)):
        step(nc.tensor(x), nc.tensor(y))
    assert step.replays == 0 and step.recordings == 3
    assert "different commands" in step.status and "gave up after 3" in step.status, step.status


def test_hooks_and_their_backward_callbacks_run_at_every_replay():
    model = FreshDropoutNet()
    seen = []

    def hook(param):
        seen.append("hook")
        autograd_engine.queue_backward_callback(lambda: seen.append("callback"))

    autograd_engine.register_post_accumulate_grad_hook(model.fc1.weight, hook)
    step = nc.training.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.1))
    for x, y in batches(5, [7] * 7, image=(13,)):
        step(nc.tensor(x), nc.tensor(y))
    assert step.replays == 3
    assert seen == ["hook", "callback"] * 7


def test_eval_mode_and_replaced_parameters_run_as_written():
    model = FreshDropoutNet()
    step = nc.training.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.1))
    data = batches(6, [7] * 8, image=(13,))
    for x, y in data[:5]:
        step(nc.tensor(x), nc.tensor(y))
    assert step.replays == 1
    model.eval()
    step(nc.tensor(data[5][0]), nc.tensor(data[5][1]))
    assert step.eager_steps == 1 and step.replaying  # the recording still serves training steps
    model.train()
    weight = model.fc1.weight
    weight.buffer = nc.tensor(weight.to_host()).buffer
    step(nc.tensor(data[6][0]), nc.tensor(data[6][1]))
    assert not step.replaying and "storage was replaced" in step.status


def test_recordings_compare_by_what_they_do_and_replay_on_new_data(device):
    a, b = nc.tensor(np.arange(13, dtype=np.float32)), nc.tensor(np.full(13, 2.0, np.float32))
    signatures, results = [], []
    for _ in range(2):
        with Recording(device) as recording:
            out = (a * b + 1.0).exp()
        signatures.append(recording.signature())
        results.append(out)
    assert signatures[0] == signatures[1] and recording.launches >= 1
    replay = Replay(recording)
    memory.upload(device, a.buffer, np.linspace(-1, 1, 13, dtype=np.float32))  # new data, same buffer
    replay.replay()
    want = np.exp(np.linspace(-1, 1, 13, dtype=np.float64) * 2.0 + 1.0)
    np.testing.assert_allclose(results[1].to_host(), want, rtol=1e-6)

    with Recording(device) as other:
        (a * 3.0).exp()
    assert other.signature() != signatures[0]  # another scalar
    with Recording(device) as reading:
        (a * b).sum().item()
    assert "reads" in reading.unusable
    with pytest.raises(ValueError, match="cannot be replayed"):
        Replay(reading)


def test_host_calls_compare_lists_by_their_items(device):
    a = nc.tensor(np.ones(7, np.float32))
    calls = []
    signatures = []
    for _ in range(2):
        with Recording(device) as recording:
            host_call(device, lambda tensors, scale=None: calls.append(len(tensors)), [a], scale=1.0)
            (a * 2.0).exp()
        signatures.append(recording.signature())
    assert calls == [1, 1]
    assert signatures[0][1:] == signatures[1][1:] and signatures[0][0][3] == signatures[1][0][3]
    Replay(recording).replay()
    assert calls == [1, 1, 1]


def test_a_replay_asked_to_leaves_out_refresh_calls_and_no_other_host_work(device):
    a = nc.tensor(np.ones(5, np.float32))
    calls = []
    with Recording(device) as recording:
        host_call(device, calls.append, "host")
        refresh_call(device, calls.append, "refresh")
        (a * 3.0).exp()
    assert calls == ["host", "refresh"]
    replay = Replay(recording)
    assert replay.refresh_count == 1
    replay.replay()
    assert calls[2:] == ["host", "refresh"]
    replay.replay(refresh=False)
    assert calls[4:] == ["host"]
    assert refresh_call(device, lambda value: value * 2, 21) == 42  # outside a recording: just the call


def test_launches_with_untyped_python_numbers_are_not_replayable(device):
    from netcl.runtime.kernels import get_kernel, launch

    t = nc.tensor(np.zeros(13, np.float64)) if device.has_fp64 else nc.tensor(np.zeros(13, np.float32))
    kernel = get_kernel(device, "random.cl", "fill_random", T="double" if device.has_fp64 else "float",
                        DIST="uniform")
    with Recording(device) as typed:
        launch(device, kernel, (13,), None, t.buffer, np.int64(0), np.uint64(5), np.int64(13), t.dtype.type(0.5))
    assert typed.unusable is None  # NumPy scalars, np.float64 (a Python float subclass) included
    with Recording(device) as untyped:
        untyped.kernel(device, kernel, (13,), None, (t.buffer, 0, np.uint64(5), np.int64(13), t.dtype.type(0)))
    assert "Python number" in untyped.unusable


def test_sgd_steps_are_recorded_and_read_their_settings_at_every_replay():
    """OneCycleLR changes lr and momentum every step; switching momentum off changes SGD's kernel, and
    the step is recorded again."""
    data = batches(7, [7] * 12, image=(13,))

    def schedule(opt):
        return nc.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12)

    def switching(replay):
        nc.manual_seed(2)
        model = FreshDropoutNet()
        opt = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = nc.training.CapturedStep(model, opt, enabled=replay)
        for k, (x, y) in enumerate(data):
            if k == 7:
                opt.param_groups[0]["momentum"] = 0.0
            step(nc.tensor(x), nc.tensor(y))
        return [p.to_host() for p in model.parameters()], step

    args = (FreshDropoutNet, lambda p: nc.optim.SGD(p, lr=0.05, momentum=0.9), data)
    written = run(*args, replay=False, seed=2, schedule=schedule)
    replayed = run(*args, replay=True, seed=2, schedule=schedule)
    assert replayed[2].replays == 8 and replayed[2].optimizer.replay_key() is not None
    assert_same(written, replayed)
    (want, _), (got, step) = switching(False), switching(True)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)
    assert step.replays >= 5, step.status


def test_no_recording_while_the_conv_planner_measures(monkeypatch):
    """A replay calls no conv op, so the planner's trials would never end and a fresh device would keep
    its uncalibrated choices: CapturedStep runs steps as written while they run layers being measured,
    and only those: a trial of another batch size (an epoch's last batch) does not hold the replay up."""
    from netcl.ops import conv_online
    state = {"calls": 0, "measured_steps": 5}
    monkeypatch.setattr(conv_online, "calls_measuring", lambda device: state["calls"])
    monkeypatch.setattr(conv_online, "measuring", lambda device: 1)  # a trial of other layers stays open
    model = nc.models.lenet(seed=1)
    forward = model.forward

    def measured_forward(x):  # the first steps' convolutions go to layers under measurement
        if state["measured_steps"] > 0:
            state["calls"] += 2
        return forward(x)
    monkeypatch.setattr(model, "forward", measured_forward)
    step = nc.training.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.05), warmup=2)
    statuses = []
    for x, y in batches(5, [6] * 10):
        step(nc.tensor(x), nc.tensor(y))
        statuses.append(step.status)
        state["measured_steps"] -= 1
    # steps 1-5 measured; 3-6 ran as written (each after a measured step); 7 and 8 recorded; 9, 10 replayed
    assert all("convolution planner measures" in s for s in statuses[2:6]), statuses
    assert step.recordings == 2 and step.replays == 2, (step.recordings, step.replays, statuses)
    assert statuses[-1].startswith("replaying") and "recorded at step 8" in statuses[-1], statuses[-1]


def test_a_replayed_step_raises_a_bad_class_index_before_updating():
    """The loss kernel's record of an out-of-range label is read back at every replay without making
    the recording unusable, and raised before the replayed optimizer step updates anything."""
    nc.manual_seed(5)
    model = nc.nn.Sequential(nc.nn.Flatten(), nc.nn.Linear(13, 10))
    step = nc.training.CapturedStep(model, nc.optim.SGD(model.parameters(), lr=0.1))
    for x, y in batches(7, [9] * 5, image=(13,)):
        step(nc.tensor(x), nc.tensor(y))
    assert step.replaying, step.status
    before = {k: v.to_host() for k, v in model.state_dict().items()}
    (x, y), = batches(8, [9], image=(13,))
    for bad in (10, -3):
        y[6] = bad
        with pytest.raises(nc.ClassIndexError, match=f"class index {bad} at position 6 is out of range for 10"):
            step(nc.tensor(x), nc.tensor(y))
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v.to_host(), before[k], err_msg=k)
    y[6] = 1
    replays = step.replays
    loss = step(nc.tensor(x), nc.tensor(y)).item()  # the replay goes on with valid labels
    assert step.replays == replays + 1 and np.isfinite(loss)
