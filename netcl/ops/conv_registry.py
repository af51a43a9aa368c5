"""The one list of conv2d strategies.

A strategy is a module implementing the protocol of netcl.ops.conv_common (ConvStrategy); adding one is
that module, imported below, plus its STRATEGY in BUILTIN. The planner, the cost model, conv2d and the
strategy tests read the registry and nothing else, so none of them changes. Order = preference when nothing else
decides. Code outside netcl (a test, a plug-in) calls :func:`register` and :func:`unregister`.
"""
from __future__ import annotations

import threading

from ..errors import ShapeError
from . import (conv_depthwise, conv_direct, conv_direct_blocked, conv_gemm, conv_im2col, conv_implicit_gemm,
               conv_mec, conv_pointwise, conv_winograd, conv_winograd4)

BUILTIN = (
    conv_direct.STRATEGY,
    conv_im2col.STRATEGY,
    conv_gemm.STRATEGY,
    conv_implicit_gemm.STRATEGY,
    conv_winograd.STRATEGY,
    conv_winograd4.STRATEGY,
    conv_mec.STRATEGY,
    conv_direct_blocked.STRATEGY,
    conv_depthwise.STRATEGY,
    conv_pointwise.STRATEGY,
)

_registry: dict[str, object] = {}
_lock = threading.RLock()
_loaded = [False]


def _load_builtin() -> None:
    # A strategy registered under a built-in's name before the first lookup replaces the built-in.
    with _lock:
        if _loaded[0]:
            return
        _loaded[0] = True
        for strategy in BUILTIN:
            _registry.setdefault(strategy.name, strategy)


def register(strategy) -> object:
    """Add (or replace) a strategy under ``strategy.name``; returns it."""
    for attr in ("name", "why_not", "workspace_bytes", "cost_terms", "forward", "backward_data", "backward_weight"):
        if not hasattr(strategy, attr):
            raise ShapeError(f"a conv2d strategy needs {attr!r} (netcl.ops.conv_common.ConvStrategy); "
                             f"{type(strategy).__name__} has none")
    with _lock:
        _registry[strategy.name] = strategy
    return strategy


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def strategies() -> dict[str, object]:
    """Every registered strategy by name, in registration order."""
    _load_builtin()
    with _lock:
        return dict(_registry)


def strategy(name: str):
    """The strategy called ``name``; a ShapeError lists the registered ones."""
    found = strategies().get(name)
    if found is None:
        raise ShapeError(f"unknown conv2d strategy {name!r}; choose one of {', '.join(strategies())} or 'auto'")
    return found


def names() -> tuple[str, ...]:
    return tuple(strategies())
