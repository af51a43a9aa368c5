"""A training step recorded once and replayed: the same kernels, without the Python that chose them.

``CapturedStep(model, optimizer, loss_fn)`` is called like the step a PyTorch user writes — zero_grad,
forward, loss, backward, optimizer.step() — and returns the loss. Its first ``warmup`` calls run that
step as written (the first builds happen there), and so does every step after one that ran a layer
whose strategies the convolution planner was still measuring (netcl.ops.conv_online: a replay calls no
conv op, so its trials would never end, and a fresh device would keep its uncalibrated model's choices
for good: LeNet ran 2,300-2,400 images/s on one PoCL thread instead of 3,100). Then it records two steps
(netcl.runtime.recording) and, when both enqueued the same commands on the same buffers, replays the
second from then on: the batch is copied into the recorded input tensors and the recorded forward,
backward and optimizer step are enqueued again (hooks such as DistributedDataParallel's allreduce run
where they ran, each Dropout draws its next seed, SGD reads its group's settings anew, so a learning-rate
schedule still applies). An optimizer whose host-side state changes every step (Adam's step count:
``Optimizer.replay_key()`` is None) runs its ``step()`` as written after each replayed backward pass. The step's host CPU falls from ~2 ms to a few tenths
of a millisecond for LeNet on PoCL; on a CPU device that is core time given back to the kernels.

It replays only what it verified: when the two recordings differ (a step that reads a result on the
host, a planner still trying strategies) it records again later, and after ``attempts`` failures runs
every step as written, with ``status`` saying why. A batch of another shape (the last, smaller one of an
epoch), a model switched to eval() or parameters replaced run as written, and the model's gradients are
those of the last step either way.
"""
from __future__ import annotations

import collections

from .. import autograd
from ..nn import CrossEntropyLoss
from ..ops import conv_online
from ..runtime import memory
from ..runtime.recording import Recording, Replay
from ..tensor import Tensor


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
    """

    def __init__(self, model, optimizer, loss_fn=None, *, warmup: int = 2, attempts: int = 6,
                 enabled: bool = True):
        self.model, self.optimizer = model, optimizer
        self.loss_fn = loss_fn or CrossEntropyLoss()
        self.warmup, self.attempts, self.enabled = int(warmup), int(attempts), bool(enabled)
        self.calls = self.replays = self.recordings = self.eager_steps = 0
        self.status = "replay disabled" if not enabled else f"running as written for the first {warmup} steps"
        self._replay: Replay | None = None
        self._previous: tuple | None = None  # the last recording and its signature
        self._inputs: tuple[Tensor, Tensor] | None = None
        self._captured: dict = {}
        self._in_flight: collections.deque = collections.deque()
        self._measured_last_step = False  # whether the last step as written ran a layer still being measured

    @property
    def replaying(self) -> bool:
        return self._replay is not None

    @property
    def launches(self) -> int:
        """Kernels a replay enqueues (0 before one exists)."""
        return self._replay.launches if self._replay is not None else 0

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        self.calls += 1
        if self._replay is not None:
            why_not = self._why_not_replay(x, y)
            if why_not is None:
                return self._replayed(x, y)
            if not self._parameters_kept():
                self._forget("recording again: a parameter's storage was replaced")
            elif not self._optimizer_kept():
                self._forget("recording again: the optimizer's kernels or buffers changed")
            else:  # a step the recording does not fit; the replay serves the next ones
                self.eager_steps += 1
                return self._eager(x, y)
        if (not self.enabled or self.calls <= self.warmup or self.recordings >= self.attempts
                or not autograd.is_grad_enabled() or not self.model.training):
            return self._eager(x, y)
        if self._measured_last_step:  # a replay calls no conv op: the planner's trials would never end
            self.status = (f"running as written while the convolution planner measures this model's layers "
                           f"(step {self.calls})")
            return self._eager(x, y)
        return self._recorded(x, y)

    # ---- the three ways of taking a step --------------------------------------------------------------
    def _eager(self, x, y) -> Tensor:
        calls_measuring = conv_online.calls_measuring(x.device)
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        # Only this step's layers count: a trial of another batch size (an epoch's last batch, an
        # evaluation) advances in its own steps and must not hold up the replay of these.
        self._measured_last_step = conv_online.calls_measuring(x.device) != calls_measuring
        return loss.detach()

    def _recorded(self, x, y) -> Tensor:
        self._load_inputs(x, y)
        static_x, static_y = self._inputs
        self.optimizer.zero_grad()
        optimizer_key = self.optimizer.replay_key()  # None: its step runs as written after each replay
        with Recording(x.device) as recording:
            loss = self.loss_fn(self.model(static_x), static_y)
            loss.backward()
            captured = self._state(loss, optimizer_key)
            if optimizer_key is not None:
                self.optimizer.step()
        if optimizer_key is None:
            self.optimizer.step()
        self.recordings += 1
        signature = recording.signature() if recording.unusable is None else None
        previous = self._previous
        if recording.unusable is not None:
            self._previous = None
            self.status = f"not replayed: the step cannot be recorded: {recording.unusable}"
        elif previous is not None and previous[1] == signature and previous[2] == captured["key"]:
            self._replay, self._captured, self._previous = Replay(recording), captured, None
            self.status = f"replaying {self._replay.launches} launches (recorded at step {self.calls})"
        else:
            self._previous = (recording, signature, captured["key"])
            if previous is not None:
                self.status = "not replayed yet: two consecutive steps enqueued different commands"
        if self.recordings >= self.attempts and self._replay is None:
            self.status += f"; gave up after {self.recordings} recordings, every step runs as written"
        return _copy(loss)  # its own storage: replays overwrite the recorded loss

    def _replayed(self, x, y) -> Tensor:
        self._load_inputs(x, y)
        for p, grad in self._captured["grads"]:
            p.grad = grad
        while len(self._in_flight) > 1:  # at most two steps queued: the host need not run further ahead
            self._in_flight.popleft().wait()
        event = self._replay.replay()  # the backward pass's callbacks run where the pass ended
        if event is not None:
            self._in_flight.append(event)
        if self._captured["optimizer_key"] is None:
            self.optimizer.step()
        self.replays += 1
        return _copy(self._captured["loss"])

    # ---- what a replay relies on -----------------------------------------------------------------------
    def _load_inputs(self, x, y) -> None:
        """Copy the batch into the tensors the recording reads (made at the first recording)."""
        if self._inputs is None or not _same_layout(self._inputs[0], x) or not _same_layout(self._inputs[1], y):
            self._inputs = (Tensor.empty(x.shape, x.dtype, x.device), Tensor.empty(y.shape, y.dtype, y.device))
        for static, batch in zip(self._inputs, (x, y)):
            batch = batch.contiguous()
            memory.copy(static.device, static.buffer, batch.buffer, static.nbytes, static.offset * static.dtype.itemsize,
                        batch.offset * batch.dtype.itemsize)

    def _state(self, loss, optimizer_key) -> dict:
        """What the recorded commands refer to: the gradients they write, the loss, the parameters' buffers,
        the optimizer's key; ``key`` must be equal for two recordings to be interchangeable."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return {"grads": [(p, p.grad) for p in params], "loss": loss.detach(),
                "buffers": [(p, p.buffer) for p in params], "optimizer_key": optimizer_key,
                "key": (self.model.training, tuple(id(p.buffer) for p in params),
                        tuple(p.grad is None for p in params), optimizer_key)}

    def _why_not_replay(self, x, y) -> str | None:
        static_x, static_y = self._inputs
        if not (_same_layout(static_x, x) and _same_layout(static_y, y)):
            return f"a batch of shape {x.shape} (recorded: {static_x.shape})"
        if not self.model.training:
            return "the model is in eval mode"
        if not autograd.is_grad_enabled():
            return "gradients are disabled"
        if not self._parameters_kept():
            return "a parameter's storage was replaced"
        if not self._optimizer_kept():
            return "the optimizer's kernels or buffers changed"
        return None

    def _parameters_kept(self) -> bool:
        return all(p.buffer is buffer for p, buffer in self._captured["buffers"])

    def _optimizer_kept(self) -> bool:
        key = self._captured["optimizer_key"]
        return key is None or key == self.optimizer.replay_key()

    def _forget(self, why: str) -> None:
        self._replay, self._captured, self._previous = None, {}, None
        self.recordings = 0
        self.status = why


def _copy(loss: Tensor) -> Tensor:
    """A detached copy in storage of its own (the driver's buffer copy: cheaper than a kernel)."""
    out = Tensor.empty(loss.shape, loss.dtype, loss.device)
    memory.copy(out.device, out.buffer, loss.buffer, out.nbytes, 0, loss.offset * loss.dtype.itemsize)
    return out


def _same_layout(static: Tensor, batch) -> bool:
    return (isinstance(batch, Tensor) and batch.shape == static.shape and batch.dtype == static.dtype
            and batch.device is static.device)


__all__ = ["CapturedStep"]
