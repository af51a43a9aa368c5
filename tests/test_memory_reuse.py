"""Memory of a training step: the autograd graph frees what it saved once backward has used it and
forms no reference cycles, and a recorded step reuses the buffers of its dead tensors, so its replay
keeps the step's live set of buffers and still computes, bit for bit, what the step as written does."""
from __future__ import annotations

import gc
from collections import OrderedDict

import numpy as np
import pytest

import netcl as nc
from netcl.runtime import memory
from netcl.runtime.recording import Recording, Replay
from netcl.tensor import Tensor


@pytest.fixture(autouse=True)
def one_strategy(monkeypatch):
    # Two runs compared bit for bit must not depend on which strategy a trial's timing favoured.
    monkeypatch.setenv("NETCL_CONV_STRATEGY", "im2col")


class Chain(nc.nn.Module):
    """Convolutions, batch norms, ReLUs, a max-pool and a residual add: what a ResNet saves for backward."""

    def __init__(self, width: int = 6, depth: int = 4):
        super().__init__()
        self.stem = nc.nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.convs = nc.nn.ModuleList([nc.nn.Conv2d(width, width, 3, padding=1, bias=False) for _ in range(depth)])
        self.norms = nc.nn.ModuleList([nc.nn.BatchNorm2d(width) for _ in range(depth)])
        self.pool = nc.nn.MaxPool2d(3, 2, 1)
        self.fc = nc.nn.Linear(width, 10)

    def forward(self, x):
        x = self.pool(self.stem(x).relu())
        for conv, norm in zip(self.convs, self.norms):
            x = (norm(conv(x)) + x).relu()
        return self.fc(x.mean(axis=(2, 3)))


def _batches(seed: int, count: int, batch: int = 5, size: int = 13):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, size, size)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int64)) for _ in range(count)]


def _train(data, replay: bool):
    nc.manual_seed(0)
    model = Chain()
    optimizer = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = nc.training.CapturedStep(model, optimizer, enabled=replay)
    losses = [step(nc.tensor(x), nc.tensor(y)).item() for x, y in data]
    return losses, OrderedDict((k, v.to_host()) for k, v in model.state_dict().items()), step


def test_replayed_steps_reusing_buffers_equal_the_steps_as_written():
    data = _batches(1, 8)
    written_losses, written_state, _ = _train(data, replay=False)
    losses, state, step = _train(data, replay=True)
    assert step.replays == 4, step.status
    assert step.state.replay.planned_bytes > 0  # the dead tensors were moved into the planned slab
    assert losses == written_losses
    for name, value in written_state.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)


def test_a_recorded_step_keeps_its_live_set_not_every_buffer_it_used(device):
    model = Chain(width=8, depth=6)
    optimizer = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = (nc.tensor(a) for a in _batches(2, 1, batch=4, size=24)[0])

    def recorded(arena):
        optimizer.zero_grad()
        with Recording(device, arena=arena) as recording:
            nc.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return recording

    recorded(None)  # momentum buffers and builds exist before the recordings compared
    plain = _buffer_sizes(recorded(None))
    arena = memory.Arena(device)
    recording = recorded(arena)
    reused = _buffer_sizes(recording)
    # What the step allocated itself, leaving out what both recordings only use (parameters, momentum,
    # the batch, workspaces cached on the device by earlier work):
    outside = {h for h in reused if h not in arena.handles}
    every_buffer = sum(size for h, size in plain.items() if h not in outside)
    live_set = sum(size for h, size in reused.items() if h in arena.handles)
    assert arena.stats()["held_bytes"] > 0  # dead tensors went back to the arena ...
    assert live_set < 0.6 * every_buffer, (live_set, every_buffer)  # ... and served later ones
    planned = Replay(recording).planned_bytes
    assert 0 < planned < live_set, (planned, live_set)  # the plan needs less than the pool's size classes


def test_a_recorded_step_hands_back_what_the_steps_as_written_left_in_the_pool_first(device):
    # The recorded step allocates from its arena: the pool's leftovers would only add to its memory.
    model = Chain()
    optimizer = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    held_at_loss = []

    def loss_fn(out, y):
        held_at_loss.append(memory.pool_stats(device)["held_bytes"])
        return nc.nn.functional.cross_entropy(out, y)
    step = nc.training.CapturedStep(model, optimizer, loss_fn, warmup=2)
    x, y = (nc.tensor(a) for a in _batches(4, 1)[0])
    for _ in range(4):
        step(x, y)
    assert step.replaying, step.status
    assert step.recordings == 2 and len(held_at_loss) == 4
    assert held_at_loss[1] > 0  # the second step as written found the first one's buffers held ...
    # ... the recorded ones an emptied pool (but for the few tensors from before that the step lets go)
    assert max(held_at_loss[2:]) < held_at_loss[1] / 10, held_at_loss


def test_a_tensor_written_in_place_and_dead_by_the_end_of_the_step_is_planned(device, rng):
    from netcl.ops.gemm import gemm
    a = nc.tensor(rng.standard_normal((37, 29)).astype(np.float32), device=device)
    b = nc.tensor(rng.standard_normal((29, 31)).astype(np.float32), device=device)
    bias = nc.tensor(rng.standard_normal((37, 31)).astype(np.float32), device=device)
    gemm(a, b)  # builds first: the recording sees only the step's own allocations
    arena = memory.Arena(device)
    with Recording(device, arena=arena) as recording:
        product = bias * 1.0  # allocated in the arena ...
        gemm(a, b, c=product, beta=1.0)  # ... written in place (a Written command) ...
        out = product * 2.0
        written = product.buffer.int_ptr
        del product  # ... and dead before the step ends
    assert any(command.written_buffers for command in recording.commands if type(command).__name__ == "Written")
    assert arena.live_allocations() == {arena.allocation_of(out.buffer)}
    replay = Replay(recording)
    assert replay.planned_bytes >= 37 * 31 * 4
    kept = {buffer.int_ptr for command in replay._commands for buffer in command.buffers()}
    assert written not in kept  # the in-place write keeps no buffer of its own alive
    assert all(not getattr(command, "written_buffers", ()) for command in replay._commands)
    expected = 2.0 * (bias.to_host().astype(np.float64) + a.to_host().astype(np.float64) @ b.to_host())
    out_values = out.to_host()
    np.testing.assert_allclose(out_values, expected, rtol=1e-4, atol=1e-4)
    replay.replay()
    np.testing.assert_array_equal(out.to_host(), out_values)


def test_a_recorded_step_packs_its_products_into_buffers_its_plan_shares(device, rng):
    # Two products that pack their operands (B read across its rows; A too in the second): eagerly they
    # share the device's packing buffers, in a recording each packs into a short-lived allocation of the
    # step, which the plan overlaps with the other; the replay computes the same bits.
    from netcl.ops.gemm import gemm, packing_bytes, release_workspaces
    from netcl.ops.gemm_packing import WORKSPACES

    def operand(*shape):
        return nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
    a1, b1 = operand(37, 29), operand(31, 29)
    a2, b2 = operand(150, 130), operand(200, 150)
    assert packing_bytes(device, np.float32, 37, 31, 29, 1, 1, 1, 1, 29)[1] > 0
    packed = sum(packing_bytes(device, np.float32, 130, 200, 150, 1, 1, 130, 1, 150))

    def step():
        return gemm(a1, b1, trans_b=True) * 1.0, gemm(a2, b2, trans_a=True, trans_b=True) * 1.0
    eager = [t.to_host() for t in step()]
    release_workspaces(device)
    arena = memory.Arena(device)
    with Recording(device, arena=arena) as recording:
        outputs = step()
    assert WORKSPACES not in device.state._tables  # the recorded products took no device-wide buffer
    replay = Replay(recording)
    assert replay.planned_bytes >= packed
    for out in outputs:
        memory.fill(device, out.buffer, np.float32(np.nan), out.nbytes)
    replay.replay()
    for out, expected in zip(outputs, eager):
        np.testing.assert_array_equal(out.to_host(), expected)


def _buffer_sizes(recording) -> dict:
    return {b.int_ptr: b.size for command in recording.commands for b in command.buffers()}


def test_backward_frees_what_the_graph_saved(device, rng):
    gc.collect()
    leaf = nc.tensor(rng.standard_normal((257, 129)).astype(np.float32), device=device).requires_grad_()
    before = memory.pool_stats(device)["active_bytes"]
    h = leaf
    for _ in range(6):
        h = (h * 1.5).relu() + 0.25
    loss = h.sum()
    del h
    saved = memory.pool_stats(device)["active_bytes"] - before
    assert saved >= 6 * leaf.nbytes  # what backward needs is alive until it runs
    loss.backward()
    left = memory.pool_stats(device)["active_bytes"] - before
    assert left <= leaf.nbytes + 4096, (left, saved)  # the gradient, and the loss: not the saved tensors


def test_a_second_backward_needs_retain_graph(device, rng):
    leaf = nc.tensor(rng.standard_normal((7, 5)).astype(np.float32), device=device).requires_grad_()
    loss = (leaf * leaf).relu().sum()
    loss.backward(retain_graph=True)
    first = leaf.grad.to_host()
    loss.backward()
    np.testing.assert_allclose(leaf.grad.to_host(), 2 * first, rtol=1e-6)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


def test_a_training_step_leaves_no_reference_cycles():
    model = Chain()
    optimizer = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = (nc.tensor(a) for a in _batches(3, 1)[0])
    for _ in range(2):  # builds and plans first: their caches are not the step's
        optimizer.zero_grad()
        nc.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        optimizer.zero_grad()
        nc.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        gc.collect()
        cyclic_tensors = [o for o in gc.garbage if isinstance(o, Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic_tensors == []  # freed by reference counting, where their last use ends


def test_the_plan_never_shares_bytes_between_allocations_in_use_together(rng):
    from netcl.runtime.recording import _place
    count, alignment = 60, 256
    sizes = [int(s) for s in rng.integers(1, 5000, count)]
    spans = {}
    for allocation in range(count):
        first = int(rng.integers(0, 200))
        spans[allocation] = [first, first + int(rng.integers(0, 40))]
    offsets, total = _place(spans, sizes, alignment)
    for a in spans:
        assert offsets[a] % alignment == 0 and offsets[a] + sizes[a] <= total
        for b in spans:
            in_use_together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            if a < b and in_use_together:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)
    # never more than every allocation side by side, and less where lifetimes are disjoint
    assert total <= sum(-(-s // alignment) * alignment for s in sizes)
    chain = {a: [a, a + 1] for a in range(count)}  # each allocation overlaps only its neighbours
    assert _place(chain, sizes, alignment)[1] <= 3 * max(-(-s // alignment) * alignment for s in sizes)
