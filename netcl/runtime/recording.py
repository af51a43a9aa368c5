"""Recording the commands a piece of host code enqueues, and replaying them without that host code.

A training step of a small network makes thousands of Python calls on the host to enqueue a few dozen
launches (LeNet). On a CPU device that host time comes from the cores the kernels run on. A ``Recording`` made while
the step runs holds every command the step enqueued — kernel launches with their arguments, uploads,
fills, copies — and the host work that must happen between them (gradient hooks such as
DistributedDataParallel's allreduce). ``Replay`` enqueues the same commands again, each kernel a private
copy with its arguments set once, for a few microseconds a launch.

A replay is only right for code that enqueues the same commands every time on the same buffers:
netcl.training.replay records two consecutive steps and replays only when ``signature()`` of the two
agree. What legitimately changes from step to step is declared where the launch is made:

- a *dynamic* scalar argument (a Dropout seed) is recomputed by its callable at every replay;
- host work (a hook) is recorded with ``host_call`` and called again at every replay.

What cannot be replayed marks the recording unusable with a reason: a download (the host reading a
result, e.g. ``loss.item()``, implies a decision taken on the host).

Recording is per process and from one thread; every other thread's launches are not recorded.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pyopencl as cl

from ..errors import DeviceError

_active: "Recording | None" = None  # the recording being made (a global: the launches' fast check)


def active() -> "Recording | None":
    """The recording the calling thread is making, if any."""
    recording = _active
    if recording is None or recording.thread != threading.get_ident() or recording.paused:
        return None
    return recording


class Recording:
    """The commands enqueued inside ``with Recording(device) as r:`` (device: the one they go to)."""

    def __init__(self, device):
        self.device = device
        self.thread = threading.get_ident()
        self.entries: list[tuple] = []
        self.unusable: str | None = None  # why this recording cannot be replayed
        self.paused = False

    def __enter__(self) -> "Recording":
        global _active
        if _active is not None:
            raise RuntimeError("a recording is already being made in this process")
        _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None

    # ---- what the runtime reports ------------------------------------------------------------------
    def kernel(self, device, kernel: cl.Kernel, global_size, local_size, args, dynamic=None) -> None:
        if not self._check_device(device):
            return
        if any(isinstance(a, (int, float, complex)) and not isinstance(a, np.generic) for a in args):
            self.refuse(f"{kernel.function_name} is launched with a Python number, whose type a replay "
                        f"cannot know")
            return
        self.entries.append(("kernel", kernel, global_size, local_size, tuple(args), dict(dynamic or {})))

    def upload(self, device, buffer, array: np.ndarray, offset_bytes: int) -> None:
        if self._check_device(device):
            self.entries.append(("upload", buffer, np.array(array, copy=True), offset_bytes))

    def fill(self, device, buffer, value, nbytes: int, offset_bytes: int) -> None:
        if self._check_device(device):
            self.entries.append(("fill", buffer, value, nbytes, offset_bytes))

    def copy(self, device, dst, src, nbytes: int, dst_offset: int, src_offset: int) -> None:
        if self._check_device(device):
            self.entries.append(("copy", dst, src, nbytes, dst_offset, src_offset))

    def refuse(self, why: str) -> None:
        """Something inside cannot be replayed (the first reason is kept)."""
        self.unusable = self.unusable or why

    def _check_device(self, device) -> bool:
        if device is not self.device:
            self.refuse(f"the step enqueues work on a second device ({device.describe()})")
            return False
        return True

    @contextlib.contextmanager
    def pause(self):
        was, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = was

    def host(self, fn, args, kwargs) -> None:
        self.entries.append(("host", fn, args, kwargs))

    # ---- comparing two recordings ------------------------------------------------------------------
    def signature(self) -> list:
        """The commands with buffers named by their order of first use, scalars by value and dynamic
        arguments left out: equal for two recordings of code that did the same thing on its data."""
        names: dict[int, int] = {}

        def buffer_name(buffer):
            handle = buffer.int_ptr
            return "buffer", names.setdefault(handle, len(names))

        def arg_name(value):
            if isinstance(value, np.generic):
                return value.dtype.str, value.tobytes()
            if isinstance(value, cl.LocalMemory):
                return "local", value.size
            if value is None:
                return None
            return buffer_name(value)

        out = []
        for entry in self.entries:
            kind = entry[0]
            if kind == "kernel":
                _, kernel, global_size, local_size, args, dynamic = entry
                out.append((kind, kernel.function_name, kernel.program.int_ptr, global_size, local_size,
                            tuple("dynamic" if i in dynamic else arg_name(a) for i, a in enumerate(args))))
            elif kind == "upload":
                _, buffer, array, offset = entry
                out.append((kind, buffer_name(buffer), array.dtype.str, array.tobytes(), offset))
            elif kind == "fill":
                _, buffer, value, nbytes, offset = entry
                out.append((kind, buffer_name(buffer), arg_name(value), nbytes, offset))
            elif kind == "copy":
                _, dst, src, nbytes, dst_offset, src_offset = entry
                out.append((kind, buffer_name(dst), buffer_name(src), nbytes, dst_offset, src_offset))
            else:
                _, fn, args, kwargs = entry
                out.append((kind, getattr(fn, "__func__", fn), id(getattr(fn, "__self__", None)),
                            _identities(args), _identities(sorted(kwargs.items()))))
        return out

    @property
    def launches(self) -> int:
        return sum(entry[0] == "kernel" for entry in self.entries)


def report(kind: str, device, *args) -> None:
    """Hand an enqueued command (``kind``: "kernel", "upload", "fill" or "copy") to the recording the
    calling thread is making, if any. The runtime's enqueue points call it behind a check of ``_active``,
    so that outside recordings they pay one global read."""
    being_made = active()
    if being_made is not None:
        getattr(being_made, kind)(device, *args)


def _identities(values) -> tuple:
    """The objects a host call was given, by identity; lists and tuples by their items' (a list of
    tensors made anew for every call is the same argument)."""
    return tuple(_identities(v) if isinstance(v, (list, tuple)) else id(v) for v in values)


def host_call(fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` now; inside a recording, with recording paused (what it enqueues is
    its own business) and again at that point of every replay. For host work between kernels, such as a
    gradient hook that starts an allreduce."""
    recording = active()
    if recording is None:
        return fn(*args, **kwargs)
    with recording.pause():
        result = fn(*args, **kwargs)
    recording.host(fn, args, kwargs)
    return result


@contextlib.contextmanager
def not_recorded():
    """Within, the calling thread's commands are not recorded (host work that a replay redoes itself)."""
    recording = active()
    if recording is None:
        yield
        return
    with recording.pause():
        yield


_set_scalar_arg = getattr(cl.Kernel, "_set_arg_buf", cl.Kernel.set_arg)  # see launching.PreparedLaunch


class Replay:
    """A recording made ready to enqueue again: ``replay()`` runs its commands in order, each kernel a
    private copy with its fixed arguments set once; the recording's buffers are kept alive (and so out of
    the memory pool) for as long as this object lives."""

    def __init__(self, recording: Recording):
        if recording.unusable:
            raise ValueError(f"this recording cannot be replayed: {recording.unusable}")
        self.device = recording.device
        self.launches = recording.launches
        self._keep = recording.entries  # the buffers and arrays the commands refer to
        self._steps = [self._prepare(entry) for entry in recording.entries]

    def _prepare(self, entry):
        kind = entry[0]
        queue = self.device.queue
        if kind == "kernel":
            _, kernel, global_size, local_size, args, dynamic = entry
            private = cl.Kernel(kernel.program, kernel.function_name)
            for i, value in enumerate(args):
                if i in dynamic:
                    continue
                if isinstance(value, np.generic):
                    _set_scalar_arg(private, i, value)
                else:
                    private.set_arg(i, value)
            if dynamic:
                updates = tuple(dynamic.items())

                def launch_dynamic():
                    for i, refresh in updates:
                        _set_scalar_arg(private, i, refresh())
                    return cl.enqueue_nd_range_kernel(queue, private, global_size, local_size)
                return launch_dynamic
            return lambda: cl.enqueue_nd_range_kernel(queue, private, global_size, local_size)
        if kind == "upload":
            _, buffer, array, offset = entry
            return lambda: cl.enqueue_copy(queue, buffer, array, dst_offset=offset, is_blocking=False)
        if kind == "fill":
            _, buffer, value, nbytes, offset = entry
            return lambda: cl.enqueue_fill_buffer(queue, buffer, value, offset, nbytes)
        if kind == "copy":
            _, dst, src, nbytes, dst_offset, src_offset = entry
            return lambda: cl.enqueue_copy(queue, dst, src, byte_count=nbytes, dst_offset=dst_offset,
                                           src_offset=src_offset)
        _, fn, args, kwargs = entry
        return lambda: fn(*args, **kwargs)

    def replay(self):
        """Enqueue every command again; the last command's event (None when the last was host work)."""
        result = None
        try:
            for step in self._steps:
                result = step()
        except cl.Error as exc:
            raise DeviceError(f"replaying {self.launches} launches on {self.device.describe()} failed: "
                              f"{exc}") from None
        return result if isinstance(result, cl.Event) else None
