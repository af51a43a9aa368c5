"""A model's inference forward recorded once per input shape and replayed: the kernels without the Python.

At batch 1 an ImageNet network's forward pass is a few hundred small launches, and the Python that decides
them (modules, fusion patterns, the planner's lookups, shape checks) costs the host about as much as the
device spends computing; on a CPU device that host time comes from the cores the kernels run on.
``CapturedInference(model)`` is called like the model, under no_grad. Its first ``warmup`` calls for an
input shape run the forward as written (kernels are built and plans made there), and so do the calls after
them while the convolutions measure their choices: in these warm-up calls each "auto" convolution without a
stored measured plan times the candidates its device's cost model cannot rule out, one per call, on the
real input (netcl.ops.conv_online, as training's first steps do), and stores the fastest for later calls
and processes. Then it records two forwards (netcl.runtime.recording) and, when both enqueued the same
commands on the same buffers, replays the second for every later input of that shape, dtype and device: the
input is copied into the recorded input tensor and the recorded commands are enqueued again. BatchNorm
folded into a convolution in eval mode is kept with the BatchNorm (netcl.nn.fusion.FoldedConvBN); the
recording holds, as host work, the check of each fold against the versions of the tensors it comes from, so
a replay after parameters changed in place (an optimizer step, ``load_state_dict``, a replayed training
step) folds those anew into the same tensors first. Each call reads the versions of the model's parameters
and buffers; while they are those of the previous call, a replay leaves those checks out
(netcl.runtime.recording's ``refresh_call``): at batch 1 the host's time is the cores' time on a CPU
device. A recording whose checks read a tensor from elsewhere (a weight kept as a plain attribute) makes
them at every replay.

An input of another shape, a model switched between train() and eval(), or a parameter or buffer whose
storage was replaced runs as written (a replaced storage or sub-module records again). A forward that reads a result on
the host cannot be recorded; it runs as written every time, with ``status`` saying why.

The output is a fresh tensor on every call (a device copy of the recorded output), so results of earlier
calls stay valid; ``reuse_output=True`` returns the recorded output tensor itself instead, which the next
replay overwrites.
"""
from __future__ import annotations

import collections

from .. import autograd
from ..module import Module
from ..ops import conv_chooser, conv_online
from ..runtime import first_step, memory
from ..runtime.recording import Recording, Replay
from ..tensor import Tensor


class CapturedInference:
    """``infer(x)``: ``model(x)`` under no_grad, replayed from a recording for the captured input shape.

    Args:
        model: the module run (normally in eval mode).
        warmup: calls per input shape run as written before the first recording (one more if the
            process's cold start is still deferring builds: it ends there, see netcl.runtime.first_step;
            more while the convolutions measure their choices).
        attempts: recordings tried (two make one comparison) before replay is given up for good.
        reuse_output: return the recorded output tensor (overwritten by the next call) instead of a copy.
        enabled: False runs every call as written (for comparisons).

    One input shape is captured at a time: the first one seen; calls of other shapes run as written.
    """

    def __init__(self, model, *, warmup: int = 1, attempts: int = 4, reuse_output: bool = False,
                 enabled: bool = True):
        self.model = model
        self.warmup, self.attempts = int(warmup), int(attempts)
        self.reuse_output, self.enabled = bool(reuse_output), bool(enabled)
        self.calls = self.replays = self.recordings = self.eager_calls = 0
        self.status = "replay disabled" if not enabled else "not recorded yet"
        self._layout: tuple | None = None       # (shape, dtype, device) of the captured input
        self._calls_of_layout = 0
        self._input: Tensor | None = None       # the tensor the recording reads
        self._output: Tensor | None = None      # the tensor the recording writes
        self._replay: Replay | None = None
        # (signature, state key, host calls) of the last recording: its host calls are kept because the
        # signature names the objects they were given by identity, which must not be reused meanwhile
        self._previous: tuple | None = None
        self._key: tuple | None = None          # the state the replay was recorded in
        self._versions: tuple | None = None     # the versions of the parameters and buffers at the last call
        # whether the replay's refresh calls read nothing but the model's modules, parameters and buffers
        # (and what earlier refreshes made of them): only then do the versions above cover them
        self._refreshes_follow_the_model = False
        self._in_flight: collections.deque = collections.deque()
        self._refused = False                   # a recording was refused: the forward reads on the host
        self._measured_last_call = False        # whether the last warm-up call measured a convolution

    @property
    def launches(self) -> int:
        """Kernels each replay enqueues; 0 while the calls of the captured shape run as written."""
        return 0 if self._replay is None else self._replay.launches

    replaying = property(lambda self: self._replay is not None, doc="Whether the captured shape is replayed.")

    def __call__(self, x: Tensor) -> Tensor:
        self.calls += 1
        layout = _layout(x)
        if self._layout is None:
            self._layout = layout
        if not self.enabled or layout != self._layout:
            return self._eager(x)
        self._calls_of_layout += 1
        if self._replay is not None:
            key, versions = self._state()
            if key == self._key:
                return self._replayed(x, versions)
            self._forget("recording again: the model's modules, their modes or a parameter's storage changed")
        if self._calls_of_layout <= self.warmup or self._measured_last_call:
            return self._warming_up(x)
        if self.recordings >= self.attempts or self._refused:
            return self._eager(x)
        if first_step.in_progress(x.device):
            # A recording keeps the kernels it saw for good: the cold start's stand-ins must give way to
            # each call's own kernels first, which this forward as written builds.
            first_step.end(x.device)
            return self._warming_up(x)
        return self._recorded(x)

    # ---- the three ways of running the forward --------------------------------------------------------
    def _eager(self, x: Tensor) -> Tensor:
        self.eager_calls += 1
        with autograd.no_grad():
            return self.model(x)

    def _warming_up(self, x: Tensor) -> Tensor:
        """The forward as written, its convolutions measuring their choices (recorded ones keep theirs)."""
        device = x.device
        before = conv_online.calls_measuring(device)
        with conv_chooser.chooser(device).measuring_inference():
            output = self._eager(x)
        self._measured_last_call = conv_online.calls_measuring(device) != before
        return output

    def _recorded(self, x: Tensor) -> Tensor:
        if self._input is None:
            self._input = Tensor.empty(x.shape, x.dtype, x.device)
        self._load_input(x)
        key, versions = self._state()
        with autograd.no_grad(), Recording(x.device) as recording:
            output = self.model(self._input)
        self.recordings += 1
        if not isinstance(output, Tensor):
            recording.refuse(f"the model returned {type(output).__name__}, not one Tensor")
        previous = self._previous
        if recording.unusable is not None:
            self._previous = None
            self.status = f"not replayed: the forward cannot be recorded: {recording.unusable}"
            self._refused = True  # it would refuse every time: stop paying for recordings
            return output
        signature = recording.signature()
        if previous is not None and previous[:2] == (signature, key):
            self._replay, self._output, self._key, self._previous = Replay(recording), output, key, None
            self._versions = versions  # the recording's host work made every fold for these
            self._refreshes_follow_the_model = self._reads_only_the_model(recording)
            self.status = (f"replaying {self._replay.launches} launches for inputs of shape {x.shape} "
                           f"(recorded at call {self.calls})")
        else:
            self._previous = (signature, key, recording.host_calls())
            if previous is not None:
                self.status = "not replayed yet: two consecutive forwards enqueued different commands"
        if self.recordings >= self.attempts and self._replay is None:
            self.status += f"; gave up after {self.recordings} recordings, every call runs as written"
        return output if self._replay is None or self.reuse_output else _copy(output)

    def _replayed(self, x: Tensor, versions: tuple) -> Tensor:
        self._load_input(x)
        while len(self._in_flight) > 1:  # at most two forwards queued: the host need not run further ahead
            self._in_flight.popleft().wait()
        # what the refresh calls check (folds, kept weight derivatives) derives from these tensors alone
        event = self._replay.replay(refresh=versions != self._versions or not self._refreshes_follow_the_model)
        self._versions = versions
        if event is not None:
            self._in_flight.append(event)
        self.replays += 1
        return self._output if self.reuse_output else _copy(self._output)

    # ---- what a replay relies on -----------------------------------------------------------------------
    def _load_input(self, x: Tensor) -> None:
        if x is self._input:
            return
        x = x.contiguous()
        static = self._input
        memory.copy(static.device, static.buffer, x.buffer, static.nbytes, static.offset * static.dtype.itemsize,
                    x.offset * x.dtype.itemsize)

    def _state(self) -> tuple[tuple, tuple]:
        """(key, versions). The key is what must be unchanged for a recording to stay right: the modules,
        each one's mode and the storage of every parameter and buffer (values may change in place); the
        versions are those storages' counts of in-place writes. Read at every call, so it walks the
        modules without naming them (a model's names cost more than the check)."""
        modules, seen, stack = [], set(), [self.model]
        pop, extend, add, append = stack.pop, stack.extend, seen.add, modules.append  # bound once per call
        while stack:
            module = pop()
            if module is None or id(module) in seen:  # by identity: a module may define __eq__
                continue
            add(id(module))
            append(module)
            extend(module._modules.values())
        tensors = _registered_tensors(modules)
        key = tuple(modules), tuple([m.training for m in modules]), tuple([t.buffer for t in tensors])
        return key, tuple([t.version for t in tensors])

    def _reads_only_the_model(self, recording: Recording) -> bool:
        """Whether each refresh call of ``recording`` is given only modules, parameters and buffers of the
        model, or tensors an earlier refresh call made (a folded weight): a tensor from elsewhere (a
        weight kept as a plain attribute) may be written without a version this object reads."""
        modules = self._key[0]
        known = {id(m) for m in modules}  # by identity, for this one check
        known.update(id(t) for t in _registered_tensors(modules))
        for call in recording.refresh_calls():
            if any(isinstance(a, (Tensor, Module)) and id(a) not in known for a in call.args):
                return False
            made = call.result if isinstance(call.result, tuple) else (call.result,)
            known.update(id(t) for t in made if isinstance(t, Tensor))
        return True

    def _forget(self, why: str) -> None:
        self._replay, self._output, self._key, self._previous, self._versions = None, None, None, None, None
        self.recordings = 0
        self._in_flight.clear()
        self.status = why


def _registered_tensors(modules) -> list:
    """The parameters and buffers of ``modules``, in order (a list: read at every call)."""
    return [t for m in modules for registry in (m._parameters, m._buffers) for t in registry.values()
            if t is not None]


def _copy(output: Tensor) -> Tensor:
    """A copy in storage of its own (the driver's buffer copy: less host work than a copy kernel)."""
    output = output.contiguous()
    out = Tensor.empty(output.shape, output.dtype, output.device)
    if out.nbytes:
        memory.copy(out.device, out.buffer, output.buffer, out.nbytes, 0, output.offset * output.dtype.itemsize)
    return out


def _layout(x) -> tuple:
    if not isinstance(x, Tensor):
        raise TypeError(f"CapturedInference takes one netcl Tensor, got {type(x).__name__}")
    return x.shape, x.dtype, x.device


__all__ = ["CapturedInference"]
