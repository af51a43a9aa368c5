"""Which operands of a product are packed into panels first: the single statement of the packing rules
(docs/explanation/gemm.md, "The packing rules"); and the buffers they are packed into."""
from __future__ import annotations

import math

from ..runtime import memory

# A product this small runs in about the time of one launch on a CPU driver: it has its own tuning
# class, and packing an operand (one more launch) would double its time.
TINY_PRODUCT_FLOP = 4_000_000
# An operand this small is re-read from L1 anyway: packing it would only add a launch.
SMALL_OPERAND_BYTES = 32 * 1024


def set_conflicts(k: int, row_bytes: int, tile_bytes: int, line: int = 64, sets: int = 64, ways: int = 8) -> bool:
    """Whether a k-row strip of B (tile_bytes wide, rows row_bytes apart) overflows the cache sets its rows
    map to (a typical 32 KiB 8-way L1): a stride with a large power-of-two factor reuses few sets. Such a
    B is packed; other strips are read in place, saving the pack launch. Strips of at most 128 lines are
    always read in place: L2 absorbs their conflicts, and the pack would cost more than it saves."""
    lines = k * -(-tile_bytes // line)
    used = sets // math.gcd(row_bytes // line, sets) if row_bytes % line == 0 else sets
    return lines > max(used * ways // 2, 128)


def packing(p: dict, itemsize: int, M: int, N: int, K: int, a_cs: int, b_rs: int, b_cs: int, batch: int,
             explicit: bool = False):
    """(pack A?, pack B?) for one product: the single statement of the packing rules
    (docs/explanation/gemm.md). ``explicit``: the caller passed the parameters, and PACK_A=1 then packs
    A whatever its size."""
    # An operand that each tile reads once (A when N fits one panel, B when M fits one) gains nothing
    # from a pack but its launch; one that fits in L1 is re-read from there anyway. Otherwise A read down
    # its columns (a transposed operand) touches one cache line per k: pack it.
    once_a = N <= p["VW"] * p["NV"] or 2 * M * N * K * batch <= TINY_PRODUCT_FLOP
    once_b = M <= p["MR"]
    small_a = M * K * itemsize <= SMALL_OPERAND_BYTES or once_a
    pack_a = ((bool(p["PACK_A"]) and (explicit or not small_a))
              or (a_cs != 1 and M > 1 and K > 1 and not small_a))
    direct_ok = b_cs == 1 and (K * N * itemsize <= SMALL_OPERAND_BYTES or once_b
                               or not set_conflicts(K, b_rs * itemsize, p["VW"] * p["NV"] * itemsize))
    # B must have unit stride along N: a strided B is packed whatever it costs.
    pack_b = (bool(p["PACK_B"]) and not direct_ok) or (b_cs != 1 and N > 1)
    return int(pack_a and K > 0), int(pack_b and K > 0)


# Packing buffers, kept in the device's state (netcl.runtime.device_state) and grown on demand: a fresh
# multi-megabyte buffer per call costs page faults comparable to the product itself on a CPU device.
# Reuse is safe because every launch goes to the device's one in-order queue, so a later pack cannot
# overtake an earlier product. A recorded training step (a recording with an arena) takes its packing
# buffers as short-lived allocations of its own instead: each dies with the product that used it, so the
# step's static memory plan (netcl.runtime.recording.Recording.compacted) overlaps them with the other
# tensors of the step, and its replay needs no packing buffer beside its slab.
WORKSPACES = "gemm packing workspaces"


def workspace(device, slot: str, nbytes: int):
    """The device's packing buffer ``slot`` ("a" or "b"), at least ``nbytes`` long; inside a recording
    with an arena, a buffer of the recorded step's own."""
    if memory.recording_arena(device) is not None:
        return memory.allocate(device, nbytes)
    state = device.state
    with state.lock:
        held_buffers = state.table(WORKSPACES)
        held = held_buffers.get(slot)
        if held is None or held[1] < nbytes:
            held_buffers.pop(slot, None)
            held = held_buffers[slot] = (memory.allocate(device, nbytes), nbytes)
        return held[0]


def release_workspaces(device) -> None:
    """Free ``device``'s packing buffers (they are re-allocated by the next product that needs them)."""
    device.state.drop(WORKSPACES)
