"""Batch normalization as fused kernels (kernels/batchnorm.cl).

Forward: ``batch_norm_stats`` (per-channel mean and biased variance in one pass over the data, moving the
running statistics in the same launch; a channel cut into several blocks adds a launch that merges the
blocks' results) then ``batch_norm_apply`` (normalize, scale, shift, optionally add a residual and apply a
ReLU). Backward: ``batch_norm_backward`` (one per-channel reduction of sum dz and sum dz·x̂, which are also
the bias and weight gradients, split and merged the same way, then one elementwise kernel for dx and the
residual's gradient). The input is viewed as (N, C, L): L = H·W for BatchNorm2d, the length (or 1) for
BatchNorm1d. The differentiable entry point is netcl.nn.functional.batch_norm.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .elementwise import as_contiguous, fill
from .pool import vector_width

REDUCE_LOCAL = 64


def _reduce_local(device) -> int:
    """Items that reduce one block together. On CPUs one: a sequential loop per block (in double where the
    device has it) runs an order of magnitude faster under PoCL than a 64-item group with a tree
    reduction, and the blocks keep the cores busy."""
    if _item_runs(device):
        return 1
    return min(REDUCE_LOCAL, 1 << (device.max_work_group_size.bit_length() - 1))


def _contiguous(t: Tensor) -> Tensor:
    return as_contiguous(t)


def channel_view(x: Tensor, what: str = "batch_norm") -> tuple[int, int, int]:
    """(N, C, L) of an input of shape (N, C, *spatial)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{what}: input must be a netcl Tensor, got {type(x).__name__}")
    if x.ndim < 2:
        raise ShapeError(f"{what}: expected an input of shape (N, C, ...), got {x.shape}")
    dtypes.require_float(x.dtype, what)
    n, c, length = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    if x.size >= 2 ** 31:
        raise ShapeError(f"{what}: {x.size:,} elements exceed the kernel's 32-bit indexing")
    return n, c, length


def _check_channel_tensor(t: Tensor | None, x: Tensor, name: str, what: str) -> None:
    if t is None:
        return
    if not isinstance(t, Tensor):
        raise DTypeError(f"{what}: {name} must be a netcl Tensor, got {type(t).__name__}")
    if t.shape != (x.shape[1],):
        raise ShapeError(f"{what}: {name} of shape {t.shape} does not match the {x.shape[1]} channels of input "
                         f"{x.shape}")
    if t.dtype != x.dtype:
        raise DTypeError(f"{what}: {name} is {t.dtype} but the input is {x.dtype}")
    x.same_device(t, what)


def _item_runs(device) -> bool:
    """Reduction items read contiguous runs on CPUs (sequential loops), interleaved elsewhere (coalesced)."""
    return device.kind == "cpu"


def _run_lanes(device, dtype) -> int:
    """Lanes of a CPU item's vector steps: pooling's width (32 bytes of elements, at most 8; the PoCL
    wheel's LLVM fails on wider vectors). A reduction keeps two such accumulators, whose adds overlap (one
    scalar chain is bound by the add's latency, not by memory)."""
    return vector_width(dtype) if _item_runs(device) else 1


def _variant(x: Tensor, **flags) -> dict:
    wide = x.dtype == np.float64 or (_item_runs(x.device) and x.device.has_fp64)
    acc = "double" if wide else "float"
    return dict(T=dtypes.c_type(x.dtype), ACC=acc, LOCAL=_reduce_local(x.device), ITEM_RUNS=_item_runs(x.device),
                RUN_LANES=_run_lanes(x.device, x.dtype), **flags)


# A reduction block holds at least this many elements: below it, the block's fixed costs (its group, its
# partial result, the merge's share) outweigh the parallelism it adds
MIN_BLOCK = 4096
# Blocks over all channels a reduction aims for per compute unit: enough to balance the units when
# channels are few (one image, a few wide channels), few enough to keep each block's runs long
BLOCKS_PER_UNIT = 8
# Row segments (and the apply kernels' runs) start at multiples of this many elements, so a row's vector
# steps fall at the same places whichever item reads them
SEGMENT_ALIGN = 16


def _reduction_geometry(device, n: int, c: int, length: int, local: int) -> tuple[int, int, int, int, int]:
    """(rows_per_block, segments, seg, blocks, parts) of the per-channel reductions: each channel's N rows of
    ``length`` elements are cut into ``blocks`` blocks of ``rows_per_block`` rows by ``seg`` columns
    (``segments`` per row), one work-group each; ``parts`` items of a group share one of its rows."""
    m = n * length
    wanted = max(1, min(-(-m // MIN_BLOCK), -(-BLOCKS_PER_UNIT * device.compute_units // max(c, 1))))
    if wanted <= n:
        rows_per_block = -(-n // wanted)
        segments, seg = 1, length
    else:
        rows_per_block = 1
        seg = -(-length // -(-wanted // n))
        seg = min(length, -(-seg // SEGMENT_ALIGN) * SEGMENT_ALIGN)
        segments = -(-length // seg)
    blocks = -(-n // rows_per_block) * segments
    parts = max(1, min(seg, local))
    return rows_per_block, segments, seg, blocks, parts


def _groups_of(count: int, device) -> int:
    """A power of two (at most 64) of ``count`` items to a work-group that leaves a few groups per compute
    unit: PoCL compiles a kernel once per work-group size, so the sizes come from a short list."""
    wanted = max(1, min(64, count // (4 * device.compute_units)))
    return 1 << (wanted.bit_length() - 1)


def _elementwise_geometry(device, nc: int, length: int):
    """(global, local, chunk) of the apply kernels: on CPUs one item per row, or per a long run of a row
    when rows are too few to share among the compute units (the item's loop runs on vectors; PoCL
    schedules several rows per work-group instead of thousands of one-element groups); elsewhere one
    item per element with several short rows per work-group, so BatchNorm1d's L = 1 leaves no item idle."""
    if _item_runs(device):
        pieces = -(-BLOCKS_PER_UNIT * device.compute_units // max(nc, 1))
        run = -(-max(MIN_BLOCK, -(-length // pieces)) // SEGMENT_ALIGN) * SEGMENT_ALIGN
        chunk = length if pieces <= 1 else min(length, run)
        return (-(-length // chunk), nc), (1, _groups_of(nc, device)), chunk
    lanes = min(64, 1 << max(length - 1, 0).bit_length())
    return (length, nc), (lanes, max(1, 64 // lanes)), 1


def _reduction_launch(device, blocks: int, c: int, local: int):
    """(global, local) of a reduction: a group per block, or with one item per block (CPUs) a group of the
    blocks of several channels."""
    if local > 1:
        return (blocks * local, c), (local, 1)
    channels = _groups_of(c, device)
    return (blocks, -(-c // channels) * channels), (1, channels)


def _merge_launch(device, c: int):
    """(global, local) of a merge kernel, one item per channel."""
    channels = _groups_of(c, device)
    return (-(-c // channels) * channels,), (channels,)


def _partials(x: Tensor, c: int, blocks: int, flags: dict) -> Tensor:
    """Scratch for two accumulator values per (channel, block) of a split reduction."""
    return Tensor.empty((2 * c * blocks,), np.float64 if flags["ACC"] == "double" else np.float32, x.device)


def _buf(t: Tensor | None, fallback: Tensor):
    return (t.buffer, np.int64(t.offset)) if t is not None else (fallback.buffer, np.int64(0))


def batch_norm_stats(x: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                     num_batches_tracked: Tensor | None = None, momentum: float | None = 0.1):
    """(mean, biased var) per channel; with running_mean/var given, moves them in place by ``momentum``
    (None: the cumulative average over num_batches_tracked + 1 batches). Does not increment the count:
    batch_norm_apply(count=...) does."""
    what = "batch_norm"
    n, c, length = channel_view(x, what)
    if n * length <= 1 and running_mean is not None:
        raise ShapeError(f"{what}: expected more than 1 value per channel when training, got input {x.shape}")
    for t, name in ((running_mean, "running_mean"), (running_var, "running_var")):
        _check_channel_tensor(t, x, name, what)
    update = running_mean is not None and running_var is not None
    cumulative = update and momentum is None
    if cumulative and num_batches_tracked is None:
        raise ShapeError(f"{what}: momentum=None (cumulative average) needs num_batches_tracked")
    x = _contiguous(x)
    mean = Tensor.empty((c,), x.dtype, x.device)
    var = Tensor.empty((c,), x.dtype, x.device)
    if c == 0:
        return mean, var
    if n * length == 0:  # no values: the statistics are 0 / 0, as PyTorch's
        return fill(mean, np.nan), fill(var, np.nan)
    local = _reduce_local(x.device)
    rows_per_block, segments, seg, blocks, parts = _reduction_geometry(x.device, n, c, length, local)
    flags = _variant(x, UPDATE_RUNNING=update, CUMULATIVE=cumulative)
    split = blocks > 1
    partials = _partials(x, c, blocks, flags) if split else None
    geometry = (np.int32(n), np.int32(c), np.int32(length), np.int32(rows_per_block), np.int32(segments),
                np.int32(seg))
    stats = (mean.buffer, np.int64(mean.offset), var.buffer, np.int64(var.offset), *_buf(running_mean, x),
             *_buf(running_var, x), *_buf(num_batches_tracked, x))
    momentum_arg = x.dtype.type(0.0 if momentum is None else momentum)
    kernel = get_kernel(x.device, "batchnorm.cl", "bn_stats", **flags, SPLIT=split)
    launch(x.device, kernel, *_reduction_launch(x.device, blocks, c, local), x.buffer, np.int64(x.offset), *stats,
           *_buf(partials, x), *geometry, np.int32(parts), momentum_arg)
    if split:
        merge = get_kernel(x.device, "batchnorm.cl", "bn_stats_merge", **flags, SPLIT=split)
        launch(x.device, merge, *_merge_launch(x.device, c), *stats, partials.buffer, np.int64(partials.offset),
               *geometry, np.int32(blocks), momentum_arg)
    if update:
        running_mean.mark_written()
        running_var.mark_written()
    return mean, var


def batch_norm_apply(x: Tensor, mean: Tensor | None, var: Tensor | None, weight: Tensor | None = None,
                     bias: Tensor | None = None, eps: float = 1e-5, residual: Tensor | None = None,
                     relu: bool = False, count: Tensor | None = None, *, relu6: bool = False,
                     hardswish: bool = False) -> Tensor:
    """y = [relu]((x − mean)/√(var + eps)·weight + bias [+ residual]); ``count`` (num_batches_tracked, int64)
    is incremented by the same launch. mean = var = weight = None: y = [relu](x + bias [+ residual]), the
    epilogue of a convolution with a BatchNorm folded in. ``relu6``: the fused activation is ReLU6,
    min(max(z, 0), 6), instead of the ReLU; ``hardswish``: Hardswish, z·relu6(z + 3)/6, for inference only
    (batch_norm_backward has no Hardswish)."""
    what = "batch_norm"
    n, c, length = channel_view(x, what)
    for t, name in ((mean, "mean"), (var, "var"), (weight, "weight"), (bias, "bias")):
        _check_channel_tensor(t, x, name, what)
    shift_only = mean is None and var is None and weight is None
    if shift_only and bias is None or (mean is None) != (var is None):
        raise ShapeError(f"{what}: needs mean and var (or, for the folded epilogue, only bias)")
    if hardswish and (relu or relu6):
        raise ShapeError(f"{what}: one fused activation at a time (hardswish with relu or relu6)")
    if (weight is None) != (bias is None) and not shift_only:
        raise ShapeError(f"{what}: weight and bias go together (affine), got only one of them")
    if residual is not None:
        if not isinstance(residual, Tensor) or residual.shape != x.shape or residual.dtype != x.dtype:
            raise ShapeError(f"{what}: the residual must match the input {x.shape} {x.dtype}, got "
                             f"{getattr(residual, 'shape', type(residual).__name__)} "
                             f"{getattr(residual, 'dtype', '')}")
        x.same_device(residual, what)
        residual = _contiguous(residual)
    if count is not None and (count.dtype != np.int64 or count.size != 1):
        raise DTypeError(f"{what}: num_batches_tracked must be a one-element int64 tensor, got {count.dtype} "
                         f"{count.shape}")
    x = _contiguous(x)
    y = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size == 0:
        return y
    kernel = get_kernel(x.device, "batchnorm.cl", "bn_apply",
                        **_variant(x, AFFINE=weight is not None, RELU=bool(relu or relu6), RELU6=bool(relu6),
                                   HARDSWISH=bool(hardswish), RESIDUAL=residual is not None,
                                   COUNT=count is not None, SHIFT_ONLY=shift_only))
    global_size, local_size, chunk = _elementwise_geometry(x.device, n * c, length)
    launch(x.device, kernel, global_size, local_size, x.buffer, np.int64(x.offset), *_buf(residual, x),
           y.buffer, np.int64(y.offset), *_buf(mean, x), *_buf(var, x), *_buf(weight, x), *_buf(bias, x),
           *_buf(count, x), np.int32(n * c), np.int32(c), np.int32(length),
           np.int32(chunk), x.dtype.type(eps))
    if count is not None:
        count.mark_written()
    return y


def batch_norm_backward(grad_y: Tensor, x: Tensor, y: Tensor, mean: Tensor, var: Tensor,
                        weight: Tensor | None = None, eps: float = 1e-5, batch_stats: bool = True,
                        relu: bool = False, residual: bool = False, *, relu6: bool = False):
    """(grad_x, grad_weight, grad_bias, grad_residual) of batch_norm_apply for upstream grad_y.

    ``y`` (the forward output) supplies the ReLU's (or ReLU6's) mask; ``batch_stats`` says whether mean/var were the
    batch's own (training: the gradient flows through them) or constants (eval). grad_residual is None
    without a residual; grad_weight and grad_bias are the per-channel sums whatever ``weight`` is."""
    what = "batch_norm backward"
    n, c, length = channel_view(x, what)
    if grad_y.shape != x.shape or y.shape != x.shape:
        raise ShapeError(f"{what}: gradient {grad_y.shape} and output {y.shape} must match the input {x.shape}")
    grad_y, x, y = _contiguous(grad_y), _contiguous(x), _contiguous(y)
    flags = _variant(x, AFFINE=weight is not None, RELU=bool(relu or relu6), RELU6=bool(relu6),
                     RESIDUAL=bool(residual),
                     BATCH_STATS=bool(batch_stats))
    grad_weight = Tensor.empty((c,), x.dtype, x.device)
    grad_bias = Tensor.empty((c,), x.dtype, x.device)
    grad_x = Tensor.empty(x.shape, x.dtype, x.device)
    grad_r = Tensor.empty(x.shape, x.dtype, x.device) if residual else None
    if x.size == 0:
        return grad_x, grad_weight, grad_bias, grad_r
    local = _reduce_local(x.device)
    rows_per_block, segments, seg, blocks, parts = _reduction_geometry(x.device, n, c, length, local)
    split = blocks > 1
    partials = _partials(x, c, blocks, flags) if split else None
    grads = (grad_weight.buffer, np.int64(grad_weight.offset), grad_bias.buffer, np.int64(grad_bias.offset))
    reduce_kernel = get_kernel(x.device, "batchnorm.cl", "bn_backward_reduce", **flags, SPLIT=split)
    launch(x.device, reduce_kernel, *_reduction_launch(x.device, blocks, c, local), x.buffer, np.int64(x.offset),
           y.buffer, np.int64(y.offset), grad_y.buffer, np.int64(grad_y.offset), mean.buffer, np.int64(mean.offset),
           var.buffer, np.int64(var.offset), *grads, *_buf(partials, x), np.int32(n), np.int32(c),
           np.int32(length), np.int32(rows_per_block), np.int32(segments), np.int32(seg), np.int32(parts),
           x.dtype.type(eps))
    if split:
        merge = get_kernel(x.device, "batchnorm.cl", "bn_backward_merge", **flags, SPLIT=split)
        launch(x.device, merge, *_merge_launch(x.device, c), var.buffer, np.int64(var.offset), *grads,
               partials.buffer, np.int64(partials.offset), np.int32(c), np.int32(blocks), x.dtype.type(eps))
    apply_kernel = get_kernel(x.device, "batchnorm.cl", "bn_backward_apply", **flags)
    global_size, local_size, chunk = _elementwise_geometry(x.device, n * c, length)
    launch(x.device, apply_kernel, global_size, local_size, x.buffer, np.int64(x.offset), y.buffer,
           np.int64(y.offset), grad_y.buffer, np.int64(grad_y.offset), mean.buffer, np.int64(mean.offset),
           var.buffer, np.int64(var.offset), *_buf(weight, x), *_buf(None, x), grad_weight.buffer,
           np.int64(grad_weight.offset), grad_bias.buffer, np.int64(grad_bias.offset), grad_x.buffer,
           np.int64(grad_x.offset), *_buf(grad_r, x), np.int32(n * c), np.int32(c), np.int32(length),
           np.int32(chunk), np.int64(n * length), x.dtype.type(eps))
    return grad_x, grad_weight, grad_bias, grad_r


def fold_into_conv(conv_weight: Tensor, conv_bias: Tensor | None, running_mean: Tensor, running_var: Tensor,
                   weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5, *,
                   out: tuple[Tensor, Tensor] | None = None):
    """(folded weight, folded bias) of the convolution equal to batch_norm(conv(x)) with running
    statistics, in one launch (no autograd: netcl.nn.utils.fold_conv_bn is the differentiable form).
    ``out``: contiguous (weight, bias) tensors to write them into (a kept fold refreshed in place)."""
    what = "fold_into_conv"
    if not isinstance(conv_weight, Tensor) or conv_weight.ndim < 2:
        raise ShapeError(f"{what}: expected a convolution weight (K, C, ...), got {getattr(conv_weight, 'shape', None)}")
    k = conv_weight.shape[0]
    for t, name in ((conv_bias, "conv bias"), (running_mean, "running_mean"), (running_var, "running_var"),
                    (weight, "weight"), (bias, "bias")):
        if t is not None and (t.shape != (k,) or t.dtype != conv_weight.dtype):
            raise ShapeError(f"{what}: {name} of shape {t.shape} {t.dtype} does not match {k} output channels "
                             f"({conv_weight.dtype})")
    cw = _contiguous(conv_weight)
    per_channel = cw.size // k
    if out is None:
        folded_w = Tensor.empty(cw.shape, cw.dtype, cw.device)
        folded_b = Tensor.empty((k,), cw.dtype, cw.device)
    else:
        folded_w, folded_b = out
        for t, shape, name in ((folded_w, cw.shape, "out weight"), (folded_b, (k,), "out bias")):
            if t.shape != shape or t.dtype != cw.dtype or not t.is_contiguous():
                raise ShapeError(f"{what}: {name} must be a contiguous {shape} {cw.dtype} tensor, got "
                                 f"{t.shape} {t.dtype}")
            cw.same_device(t, what)
    kernel = get_kernel(cw.device, "batchnorm.cl", "bn_fold",
                        **_variant(cw, AFFINE=weight is not None, CONV_BIAS=conv_bias is not None))
    global_size, local_size, chunk = _elementwise_geometry(cw.device, k, per_channel)
    launch(cw.device, kernel, global_size, local_size, cw.buffer, np.int64(cw.offset),
           *_buf(conv_bias, cw), running_mean.buffer, np.int64(running_mean.offset), running_var.buffer,
           np.int64(running_var.offset), *_buf(weight, cw), *_buf(bias, cw), folded_w.buffer,
           np.int64(folded_w.offset), folded_b.buffer, np.int64(folded_b.offset), np.int32(k),
           np.int32(per_channel), np.int32(chunk), cw.dtype.type(eps))
    if out is not None:
        folded_w.mark_written()
        folded_b.mark_written()
    return folded_w, folded_b
