"""Recording the commands a piece of host code enqueues, and replaying them without that host code.

A training step of a small network makes thousands of Python calls on the host to enqueue a few dozen
launches (LeNet). On a CPU device that host time comes from the cores the kernels run on. A ``Recording`` made while
the step runs holds every command the step enqueued — kernel launches with their arguments, uploads,
fills, copies — and the host work that must happen between them (gradient hooks such as
DistributedDataParallel's allreduce), each an object of its own kind (``KernelLaunch``, ``Upload``,
``Fill``, ``Copy``, ``HostCall``, ``Written``) that knows its place in a signature and how to enqueue itself again.
``Replay`` enqueues the same commands again, each kernel a private copy with its arguments set once, for a
few microseconds a launch.

A replay is only right for code that enqueues the same commands every time on the same buffers:
netcl.training.replay records two consecutive steps and replays only when ``signature()`` of the two
agree. What legitimately changes from step to step is declared where the launch is made:

- a *dynamic* scalar argument (a Dropout seed) is recomputed by its callable at every replay;
- host work (a hook) is recorded with ``host_call`` and called again at every replay; host work that only
  makes a value derived from tensors again when their storage was written (``refresh_call``: BatchNorm
  folded into a convolution, a strategy's transformed weight) is called again at every replay but one
  whose caller knows that no storage was written since the previous replay (``Replay.replay(refresh=False)``:
  netcl.training.CapturedInference checks the versions of its model's parameters and buffers);
- the writes into existing tensors (``Tensor.mark_written``: an optimizer's update of the parameters,
  BatchNorm's running statistics) are counted again at every replay, so what caches values derived from
  those tensors (BatchNorm folded into a convolution) sees a replayed step's writes as it sees an eager one's.

What cannot be replayed marks the recording unusable with a reason: a download (the host reading a
result, e.g. ``loss.item()``, implies a decision taken on the host).

A recording is a launch observer of its device (netcl.runtime.observers), pushed on the device's
stack by ``with Recording(device)``; it sees the commands of the thread that made it, no other's.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pyopencl as cl

from ..errors import DeviceError
from .observers import LaunchObserver


def active(device) -> "Recording | None":
    """The recording the calling thread is making of ``device``'s commands, if any."""
    if not device.state.observers:
        return None
    return next((o for o in device.state.observers_here() if isinstance(o, Recording)), None)


class Recording(LaunchObserver):
    """The commands enqueued inside ``with Recording(device) as r:`` (device: the one they go to).

    The commands keep the buffers they refer to alive. With an ``arena`` (netcl.runtime.memory.Arena),
    the buffers allocated inside come from it and the commands hold their own handle of each such
    buffer instead of the tensor's, so a tensor dead mid-step gives its buffer back to the arena for the
    step's later tensors: the recording, and its replay, need the step's live set of buffers, not the
    sum of every buffer the step used."""

    def __init__(self, device, arena=None):
        super().__init__(thread=threading.get_ident())
        self.device = device
        self.arena = arena
        self.commands: list = []  # KernelLaunch, Upload, Fill, Copy and HostCall, in their order
        self.unusable: str | None = None  # why this recording cannot be replayed
        self.paused = False
        self._handles: dict[int, cl.Buffer] = {}  # an arena buffer's OpenCL handle -> the recording's own
        self.arena_uses: list[tuple[int, int, int]] = []  # (command index, buffer position, allocation)

    def __enter__(self) -> "Recording":
        if any(isinstance(o, Recording) for o in self.device.state.observers):
            raise RuntimeError(f"a recording of {self.device.describe()} is already being made")
        self.device.state.push(self)
        return self

    def __exit__(self, *exc) -> None:
        self.device.state.remove(self)

    # ---- what the runtime reports ------------------------------------------------------------------
    def kernel(self, device, kernel: cl.Kernel, global_size, local_size, args, dynamic=None) -> None:
        if not self._check_device(device):
            return
        if any(isinstance(a, (int, float, complex)) and not isinstance(a, np.generic) for a in args):
            self.refuse(f"{kernel.function_name} is launched with a Python number, whose type a replay "
                        f"cannot know")
            return
        if self.arena is not None:
            args = [self._kept(a, i) if isinstance(a, cl.MemoryObjectHolder) else a for i, a in enumerate(args)]
        self.commands.append(KernelLaunch(kernel, global_size, local_size, tuple(args), dict(dynamic or {})))

    def upload(self, device, buffer, array: np.ndarray, offset_bytes: int) -> None:
        if self._check_device(device):
            self.commands.append(Upload(self._kept(buffer, 0), np.array(array, copy=True), offset_bytes))

    def fill(self, device, buffer, value, nbytes: int, offset_bytes: int) -> None:
        if self._check_device(device):
            self.commands.append(Fill(self._kept(buffer, 0), value, nbytes, offset_bytes))

    def copy(self, device, dst, src, nbytes: int, dst_offset: int, src_offset: int) -> None:
        if self._check_device(device):
            self.commands.append(Copy(self._kept(dst, 0), self._kept(src, 1), nbytes, dst_offset, src_offset))

    def _kept(self, buffer, position: int):
        """What the command being recorded keeps of ``buffer``, its ``position``-th buffer argument: the
        buffer itself, or for one of the arena's, a handle of the recording's own (it keeps the memory
        alive without keeping it out of the arena), noting which allocation the command used."""
        if self.arena is None or not self.arena.owns(buffer):
            return buffer
        allocation = self.arena.allocation_of(buffer)
        if allocation is not None:
            self.arena_uses.append((len(self.commands), position, allocation))
        return self._own_handle(buffer)

    def _own_handle(self, buffer):
        """The recording's own handle of the arena buffer ``buffer``."""
        handle = self._handles.get(buffer.int_ptr)
        if handle is None:
            handle = self._handles[buffer.int_ptr] = cl.Buffer.from_int_ptr(buffer.int_ptr, retain=True)
        return handle

    def download(self, device, nbytes: int) -> None:
        # the host reads a result: what it decides from it is not recorded
        self.refuse(f"it reads {nbytes:,} bytes of device data on the host (.item(), .to_host() or the like)")

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

    def host(self, fn, args, kwargs, refresh: bool = False, result=None) -> None:
        self.commands.append(HostCall(fn, args, kwargs, refresh, result))

    def written(self, writes: "StorageWrites", buffer) -> None:
        """A tensor stored in ``buffer`` was written in place (its ``writes`` counted once more): a replay
        counts it again at this point. Consecutive writes are kept as one command. The command names
        the buffer only for signatures: an arena buffer is kept by the recording's own handle, so the
        written tensor's death still ends its allocation (no device command uses it here)."""
        if self.arena is not None and self.arena.owns(buffer):
            buffer = self._own_handle(buffer)
        last = self.commands[-1] if self.commands else None
        if isinstance(last, Written):
            last.add(writes, buffer)
        else:
            self.commands.append(Written(writes, buffer))

    def buffer_bytes(self) -> int:
        """Bytes of the distinct buffers the commands refer to (what a replay of them keeps)."""
        return _buffer_bytes(self.commands)

    def compacted(self):
        """``(commands, slab)``: the commands with every arena allocation that died within the recording
        moved into one buffer, ``slab``, where allocations share bytes whenever the commands that use them
        do not overlap (from an allocation's first use to its last): a static memory plan of the step,
        free of the pool's size classes. Allocations still alive (gradients, the loss) keep their
        buffers. ``(commands, None)`` where there is nothing to plan or no slab could be allocated."""
        # A replay only counts the in-place writes again: its Written commands name no buffer, which would
        # keep the memory of a tensor that died within the step.
        commands = [Written.counting(c.writes) if isinstance(c, Written) else c for c in self.commands]
        dead = {}  # allocation -> [first use, last use]
        live = self.arena.live_allocations() if self.arena is not None else set()
        for index, _, allocation in self.arena_uses:
            if allocation not in live:
                dead.setdefault(allocation, [index, index])[1] = index
        if not dead:
            return commands, None
        offsets, total = _place(dead, self.arena.sizes, self.arena.alignment)
        slab = self.arena.slab(total)
        if slab is None:
            return commands, None
        views = {a: slab.get_sub_region(offsets[a], self.arena.sizes[a]) for a in dead}
        moved: dict[int, dict[int, cl.Buffer]] = {}  # command index -> {buffer position: its new buffer}
        for index, position, allocation in self.arena_uses:
            if allocation in views:
                moved.setdefault(index, {})[position] = views[allocation]
        return [command.moved(moved[i]) if i in moved else command for i, command in enumerate(commands)], slab

    # ---- comparing two recordings ------------------------------------------------------------------
    def signature(self) -> list:
        """The commands with buffers named by their order of first use, scalars by value and dynamic
        arguments left out: equal for two recordings of code that did the same thing on its data."""
        names = _BufferNames()
        return [command.signature(names) for command in self.commands]

    def host_calls(self) -> tuple:
        """The host calls recorded (what their signatures name by identity, so whoever compares this
        recording's signature later keeps them)."""
        return tuple(command for command in self.commands if isinstance(command, HostCall))

    def refresh_calls(self) -> tuple:
        """The ``refresh_call`` host work recorded, in order (each with its arguments and recorded value)."""
        return tuple(command for command in self.host_calls() if command.refresh)

    @property
    def launches(self) -> int:
        return sum(command.launches for command in self.commands)


# ---- the recorded commands ---------------------------------------------------------------------------
# Each knows what it is in a signature (``signature(names)``), how many kernels it launches, and how to
# be enqueued again (``prepare(queue)``: a callable that enqueues it and returns its event, if any).

class _BufferNames:
    """Buffers named by their order of first use in one recording, so that two recordings of the same
    work on buffers the memory pool handed out in another order still compare equal."""

    def __init__(self):
        self._names: dict[int, int] = {}  # a buffer's handle -> its name, for one signature() call

    def buffer(self, buffer) -> tuple:
        return "buffer", self._names.setdefault(buffer.int_ptr, len(self._names))

    def argument(self, value) -> tuple | None:
        if isinstance(value, np.generic):
            return value.dtype.str, value.tobytes()
        if isinstance(value, cl.LocalMemory):
            return "local", value.size
        if value is None:
            return None
        return self.buffer(value)


class KernelLaunch:
    """A kernel launched with its arguments; ``dynamic`` maps argument positions to callables that
    compute them anew at every replay (a Dropout seed)."""

    launches = 1

    def __init__(self, kernel: cl.Kernel, global_size, local_size, args: tuple, dynamic: dict):
        self.kernel, self.global_size, self.local_size = kernel, global_size, local_size
        self.args, self.dynamic = args, dynamic

    def signature(self, names: _BufferNames) -> tuple:
        return ("kernel", self.kernel.function_name, self.kernel.program.int_ptr, self.global_size,
                self.local_size, tuple("dynamic" if i in self.dynamic else names.argument(a)
                                       for i, a in enumerate(self.args)))

    def buffers(self) -> tuple:
        return tuple(a for a in self.args if isinstance(a, cl.MemoryObjectHolder))

    def moved(self, buffers: dict) -> "KernelLaunch":
        """This launch with the buffer arguments at the given positions replaced."""
        args = tuple(buffers.get(i, a) for i, a in enumerate(self.args))
        return KernelLaunch(self.kernel, self.global_size, self.local_size, args, self.dynamic)

    def prepare(self, queue):
        """A private copy of the kernel with its fixed arguments set once: a replay sets only the
        dynamic ones."""
        private = cl.Kernel(self.kernel.program, self.kernel.function_name)
        for i, value in enumerate(self.args):
            if i in self.dynamic:
                continue
            if isinstance(value, np.generic):
                _set_scalar_arg(private, i, value)
            else:
                private.set_arg(i, value)
        global_size, local_size = self.global_size, self.local_size
        if not self.dynamic:
            return lambda: cl.enqueue_nd_range_kernel(queue, private, global_size, local_size)
        updates = tuple(self.dynamic.items())

        def launch_dynamic():
            for i, refresh in updates:
                _set_scalar_arg(private, i, refresh())
            return cl.enqueue_nd_range_kernel(queue, private, global_size, local_size)
        return launch_dynamic


class Upload:
    """Host data copied into a buffer (the recording keeps its own copy of the data)."""

    launches = 0

    def __init__(self, buffer, array: np.ndarray, offset_bytes: int):
        self.buffer, self.array, self.offset_bytes = buffer, array, offset_bytes

    def buffers(self) -> tuple:
        return (self.buffer,)

    def moved(self, buffers: dict) -> "Upload":
        return Upload(buffers.get(0, self.buffer), self.array, self.offset_bytes)

    def signature(self, names: _BufferNames) -> tuple:
        return "upload", names.buffer(self.buffer), self.array.dtype.str, self.array.tobytes(), self.offset_bytes

    def prepare(self, queue):
        buffer, array, offset = self.buffer, self.array, self.offset_bytes
        return lambda: cl.enqueue_copy(queue, buffer, array, dst_offset=offset, is_blocking=False)


class Fill:
    """``nbytes`` of a buffer set to a repeated value."""

    launches = 0

    def __init__(self, buffer, value, nbytes: int, offset_bytes: int):
        self.buffer, self.value, self.nbytes, self.offset_bytes = buffer, value, nbytes, offset_bytes

    def buffers(self) -> tuple:
        return (self.buffer,)

    def moved(self, buffers: dict) -> "Fill":
        return Fill(buffers.get(0, self.buffer), self.value, self.nbytes, self.offset_bytes)

    def signature(self, names: _BufferNames) -> tuple:
        return "fill", names.buffer(self.buffer), names.argument(self.value), self.nbytes, self.offset_bytes

    def prepare(self, queue):
        buffer, value, nbytes, offset = self.buffer, self.value, self.nbytes, self.offset_bytes
        return lambda: cl.enqueue_fill_buffer(queue, buffer, value, offset, nbytes)


class Copy:
    """A device-side copy of ``nbytes`` between buffers."""

    launches = 0

    def __init__(self, dst, src, nbytes: int, dst_offset: int, src_offset: int):
        self.dst, self.src, self.nbytes = dst, src, nbytes
        self.dst_offset, self.src_offset = dst_offset, src_offset

    def buffers(self) -> tuple:
        return self.dst, self.src

    def moved(self, buffers: dict) -> "Copy":
        return Copy(buffers.get(0, self.dst), buffers.get(1, self.src), self.nbytes, self.dst_offset,
                    self.src_offset)

    def signature(self, names: _BufferNames) -> tuple:
        return ("copy", names.buffer(self.dst), names.buffer(self.src), self.nbytes, self.dst_offset,
                self.src_offset)

    def prepare(self, queue):
        dst, src, nbytes, dst_offset, src_offset = self.dst, self.src, self.nbytes, self.dst_offset, self.src_offset
        return lambda: cl.enqueue_copy(queue, dst, src, byte_count=nbytes, dst_offset=dst_offset,
                                       src_offset=src_offset)


class HostCall:
    """Host work between kernels (``host_call``), called again with the same arguments at every replay;
    a ``refresh`` (``refresh_call``) may be left out of a replay whose caller knows it has nothing to do."""

    launches = 0

    def __init__(self, fn, args: tuple, kwargs: dict, refresh: bool = False, result=None):
        self.fn, self.args, self.kwargs, self.refresh = fn, args, kwargs, refresh
        self.result = result  # a refresh's value when recorded (what later refreshes may be given)

    def buffers(self) -> tuple:
        return ()

    def signature(self, names: _BufferNames) -> tuple:
        """The function and the objects it is given, by identity: the recording holds them, so no
        identity is reused while the signature is compared."""
        return ("host", getattr(self.fn, "__func__", self.fn), id(getattr(self.fn, "__self__", None)),
                _identities(self.args), _identities(sorted(self.kwargs.items())), self.refresh)

    def prepare(self, queue):
        fn, args, kwargs = self.fn, self.args, self.kwargs

        def call() -> None:  # what it returns is no event of the replay's
            fn(*args, **kwargs)
        return call


class StorageWrites:
    """The count of in-place writes into one tensor's storage, shared by the tensor and its views
    (``Tensor.version`` reads it, ``Tensor.mark_written`` and replays of ``Written`` add to it)."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


class Written:
    """Tensors written in place by the commands before it: a replay counts their writes again."""

    launches = 0

    def __init__(self, writes: StorageWrites, buffer):
        self.writes, self.written_buffers = [writes], [buffer]

    @classmethod
    def counting(cls, writes: list) -> "Written":
        """The command that counts ``writes`` again, naming no buffer (what a replay needs of it)."""
        command = cls.__new__(cls)
        command.writes, command.written_buffers = list(writes), []
        return command

    def add(self, writes: StorageWrites, buffer) -> None:
        self.writes.append(writes)
        self.written_buffers.append(buffer)

    def buffers(self) -> tuple:
        return ()  # the device does nothing here: a replay only counts the writes again

    def signature(self, names: _BufferNames) -> tuple:
        return "written", tuple(names.buffer(b) for b in self.written_buffers)

    def prepare(self, queue):
        counts = tuple(self.writes)

        def count_writes():
            for writes in counts:
                writes.count += 1
        return count_writes


def _place(spans: dict, sizes: list, alignment: int) -> tuple[dict, int]:
    """Offsets for allocations used over ``spans`` (allocation -> [first, last] command index) such that
    two whose spans overlap never share a byte: the largest first, each at the lowest aligned offset
    that fits between those already placed whose spans overlap its own. Returns (offsets, total bytes)."""
    def aligned(n):
        return -(-n // alignment) * alignment
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets, total = {}, 0
    for allocation in sorted(spans, key=lambda a: (-sizes[a], spans[a][0])):
        first, last = spans[allocation]
        size = sizes[allocation]
        offset = 0
        for start, end in sorted((o, e) for o, e, f, l in placed if f <= last and first <= l):
            if offset + size <= start:
                break
            offset = max(offset, aligned(end))
        offsets[allocation] = offset
        placed.append((offset, offset + size, first, last))
        total = max(total, offset + size)
    return offsets, total


def _buffer_bytes(commands, outside=None) -> int:
    """Bytes of the distinct buffers ``commands`` refer to, sub-buffers of ``outside`` left out."""
    sizes = {}
    for command in commands:
        for buffer in command.buffers():
            if outside is None or buffer.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) != outside:
                sizes[buffer.int_ptr] = buffer.size
    return sum(sizes.values())


def _identities(values) -> tuple:
    """The objects a host call was given, by identity; lists and tuples by their items' (a list of
    tensors made anew for every call is the same argument)."""
    return tuple(_identities(v) if isinstance(v, (list, tuple)) else id(v) for v in values)


def host_call(device, fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` now; inside a recording of ``device``, with recording paused (what it
    enqueues is its own business) and again at that point of every replay. For host work between
    kernels, such as a gradient hook that starts an allreduce."""
    recording = active(device)
    if recording is None:
        return fn(*args, **kwargs)
    with recording.pause():
        result = fn(*args, **kwargs)
    recording.host(fn, args, kwargs)
    return result


def refresh_call(device, fn, *args):
    """``host_call(device, fn, *args)`` for host work that makes a value derived from tensors again only
    when the storage of one of them was written (``Tensor.version``) or replaced, and otherwise returns
    what it made before: work that a replay may leave out when its caller knows that no tensor's storage
    such work reads was written since the previous replay (``Replay.replay(refresh=False)``)."""
    recording = active(device)
    if recording is None:
        return fn(*args)
    with recording.pause():
        result = fn(*args)
    recording.host(fn, args, {}, refresh=True, result=result)
    return result


@contextlib.contextmanager
def not_recorded(device):
    """Within, the calling thread's commands on ``device`` are not recorded (host work that a replay
    redoes itself)."""
    recording = active(device)
    if recording is None:
        yield
        return
    with recording.pause():
        yield


_set_scalar_arg = getattr(cl.Kernel, "_set_arg_buf", cl.Kernel.set_arg)  # see launching.PreparedLaunch


class Replay:
    """A recording made ready to enqueue again: ``replay()`` runs its commands in order, each kernel a
    private copy with its fixed arguments set once; the recording's buffers are kept alive (and so out of
    the memory pool) for as long as this object lives. A recording made with an arena is replayed from
    its compacted commands (``Recording.compacted``): the step's dead tensors in one planned buffer, the
    slab, of ``planned_bytes``; ``buffer_bytes`` counts the slab and every other buffer the replay keeps."""

    def __init__(self, recording: Recording):
        if recording.unusable:
            raise ValueError(f"this recording cannot be replayed: {recording.unusable}")
        self.device = recording.device
        self.launches = recording.launches
        commands, self._slab = recording.compacted()
        self._commands = tuple(commands)  # they hold the buffers and arrays they refer to
        self.planned_bytes = 0 if self._slab is None else self._slab.size  # the step's dead tensors, planned
        self.buffer_bytes = self.planned_bytes + _buffer_bytes(self._commands, outside=self._slab)
        self._steps = [command.prepare(self.device.queue) for command in self._commands]
        self._steps_without_refresh = [step for step, command in zip(self._steps, self._commands)
                                       if not getattr(command, "refresh", False)]
        self.refresh_count = len(self._steps) - len(self._steps_without_refresh)  # what refresh=False skips

    def replay(self, refresh: bool = True):
        """Enqueue every command again; the event of the last command that enqueued one (None when none
        did): its completion means the whole replay's has, the queue being in order. ``refresh=False``
        leaves out the ``refresh_call`` host work: for a caller that knows no storage it reads was written
        since the previous replay (it would find its values current and return them)."""
        result = None
        try:
            for step in (self._steps if refresh else self._steps_without_refresh):
                event = step()
                if event is not None:
                    result = event
        except cl.Error as exc:
            raise DeviceError(f"replaying {self.launches} launches on {self.device.describe()} failed: "
                              f"{exc}") from None
        return result
