"""The per-device tuning database: kernel parameters (and measured rates) that a tuner found best.

Entries are keyed by the device's identity (platform | device | driver | OpenCL version), a kernel
*family* ("gemm", "mec", "conv_calibration", "conv_plans"...) and an optional *key* inside the family (a dtype, a shape class...).
Two layers answer a :func:`lookup`, first match wins:

1. the user's file ``<cache dir>/tuning/tuning.json`` (written by ``netcl tune`` through :func:`store`,
   with a locked read-modify-write so concurrent tuners do not lose each other's entries);
2. :data:`BUILTIN`, shipped with netcl, keyed by device kind ("cpu", "gpu", "any") instead of identity,
   so an unknown device still gets sensible parameters.

A damaged user file is ignored with a RuntimeWarning (lookups fall back to the built-in table).
:func:`identity` hashes everything a lookup on one device can see, so a cache of decisions derived from
tuning results (the conv planner's) can put it in its key and be invalidated by a re-tune.
With ``NETCL_CACHE=0`` the user file is neither read nor written; :func:`store` then only affects the
running process.

File layout::

    {"format": 1, "devices": {"<identity>": {"<family>": {"<key or *>": {param: value, ...}}}}}
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
import warnings

from .. import settings
from ..runtime.cache import cache_enabled, cache_path, update_json

FORMAT = 1
_DEFAULT_KEY = "*"  # the family-wide entry (key=None)

# Parameters for devices without a user entry, by device kind then family then key. Only the GEMM
# family ships here: other families pass their own ``default=`` to lookup.
BUILTIN: dict[str, dict[str, dict[str, dict]]] = {
    # PoCL's CPU driver: no local memory, one register tile per work-item, B packed into panels
    # (docs/explanation/gemm.md says why); measured with `netcl tune gemm` on a 2-core AVX2 PoCL 3.1
    # device.
    "cpu": {
        "gemm": {
            "float32": {"MR": 6, "VW": 8, "NV": 2, "WG_M": 8, "WG_N": 1, "KU": 1, "LOCAL": 0, "PACK_B": 1,
                        "ORDER": "mn"},
            # small K: a group of 8 work-items along N, faster than 8 along M on products such as cv9's
            # Winograd product (16×64×23328×64) and LeNet conv1's (20×36864×25)
            "float32/small_k": {"MR": 6, "VW": 8, "NV": 2, "WG_M": 1, "WG_N": 8, "KU": 1, "LOCAL": 0,
                                "PACK_B": 1, "ORDER": "mn"},
            # launch-bound products (64x10x500): a small grid of 8x8 tiles
            "float32/tiny": {"MR": 8, "VW": 8, "NV": 1, "WG_M": 1, "WG_N": 1, "KU": 1, "LOCAL": 0, "PACK_B": 1,
                             "ORDER": "mn"},
            "float32/small_mn": {"MR": 4, "VW": 8, "NV": 2, "WG_M": 8, "WG_N": 1, "KU": 1, "LOCAL": 0,
                                 "PACK_B": 1, "ORDER": "mn"},
            "float64": {"MR": 4, "VW": 4, "NV": 2, "WG_M": 8, "WG_N": 1, "KU": 1, "LOCAL": 0, "PACK_B": 1,
                        "ORDER": "mn"},
        },
    },
    # GPUs and anything else: work-group tiles staged in local memory.
    "any": {
        "gemm": {
            "float32": {"MR": 4, "VW": 4, "NV": 1, "WG_M": 8, "WG_N": 16, "KC": 16, "LOCAL": 1, "ORDER": "nm"},
            "float64": {"MR": 2, "VW": 2, "NV": 1, "WG_M": 8, "WG_N": 16, "KC": 16, "LOCAL": 1, "ORDER": "nm"},
        },
    },
}

_lock = threading.Lock()
_memo: dict = {"stamp": None, "data": {}}
_overlay: dict = {}  # entries stored while the on-disk cache is off
_overlay_edits = [0]  # bumped on every change to _overlay, so generation() sees it


def db_path():
    return cache_path("tuning", "tuning.json")


def _key(key) -> str:
    return _DEFAULT_KEY if key is None else str(key)


def _valid(data) -> bool:
    if not isinstance(data, dict) or not isinstance(data.get("devices", {}), dict):
        return False
    for families in data.get("devices", {}).values():
        if not isinstance(families, dict):
            return False
        for entries in families.values():
            if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
                return False
    return True


def _user_devices() -> dict:
    """The user file's ``devices`` mapping, re-read only when the file changes."""
    if not cache_enabled():
        return _overlay
    path = db_path()
    try:
        st = os.stat(path)
        stamp = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return {}
    with _lock:
        if _memo["stamp"] == stamp:
            return _memo["data"]
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"ignoring damaged tuning database at {path}: {exc}", RuntimeWarning, stacklevel=3)
            data = None
        if data is not None and not _valid(data):
            warnings.warn(f"ignoring tuning database at {path}: unexpected layout", RuntimeWarning, stacklevel=3)
            data = None
        devices = (data or {}).get("devices", {})
        _memo.update(stamp=stamp, data=devices)
        return devices


# generation() looks at the user file at most this often for one location (every GEMM call asks, and a
# stat per call cost more than the launch it configures); store() and forget() are seen at once.
GENERATION_RECHECK_SECONDS = 0.5
_generation_memo: dict = {"where": None, "at": -1e300, "token": None}


def generation() -> tuple:
    """A token that changes whenever what :func:`lookup` answers may change (the user file was edited,
    replaced or removed, or an entry stored), so callers can memoize lookups on it. An edit made to the
    file by another program is seen within GENERATION_RECHECK_SECONDS."""
    # The settings that decide where the file is (netcl.runtime.cache): cheaper to compare than the path.
    where = (settings.CACHE.text(), settings.CACHE_DIR.text(), _overlay_edits[0])
    now = time.monotonic()
    memo = _generation_memo
    if memo["where"] == where and now - memo["at"] < GENERATION_RECHECK_SECONDS:
        return memo["token"]
    devices = _user_devices()
    token = (where, _memo["stamp"] if devices is _memo["data"] else None)  # None: no file to read
    memo.update(where=where, at=now, token=token)
    return token


def _forget_generation() -> None:
    _generation_memo["where"] = None


def _identity_of(device) -> str:
    return device if isinstance(device, str) else device.identity


def _kind_of(device) -> str:
    return "any" if isinstance(device, str) else getattr(device, "kind", "any")


def lookup(device, family: str, key=None, default=None):
    """The stored parameters for (device, family, key) as a fresh dict, else the built-in entry for the
    device's kind (then for "any"), else ``default``. ``device`` is a Device or an identity string."""
    entry = _user_devices().get(_identity_of(device), {}).get(family, {}).get(_key(key))
    if entry is None:
        for kind in (_kind_of(device), "any"):
            entry = BUILTIN.get(kind, {}).get(family, {}).get(_key(key))
            if entry is not None:
                break
    return copy.deepcopy(entry) if entry is not None else default


def source(device, family: str, key=None) -> str:
    """Where :func:`lookup` would answer from: "user", "builtin" or "none"."""
    if _key(key) in _user_devices().get(_identity_of(device), {}).get(family, {}):
        return "user"
    if any(_key(key) in BUILTIN.get(k, {}).get(family, {}) for k in (_kind_of(device), "any")):
        return "builtin"
    return "none"


def store(device, family: str, params: dict, key=None) -> None:
    """Record ``params`` (JSON-serializable) as the entry for (device, family, key)."""
    params = json.loads(json.dumps(params))  # fail here, not in the middle of a locked write
    ident = _identity_of(device)

    def mutate(data):
        if not _valid(data):
            data.clear()
        data["format"] = FORMAT
        data.setdefault("devices", {}).setdefault(ident, {}).setdefault(family, {})[_key(key)] = params

    def in_process():
        _overlay.setdefault(ident, {}).setdefault(family, {})[_key(key)] = params

    _change(mutate, in_process)


def forget(device, family: str | None = None) -> None:
    """Drop the user entries of one device (one family, or all of them)."""
    ident = _identity_of(device)

    def mutate(data):
        families = data.get("devices", {}).get(ident, {}) if _valid(data) else {}
        if family is None:
            families.clear()
        else:
            families.pop(family, None)

    _change(mutate, lambda: _overlay.get(ident, {}).pop(family, None) if family else _overlay.pop(ident, None))


def _change(mutate, in_process) -> None:
    """Apply a change: ``mutate(data)`` to the user file, or ``in_process()`` while the disk cache is off."""
    if not cache_enabled():
        in_process()
        _overlay_edits[0] += 1
        return
    update_json(db_path(), "tuning database", mutate)
    with _lock:
        _memo["stamp"] = None
    _forget_generation()


def entries(device) -> dict:
    """Everything the user file holds for one device: {family: {key: params}} (a copy)."""
    return copy.deepcopy(_user_devices().get(_identity_of(device), {}))


# Families that record what was measured with the kernels rather than choose the kernels' parameters
# (the conv planner's calibration and measured plans): they do not enter identity(), which keys them.
DERIVED_FAMILIES = ("conv_calibration", "conv_plans")


def identity(device) -> str:
    """A short hash of every kernel-parameter entry a lookup on ``device`` can return (user and
    built-in; the DERIVED_FAMILIES are left out)."""
    user = {f: v for f, v in _user_devices().get(_identity_of(device), {}).items() if f not in DERIVED_FAMILIES}
    blob = json.dumps({"format": FORMAT, "user": user,
                       "builtin": {k: BUILTIN.get(k, {}) for k in (_kind_of(device), "any")}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
