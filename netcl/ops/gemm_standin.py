"""Products during the cold start: one whose own kernel is not built yet runs on a GEMM kernel that is.

A LeNet training step makes products of five shape classes, and each class's tile is a program of its own:
on PoCL their builds and first launches are a large part of a cold first step. Any tile computes any
product, so until the first step is over (netcl.runtime.first_step) a product whose program is neither built
nor in the disk cache borrows one this process has built (same dtype, a packing of B it can serve, a
work-group shape it was launched with, so no new code is generated), and builds its own at its first
call after that step.
"""
from __future__ import annotations

from ..runtime import first_step, kernels


def lenders(dev, c_type: str) -> list[tuple[dict, tuple[int, int]]]:
    """(template parameters without T, (WG_M, WG_N)) of every product kernel of element type ``c_type``
    this process has launched on ``dev``'s context, once per work-group shape it ran with, oldest first.
    Local-memory tiles are not lent: they have their own limits on the work-group; nor kernels with an
    epilogue (netcl.ops.gemm.gemm_batched's bias, residual, activation)."""
    found = []
    for params, launched in kernels.built_variants_of(dev, "gemm.cl", "gemm_tiled"):
        if params.pop("T") != c_type or params["LOCAL"]:
            continue
        if params.get("BIAS") or params.get("RESIDUAL") or params.get("ACT", "none") != "none":
            continue  # an epilogue's kernel changes what it stores
        for local in sorted(launched):  # (WG_N, WG_M, 1) in "nm" grid order, (WG_M, WG_N, 1) in "mn"
            found.append((params, (local[1], local[0]) if params["ORDER"] == "nm" else (local[0], local[1])))
    return found


def stand_in(dev, c_type: str, template_params: dict, b_unit_stride: bool):
    """(template parameters, (WG_M, WG_N)) of a built kernel to run this product on now, or None when the
    product should build its own: after the first step, when its own is at hand, or when none fits."""
    if not first_step.in_progress(dev):
        return None
    held = [(tp, wg) for tp, wg in lenders(dev, c_type) if b_unit_stride or tp["PACK_B"]]
    if not held or kernels.is_built(dev, "gemm.cl", T=c_type, **template_params):
        return None
    # a kernel with the same packing launches no pack kernel this product would not have launched
    wanted = (template_params["PACK_A"], template_params["PACK_B"])
    return min(held, key=lambda e: ((e[0]["PACK_A"], e[0]["PACK_B"]) != wanted, e[0]["PACK_A"] + e[0]["PACK_B"]))
