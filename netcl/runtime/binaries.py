"""Program binaries on disk: loading them, and writing them off the critical path.

Asking PoCL for a program's binary compiles every kernel in it once more (for a work-group size fixed
only at launch), which takes as long as the build itself (gemm_tiled: 0.69 s build, 0.70 s binary).
Fetching binaries at build time therefore doubled the time to a cold first training step (14.0 s ->
9.6 s without). So a program built from source is remembered, and a background thread writes its binary
once no program has been built for ``IDLE_SECONDS``; what is still unwritten when the process exits is
written then. A process killed before that only costs the next one a rebuild from source.

File layout: ``MAGIC``, the SHA-256 of the payload, the payload (the driver's binary). An entry that
fails the check or the driver's load is a miss.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import threading
import time
import warnings
from pathlib import Path

import pyopencl as cl

from .cache import atomic_write_bytes

MAGIC = b"NETCLBIN"
IDLE_SECONDS = 2.0

_unsaved: dict[Path, cl.Program] = {}
_lock = threading.Lock()
_wake = threading.Condition(_lock)  # the saver sleeps on it; exit wakes it
_last_build = 0.0
_saver: threading.Thread | None = None
_stopping = False
_holds = 0  # timings in progress (held_back): the saver waits
_writing = False  # the saver is fetching a binary (held_back waits for it to finish)


def load(context: cl.Context, cl_device: cl.Device, path: Path, options: tuple[str, ...]) -> cl.Program | None:
    """The program stored at ``path``, built from its binary, or None (missing, damaged or refused)."""
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
            return program.build(options=list(options))
    except cl.Error:
        return None


def remember(path: Path, program: cl.Program) -> None:
    """Schedule ``program`` (just built from source) to be written to ``path``."""
    global _last_build, _saver
    with _lock:
        _unsaved[path] = program
        _last_build = time.monotonic()
        if _saver is None and not _stopping:
            _saver = threading.Thread(target=_save_when_idle, name="netcl-binary-saver", daemon=True)
            _saver.start()


def note_build() -> None:
    """Another build is under way: postpone background writes (they would compete for the compiler)."""
    global _last_build
    with _lock:
        _last_build = time.monotonic()


def _write(path: Path, program: cl.Program) -> bool:
    try:
        payload = program.get_info(cl.program_info.BINARIES)[0]
        atomic_write_bytes(path, MAGIC + hashlib.sha256(payload).digest() + payload)
        return True
    except (cl.Error, OSError):
        return False  # a cache we cannot write only costs the next process a rebuild


def _save_when_idle() -> None:
    global _saver, _writing
    while True:
        with _lock:
            while True:
                if _stopping or not _unsaved:
                    _saver = None
                    return
                wait = _last_build + IDLE_SECONDS - time.monotonic()
                if wait <= 0 and not _holds:
                    break
                _wake.wait(wait if wait > 0 else None)
            item = _unsaved.popitem()
            _writing = True
        try:
            _write(*item)
        finally:
            with _lock:
                _writing = False
                _wake.notify_all()


@contextlib.contextmanager
def held_back():
    """No background writes inside this block (it is timing something: a write takes a core for up to
    a second); they resume after it, and exit still writes whatever is left."""
    global _holds
    with _lock:
        _holds += 1
        while _writing:  # the binary in hand takes up to a second of a core: let it finish first
            _wake.wait()
    try:
        yield
    finally:
        with _lock:
            _holds -= 1
            _wake.notify_all()


def save_binaries() -> int:
    """Write every remembered binary now; returns how many were written. Runs by itself at exit."""
    written = 0
    while True:
        with _lock:
            if not _unsaved:
                return written
            item = _unsaved.popitem()
        written += _write(*item)


def _save_at_exit() -> None:
    global _stopping
    with _lock:
        _stopping = True
        saver = _saver
        _wake.notify_all()
    if saver is not None:
        saver.join()  # it finishes the binary in hand; the rest is written here
    try:
        save_binaries()
    except KeyboardInterrupt:
        pass  # the user wants out: the next process rebuilds what is missing


atexit.register(_save_at_exit)  # registered after pyopencl's own handler, so it runs before it
