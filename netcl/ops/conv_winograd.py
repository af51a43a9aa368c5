"""The `winograd` conv2d strategy: F(2×2, 3×3) for 3×3 kernels with stride 1 and dilation 1, any padding,
size, channel count, batch and group count (partial tiles at the borders are computed and cropped).

forward          V = BᵀdB of x, U = GgGᵀ of w, 16·groups batched GEMMs M = U·V, y = AᵀmA.
backward_data    the same pipeline on grad_y padded by 2 − pad with the rotated, channel-swapped filters
                 (a full correlation whose output is exactly the input's size).
backward_weight  by the transposed algorithm (F(3×3, 2×2) form): V = BᵀdB of x, Z = A·dy·Aᵀ of grad_y,
                 16·groups GEMMs Mw = Z·Vᵀ (summing over every tile of the batch), gw = Gᵀ·Mw·G: the same
                 2.25× saving in multiplies as the forward pass, and exact in real arithmetic.
Transforms are kernels/winograd.cl; the GEMMs are netcl.ops.gemm.gemm_batched.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..runtime import memory
from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor
from .conv_common import ConvLayer, ConvStrategy, CostTerms, Product, epilogue_operands, tensor_bytes
from .gemm import gemm_batched
from .kept import derived_from_weight


def gemm_packing_bytes(device, dtype, calls) -> int:
    """Bytes netcl.ops.gemm allocates for its packing buffers over a sequence of gemm_batched calls,
    starting from none (netcl's workspace convention: GEMM's cached buffers count, from an empty cache).
    Each call is (M, N, K, a_batches, b_batches, a_cs, b_cs, b_rs) of op(A) (M×K) and op(B) (K×N), strides
    in elements. The rule is netcl.ops.gemm.packing_bytes; each of its two buffers grows to the largest
    need met, and every growth is a new allocation."""
    from .gemm import packing_bytes
    held, total = {"a": 0, "b": 0}, 0
    for M, N, K, a_batches, b_batches, a_cs, b_cs, b_rs in calls:
        for slot, nbytes in zip("ab", packing_bytes(device, dtype, M, N, K, a_batches, b_batches, a_cs, b_rs, b_cs)):
            if nbytes > held[slot]:
                total += nbytes
                held[slot] = nbytes
    return total


def _tile_local(th: int, tw: int) -> tuple[int, int, int]:
    """Work-group shape of the tile kernels: up to 8×8 tiles of one plane, the rest of the 64 work-items
    along the planes, so that small tile grids (7×7 inputs: 3×3 tiles) do not leave most of a work-group
    idle (on PoCL 4×4×4 beats 8×8×1 on small planes such as cv12's, and loses on larger ones)."""
    lx = 1 << max(0, (min(tw, 8) - 1).bit_length())
    ly = 1 << max(0, (min(th, 64 // lx) - 1).bit_length())
    ly = min(ly, 64 // lx)
    return lx, ly, max(1, 64 // (lx * ly))


def _filter_local(cols: int) -> tuple[int, int]:
    """Work-group shape of the filter kernels (one work-item per (column, row) of a transformed matrix, or
    per 8 columns for wino_filter_transform8: pass the work-items along a row):
    up to 64 work-items along the columns, so each of the 16 matrices is written in long contiguous runs
    (square groups write short runs, several times slower on PoCL)."""
    lx = 1 << max(0, (min(cols, 64) - 1).bit_length())
    return lx, max(1, 64 // lx)


def _channel_major(th: int, tw: int) -> int:
    """Whether the tile kernels walk planes channel-major (kernels/winograd.cl, CMAJOR): below 256 tiles
    per plane, where it makes neighbouring work-items share cache lines of the transformed rows (it
    makes no difference on planes of hundreds of tiles)."""
    return int(th * tw < 256)


def _tiles(n: int, out_h: int, out_w: int, size: int = 2) -> tuple[int, int, int]:
    """(tile rows, tile columns, tiles of the n samples) for output tiles of size × size."""
    th, tw = -(-out_h // size), -(-out_w // size)
    return th, tw, n * th * tw


def matrix_stride(rows: int, cols: int, groups: int, itemsize: int) -> int:
    """Elements from one of the 16 transformed matrices to the next. A transform kernel writes (or reads)
    all 16 at once, so the stride decides which cache sets its 16 streams share: rows·cols is a multiple
    of 4 KiB on most real layers (cv12: 512·288 floats), which puts every stream in one L1 set, more
    streams than ways, and the transform runs several times slower than at a slightly different size.
    So the stride is padded to an odd number of 64-byte lines, which sends the 16 streams to 16
    different sets. With groups > 1 the group blocks of a matrix and the matrices form one uniform
    batch (16·groups GEMM operands, netcl.ops.gemm.gemm_batched), so the stride stays rows·cols."""
    size = rows * cols
    if groups != 1:
        return size
    per_line = max(1, 64 // itemsize)
    lines = -(-size // per_line)
    return (lines | 1) * per_line


def _stack_elements(rows: int, cols: int, groups: int, itemsize: int, count: int = 16) -> int:
    return (count - 1) * matrix_stride(rows, cols, groups, itemsize) + rows * cols


def _chunk(layer: ConvLayer, pass_: str, tile: int = 2) -> int:
    """Samples per chunk of a data pass (backward_data correlates grad_y with the flipped filters into an
    input-sized result), for output tiles of tile × tile."""
    if pass_ == "backward_data":
        return samples_per_chunk(layer.n, layer.k, layer.c, layer.h, layer.w, layer.itemsize, layer.groups, tile)
    return samples_per_chunk(layer.n, layer.c, layer.k, layer.out_h, layer.out_w, layer.itemsize, layer.groups,
                             tile)


def workspace_elements(layer: ConvLayer, pass_: str, tile: int = 2) -> int:
    """Elements of the transformed operands one pass allocates (U, V and M for the data passes;
    V, Z and Mw for backward_weight), each of the (tile + 2)² matrices matrix_stride apart."""
    cg, kg = layer.c // layer.groups, layer.k // layer.groups
    g, size, count = layer.groups, layer.itemsize, (tile + 2) ** 2
    if pass_ == "forward":
        t = _tiles(_chunk(layer, pass_, tile), layer.out_h, layer.out_w, tile)[2]
        shapes = [(layer.k, cg), (layer.c, t), (layer.k, t)]
    elif pass_ == "backward_data":
        t = _tiles(_chunk(layer, pass_, tile), layer.h, layer.w, tile)[2]
        shapes = [(layer.c, kg), (layer.k, t), (layer.c, t)]
    else:
        t = _tiles(layer.n, layer.out_h, layer.out_w, tile)[2]
        shapes = [(layer.c, t), (layer.k, t), (layer.k, cg)]
    return sum(_stack_elements(rows, cols, g, size, count) for rows, cols in shapes)


CHUNK_BYTES = 2 << 20              # V + M of one chunk of samples (samples_per_chunk)
CHUNK_MAX_FILTER_BYTES = 512 << 10  # chunk only below this size of U


def _stack(rows: int, cols: int, groups: int, dtype, device, count: int = 16) -> Tensor:
    """An uninitialized (count, rows, cols) tensor (16 matrices unless told) whose matrices lie
    matrix_stride elements apart."""
    itemsize = np.dtype(dtype).itemsize
    stride = matrix_stride(rows, cols, groups, itemsize)
    buffer = memory.allocate(device, _stack_elements(rows, cols, groups, itemsize, count) * itemsize)
    return Tensor(buffer, (count, rows, cols), dtype, device, (stride, cols, 1))


def _kernel(device, name: str, dtype, flip: int = 0):
    return get_kernel(device, "winograd.cl", name, T=dtypes.c_type(dtype), FLIP=flip)


def _input_transform(src: Tensor, pad_h: int, pad_w: int, th: int, tw: int, groups: int,
                     tile_major: bool = False, into: Tensor | None = None, lanes: int = 0) -> Tensor:
    """V = BᵀdB of every tile: [16][channels][tiles], or tile-major [16][groups][tiles][channels/groups]
    (the form backward_weight multiplies without a transposed operand), into ``into`` when given (a
    [16][channels][tiles] stack made by _stack for these tiles). ``lanes`` > 0: the whole-plane kernel
    with that many samples per work-item (plane_lanes), whose tiles are ordered sample-fastest."""
    n, channels, ih, iw = src.shape
    tiles = n * th * tw
    v = into if into is not None else _stack(channels, tiles, groups, src.dtype, src.device)
    if lanes:
        kernel = get_kernel(src.device, "winograd_plane.cl", "wino_input_plane", T=dtypes.c_type(src.dtype),
                            N=n, CH=channels, IH=ih, IW=iw, PH=pad_h, PW=pad_w, TH=th, TW=tw, VN=lanes)
        launch(src.device, kernel, (n // lanes, channels), PLANE_LOCAL, src.buffer, np.int64(src.offset),
               v.buffer, np.int64(v.offset), np.int64(v.strides[0]))
        return v
    geometry = (np.int32(n), np.int32(channels), np.int32(ih), np.int32(iw), np.int32(pad_h), np.int32(pad_w),
                np.int32(th), np.int32(tw), np.int32(0 if tile_major else _channel_major(th, tw)))
    if tile_major:
        kernel = get_kernel(src.device, "winograd.cl", "wino_input_transform", T=dtypes.c_type(src.dtype),
                            TILE_MAJOR=1)
        launch(src.device, kernel, (tw, th, n * channels), _tile_local(th, tw),
               src.buffer, np.int64(src.offset), *geometry, np.int32(groups), v.buffer, np.int64(v.offset),
               np.int64(v.strides[0]))
    else:
        tw4 = -(-tw // 4)
        launch(src.device, _kernel(src.device, "wino_input_transform4", src.dtype), (tw4, th, n * channels),
               _tile_local(th, tw4), src.buffer, np.int64(src.offset), *geometry, v.buffer, np.int64(v.offset),
               np.int64(v.strides[0]))
    return v


def _filter_transform(w: Tensor, layer: ConvLayer, flip: bool, into: Tensor | None = None) -> Tensor:
    """U = G·w·Gᵀ of every filter (flipped and with channels swapped for backward_data), into ``into`` when
    given (a stack _filter_transform made before for this layer)."""
    cg, kg = layer.c // layer.groups, layer.k // layer.groups
    rows, cols = (layer.c, kg) if flip else (layer.k, cg)
    u = into if into is not None else _stack(rows, cols, layer.groups, w.dtype, w.device)
    if not flip and cols % 8 == 0:
        launch(w.device, _kernel(w.device, "wino_filter_transform8", w.dtype), (cols // 8, rows),
               _filter_local(cols // 8),
               w.buffer, np.int64(w.offset), np.int32(rows), np.int32(cols),
               u.buffer, np.int64(u.offset), np.int64(u.strides[0]))
        return u
    launch(w.device, _kernel(w.device, "wino_filter_transform", w.dtype, int(flip)), (cols, rows),
           _filter_local(cols),
           w.buffer, np.int64(w.offset), np.int32(rows), np.int32(cols), np.int32(cg), np.int32(kg),
           u.buffer, np.int64(u.offset), np.int64(u.strides[0]))
    return u


def _output_transform(m: Tensor, out: Tensor, th: int, tw: int, lanes: int = 0, bias: Tensor | None = None,
                      residual: Tensor | None = None, activation: str = "none") -> Tensor:
    """out = AᵀmA of every tile of M ([16][channels][tiles]; ``lanes`` as in _input_transform), then the
    inference epilogue: + bias[channel], + residual (out's shape), the activation."""
    n, ch, oh, ow = out.shape
    epilogue = {"BIAS": bias is not None, "RESIDUAL": residual is not None, "ACT": activation}
    operands = epilogue_operands(out, bias, residual)
    if lanes:
        kernel = get_kernel(out.device, "winograd_plane.cl", "wino_output_plane", T=dtypes.c_type(out.dtype),
                            N=n, CH=ch, OH=oh, OW=ow, TH=th, TW=tw, VN=lanes, **epilogue)
        launch(out.device, kernel, (n // lanes, ch), PLANE_LOCAL, m.buffer, np.int64(m.offset),
               np.int64(m.strides[0]), out.buffer, np.int64(out.offset), *operands)
        return out
    tw4 = -(-tw // 4)
    kernel = get_kernel(out.device, "winograd.cl", "wino_output_transform4", T=dtypes.c_type(out.dtype), **epilogue)
    launch(out.device, kernel, (tw4, th, n * ch), _tile_local(th, tw4),
           m.buffer, np.int64(m.offset), np.int64(m.strides[0]),
           np.int32(n), np.int32(ch), np.int32(oh), np.int32(ow),
           np.int32(th), np.int32(tw), np.int32(_channel_major(th, tw)), out.buffer, np.int64(out.offset),
           *operands)
    return out


PLANE_MAX_TILES = 64     # tiles per plane up to which the whole-plane kernels serve (they unroll the plane)
PLANE_LOCAL = (8, 8)     # their work-group: 8 sample blocks x 8 channels


def plane_lanes(device, samples: int, th: int, tw: int) -> int:
    """Samples per work-item of the whole-plane transforms (kernels/winograd_plane.cl), or 0 for the
    general tile kernels. Those parallelize over the tiles of a plane; on small images a CPU driver gets
    too few of them to vectorize, and each tile pays run-time bounds checks. The plane kernels put VN
    samples in the lanes of a vector instead, with the geometry compiled in, which makes the transforms of
    small planes several times faster on PoCL. They hold a whole plane per work-item, which a GPU would spill from its registers, so
    they serve CPU devices only, and only batches with a multiple of 4 samples: with fewer lanes the
    general kernels were as fast."""
    if device.kind != "cpu" or th * tw > PLANE_MAX_TILES:
        return 0
    return next((lanes for lanes in (8, 4) if samples % lanes == 0), 0)


def _grouped(t: Tensor, groups: int) -> Tensor:
    """[16][groups*rows][cols] as the (16*groups, rows, cols) batch of per-group GEMM operands."""
    if groups == 1:
        return t
    e, rows, cols = t.shape
    return Tensor(t.buffer, (e * groups, rows // groups, cols), t.dtype, t.device,
                  (rows // groups * cols, cols, 1), t.offset)


def samples_per_chunk(n: int, ch_in: int, ch_out: int, out_h: int, out_w: int, itemsize: int,
                      groups: int = 1, tile: int = 2) -> int:
    """Samples whose transformed input V and product M are made and consumed together.

    With small filters the products stream V and M: cv9 at batch 32 (64 channels, 23,328 tiles) writes
    95 MB of V, which the GEMM then reads back from memory, and the same for M. Chunks of CHUNK_BYTES keep
    them in cache. Every chunk re-reads the transformed filters U and adds three launches, and its GEMM
    has fewer columns: with U above CHUNK_MAX_FILTER_BYTES that costs more than it saves, so those layers
    run whole."""
    th, tw, _ = _tiles(1, out_h, out_w, tile)
    count = (tile + 2) ** 2
    filter_bytes = count * ch_out * (ch_in // groups) * itemsize
    per_sample = count * (ch_in + ch_out) * th * tw * itemsize
    if filter_bytes > CHUNK_MAX_FILTER_BYTES or n * per_sample <= CHUNK_BYTES:
        return n
    limit = max(1, CHUNK_BYTES // per_sample)
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)  # equal chunks share V and M


def _view(t: Tensor, shape, offset: int) -> Tensor:
    return Tensor(t.buffer, shape, t.dtype, t.device, t.strides, t.offset + offset)


class WinogradStrategy(ConvStrategy):
    """F(2×2, 3×3) for every pass. The data passes run through :meth:`correlate`, whose three transforms
    are methods, so a strategy with larger tiles (netcl.ops.conv_winograd4) reuses the pipeline around
    them: chunking, the stacks of transformed matrices, the batched GEMM and the epilogue."""
    name = "winograd"
    tile = 2  # F(2×2, 3×3)
    keeps_weight_derivatives = True  # the transformed filters
    fuses_bias = True  # forward(..., bias=) adds the bias in the output transform
    fuses_epilogue = True  # and forward(..., residual=, activation=) the rest of an inference epilogue

    @property
    def elements(self) -> int:
        """Elements of a transformed tile, one GEMM each: (tile + 2)²."""
        return (self.tile + 2) ** 2

    def transform_filters(self, w: Tensor, layer: ConvLayer, flip: bool, into: Tensor | None = None) -> Tensor:
        return _filter_transform(w, layer, flip, into)

    def transform_input(self, src: Tensor, pad_h: int, pad_w: int, th: int, tw: int, groups: int,
                        into: Tensor) -> Tensor:
        lanes = plane_lanes(src.device, src.shape[0], th, tw)  # the output transform orders tiles alike
        return _input_transform(src, pad_h, pad_w, th, tw, groups, into=into, lanes=lanes)

    def transform_output(self, m: Tensor, out: Tensor, th: int, tw: int, bias: Tensor | None,
                         residual: Tensor | None, activation: str) -> Tensor:
        lanes = plane_lanes(out.device, out.shape[0], th, tw)
        return _output_transform(m, out, th, tw, lanes, bias, residual, activation)

    def correlate(self, src: Tensor, u: Tensor, out: Tensor, pad_h: int, pad_w: int, groups: int,
                  bias: Tensor | None = None, residual: Tensor | None = None, activation: str = "none") -> Tensor:
        """out = the stride-1 3×3 correlation of src with the transformed filters u (any padding), a chunk
        of samples at a time (samples_per_chunk: a divisor of the batch, so every chunk reuses V and M),
        with the inference epilogue (bias, residual of out's shape, activation) in the output transform."""
        n, ch_out, oh, ow = out.shape
        ch_in, ih, iw = src.shape[1:]
        chunk = samples_per_chunk(n, ch_in, ch_out, oh, ow, out.dtype.itemsize, groups, self.tile)
        th, tw, tiles = _tiles(chunk, oh, ow, self.tile)
        v = _stack(ch_in, tiles, groups, src.dtype, src.device, self.elements)
        m = _stack(ch_out, tiles, groups, out.dtype, out.device, self.elements)
        for n0 in range(0, n, chunk):
            x_part = _view(src, (chunk, ch_in, ih, iw), n0 * src.strides[0])
            y_part = _view(out, (chunk, ch_out, oh, ow), n0 * out.strides[0])
            r_part = None if residual is None else _view(residual, y_part.shape, n0 * residual.strides[0])
            self.transform_input(x_part, pad_h, pad_w, th, tw, groups, v)
            gemm_batched(_grouped(u, groups), _grouped(v, groups), c=_grouped(m, groups))
            self.transform_output(m, y_part, th, tw, bias, r_part, activation)
        return out

    def why_not(self, layer: ConvLayer, pass_: str, device=None) -> str | None:
        if (layer.r, layer.s) != (3, 3):
            return f"needs a 3×3 kernel, got {layer.r}×{layer.s}"
        if (layer.stride_h, layer.stride_w) != (1, 1):
            return f"needs stride 1, got {layer.stride_h}×{layer.stride_w}"
        if (layer.dil_h, layer.dil_w) != (1, 1):
            return f"needs dilation 1, got {layer.dil_h}×{layer.dil_w}"
        from ..runtime.device import resolve_device
        device = resolve_device(device)
        th, tw, tiles = _tiles(layer.n, *((layer.h, layer.w) if pass_ == "backward_data" else
                                          (layer.out_h, layer.out_w)), self.tile)
        nbytes = self.elements * max(layer.c, layer.k) * tiles * layer.itemsize
        if nbytes > device.max_alloc_bytes:
            return (f"its transformed tiles ({self.elements} × channels × tiles) need {nbytes:,} bytes, more "
                    f"than the largest single allocation {device.name} allows ({device.max_alloc_bytes:,})")
        return None

    def workspace_bytes(self, layer: ConvLayer, pass_: str, device=None) -> int:
        """U, V and M (V, Z and Mw for backward_weight), see workspace_elements, plus the packing buffers
        netcl.ops.gemm allocates for the one batched product (from an empty GEMM cache)."""
        from ..runtime.device import resolve_device
        cg, kg, b = layer.c // layer.groups, layer.k // layer.groups, self.elements * layer.groups
        if pass_ == "forward":
            t = _tiles(_chunk(layer, pass_, self.tile), layer.out_h, layer.out_w, self.tile)[2]
            call = (kg, t, cg, b, b, 1, 1, t)
        elif pass_ == "backward_data":
            t = _tiles(_chunk(layer, pass_, self.tile), layer.h, layer.w, self.tile)[2]
            call = (cg, t, kg, b, b, 1, 1, t)
        else:
            t = _tiles(layer.n, layer.out_h, layer.out_w, self.tile)[2]
            call = (kg, cg, t, b, b, 1, *self.weight_product_strides(t, cg))
        packing = gemm_packing_bytes(resolve_device(device), layer.dtype, [call])
        return workspace_elements(layer, pass_, self.tile) * layer.itemsize + packing

    def weight_product_strides(self, tiles: int, cols: int) -> tuple[int, int]:
        """(column stride, row stride) of backward_weight's second GEMM operand, the transformed input
        (tiles × cols): read in place from its tile-major layout."""
        return 1, cols

    def cost_terms(self, layer: ConvLayer, pass_: str, device=None) -> CostTerms:
        """(tile + 2)²·groups batched products in the transformed domain (F(2×2, 3×3): 2.25× fewer
        multiplies than the definition), one call per chunk of samples (samples_per_chunk) with three
        launches each; the transformed tiles are written and read back once each, beside x, w and y."""
        g = layer.groups
        cg, kg = layer.c // g, layer.k // g
        oh, ow = (layer.h, layer.w) if pass_ == "backward_data" else (layer.out_h, layer.out_w)
        chunk = layer.n if pass_ == "backward_weight" else _chunk(layer, pass_, self.tile)
        tiles = chunk * -(-oh // self.tile) * -(-ow // self.tile)
        dims = {"forward": (kg, tiles, cg), "backward_data": (cg, tiles, kg), "backward_weight": (kg, cg, tiles)}[pass_]
        calls = layer.n // chunk
        transformed = workspace_elements(layer, pass_, self.tile) * layer.itemsize
        return CostTerms(products=[Product(*dims, batch=self.elements * g, calls=calls)], launches=1 + 3 * calls,
                         bytes_moved=tensor_bytes(layer) + 2 * transformed)

    def forward(self, x: Tensor, w: Tensor, layer: ConvLayer, bias: Tensor | None = None,
                residual: Tensor | None = None, activation: str = "none", keep: bool = False) -> Tensor:
        y = Tensor.empty(layer.output_shape, x.dtype, x.device)
        if y.size == 0:
            return y
        u = derived_from_weight(w, (f"{self.name} filters", layer.k, layer.c, layer.groups),
                                lambda weight, into: self.transform_filters(weight, layer, False, into), keep)
        return self.correlate(x, u, y, layer.pad_h, layer.pad_w, layer.groups, bias, residual, activation)

    def backward_data(self, grad_y: Tensor, w: Tensor, layer: ConvLayer) -> Tensor:
        gx = Tensor.empty(layer.input_shape, w.dtype, w.device)
        if gx.size == 0:
            return gx
        u = self.transform_filters(w, layer, flip=True)
        return self.correlate(grad_y, u, gx, 2 - layer.pad_h, 2 - layer.pad_w, layer.groups)

    def backward_weight(self, x: Tensor, grad_y: Tensor, layer: ConvLayer) -> Tensor:
        gw = Tensor.empty(layer.weight_shape, x.dtype, x.device)
        if gw.size == 0:
            return gw
        th, tw, tiles = _tiles(layer.n, layer.out_h, layer.out_w)
        v = _input_transform(x, layer.pad_h, layer.pad_w, th, tw, layer.groups, tile_major=True)
        z = _stack(layer.k, tiles, layer.groups, x.dtype, x.device)
        launch(x.device, _kernel(x.device, "wino_grad_transform", x.dtype), (tw, th, layer.n * layer.k),
               _tile_local(th, tw),
               grad_y.buffer, np.int64(grad_y.offset), np.int32(layer.n), np.int32(layer.k),
               np.int32(layer.out_h), np.int32(layer.out_w), np.int32(th), np.int32(tw),
               np.int32(_channel_major(th, tw)),
               z.buffer, np.int64(z.offset), np.int64(z.strides[0]))
        cg = layer.c // layer.groups
        mw = _stack(layer.k, cg, layer.groups, x.dtype, x.device)
        # v is [16][groups][tiles][cg] (tile-major): per (element, group) a tiles × cg matrix
        v_groups = Tensor(v.buffer, (16 * layer.groups, tiles, cg), v.dtype, v.device,
                          (v.strides[0] if layer.groups == 1 else tiles * cg, cg, 1), v.offset)
        gemm_batched(_grouped(z, layer.groups), v_groups, c=_grouped(mw, layer.groups))
        launch(x.device, _kernel(x.device, "wino_filter_grad", x.dtype), (cg, layer.k), _filter_local(cg),
               mw.buffer, np.int64(mw.offset), np.int64(mw.strides[0]), np.int32(layer.k), np.int32(cg),
               gw.buffer, np.int64(gw.offset))
        return gw


STRATEGY = WinogradStrategy()
