"""Where netcl keeps what outlives a process: compiled kernels, tuning results, conv plans.

``NETCL_CACHE_DIR`` moves the directory; ``NETCL_CACHE=0`` turns every on-disk cache off. Every write is
atomic (a temporary file in the same directory, then ``os.replace``), so concurrent processes never see a
half-written entry, and a reader treats any entry it cannot parse as a miss.
"""
from __future__ import annotations

import functools
import json
import os
import tempfile
import warnings
from pathlib import Path

from .. import settings

CACHE_FORMAT_VERSION = 1


def cache_enabled() -> bool:
    return settings.CACHE.get()


def cache_root() -> Path:
    return _root_for(settings.CACHE_DIR.get())


# Hot paths (the tuning lookup of every GEMM) ask for cache paths: resolve the root once per setting and
# create each directory once per process.
@functools.lru_cache(maxsize=8)
def _root_for(configured: Path | None) -> Path:
    if configured is not None:
        return configured
    try:
        from platformdirs import user_cache_dir
        return Path(user_cache_dir("netcl", appauthor=False))
    except ImportError:  # platformdirs comes with pyopencl, but stay usable without it
        return Path.home() / ".cache" / "netcl"


_made_dirs: set = set()


def cache_path(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    if path.parent not in _made_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        _made_dirs.add(path.parent)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path, what: str):
    """Read a JSON cache file; a missing file is None, a damaged one warns and is None."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring damaged {what} at {path}: {exc}", RuntimeWarning, stacklevel=3)
        return None


class FileLock:
    """An advisory lock around read-modify-write of a shared JSON file (POSIX flock; no-op elsewhere)."""

    def __init__(self, path: Path):
        self.path = Path(str(path) + ".lock")
        self._fd = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            import fcntl
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        try:
            import fcntl
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except ImportError:
            pass
        os.close(self._fd)
        self._fd = None


def update_json(path: Path, what: str, mutate) -> dict:
    """Locked read-modify-write of a JSON object file; returns the object written."""
    with FileLock(path):
        current = read_json(path, what)
        if not isinstance(current, dict):
            current = {}
        mutate(current)
        atomic_write_json(path, current)
        return current
