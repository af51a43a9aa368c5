"""im2col / col2im: the lowering of a convolution input to a matrix and its adjoint.

``im2col(x, kh, kw, ...)`` gives the (N·Ho·Wo, C·kh·kw) matrix of the public API (row = one receptive field,
column = one (channel, tap)); ``transposed=True`` gives its (C·kh·kw, N·Ho·Wo) transpose, the memo's layout
that the im2col conv strategy feeds to GEMM. ``col2im`` adds a column matrix back into an input-shaped
tensor: by atomic scatter-add, or by the deterministic gather form, which runs in deterministic mode
(``nc.use_deterministic``, ``NETCL_DETERMINISTIC``) and on CPUs, where it is faster. Kernels:
kernels/im2col.cl, kernels/col2im.cl.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes, settings
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch, local_size_1d
from ..tensor import Tensor
from .conv_common import ConvLayer
from .elementwise import as_contiguous

VEC = 4  # column entries per work-item: amortizes the index decode without hurting coalescing
_INT_LIMIT = 2**31 - 1


def _kernel_size(value, name: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ShapeError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _layer(input_shape, kernel_h, kernel_w, stride, padding, dilation, dtype) -> ConvLayer:
    """The conv geometry (one output channel, no groups) that fixes the column matrix's shape."""
    input_shape = tuple(input_shape)
    if len(input_shape) != 4:
        raise ShapeError(f"im2col/col2im work on a 4-D (N, C, H, W) input, got shape {input_shape}")
    kh, kw = _kernel_size(kernel_h, "kernel_h"), _kernel_size(kernel_w, "kernel_w")
    return ConvLayer.from_shapes(input_shape, (1, input_shape[1], kh, kw), stride, padding, dilation, 1, dtype)


def cols_shape(layer: ConvLayer, transposed: bool) -> tuple[int, int]:
    rows, cols = layer.n * layer.out_h * layer.out_w, layer.c * layer.r * layer.s
    return (cols, rows) if transposed else (rows, cols)


def _params(layer: ConvLayer, dtype, transposed: bool, local: int, runs: int = 0,
            chunks_per_item: int = 0) -> dict:
    # the largest index any work-item forms, including the first entry of a padding work-item's run
    per_item = chunks_per_item * _chunk_lanes(dtype) if chunks_per_item else max(runs, VEC)
    biggest = max(layer.n * layer.out_h * layer.out_w * layer.c * layer.r * layer.s,
                  layer.n * layer.c * layer.h * layer.w) + local * per_item
    return dict(T=dtypes.c_type(dtype), IDX="int" if biggest <= _INT_LIMIT else "long",
                TRANSPOSED=int(bool(transposed)), RUNS=int(runs > 0), CHUNKS=int(chunks_per_item > 0),
                VEC=chunks_per_item or runs or VEC, LOCAL=local,
                N=layer.n, C=layer.c, H=layer.h, W=layer.w, R=layer.r, S=layer.s, P=layer.out_h, Q=layer.out_w,
                SH=layer.stride_h, SW=layer.stride_w, PH=layer.pad_h, PW=layer.pad_w, DH=layer.dil_h, DW=layer.dil_w)


def _chunk_lanes(dtype) -> int:
    """Entries per chunk of the chunk form: one 32-byte vector store."""
    return 32 // np.dtype(dtype).itemsize



def _layer_kernel(device, template: str, name: str, layer: ConvLayer, dtype, transposed: bool, local: int,
                  runs: int = 0, chunks_per_item: int = 0):
    """get_kernel for one layer's geometry, memoized on the layer itself: rebuilding the parameter dict
    and its sorted key costs a noticeable share of a small layer's whole im2col."""
    key = (template, name, layer, np.dtype(dtype).str, bool(transposed), local, runs, chunks_per_item)
    table = device.state.table("im2col layer kernels")
    kernel = table.get(key)
    if kernel is None:
        if len(table) > 4096:
            table.clear()
        kernel = table[key] = get_kernel(device, template, name,
                                         **_params(layer, dtype, transposed, local, runs, chunks_per_item))
    return kernel


def _flat_launch(device, kernel, total: int, local: int, per_item: int, *args):
    groups = -(-total // (local * per_item))
    launch(device, kernel, (groups * local,), (local,), *args)


def run_length(device, layer: ConvLayer, transposed: bool, local: int, lanes: int = 0) -> int:
    """Work per work-item for the run form of im2col, or 0 for the interleaved form: whole output rows
    (Q entries each) for the transposed layout, entries for the row layout, chunks of ``lanes`` entries
    for the chunk form (``lanes`` > 0).

    CPUs run a work-group's items one after another, so a work-item that walks a contiguous run of the
    matrix (one closed-form decode, then vectorizable row copies) beats per-entry index arithmetic several
    times over there; GPUs want neighbouring work-items on neighbouring entries (the interleaved form). Runs are as
    long as possible (up to about 2048 entries: longer ones measured no faster) while still leaving two
    work-groups per compute unit."""
    if device.kind != "cpu":
        return 0
    units, entries_per_unit = _run_units(layer, transposed, lanes)
    fit = units // max(1, device.compute_units * local * 2)
    cap = max(1, 2048 // entries_per_unit)
    longest = max(1, min(cap, fit))
    return max(1 if transposed or lanes else 16, 1 << longest.bit_length() - 1)


def _run_units(layer: ConvLayer, transposed: bool, lanes: int = 0) -> tuple[int, int]:
    """(how many units the run form's launch covers, entries per unit)."""
    total = layer.c * layer.r * layer.s * layer.n * layer.out_h * layer.out_w
    if lanes:
        return total // lanes + 1, lanes
    if transposed:
        return layer.c * layer.r * layer.s * layer.n * layer.out_h, layer.out_w
    return total, 1


def chunk_form(device, layer: ConvLayer, dtype, transposed: bool) -> bool:
    """Whether the chunk form writes this layer's matrix: on a CPU, for the transposed layout of a layer
    without padding (every tap inside the input) whose rows hold at least one chunk, when the matrix is
    larger than the last-level cache. Its stores then stream past the cache (cv4 of the MEC paper, 149 MB:
    0.42–0.46 → median 0.52 of copy bandwidth); a matrix that fits is better left in the cache for the GEMM
    that reads it next, and with ordinary stores the form measured slower than the run form. Its aligned
    stores need buffers aligned to 32 bytes, which OpenCL drivers give (CL_DEVICE_MEM_BASE_ADDR_ALIGN)."""
    return (device.kind == "cpu" and _chunk_form_misfit(layer, dtype, transposed) is None
            and _cols_bytes(layer, dtype) > device.cache_bytes and device.base_align_bytes >= 32)


def _chunk_form_misfit(layer: ConvLayer, dtype, transposed: bool) -> str | None:
    """Why the chunk form cannot write this layer's matrix at all, or None."""
    lanes = _chunk_lanes(dtype)
    if not transposed or layer.pad_h or layer.pad_w or layer.out_w < lanes:
        return (f"the chunk form needs the transposed layout, no padding and at least {lanes} output columns; "
                f"got transposed={transposed}, padding ({layer.pad_h}, {layer.pad_w}), {layer.out_w} columns")
    return None


def _cols_bytes(layer: ConvLayer, dtype) -> int:
    return layer.n * layer.out_h * layer.out_w * layer.c * layer.r * layer.s * np.dtype(dtype).itemsize


def im2col_into(x: Tensor, layer: ConvLayer, out: Tensor, transposed: bool = True, runs: int | None = None,
                chunks: bool | None = None) -> Tensor:
    """Write the column matrix of the contiguous input ``x`` (geometry ``layer``; its K and groups do not
    matter) into the contiguous ``out``. The one-pass kernel of kernels/im2col.cl; ``runs`` overrides the
    run length (0 = interleaved form; :func:`run_length` says in what unit), ``chunks`` the choice of the
    chunk form (:func:`chunk_form`)."""
    if out.size == 0:
        return out
    kernel, global_size, local = im2col_launch(x.device, layer, x.dtype, transposed, runs, chunks)
    launch(x.device, kernel, global_size, local, x.buffer, np.int64(x.offset), out.buffer, np.int64(out.offset))
    return out


def im2col_launch(device, layer: ConvLayer, dtype, transposed: bool, runs: int | None = None,
                  chunks: bool | None = None):
    """(kernel, global size, local size) of the one-pass im2col for a layer: what :func:`im2col_into`
    launches with (x, x offset, cols, cols offset); `netcl bench im2col` launches it the same way."""
    total = layer.n * layer.out_h * layer.out_w * layer.c * layer.r * layer.s
    local = local_size_1d(device, total)[0]
    if chunks is None:
        chunks = runs is None and chunk_form(device, layer, dtype, transposed)
    if chunks:
        misfit = _chunk_form_misfit(layer, dtype, transposed)
        if misfit:
            raise ValueError(misfit)
        lanes = _chunk_lanes(dtype)
        per_item = runs or max(1, run_length(device, layer, transposed, local, lanes))
        kernel = _layer_kernel(device, "im2col.cl", "im2col", layer, dtype, transposed, local, 0, per_item)
        units = _run_units(layer, transposed, lanes)[0]
        return kernel, (-(-units // (local * per_item)) * local,), (local,)
    if runs is None:
        runs = run_length(device, layer, transposed, local)
    kernel = _layer_kernel(device, "im2col.cl", "im2col", layer, dtype, transposed, local, runs)
    units = _run_units(layer, transposed)[0] if runs else total
    return kernel, (-(-units // (local * (runs or VEC))) * local,), (local,)


def prefers_gather(device) -> bool:
    """The col2im form used when the caller does not ask for one: the deterministic gather when
    in deterministic mode (``nc.use_deterministic``, ``NETCL_DETERMINISTIC``), and on CPUs, where
    compare-and-swap loops cost more than the gather's R·S divisibility tests (`netcl bench im2col`
    compares them); else the atomic scatter."""
    return settings.DETERMINISTIC.get() or device.kind == "cpu"


def col2im_into(cols: Tensor, layer: ConvLayer, out: Tensor, transposed: bool = True,
                deterministic: bool | None = None) -> Tensor:
    """out (contiguous, input-shaped) = the fold of the contiguous column matrix ``cols``: the gather
    form when ``deterministic`` is True, the atomic scatter when False, :func:`prefers_gather` when None."""
    if out.size == 0:
        return out
    device = cols.device
    gather = prefers_gather(device) if deterministic is None else deterministic
    if cols.dtype == np.float64 and not device.has_int64_atomics:
        gather = True  # no 64-bit compare-and-swap: the gather form is the only one
    local = local_size_1d(device, cols.size)[0]
    if gather:
        kernel = _layer_kernel(device, "col2im.cl", "col2im_gather", layer, cols.dtype, transposed, local)
        launch(device, kernel, (out.size,), (local,), cols.buffer, np.int64(cols.offset),
               out.buffer, np.int64(out.offset))
    else:
        from .elementwise import fill
        fill(out, 0.0)
        kernel = _layer_kernel(device, "col2im.cl", "col2im_scatter", layer, cols.dtype, transposed, local)
        if cols.size:
            _flat_launch(device, kernel, cols.size, local, VEC, cols.buffer, np.int64(cols.offset),
                         out.buffer, np.int64(out.offset))
    return out


def _check_float(t, what: str) -> None:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{what} must be a netcl Tensor, got {type(t).__name__}")
    dtypes.require_float(t.dtype, what)


def im2col(x: Tensor, kernel_h: int, kernel_w: int, stride=1, padding=0, dilation=1,
           transposed: bool = False) -> Tensor:
    """The column matrix of an (N, C, H, W) input for a kernel_h × kernel_w window.

    Returns (N·Ho·Wo, C·kh·kw) with ``cols[n·Ho·Wo + i·Wo + j, c·kh·kw + u·kw + v] =
    x[n, c, i·sh − ph + u·dh, j·sw − pw + v·dw]`` (0 where that falls in the padding), or its transpose
    (C·kh·kw, N·Ho·Wo) when ``transposed``. Ho, Wo as in conv2d. Not differentiable (col2im is its adjoint).
    """
    _check_float(x, "im2col input")
    layer = _layer(x.shape, kernel_h, kernel_w, stride, padding, dilation, x.dtype)
    x = as_contiguous(x)
    out = Tensor.empty(cols_shape(layer, transposed), x.dtype, x.device)
    return im2col_into(x, layer, out, transposed)


def col2im(cols: Tensor, input_shape, kernel_h: int, kernel_w: int, stride=1, padding=0, dilation=1,
           transposed: bool = False, deterministic: bool | None = None) -> Tensor:
    """Fold a column matrix (layout as :func:`im2col`, ``transposed`` likewise) back to ``input_shape``,
    summing the entries that came from the same input element: the adjoint of im2col.

    ``deterministic=False`` runs the atomic scatter-add (one work-item per column entry, float adds by
    compare-and-swap), ``True`` the deterministic gather (one work-item per input element). ``None``
    (the default) takes the gather in deterministic mode and on CPU devices
    (where it is the faster one), else the scatter.
    """
    _check_float(cols, "col2im columns")
    layer = _layer(input_shape, kernel_h, kernel_w, stride, padding, dilation, cols.dtype)
    expected = cols_shape(layer, transposed)
    if cols.shape != expected:
        raise ShapeError(f"col2im: columns of shape {cols.shape} do not match input {layer.input_shape} with a "
                         f"{layer.r}×{layer.s} kernel (expected {expected}{', transposed' if transposed else ''})")
    cols = as_contiguous(cols)
    out = Tensor.empty(layer.input_shape, cols.dtype, cols.device)
    return col2im_into(cols, layer, out, transposed, deterministic)
