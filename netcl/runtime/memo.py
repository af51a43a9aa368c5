"""One memoizer for per-device state.

State that belongs to a device lives in a :class:`DeviceMemo`, scoped either by the device's *context*
(compiled kernels, buffers: valid only in the context that made them; held weakly by the Device object,
so a collected Device takes its entries with it and a new Device reusing its address starts empty) or by
the device's *identity* (platform | device | driver: plans, profiles and calibrations, valid for every
context on that device). Keys of ``id()`` of objects that can be collected and reused are what this
replaces. :func:`clear_all` empties every memo (tests, and the planner's clear_memory_cache).
"""
from __future__ import annotations

import threading
import weakref

_all: "weakref.WeakSet[DeviceMemo]" = weakref.WeakSet()


class DeviceMemo:
    """A mapping (device, key) -> value; ``scope`` is "context" or "identity" (see the module docstring)."""

    def __init__(self, name: str, scope: str = "identity"):
        if scope not in ("context", "identity"):
            raise ValueError(f"scope must be 'context' or 'identity', got {scope!r}")
        self.name, self.scope = name, scope
        self._lock = threading.RLock()
        self._by_identity: dict[str, dict] = {}
        self._by_device: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        _all.add(self)

    def _table(self, device, create: bool = True) -> dict | None:
        if self.scope == "identity":
            key = device if isinstance(device, str) else device.identity
            return self._by_identity.setdefault(key, {}) if create else self._by_identity.get(key)
        table = self._by_device.get(device)
        if table is None and create:
            table = self._by_device[device] = {}
        return table

    def get(self, device, key, default=None):
        with self._lock:
            table = self._table(device, create=False)
            return default if table is None else table.get(key, default)

    def put(self, device, key, value):
        with self._lock:
            self._table(device)[key] = value
        return value

    def get_or_make(self, device, key, make):
        """The value for (device, key), made by ``make()`` once (under the memo's lock)."""
        with self._lock:
            table = self._table(device)
            if key not in table:
                table[key] = make()
            return table[key]

    def values(self, device) -> list:
        """The values held for ``device`` (a snapshot)."""
        with self._lock:
            table = self._table(device, create=False)
            return list(table.values()) if table else []

    def pop(self, device, key, default=None):
        with self._lock:
            table = self._table(device, create=False)
            return default if table is None else table.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._by_identity.clear()
            self._by_device = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._by_identity.values()) + sum(len(t) for t in self._by_device.values())


def clear_all() -> None:
    for memo in list(_all):
        memo.clear()
