"""Program binaries on disk: loading them, and writing them where it is safe and cheap.

Asking PoCL for a program's binary compiles every kernel in it once more, which takes as long as the
build itself; fetching binaries at build time would nearly double a cold first training step. So a
program built from source is remembered,
and its binary is written later, by :func:`save_binaries`: at exit, after each training epoch
(netcl.training), or when a caller asks.

Never while the program's kernels may be running. On PoCL 3.1 the binary's compilation registers a
code entry under the same key as a launched kernel whose work-group size is fixed
(``reqd_work_group_size``); a launch in flight at that moment releases the wrong entry and PoCL aborts
the process (``pocl_release_dlhandle_cache: Assertion `found->ref_count > 0' failed``). A background
writer thread did exactly that (reproduced in tests/test_kernel_cache.py), so :func:`save_binaries`
first drains the queue of every device it writes for, in the calling thread.

File layout: ``MAGIC``, the SHA-256 of the payload, the payload (the driver's binary). An entry that
fails the check or the driver's load is a miss.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import re
import threading
import time
import warnings
from pathlib import Path

import pyopencl as cl

from .cache import atomic_write_bytes

MAGIC = b"NETCLBIN"

# Programs built from source whose binary is still to be written, with the queue to drain first (the
# device's queue, not the Device: a Device nobody uses is collected). Process-wide, as the disk cache it
# fills; a program stays here after its Device is gone, and is written at exit.
_unsaved: dict[Path, tuple[cl.Program, cl.CommandQueue]] = {}
_lock = threading.Lock()


def kernel_names(source: str) -> set[str]:
    """The names of the kernels an OpenCL C source defines."""
    return set(_KERNEL_NAME.findall(source))


_KERNEL_NAME = re.compile(r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)", re.S)


def missing_kernels(program: cl.Program, source: str) -> set[str]:
    """The kernels of ``source`` that the built ``program`` lacks: the PoCL wheel (3.0-rc2, on a CPU whose
    name its LLVM does not match) gave back programs without some of their kernels from its caches."""
    try:
        built = set(filter(None, program.get_info(cl.program_info.KERNEL_NAMES).split(";")))
    except cl.Error:
        return kernel_names(source)
    return kernel_names(source) - built


def load(context: cl.Context, cl_device: cl.Device, path: Path, options: tuple[str, ...],
         source: str | None = None) -> cl.Program | None:
    """The program stored at ``path``, built from its binary, or None (missing, damaged, refused, or, given
    the ``source``, lacking any of its kernels)."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    header = len(MAGIC) + 32
    if len(blob) <= header or not blob.startswith(MAGIC):
        return None
    digest, payload = blob[len(MAGIC):header], blob[header:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        program = cl.Program(context, [cl_device], [payload])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = program.build(options=list(options))
    except cl.Error:
        return None
    return None if source is not None and missing_kernels(program, source) else program


def remember(path: Path, program: cl.Program, device) -> None:
    """Schedule ``program`` (just built from source for ``device``) to be written to ``path``."""
    with _lock:
        _unsaved[path] = (program, device.queue)


def pending() -> int:
    """How many built programs have no binary on disk yet."""
    with _lock:
        return len(_unsaved)


def discard_unsaved() -> int:
    """Forget every program waiting for its binary to be written; returns how many."""
    return forget(unsaved_programs())


def unsaved_programs() -> dict:
    """{path: program} of the programs waiting for their binary to be written."""
    with _lock:
        return {path: program for path, (program, _) in _unsaved.items()}


def forget(paths) -> int:
    """Never write the binaries of the programs at ``paths`` (those still waiting); returns how many."""
    with _lock:
        return sum(_unsaved.pop(path, None) is not None for path in paths)


@contextlib.contextmanager
def builds_inside():
    """Yields a dict that, once the block ends (also by an exception), holds {path: program} of the
    programs first built inside it and still waiting for their binary."""
    with _lock:
        before = set(_unsaved)
    built: dict = {}
    try:
        yield built
    finally:
        built.update((path, program) for path, program in unsaved_programs().items() if path not in before)


@contextlib.contextmanager
def unsaved_builds_discarded():
    """Programs first built inside the block are never written (those pending before it still are). For
    searches that build many candidates and keep few (`netcl tune conv`, `netcl tune gemm`): a
    calibration on a cold PoCL cache finished in 142 s and then spent 67 s at exit compiling 169
    programs again for their binaries; the next process rebuilds the few it uses, from PoCL's own
    kernel cache where there is one."""
    try:
        with builds_inside() as built:
            yield
    finally:
        forget(built)


def fetch_seconds(program: cl.Program) -> float:
    """Seconds the driver takes to hand over ``program``'s binary (PoCL compiles it again; Intel's CPU
    runtime has it at hand); infinite where it cannot."""
    start = time.perf_counter()
    try:
        program.get_info(cl.program_info.BINARIES)
    except cl.Error:
        return float("inf")
    return time.perf_counter() - start


def _write(path: Path, program: cl.Program) -> bool:
    try:
        payload = program.get_info(cl.program_info.BINARIES)[0]
        atomic_write_bytes(path, MAGIC + hashlib.sha256(payload).digest() + payload)
        return True
    except (cl.Error, OSError):
        return False  # a cache we cannot write only costs the next process a rebuild


def save_binaries() -> int:
    """Write every remembered binary now; returns how many were written. Waits for the queues of the
    devices concerned to drain first (see the module's doc), so call it from the thread that launches
    netcl's kernels, or while no other thread does. Runs by itself at exit."""
    with _lock:
        items = list(_unsaved.items())
        _unsaved.clear()
    drained: dict[int, bool] = {}  # queue handle -> drained
    written = 0
    for path, (program, queue) in items:
        if queue.int_ptr not in drained:
            try:
                queue.finish()
                drained[queue.int_ptr] = True
            except cl.Error:  # a device in a failed state: skip its binaries (the next process rebuilds)
                drained[queue.int_ptr] = False
        if drained[queue.int_ptr]:
            written += _write(path, program)
    return written


def _save_at_exit() -> None:
    try:
        save_binaries()
    except KeyboardInterrupt:
        pass  # the user wants out: the next process rebuilds what is missing


atexit.register(_save_at_exit)  # registered after pyopencl's own handler, so it runs before it
