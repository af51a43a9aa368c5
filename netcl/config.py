"""Process-wide switches read by the ops: deterministic kernels."""
from __future__ import annotations

import os

_deterministic: bool | None = None


def use_deterministic(flag: bool = True) -> None:
    """Make every op choose a kernel whose result does not depend on scheduling (e.g. col2im by gather
    instead of atomic scatter-add). Also set by NETCL_DETERMINISTIC=1."""
    global _deterministic
    _deterministic = bool(flag)


def deterministic_enabled() -> bool:
    if _deterministic is not None:
        return _deterministic
    return os.environ.get("NETCL_DETERMINISTIC", "0").strip().lower() in ("1", "true", "yes", "on")
