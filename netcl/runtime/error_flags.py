"""Errors found by kernels, reported to the host without making it wait.

A kernel that meets input it must reject (a class index out of range) cannot raise; making the host read
a result after every launch to ask would cost a synchronization per call and make a training step
unrecordable (netcl.runtime.recording refuses downloads). Instead each kind of check has an ``ErrorFlag``
per device (in the device's state, ``device.state``): a small device buffer of ``WORDS`` int64 words that kernels fill in when they find bad input
and word 0 is still 0 (the first record stays; the device's one in-order queue runs kernels one at a time,
so no atomics are needed). Its meaning beyond word 0 belongs to the kernels that write it and to
``make_error``, which turns a record into the exception to raise.

After launching such kernels the op calls ``watch()``: a non-blocking read of the buffer into a fresh host
array, through ``recording.host_call`` so a recorded step reads it again at every replay. ``check()``
looks at the reads that have completed (``wait=True``: at all of them, waiting) and raises the first
record it finds, clearing the flag. Every blocking download checks (its completion implies the earlier
reads'), and so does ``Optimizer.step()`` before updating any parameter: an error surfaces no later than
the next host read or the next optimizer step, and that step does not apply the bad batch's gradients.
"""
from __future__ import annotations

import collections

import numpy as np
import pyopencl as cl

from . import recording

WORDS = 8
MAX_PENDING_READS = 64  # beyond, ``watch`` waits for the oldest: a loop that never checks stays bounded


class ErrorFlag:
    """One kind of check's record on one device (made by ``error_flag``)."""

    def __init__(self, device, name: str, make_error):
        self.device, self.name, self.make_error = device, name, make_error
        self.buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, WORDS * 8)
        self._clear()
        self._pending: collections.deque = collections.deque()  # (event, host array) of reads in flight

    def watch(self) -> None:
        """Read the record back after the kernels enqueued so far, without waiting (also at replays)."""
        recording.host_call(self.device, self._read_back)

    def _read_back(self) -> None:
        self.check(wait=False)
        if len(self._pending) >= MAX_PENDING_READS:
            self._pending[0][0].wait()
        record = np.empty(WORDS, np.int64)
        event = cl.enqueue_copy(self.device.queue, record, self.buffer, is_blocking=False)
        self._pending.append((event, record))

    def check(self, wait: bool = True) -> None:
        """Raise the error of the first record set among the completed reads (``wait``: all reads)."""
        pending = self._pending
        while pending:
            event, record = pending[0]
            if wait:
                event.wait()
            elif event.command_execution_status != cl.command_execution_status.COMPLETE:
                return
            pending.popleft()
            if record[0] != 0:
                pending.clear()
                self._clear()
                raise self.make_error(record)

    def _clear(self) -> None:
        cl.enqueue_fill_buffer(self.device.queue, self.buffer, np.int64(0), 0, WORDS * 8)


def _flags(device) -> dict:
    """The device's flags by the name of their check (an entry of its DeviceState)."""
    return device.state.entry("error flags", dict)


def error_flag(device, name: str, make_error) -> ErrorFlag:
    """The device's flag for the check ``name``, made at the first call (``make_error(record)`` -> the
    exception for a record whose word 0 is set)."""
    flags = _flags(device)
    flag = flags.get(name)
    if flag is None:
        flag = flags[name] = ErrorFlag(device, name, make_error)
    return flag


def check(device, wait: bool = True) -> None:
    """Raise the first error the device's kernels recorded (see ``ErrorFlag.check``)."""
    for flag in _flags(device).values():
        flag.check(wait)


def check_before_update(device) -> None:
    """``check`` where a training step applies gradients; inside a recording, again at every replay."""
    if _flags(device):
        recording.host_call(device, check, device)
