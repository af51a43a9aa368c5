"""Products during the cold start: one whose own kernel is not built yet runs on a GEMM kernel that is.

A LeNet training step makes products of five shape classes, and each class's tile is a program of its own:
on PoCL 3.1 five builds and six first launches, 2.5 s of a 6 s cold first step. Any tile computes any
product, so until the first step is over (netcl.runtime.first_step) a product whose program is neither built
nor in the disk cache borrows one this process has built (same dtype, a packing of B it can serve, the
work-group shape it was launched with, so no new code is generated), and builds its own at its first
call after that step.
"""
from __future__ import annotations

from ..runtime import first_step, kernels
from ..runtime.memo import DeviceMemo

_built = DeviceMemo("gemm kernels built", scope="context")


def remember(dev, dtype_char: str, template_params: dict, work_group: tuple[int, int]) -> None:
    """A product kernel this process has built and launched with ``work_group`` (WG_M, WG_N)."""
    if template_params["LOCAL"]:
        return  # local-memory tiles have their own limits on the work-group; they are not lent
    entry = (dict(template_params), tuple(work_group))
    held = _built.get_or_make(dev, dtype_char, list)
    if entry not in held:
        held.append(entry)


def stand_in(dev, dtype_char: str, c_type: str, template_params: dict, b_unit_stride: bool):
    """(template parameters, (WG_M, WG_N)) of a built kernel to run this product on now, or None when the
    product should build its own: after the first step, when its own is at hand, or when none fits."""
    if not first_step.in_progress():
        return None
    held = [(tp, wg) for tp, wg in _built.get(dev, dtype_char, ()) if b_unit_stride or tp["PACK_B"]]
    if not held or kernels.is_built(dev, "gemm.cl", T=c_type, **template_params):
        return None
    # a kernel with the same packing launches no pack kernel this product would not have launched
    wanted = (template_params["PACK_A"], template_params["PACK_B"])
    return min(held, key=lambda e: ((e[0]["PACK_A"], e[0]["PACK_B"]) != wanted, e[0]["PACK_A"] + e[0]["PACK_B"]))
