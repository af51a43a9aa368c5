"""Measured figures per device: GEMM rate and copy bandwidth, from `netcl devices --bench` or `netcl tune`.

They are stored in ``<cache dir>/devices/figures.json`` keyed by the device's identity (platform, device,
driver, OpenCL version), so a driver update starts unmeasured. ``nc.default_device()`` reads them to pick
the fastest measured device when no selector and no GPU decides, and `netcl devices` prints them. With
``NETCL_CACHE=0`` they live only in the running process.

File layout::

    {"format": 1, "devices": {"<identity>": {"gemm_gflops": 90.1, "copy_gbps": 41.0, "measured_at": "...",
                                             "source": "netcl devices --bench", ...}}}
"""
from __future__ import annotations

import datetime

from .cache import cache_enabled, cache_path, read_json, update_json

FORMAT = 1
_overlay: dict = {}  # figures stored while the on-disk cache is off


def figures_path():
    return cache_path("devices", "figures.json")


def _all_stored() -> dict:
    if not cache_enabled():
        return _overlay
    data = read_json(figures_path(), "device figures")
    devices = data.get("devices") if isinstance(data, dict) else None
    return devices if isinstance(devices, dict) else {}


def _identity_of(device) -> str:
    return device if isinstance(device, str) else device.identity


def stored_figures(device) -> dict:
    """The figures measured for this device (a copy), or an empty dict."""
    entry = _all_stored().get(_identity_of(device))
    return dict(entry) if isinstance(entry, dict) else {}


def store_figures(device, figures: dict, source: str) -> dict:
    """Merge ``figures`` into the device's entry (figures not re-measured are kept) and return it."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ident = _identity_of(device)
    update = dict(figures, measured_at=stamp, source=source)
    if not cache_enabled():
        _overlay.setdefault(ident, {}).update(update)
        return dict(_overlay[ident])

    def mutate(data):
        if not isinstance(data.get("devices"), dict):
            data.clear()
        data["format"] = FORMAT
        entry = data.setdefault("devices", {}).get(ident)
        data["devices"][ident] = dict(entry if isinstance(entry, dict) else {}, **update)

    return dict(update_json(figures_path(), "device figures", mutate)["devices"][ident])
