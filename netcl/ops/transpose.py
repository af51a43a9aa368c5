"""Batched strided 2-D transposes (kernels/transpose.cl): layout changes whose contiguous axis moves, so
that a gather copy would read or write with a stride."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import DTypeError
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor

TILE, ROWS = 32, 8      # the local-memory form (GPUs)
DIRECT_TILE = 8         # columns per work-item in the direct form (CPUs; 8 measured best on PoCL)


def transpose_into(dst: Tensor, src: Tensor, rows: int, cols: int, src_row_stride: int,
                   row_split=None, col_split=None, batches: int = 1, batch_strides=(0, 0)) -> Tensor:
    """For b < batches, r < rows, c < cols (src's columns and dst's rows contiguous):

        dst[b*DB + (r // RLO)*DRH + r % RLO + (c // CLO)*DCH + (c % CLO)*DCL] = src[b*SB + r*SR + c]

    with SR = src_row_stride, (RLO, DRH) = row_split (default: rows, 0), (CLO, DCH, DCL) = col_split
    (default: cols, 0, rows) and (SB, DB) = batch_strides, all in elements from each tensor's offset."""
    if src.dtype != dst.dtype:
        raise DTypeError(f"transpose: src is {src.dtype}, dst is {dst.dtype}")
    if rows * cols * batches == 0:
        return dst
    rlo, drh = row_split or (rows, 0)
    clo, dch, dcl = col_split or (cols, 0, rows)
    if src.device.kind == "cpu":
        kernel = get_kernel(src.device, "transpose.cl", "transpose_tiles", T=dtypes.c_type(src.dtype),
                            FORM="direct", TILE=DIRECT_TILE)
        geometry = (rows, -(-cols // DIRECT_TILE), batches), (min(64, rows), 1, 1)
    else:
        kernel = get_kernel(src.device, "transpose.cl", "transpose_tiles", T=dtypes.c_type(src.dtype),
                            FORM="local", TILE=TILE, ROWS=ROWS)
        geometry = (-(-cols // TILE) * TILE, -(-rows // TILE) * ROWS, batches), (TILE, ROWS, 1)
    launch(src.device, kernel, *geometry,
           src.buffer, np.int64(src.offset), dst.buffer, np.int64(dst.offset), np.int32(rows), np.int32(cols),
           np.int64(src_row_stride), np.int64(batch_strides[0]), np.int64(batch_strides[1]),
           np.int32(rlo), np.int64(drh), np.int32(clo), np.int64(dch), np.int64(dcl))
    return dst
