"""OpenCL C text for the activations a kernel applies to its results as it stores them (an epilogue).

The convolution kernels that fuse an inference epilogue (kernels/conv_blocked.cl, implicit_gemm.cl,
conv_depthwise.cl, winograd.cl, winograd_plane.cl) and BatchNorm's apply kernel (kernels/batchnorm.cl)
take the activation from here, so the arithmetic is written once and a fused epilogue gives the same bits
as the separate pass:
  relu       z > 0 ? z : 0
  relu6      the ReLU, then z < 6 ? z : 6
  hardswish  z · (gate < 0 ? 0 : (gate > 6 ? 6 : gate)) / 6 with gate = z + 3
The text works on a scalar or a vector value alike: a vector ternary is a per-lane select, and no OpenCL
built-in function is called (netcl.runtime.cl_vectors says why). Templates import it with
``<%! from netcl.runtime.cl_activation import apply_activation %>``.
"""
from __future__ import annotations

from ..errors import ShapeError

ACTIVATIONS = ("none", "relu", "relu6", "hardswish")


def apply_activation(activation: str, value: str, value_type: str) -> str:
    """Statements applying ``activation`` (one of ACTIVATIONS) in place to the variable ``value`` of C type
    ``value_type`` (a scalar or vector type: the constants are cast to it)."""
    if activation not in ACTIVATIONS:
        raise ShapeError(f"unknown epilogue activation {activation!r}; expected one of {ACTIVATIONS}")
    zero, three, six = ("(%s) %d" % (value_type, c) for c in (0, 3, 6))
    if activation == "none":
        return ""
    relu = "%s = %s > %s ? %s : %s;" % (value, value, zero, value, zero)
    if activation == "relu":
        return relu
    if activation == "relu6":
        return relu + " %s = %s < %s ? %s : %s;" % (value, value, six, value, six)
    return ("{ const %s gate = %s + %s; %s = %s * (gate < %s ? %s : (gate > %s ? %s : gate)) / %s; }"
            % (value_type, value, three, value, value, zero, zero, six, six, six))


def apply_epilogue(value: str, value_type: str, bias: str | None = None, residual: str | None = None,
                   activation: str = "none") -> str:
    """Statements applying an inference epilogue in place to the variable ``value``: add ``bias`` (a C
    expression, or None), then ``residual`` (likewise), then ``activation``: the order and arithmetic of
    kernels/batchnorm.cl's bn_apply with SHIFT_ONLY, so a fused epilogue gives the separate pass's bits.
    The GEMM's, depthwise's and Winograd's stores use it; conv_blocked.cl and implicit_gemm.cl build
    their residual vectors with per-lane bounds tests and take only the activation from here."""
    steps = []
    if bias is not None:
        steps.append(f"{value} = {value} + ({value_type})({bias});")
    if residual is not None:
        steps.append(f"{value} += ({value_type})({residual});")
    steps.append(apply_activation(activation, value, value_type))
    return " ".join(s for s in steps if s)
