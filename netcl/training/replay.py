"""A training step recorded once and replayed: the same kernels, without the Python that chose them.

``CapturedStep(model, optimizer, loss_fn)`` is called like the step a PyTorch user writes — zero_grad,
forward, loss, backward, optimizer.step() — and returns the loss. It moves through four states:

- ``Warming``: its first ``warmup`` calls run the step as written (the first builds happen there).
- ``Comparing``: steps are recorded (netcl.runtime.recording) until two consecutive recordings enqueued
  the same commands on the same buffers. ``CapturedStep._may_record`` owns the rule for recording a
  step: gradients on, the model training, and the last step as written ran no layer whose strategies
  the convolution planner was still measuring (netcl.ops.conv_online: a replay calls no conv op, so its
  trials would never end, and a fresh device would keep its uncalibrated model's choices for good).
  Steps the rule refuses run as written.
- ``Replaying``: the batch is copied into the recorded input tensors and the recorded forward, backward
  and optimizer step are enqueued again (hooks such as DistributedDataParallel's allreduce run where they
  ran, each Dropout draws its next seed, SGD reads its group's settings anew, so a learning-rate schedule
  still applies). An optimizer whose host-side state changes every step (Adam's step count:
  ``Optimizer.replay_key()`` is None) runs its ``step()`` as written after each replayed backward pass.
  A batch of another shape (the last, smaller one of an epoch) or a model switched to eval() runs as
  written and the replay serves the next steps; replaced parameters or a changed optimizer end the
  replay, and the step is compared anew.
- ``Disabled``: every step runs as written, because ``enabled=False`` or because ``attempts``
  recordings never agreed (a step that reads a result on the host, a planner still trying strategies).

``status`` says in words what the last step did and why. The model's gradients are those of the last
step whichever way it was taken. On a CPU device the host time a replay saves is core time given back to
the kernels.
"""
from __future__ import annotations

import collections

from .. import autograd
from ..nn import CrossEntropyLoss
from ..ops import conv_online
from ..ops.gemm_packing import release_workspaces
from ..runtime import memory
from ..runtime.recording import Recording, Replay
from ..tensor import Tensor


# ---- the states of a CapturedStep ---------------------------------------------------------------------
class Warming:
    """The first ``warmup`` steps: every step runs as written (the first builds happen there)."""

    name = "warming"


class Comparing:
    """Steps are recorded until two consecutive recordings agree; ``previous`` is the last usable
    recording (None before the first, or after one that could not be replayed). Steps that the rule of
    ``CapturedStep._may_record`` refuses run as written meanwhile."""

    name = "comparing"

    def __init__(self, previous: "_Take | None" = None):
        self.previous = previous


class Replaying:
    """Steps replay ``replay``, whose commands refer to what ``capture`` holds."""

    name = "replaying"

    def __init__(self, replay: Replay, capture: "_Capture"):
        self.replay, self.capture = replay, capture


class Disabled:
    """Every step runs as written, for ``reason``: replay switched off, or given up after the attempts."""

    name = "disabled"

    def __init__(self, reason: str):
        self.reason = reason


class _Capture:
    """What a recording's commands refer to: the gradients they write, the loss, the parameters' buffers
    and the optimizer's replay key (None: its step runs as written after each replay)."""

    def __init__(self, model, loss: Tensor, optimizer_key):
        params = [p for p in model.parameters() if p.requires_grad]
        self.training = model.training
        self.grads = [(p, p.grad) for p in params]
        self.buffers = [(p, p.buffer) for p in params]
        self.loss = loss.detach()
        self.optimizer_key = optimizer_key

    def interchangeable(self, other: "_Capture") -> bool:
        """Whether a replay of one recording does what the other's step did: the same mode, parameters
        stored in the same buffers, the same gradients present and the same optimizer key."""
        return (self.training == other.training and len(self.buffers) == len(other.buffers)
                and all(a is b for (_, a), (_, b) in zip(self.buffers, other.buffers))
                and [g is None for _, g in self.grads] == [g is None for _, g in other.grads]
                and self.optimizer_key == other.optimizer_key)

    def stale(self, optimizer) -> str | None:
        """Why the recording no longer describes the model and optimizer, if it does not."""
        if not all(p.buffer is buffer for p, buffer in self.buffers):
            return "a parameter's storage was replaced"
        if self.optimizer_key is not None and self.optimizer_key != optimizer.replay_key():
            return "the optimizer's kernels or buffers changed"
        return None


class _Take:
    """A usable recording, its signature and its capture: a candidate for replay once the next agrees
    (``recording`` is dropped once it is known that it will not be replayed)."""

    def __init__(self, recording: Recording, capture: _Capture):
        self.recording, self.signature, self.capture = recording, recording.signature(), capture

    def agrees(self, other: "_Take") -> bool:
        return self.signature == other.signature and self.capture.interchangeable(other.capture)


class CapturedStep:
    """``step(x, y)``: one optimizer step on the batch (x, y); returns the loss as a device tensor.

    Args:
        model: the module trained (a DistributedDataParallel wrapper too).
        optimizer: its optimizer: SGD's step is recorded and replayed, any other's runs as written
            after every replayed backward pass.
        loss_fn: ``loss_fn(model(x), y)``, CrossEntropyLoss() when None.
        warmup: steps run as written before the first recording.
        attempts: recordings tried (two make one comparison) before replay is given up.
        enabled: False runs every step as written (for comparisons).

    ``state`` is one of ``Warming``, ``Comparing`` (recording steps until two agree), ``Replaying`` or
    ``Disabled``; ``status`` says in words what the last step did and why.
    """

    def __init__(self, model, optimizer, loss_fn=None, *, warmup: int = 2, attempts: int = 6,
                 enabled: bool = True):
        self.model, self.optimizer = model, optimizer
        self.loss_fn = loss_fn or CrossEntropyLoss()
        self.warmup, self.attempts, self.enabled = int(warmup), int(attempts), bool(enabled)
        self.calls = self.replays = self.recordings = self.eager_steps = 0
        if enabled:
            self.state = Warming()
            self.status = f"running as written for the first {warmup} steps"
        else:
            self.state = Disabled("replay disabled")
            self.status = self.state.reason
        self._inputs: tuple[Tensor, Tensor] | None = None
        self._in_flight: collections.deque = collections.deque()
        self._measured_last_step = False  # whether the last step as written ran a layer still being measured

    @property
    def replaying(self) -> bool:
        return isinstance(self.state, Replaying)

    @property
    def launches(self) -> int:
        """Kernels a replay enqueues (0 before one exists)."""
        return self.state.replay.launches if isinstance(self.state, Replaying) else 0

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        self.calls += 1
        return self._next_way(x, y)(x, y)

    # ---- the transitions ----------------------------------------------------------------------------
    def _next_way(self, x, y):
        """How this step is taken (``_replayed``, ``_recorded`` or ``_eager``), after the transitions that
        the step's arrival makes: a replay the model or optimizer no longer matches is dropped, and the
        warm-up ends once ``warmup`` steps have run."""
        state = self.state
        if isinstance(state, Replaying):
            stale = state.capture.stale(self.optimizer)
            if stale is None:
                if self._replay_fits(x, y):
                    return self._replayed
                self.eager_steps += 1  # a step the recording does not fit; the replay serves the next ones
                return self._eager
            self.state, self.recordings = Comparing(), 0
            self.status = f"recording again: {stale}"
        elif isinstance(state, Warming) and self.calls > self.warmup:
            self.state = Comparing()
        return self._recorded if self._may_record() else self._eager

    def _may_record(self) -> bool:
        """The rule for recording this step: only while comparing recordings, with gradients on, the
        model in training mode, and once the last step as written ran no layer that the convolution
        planner was still measuring (a replay calls no conv op, so its trials would never end, and a
        fresh device would keep its uncalibrated model's choices for good)."""
        if not isinstance(self.state, Comparing) or not autograd.is_grad_enabled() or not self.model.training:
            return False
        if self._measured_last_step:
            self.status = (f"running as written while the convolution planner measures this model's layers "
                           f"(step {self.calls})")
            return False
        return True

    def _compared(self, take: _Take | None, why_unusable: str | None) -> None:
        """The transition after a recording: replay once two consecutive recordings agree, give up after
        ``attempts`` recordings."""
        previous = self.state.previous
        if take is None:
            self.state = Comparing()
            self.status = f"not replayed: the step cannot be recorded: {why_unusable}"
        elif previous is not None and previous.agrees(take):
            self.state = Replaying(Replay(take.recording), take.capture)
            self.status = f"replaying {self.state.replay.launches} launches (recorded at step {self.calls})"
            # What the steps as written left in the device's pool, and the GEMM's packing buffers (a
            # replay packs into its slab), serve no replayed step: hand them back.
            release_workspaces(take.recording.device)
            memory.release_cached(take.recording.device)
            return
        else:
            self.state = Comparing(take)
            if previous is not None:
                self.status = "not replayed yet: two consecutive steps enqueued different commands"
        if self.recordings >= self.attempts:
            self.status += f"; gave up after {self.recordings} recordings, every step runs as written"
            self.state = Disabled(self.status)

    # ---- the three ways of taking a step --------------------------------------------------------------
    def _eager(self, x, y) -> Tensor:
        calls_measuring = self._conv_calls_measuring(x.device)
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        # Only this step's layers count: a trial of another batch size (an epoch's last batch, an
        # evaluation) advances in its own steps and must not hold up the replay of these.
        self._measured_last_step = self._conv_calls_measuring(x.device) != calls_measuring
        return loss.detach()

    @staticmethod
    def _conv_calls_measuring(device) -> int:
        """The convolution planner's count of calls on ``device`` that went to layers still being measured."""
        return conv_online.calls_measuring(device)

    def _recorded(self, x, y) -> Tensor:
        self._load_inputs(x, y)
        static_x, static_y = self._inputs
        self.optimizer.zero_grad()
        optimizer_key = self.optimizer.replay_key()  # None: its step runs as written after each replay
        # A recorded step allocates from a fresh arena of its own: it reuses the buffers of its dead
        # tensors as a step run as written does, so its replay needs the step's live set of buffers, not
        # every buffer it touched; and starting empty, it reuses them in the same pattern at every
        # recording of the same step, so two recordings' signatures can agree.
        arena = memory.Arena(x.device)
        # What the steps as written left in the device's pool serves none of the recorded step's
        # allocations: handed back first, the arena's buffers take its place instead of coming on top.
        memory.release_cached(x.device)
        with Recording(x.device, arena=arena) as recording:
            loss = self.loss_fn(self.model(static_x), static_y)
            loss.backward()
            capture = _Capture(self.model, loss, optimizer_key)
            if optimizer_key is not None:
                self.optimizer.step()
        recording_unusable = recording.unusable
        if optimizer_key is None:
            self.optimizer.step()
        self.recordings += 1
        take = _Take(recording, capture) if recording.unusable is None else None
        del recording
        self._compared(take, recording_unusable)
        # Only the newest recording is ever replayed, once the next one agrees with it, and the replay
        # made from it has its own plan for the step's dead tensors: the recording's commands are not
        # needed beyond its signature, nor the arena's buffers that held those tensors.
        if take is not None:
            take.recording = None
        arena.release()
        return _copy(loss)  # its own storage: replays overwrite the recorded loss

    def _replayed(self, x, y) -> Tensor:
        capture = self.state.capture
        self._load_inputs(x, y)
        for p, grad in capture.grads:
            p.grad = grad
        while len(self._in_flight) > 1:  # at most two steps queued: the host need not run further ahead
            self._in_flight.popleft().wait()
        event = self.state.replay.replay()  # the backward pass's callbacks run where the pass ended
        if event is not None:
            self._in_flight.append(event)
        if capture.optimizer_key is None:
            self.optimizer.step()
        self.replays += 1
        return _copy(capture.loss)

    # ---- what a replay relies on -----------------------------------------------------------------------
    def _load_inputs(self, x, y) -> None:
        """Copy the batch into the tensors the recording reads (made at the first recording)."""
        if self._inputs is None or not _same_layout(self._inputs[0], x) or not _same_layout(self._inputs[1], y):
            self._inputs = (Tensor.empty(x.shape, x.dtype, x.device), Tensor.empty(y.shape, y.dtype, y.device))
        for static, batch in zip(self._inputs, (x, y)):
            batch = batch.contiguous()
            memory.copy(static.device, static.buffer, batch.buffer, static.nbytes, static.offset * static.dtype.itemsize,
                        batch.offset * batch.dtype.itemsize)

    def _replay_fits(self, x, y) -> bool:
        """Whether the replay computes this step: a batch of the recorded layout, in training, with
        gradients on."""
        static_x, static_y = self._inputs
        return (_same_layout(static_x, x) and _same_layout(static_y, y) and self.model.training
                and autograd.is_grad_enabled())


def _copy(loss: Tensor) -> Tensor:
    """A detached copy in storage of its own (the driver's buffer copy: cheaper than a kernel)."""
    out = Tensor.empty(loss.shape, loss.dtype, loss.device)
    memory.copy(out.device, out.buffer, loss.buffer, out.nbytes, 0, loss.offset * loss.dtype.itemsize)
    return out


def _same_layout(static: Tensor, batch) -> bool:
    return (isinstance(batch, Tensor) and batch.shape == static.shape and batch.dtype == static.dtype
            and batch.device is static.device)


__all__ = ["CapturedStep", "Comparing", "Disabled", "Replaying", "Warming"]
