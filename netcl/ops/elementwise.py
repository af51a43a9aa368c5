"""Elementwise maps with NumPy broadcasting, strided copies and fills (kernels/elementwise.cl)."""
from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime import memory
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor

BINARY_EXPR = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "pow": "pow({0}, {1})",
    # NaN propagates (PyTorch's maximum/minimum), unlike OpenCL's max/fmax which drop it
    "maximum": "({0} > {1} || {0} != {0}) ? {0} : {1}", "minimum": "({0} < {1} || {0} != {0}) ? {0} : {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "and": "{0} & {1}", "or": "{0} | {1}", "xor": "{0} ^ {1}",
    # Python's (and PyTorch's) rounding: the quotient floors, the remainder takes the divisor's sign
    # floor((a - fmod(a, b)) / b) with PyTorch's corrections (div_floor_floating): 1.0 // 0.1 is 9, not 10
    "floordiv": "{1} == 0 ? {0} / {1} : (floor({D}) + ({D} - floor({D}) > ({T})0.5 ? ({T})1 : ({T})0))",
    "mod": "(fmod({0}, {1}) != 0 && (fmod({0}, {1}) < 0) != ({1} < 0)) ? fmod({0}, {1}) + {1} : fmod({0}, {1})",
}
# Integer forms: a zero divisor gives 0 and -1 negates, because x86 traps on both (a kernel cannot raise
# ZeroDivisionError as PyTorch does without waiting for the device).
INTEGER_EXPR = {
    "floordiv": "{1} == 0 ? ({T})0 : {1} == -1 ? -{0} : "
                "({0} / {1} - (({0} % {1} != 0) && (({0} < 0) != ({1} < 0))))",
    "mod": "({1} == 0 || {1} == -1) ? ({T})0 : "
           "({0} % {1} + (({0} % {1} != 0 && ({0} % {1} < 0) != ({1} < 0)) ? {1} : ({T})0))",
}
UNARY_EXPR = {
    "neg": "-{0}", "exp": "exp({0})", "log": "log({0})", "tanh": "tanh({0})", "sqrt": "sqrt({0})",
    "abs": "fabs({0})", "relu": "max({0}, ({T})0)", "sigmoid": "({T})1 / (({T})1 + exp(-{0}))",
    "relu_mask": "{0} > ({T})0 ? ({T})1 : ({T})0", "invert": "~{0}", "logical_not": "!{0}",
}
FLOAT_ONLY = {"exp", "log", "tanh", "sqrt", "sigmoid", "pow", "div"}
INTEGER_SAFE = {"neg", "abs", "relu", "relu_mask", "invert", "logical_not"}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
BITWISE = {"and", "or", "xor", "invert"}


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        sizes = {s[d - ndim + len(s)] for s in shapes if d - ndim + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ShapeError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_strides(t: Tensor, shape) -> tuple[int, ...]:
    pad = len(shape) - t.ndim
    strides = [0] * pad
    for n, s, target in zip(t.shape, t.strides, shape[pad:]):
        strides.append(0 if n == 1 and target != 1 else s)
    return tuple(strides)


def result_dtype(*operands) -> np.dtype:
    """PyTorch's promotion: tensors decide among themselves; a Python float lifts ints and bools to float32,
    a Python int lifts bools to int64."""
    tensor_dtypes = [o.dtype for o in operands if isinstance(o, Tensor)]
    dt = np.result_type(*tensor_dtypes) if tensor_dtypes else np.dtype(np.float32)
    if dt.kind != "f" and any(isinstance(o, (float, np.floating)) for o in operands):
        dt = np.dtype(np.float32)
    elif dt.kind == "b" and any(isinstance(o, numbers.Integral) and not isinstance(o, (bool, np.bool_))
                                for o in operands):
        dt = np.dtype(np.int64)
    return dtypes.as_dtype(dt)


def _collapse(shape, stride_sets):
    """Merge adjacent dimensions that are contiguous in every operand: fewer index divisions."""
    dims = [(n, [s[k] for s in stride_sets]) for k, n in enumerate(shape) if n != 1]
    if not dims:
        return (1,), [(0,) for _ in stride_sets]
    merged = [dims[0]]
    for n, strides in dims[1:]:
        pn, pstrides = merged[-1]
        if all(ps == s * n for ps, s in zip(pstrides, strides)):
            merged[-1] = (pn * n, strides)
        else:
            merged.append((n, strides))
    shape = tuple(n for n, _ in merged)
    return shape, [tuple(st[k] for _, st in merged) for k in range(len(stride_sets))]


def map_expr(template_expr: str, operands, out_dtype=None, compute_dtype=None) -> Tensor:
    """out = template_expr(operands) elementwise, with broadcasting. Operands are Tensors or numbers;
    ``template_expr`` uses {0}, {1}, ... for operands and {T} for the compute type's C name."""
    tensors = [o for o in operands if isinstance(o, Tensor)]
    if not tensors:
        raise DTypeError("an elementwise op needs at least one tensor operand")
    first = tensors[0]
    for t in tensors[1:]:
        first.same_device(t, "elementwise op")
    for o in operands:
        if not isinstance(o, (Tensor, numbers.Number)):
            raise DTypeError(f"cannot combine a tensor with {type(o).__name__}")
    compute = dtypes.as_dtype(compute_dtype) if compute_dtype is not None else result_dtype(*operands)
    out_dt = dtypes.as_dtype(out_dtype) if out_dtype is not None else compute
    shape = broadcast_shapes(*(t.shape for t in tensors))
    out = Tensor.empty(shape, out_dt, first.device)
    if out.size == 0:
        return out
    ct = dtypes.c_type(compute)
    names, args_t, args_s = [], [], []
    for o in operands:
        if isinstance(o, Tensor):
            names.append(f"a{len(args_t)}")
            args_t.append(o)
        else:
            names.append(f"s{len(args_s)}")
            args_s.append(o)
    expr = template_expr.format(*names, T=ct)
    if out_dt == dtypes.BOOL:
        expr = f"(({expr}) != ({ct})0)"  # a bool is stored as exactly 0 or 1, whatever the expression gave
    stride_sets = [broadcast_strides(t, shape) for t in args_t]
    contiguous = all(t.shape == shape and t.is_contiguous() for t in args_t)
    if contiguous:
        ndim, meta = 0, memory.meta_buffer(first.device, (0,))
    else:
        cshape, cstrides = _collapse(shape, stride_sets)
        ndim = len(cshape)
        meta = memory.meta_buffer(first.device, cshape + sum(cstrides, ()))
    kernel = get_kernel(first.device, "elementwise.cl", "elementwise", OUT_TYPE=dtypes.c_type(out_dt),
                        IN_TYPES=tuple(dtypes.c_type(t.dtype) for t in args_t), N_SCALARS=len(args_s),
                        COMPUTE_TYPE=ct, EXPR=expr, NDIM=ndim)
    args = [out.buffer, np.int64(out.offset)]
    for t in args_t:
        args += [t.buffer, np.int64(t.offset)]
    args += [np.uint8(bool(s)) if compute == dtypes.BOOL else compute.type(s) for s in args_s]
    args += [meta, np.int64(out.size)]
    launch(first.device, kernel, (out.size,), local_size_1d(first.device, out.size), *args)
    return out


def binary(op: str, a, b) -> Tensor:
    """a <op> b with broadcasting. Comparisons give bool; div and pow of ints compute in float32 (true
    division, as PyTorch's default dtype); and/or/xor take ints and bools."""
    if op not in BINARY_EXPR:
        raise ValueError(f"unknown binary op {op!r}")
    dt = result_dtype(a, b)
    if op in COMPARISONS:
        return map_expr(BINARY_EXPR[op], [a, b], out_dtype=dtypes.BOOL, compute_dtype=dt)
    if op in BITWISE and dt.kind == "f":
        raise DTypeError(f"{op} takes int or bool tensors, got {dt}")
    if op in FLOAT_ONLY and dt.kind != "f":
        return map_expr(BINARY_EXPR[op], [a, b], compute_dtype=np.float32)
    if op == "floordiv" and dt.kind == "f":
        quotient = ("((({0} - fmod({0}, {1})) / {1}) - ((fmod({0}, {1}) != 0 && ({1} < 0) != (fmod({0}, {1}) < 0))"
                    " ? ({T})1 : ({T})0))")
        return map_expr(BINARY_EXPR[op].replace("{D}", quotient), [a, b], compute_dtype=dt)
    if op in INTEGER_EXPR and dt.kind != "f":
        if dt == dtypes.BOOL:
            raise DTypeError(f"{op} of bool tensors")
        return map_expr(INTEGER_EXPR[op], [a, b], compute_dtype=dt)
    return map_expr(BINARY_EXPR[op], [a, b], compute_dtype=dt)


def unary(op: str, a: Tensor) -> Tensor:
    if op not in UNARY_EXPR:
        raise ValueError(f"unknown unary op {op!r}")
    if a.dtype.kind != "f" and op not in INTEGER_SAFE:
        raise DTypeError(f"{op} needs a float tensor, got {a.dtype}")
    if op in BITWISE and a.dtype.kind == "f":
        raise DTypeError(f"{op} takes an int or bool tensor, got {a.dtype}")
    if op == "invert" and a.dtype == dtypes.BOOL:
        op = "logical_not"  # ~mask flips a bool, as in PyTorch (a bitwise ~ of 1 would give 254)
    if op == "abs" and a.dtype.kind != "f":
        return map_expr("{0} < 0 ? -{0} : {0}", [a])  # fabs is float-only in OpenCL C
    return map_expr(UNARY_EXPR[op], [a])


def cast(a: Tensor, dtype) -> Tensor:
    dtype = dtypes.as_dtype(dtype)
    # to bool compares in the source type (0.5 is True); other casts convert first
    return map_expr("{0}", [a], out_dtype=dtype, compute_dtype=a.dtype if dtype == dtypes.BOOL else dtype)


def where(cond: Tensor, a, b) -> Tensor:
    """cond ? a : b elementwise with broadcasting; a and b are tensors or numbers, cond any dtype (nonzero
    is true)."""
    if not isinstance(cond, Tensor):
        raise DTypeError(f"where's condition is a tensor, got {type(cond).__name__}")
    if cond.dtype != dtypes.BOOL:
        cond = cast(cond, dtypes.BOOL)
    dt = result_dtype(a, b)
    return map_expr("{0} != ({T})0 ? {1} : {2}", [cond, a, b], out_dtype=dt, compute_dtype=dt)


def clamp(x: Tensor, low=None, high=None) -> Tensor:
    """min(max(x, low), high) elementwise (NaN stays NaN; low > high gives high, as PyTorch); bounds are
    tensors, numbers or None."""
    if low is None and high is None:
        raise ShapeError("clamp needs at least one of min and max")
    operands = [x] + [v for v in (low, high) if v is not None]
    dt = result_dtype(*operands)
    if low is not None and high is not None:
        expr = "(({0} < {1} ? {1} : {0}) > {2} ? {2} : ({0} < {1} ? {1} : {0}))"
    elif low is not None:
        expr = "({0} < {1} ? {1} : {0})"
    else:
        expr = "({0} > {1} ? {1} : {0})"
    return map_expr(expr, operands, compute_dtype=dt)


def copy_into(dst: Tensor, src: Tensor) -> Tensor:
    """dst[...] = src, broadcasting src; dst may be any strided view (its elements must not overlap)."""
    _copy_elements(dst, src)
    dst.mark_written()
    return dst


def _copy_elements(dst: Tensor, src: Tensor) -> Tensor:
    dst.same_device(src, "copy")
    if src.dtype != dst.dtype:
        src = cast(src, dst.dtype)
    shape = dst.shape
    broadcast_shapes(shape, src.shape)
    if dst.size == 0:
        return dst
    if src.shape == shape and src.is_contiguous() and dst.is_contiguous() and (
            src.buffer is not dst.buffer or abs(src.offset - dst.offset) >= dst.size):
        itemsize = dst.dtype.itemsize
        memory.copy(dst.device, dst.buffer, src.buffer, dst.nbytes, dst.offset * itemsize, src.offset * itemsize)
        return dst
    cshape, (dstr, sstr) = _collapse(shape, [dst.strides, broadcast_strides(src, shape)])
    meta = memory.meta_buffer(dst.device, cshape + dstr + sstr)
    kernel = get_kernel(dst.device, "copy.cl", "strided_copy", T=dtypes.c_type(dst.dtype), NDIM=len(cshape))
    launch(dst.device, kernel, (dst.size,), local_size_1d(dst.device, dst.size),
           dst.buffer, np.int64(dst.offset), src.buffer, np.int64(src.offset), meta, np.int64(dst.size))
    return dst


def contiguous_copy(a: Tensor) -> Tensor:
    out = Tensor.empty(a.shape, a.dtype, a.device)
    return _copy_elements(out, a)  # a fresh tensor: no write to count


def as_contiguous(a: Tensor) -> Tensor:
    """``a`` itself when its elements are contiguous, else a contiguous copy. Records no graph (ops run
    below autograd, unlike ``Tensor.contiguous``, which goes through its rule)."""
    return a if a.is_contiguous() else contiguous_copy(a)


def contiguous_view(a: Tensor, shape) -> Tensor:
    """``a``'s elements in ``shape`` (as many), viewed contiguously: ``a`` is copied first when it is not
    contiguous. Records no graph (the op-level ``Tensor.reshape``)."""
    shape = tuple(int(n) for n in shape)
    if int(np.prod(shape, dtype=np.int64)) != a.size:
        raise ShapeError(f"cannot view {a.size} elements of shape {a.shape} as {shape}")
    a = as_contiguous(a)
    return Tensor(a.buffer, shape, a.dtype, a.device, None, a.offset)


def fill(t: Tensor, value) -> Tensor:
    """Fill a contiguous tensor in place."""
    if t.size == 0:
        return t
    if t.is_contiguous():
        pattern = np.uint8(bool(value)) if t.dtype == dtypes.BOOL else t.dtype.type(value)
        memory.fill(t.device, t.buffer, pattern, t.nbytes, t.offset * t.dtype.itemsize)
    else:
        _copy_elements(t, Tensor.from_host(np.asarray(value, dtype=t.dtype), t.device))
    t.mark_written()
    return t
