"""General matrix products: gemm(a, b, c=None, alpha, beta, trans_a, trans_b) and a batched form.

Operands may be any 2-D (3-D for batched) views: the kernels address them through offsets and
strides, so transposed or sliced operands are not copied.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor


def _check_operands(a: Tensor, b: Tensor, c: Tensor | None, rank: int, what: str):
    for name, t in (("a", a), ("b", b)) + ((("c", c),) if c is not None else ()):
        if not isinstance(t, Tensor):
            raise DTypeError(f"{what}: operand {name} must be a netcl Tensor, got {type(t).__name__}")
        if t.ndim != rank:
            raise ShapeError(f"{what}: operand {name} must be {rank}-D, got shape {t.shape}")
        if t.dtype not in dtypes.FLOAT_DTYPES:
            raise DTypeError(f"{what}: operand {name} must be float32 or float64, got {t.dtype}")
    a.same_device(b, what)
    if a.dtype != b.dtype or (c is not None and c.dtype != a.dtype):
        raise DTypeError(f"{what}: dtypes differ: a {a.dtype}, b {b.dtype}" + (f", c {c.dtype}" if c is not None else ""))
    if c is not None:
        a.same_device(c, what)


def _op_dims(t: Tensor, trans: bool):
    """(rows, cols, row stride, col stride) of op(t) for the last two axes."""
    r, k = t.shape[-2:]
    rs, cs = t.strides[-2:]
    return (k, r, cs, rs) if trans else (r, k, rs, cs)


def gemm_batched(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
                 trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for 3-D operands; a batch of 1 broadcasts."""
    _check_operands(a, b, c, 3, "gemm_batched")
    M, K, a_rs, a_cs = _op_dims(a, trans_a)
    K2, N, b_rs, b_cs = _op_dims(b, trans_b)
    batch = max(a.shape[0], b.shape[0])
    if K != K2 or a.shape[0] not in (1, batch) or b.shape[0] not in (1, batch):
        raise ShapeError(f"gemm_batched: op(a) of shape {(a.shape[0], M, K)} and op(b) of shape "
                         f"{(b.shape[0], K2, N)} do not multiply (trans_a={trans_a}, trans_b={trans_b})")
    if c is None:
        c = Tensor.empty((batch, M, N), a.dtype, a.device)
        beta = 0.0
    elif c.shape != (batch, M, N):
        raise ShapeError(f"gemm_batched: c has shape {c.shape}, expected {(batch, M, N)}")
    if c.size == 0:
        return c
    if K == 0:
        from .elementwise import fill
        if beta == 0.0:
            return fill(c, 0.0)
    a_bs = a.strides[0] if a.shape[0] > 1 else 0
    b_bs = b.strides[0] if b.shape[0] > 1 else 0
    T = dtypes.c_type(a.dtype)
    kernel = get_kernel(a.device, "gemm.cl", "gemm_reference", T=T)
    scalar = a.dtype.type
    launch(a.device, kernel, (N, M, batch), None,
           np.int32(M), np.int32(N), np.int32(K), np.int32(batch), scalar(alpha), scalar(beta),
           a.buffer, np.int64(a.offset), np.int64(a_rs), np.int64(a_cs), np.int64(a_bs),
           b.buffer, np.int64(b.offset), np.int64(b_rs), np.int64(b_cs), np.int64(b_bs),
           c.buffer, np.int64(c.offset), np.int64(c.strides[1]), np.int64(c.strides[2]), np.int64(c.strides[0]))
    return c


def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
         trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """alpha * op(a) @ op(b) + beta * c for 2-D operands (op = transpose when trans_* is set)."""
    _check_operands(a, b, c, 2, "gemm")
    M, K = _op_dims(a, trans_a)[:2]
    K2, N = _op_dims(b, trans_b)[:2]
    if K != K2:
        raise ShapeError(f"gemm: op(a) of shape {(M, K)} (a {a.shape}, trans_a={trans_a}) and op(b) of shape "
                         f"{(K2, N)} (b {b.shape}, trans_b={trans_b}) do not multiply")
    if c is not None and c.shape != (M, N):
        raise ShapeError(f"gemm: c has shape {c.shape}, expected {(M, N)} for a {a.shape} and b {b.shape}")
    out = gemm_batched(_as3(a), _as3(b), _as3(c) if c is not None else None, alpha, beta, trans_a, trans_b)
    return c if c is not None else out.reshape((M, N))


def _as3(t: Tensor) -> Tensor:
    return Tensor(t.buffer, (1,) + t.shape, t.dtype, t.device, (0,) + t.strides, t.offset)
