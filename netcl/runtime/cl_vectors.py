"""OpenCL C text for vector loads, stores and minima without OpenCL built-in functions, for kernel templates.

A driver whose built-in library was compiled for other CPU features than the kernel cannot inline
``vloadN``, ``vstoreN``, ``fma`` or ``min`` (the PoCL wheel on CPUs its LLVM does not know;
docs/explanation/gemm.md): each becomes a function call, which makes the GEMM several times slower, and
with 16-lane vectors LLVM 14 aborts the process ("Do not know how to scalarize this operator's operand!").
Vectors assembled from element loads and stored element by element compile to the same unaligned vector
loads and stores, and ``a * b + c`` is contracted into an FMA where the target has one. Templates import
these with
``<%! from netcl.runtime.cl_vectors import vload, vstore, lesser %>``.

Element loads that overlap, such as the taps of one row of a convolution (elements 0-15, 1-16, 2-17),
are the exception: LLVM assembles them from pieces and shuffles. A template that reads such runs declares
an unaligned vector type (``unaligned_vector_typedef``) and loads and stores through it
(``unaligned_load``, ``unaligned_store``): a pointer cast, no built-in function.
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


UNALIGNED_VECTOR = "unaligned_vector"


def unaligned_vector_typedef(vector_type: str, element_bytes: int) -> str:
    """The declaration of UNALIGNED_VECTOR: ``vector_type`` at the alignment of one element, so that a
    pointer to it may point at any element."""
    return "typedef %s %s __attribute__((aligned(%d)));" % (vector_type, UNALIGNED_VECTOR, element_bytes)


def unaligned_load(width: int, ptr: str, offset: str = "0") -> str:
    """The ``width`` consecutive elements from ``ptr[offset]`` on as one load through UNALIGNED_VECTOR
    (the element itself when width is 1)."""
    if width == 1:
        return "(%s)[%s]" % (ptr, offset)
    return "(*(__global const %s*)((%s) + %s))" % (UNALIGNED_VECTOR, ptr, offset)


def unaligned_store(width: int, ptr: str, value: str) -> str:
    """A statement storing vector ``value`` at ``ptr[0 .. width)`` through UNALIGNED_VECTOR."""
    if width == 1:
        return "*(%s) = %s;" % (ptr, value)
    return "*(__global %s*)(%s) = %s;" % (UNALIGNED_VECTOR, ptr, value)


def even_odd_definition(vector_type: str, width: int) -> str:
    """An inline OpenCL function ``even_odd(low, high)``: the even lanes of ``low``, then the odd lanes of
    ``high`` (a stride-2 run from two consecutive loads). The lanes are named one by one, which LLVM
    turns into one shuffle; PoCL's ``shuffle2`` built-in with a mask vector picks lane by lane."""
    lanes = ["low.s%x" % lane for lane in range(0, width, 2)] + ["high.s%x" % lane for lane in range(1, width, 2)]
    return ("inline %s even_odd(const %s low, const %s high)\n{\n    return (%s)(%s);\n}"
            % (vector_type, vector_type, vector_type, vector_type, ", ".join(lanes)))
