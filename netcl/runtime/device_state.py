"""What netcl keeps for one device while a process runs, in one object: ``device.state``.

A :class:`DeviceState` is made at a Device's first use and lives as long as the Device. It owns:

- the kernel pipeline's tables (netcl.runtime.kernels): built programs, the builds in progress, the
  kernels made from them, and an index of those kernels by the parameters as a caller ordered them;
- the small ``meta`` buffers of strided kernels (netcl.runtime.memory.meta_buffer) and the normalized
  launch geometries (netcl.runtime.launching);
- the cold-start phase (netcl.runtime.first_step): whether this device's first training step is over;
- the launch observers (:mod:`netcl.runtime.observers`): a stack that context managers push and pop;
- one named entry per kind of knowledge the layers above keep for the device (:meth:`table`,
  :meth:`entry`): build statistics, error flags, GEMM parameters, plans and packing workspaces, the
  convolution chooser and its memory (profiles, plans, training trials), im2col's kernels, the host
  buffers of collectives, what a probe found out about the driver.

Every table here is keyed by values (parameters, shapes, names), never by ``id()`` of an object that
may be collected; nothing here refers to the Device, so a Device nobody uses is collected with its state.
:meth:`clear` (``device.clear_state()``) empties all of it: the next call builds, plans and measures as
a fresh process would (the disk caches stay).
"""
from __future__ import annotations

import contextlib
import threading


class DeviceState:
    """The per-device tables and flags of one Device (see the module docstring)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.observers: tuple = ()  # innermost last; replaced whole, so a launch reads it without a lock
        self._reset()

    def _reset(self) -> None:
        self.programs: dict = {}        # program cache key -> cl.Program
        self.building: dict = {}        # program cache key -> threading.Event of the build in progress
        self.kernels: dict = {}         # (template, kernel, options, sorted parameters) -> cl.Kernel
        self.kernels_by_call: dict = {}  # the same with the parameters in the caller's order
        self.meta_buffers: dict = {}    # int64 values -> read-only cl.Buffer holding them
        self.geometries: dict = {}      # (global size, local size) as given -> normalized
        self.first_step_over = False
        self._tables: dict[str, dict] = {}

    def table(self, name: str) -> dict:
        """The device's table ``name`` (made empty at its first use): one per kind of knowledge a layer
        above the runtime keeps for this device, named by that layer ("gemm plans", "im2col layer
        kernels"...)."""
        return self.entry(name, dict)

    def entry(self, name: str, make):
        """The device's entry ``name``, made by ``make()`` at its first use (a table, or an object that
        keeps a layer's state for this device)."""
        value = self._tables.get(name)
        if value is None:
            with self.lock:
                value = self._tables.get(name)
                if value is None:
                    value = self._tables[name] = make()
        return value

    def drop(self, name: str) -> None:
        """Forget the entry ``name`` (closing it, as :meth:`clear` does); the next use makes it anew."""
        with self.lock:
            entry = self._tables.pop(name, None)
        _close(entry)

    def clear(self) -> None:
        """Forget everything this process learnt and built for the device, and begin its cold start
        again. An entry with a ``close()`` method is closed first (it may have pushed an observer); the
        observers that context managers pushed stay (the block that pushed one pops it)."""
        with self.lock:
            entries = list(self._tables.values())
            self._reset()
        for entry in entries:
            _close(entry)

    # ---- launch observers ------------------------------------------------------------------------
    @contextlib.contextmanager
    def observing(self, observer):
        """Within, ``observer`` sees the commands enqueued on this device (those of its thread, or of
        every thread when its ``thread`` is None): see netcl.runtime.observers."""
        self.push(observer)
        try:
            yield observer
        finally:
            self.remove(observer)

    def push(self, observer) -> None:
        """Add ``observer`` on top of the stack (:meth:`observing` pairs this with :meth:`remove`; an
        observer whose end is not one block of code pushes and removes itself)."""
        with self.lock:
            self.observers = self.observers + (observer,)

    def remove(self, observer) -> None:
        with self.lock:
            self.observers = tuple(o for o in self.observers if o is not observer)

    def observers_here(self) -> tuple:
        """The observers that see the calling thread's commands, innermost first."""
        me = threading.get_ident()
        return tuple(o for o in reversed(self.observers) if (o.thread is None or o.thread == me) and not o.paused)


def _close(entry) -> None:
    close = getattr(entry, "close", None)
    if close is not None:
        close()
