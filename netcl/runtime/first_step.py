"""The cold start: what a process's first training step does not need is deferred past it.

The phase is per device (``device.state.first_step_over``): a fresh process, or a device whose state
was cleared (``device.clear_state()``), is in its first step. A fresh process builds every kernel it launches, and on a CPU driver such as PoCL
each program costs a build and each kernel more code generation at its first launch per work-group size
(docs/architecture.md, "The first step"). Work that only makes later steps faster, such as a product's best tile when a kernel
that computes the same product is already built, waits until the first step is over:

- the first step ends at the first optimizer update of the device's parameters (:func:`end`;
  `Optimizer.step` calls it), or when anything times kernels on the device (netcl.runtime.timing), which
  must time the kernels the process will keep using;
- a process that never trains (inference only) revisits a deferred choice after :data:`PATIENCE` uses of
  it, so it is not left on a stand-in for good.

A stand-in computes the same result up to rounding (another tile sums in another order), so the first
step's result can depend on which kernels were cached. ``NETCL_DEFER_BUILDS=0`` turns deferral off (every
call builds its best kernel at once), and so does deterministic mode (``nc.use_deterministic``).
"""
from __future__ import annotations

from .. import settings

PATIENCE = 8  # uses of a deferred choice before a process that never trains revisits it



def enabled() -> bool:
    return settings.DEFER_BUILDS.get() and not settings.DETERMINISTIC.get()


def in_progress(device) -> bool:
    """Whether builds on ``device`` that only make later steps faster should wait."""
    return not device.state.first_step_over and enabled()


def end(device) -> None:
    """``device``'s first step is over: its deferred builds are due at their next use."""
    device.state.first_step_over = True


def restart(device) -> None:
    """Back to a fresh process's phase on ``device`` (tests)."""
    device.state.first_step_over = False


class Deferred:
    """A choice made for the cold start on one device, to be revisited: :meth:`due` turns true at the first
    use after the device's first step ends, or at the PATIENCE-th use in a process that has not trained."""

    __slots__ = ("uses", "state")

    def __init__(self, device):
        self.uses = 0
        self.state = device.state

    def due(self) -> bool:
        self.uses += 1
        return self.state.first_step_over or self.uses > PATIENCE or not enabled()


def variant(device, template_name: str, kernel_name: str, params: dict, free: tuple[str, ...]) -> dict:
    """The template parameters to launch ``kernel_name`` with: ``params``, or, during the first step when
    that variant is neither built nor in the disk cache, those of a variant this process has built that
    differs only in the ``free`` parameters (which the caller's launch geometry then follows)."""
    if not in_progress(device):
        return params
    from . import kernels
    fixed = {k: v for k, v in params.items() if k not in free}
    built = [p for p, _ in kernels.built_variants_of(device, template_name, kernel_name)]
    if params in built or kernels.is_built(device, template_name, **params):
        return params
    return next((p for p in built if p.keys() == params.keys() and all(p[k] == v for k, v in fixed.items())),
                params)
