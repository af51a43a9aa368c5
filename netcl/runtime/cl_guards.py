"""OpenCL C text for the tail guard of a kernel whose global size is rounded up past its data.

A CPU driver runs a work-group as a loop over its work-items and vectorizes that loop. A guard such as
``if (i >= n) return;`` is a condition that differs between work-items, so the vectorized loop masks every
load and store with it. Where the target has no mask registers (AVX2, which is what the PoCL wheel's
LLVM 14 compiles for on an AVX-512 Zen 4, named ``znver3``) the masked stores are ``vmaskmovps``,
microcoded on AMD CPUs, which makes a guarded ``y[i] -= a * x[i]`` several times slower than an unguarded
one; Debian's PoCL (AVX-512 masks) loses too with small work-groups (docs/explanation/gemm.md, "Tail
guards uniform per work-group").

So the guard is tested only in the one work-group that straddles the bound: ``whole && …`` is the same
for every work-item of a group, LLVM unswitches the work-item loop on it, and every other group runs the
loop without masks. The result is the same as the plain guard on every driver. Templates import it with
``<%! from netcl.runtime.cl_guards import beyond %>`` and write ``if (${beyond('i', 'n')}) return;``.
"""
from __future__ import annotations


def beyond(index: str, bound: str, dim: int = 0, group_first: str = "") -> str:
    """A C condition: ``index >= bound`` for a work-item whose group reaches ``bound``, false in groups
    that lie wholly below it. ``index`` must grow by one per work-item along ``dim`` from
    ``group_first``, the index of the group's first work-item (by default ``get_global_id(dim)``'s:
    no global offset)."""
    first = group_first or f"(long) get_group_id({dim}) * (long) get_local_size({dim})"
    return f"(({first}) + (long) get_local_size({dim}) > (long) ({bound}) && ({index}) >= ({bound}))"
