"""Launch observers: who sees the commands enqueued on a device, pushed and popped by context managers.

Each Device's state holds a stack of observers (netcl.runtime.device_state). ``launch`` and
``PreparedLaunch`` (netcl.runtime.launching) and the transfers of netcl.runtime.memory consult it, and
only it: with the stack empty they pay one attribute read. An observer sees the commands of the thread
that made it (``thread``), or of every thread (``thread`` None). Three kinds exist:

- :func:`builds_only` — the calling thread's launches enqueue nothing and return a completed event, so
  code run inside builds the programs its kernels come from and computes nothing (a calibration builds
  its kernels that way before timing them: netcl.tuning.conv_prebuild). Copies and fills still run.
- a ``Recording`` (netcl.runtime.recording) — the calling thread's commands are recorded for replay.
- :func:`watching_launches` — a callable sees every kernel launched on the device from any thread
  (netcl.ops.conv_online notes which programs its trials' candidates ran).
"""
from __future__ import annotations

import contextlib
import threading

import pyopencl as cl


class LaunchObserver:
    """Sees the commands enqueued on one device; every method does nothing unless a subclass says.
    ``builds_only``: launches are skipped (and no observer sees them) while this observer is active."""

    builds_only = False
    paused = False

    def __init__(self, thread: int | None = None):
        self.thread = thread

    def kernel(self, device, kernel: cl.Kernel, global_size, local_size, args, dynamic=None) -> None:
        pass

    def upload(self, device, buffer, array, offset_bytes: int) -> None:
        pass

    def fill(self, device, buffer, value, nbytes: int, offset_bytes: int) -> None:
        pass

    def copy(self, device, dst, src, nbytes: int, dst_offset: int, src_offset: int) -> None:
        pass

    def download(self, device, nbytes: int) -> None:
        pass


class _BuildsOnly(LaunchObserver):
    builds_only = True


@contextlib.contextmanager
def builds_only(device):
    """Within, in the calling thread only, launches on ``device`` enqueue nothing and return a completed
    event (see the module docstring); other threads launch as usual meanwhile."""
    with device.state.observing(_BuildsOnly(threading.get_ident())):
        yield


class _Watcher(LaunchObserver):
    def __init__(self, watcher):
        super().__init__(thread=None)
        self.watcher = watcher

    def kernel(self, device, kernel, global_size, local_size, args, dynamic=None) -> None:
        self.watcher(kernel)


def launch_watcher(watcher) -> LaunchObserver:
    """An observer calling ``watcher(kernel)`` at every launch, with the kernel get_kernel made: push it
    with ``device.state.observing(...)`` (or :func:`watching_launches`)."""
    return _Watcher(watcher)


def watching_launches(device, watcher):
    """Within, ``watcher(kernel)`` is called at every launch on ``device``, from any thread."""
    return device.state.observing(launch_watcher(watcher))


def skip_launch(device, observers: tuple):
    """A launch's stand-in (a completed event) when a build-only observer is among ``observers``."""
    if not any(o.builds_only for o in observers):
        return None
    event = cl.UserEvent(device.context)
    event.set_status(cl.command_execution_status.COMPLETE)
    return event
