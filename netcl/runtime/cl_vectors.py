"""OpenCL C text for vector loads, stores and minima without OpenCL built-in functions, for kernel templates.

A driver whose built-in library was compiled for other CPU features than the kernel cannot inline
``vloadN``, ``vstoreN``, ``fma`` or ``min`` (the PoCL wheel on CPUs its LLVM does not know;
docs/explanation/gemm.md): each becomes a function call, which makes the GEMM several times slower, and
with 16-lane vectors LLVM 14 aborts the process ("Do not know how to scalarize this operator's operand!").
Vectors assembled from element loads and stored element by element compile to the same unaligned vector
loads and stores, and ``a * b + c`` is contracted into an FMA where the target has one. Templates import
these with
``<%! from netcl.runtime.cl_vectors import vload, vstore, lesser %>``.
"""
from __future__ import annotations


def vload(vector_type: str, width: int, ptr: str, element_type: str = "") -> str:
    """``width`` consecutive elements at ``ptr`` as one ``vector_type`` value (the element when width is 1);
    with ``element_type``, each element converted to it first (a widening load without ``convert_``)."""
    cast = "(%s)" % element_type if element_type else ""
    if width == 1:
        return "%s*(%s)" % (cast, ptr)
    return "(%s)(%s)" % (vector_type, ", ".join("%s(%s)[%d]" % (cast, ptr, lane) for lane in range(width)))


def vstore(value: str, width: int, ptr: str) -> str:
    """Statements storing the ``width`` lanes of ``value`` at ``ptr`` (``value`` may be evaluated per lane)."""
    if width == 1:
        return "*(%s) = %s;" % (ptr, value)
    return " ".join("(%s)[%d] = (%s).s%x;" % (ptr, lane, value, lane) for lane in range(width))


def lesser(a: str, b: str) -> str:
    """The smaller of two scalar expressions, each evaluated twice (give it names or constants)."""
    return "(%s < %s ? %s : %s)" % (a, b, a, b)
