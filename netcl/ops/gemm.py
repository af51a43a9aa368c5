"""General matrix products: gemm(a, b, c=None, alpha, beta, trans_a, trans_b) and a batched form.

Operands may be any 2-D (3-D for batched) views: the kernels address A and C through offsets and
strides, so transposed or sliced operands are not copied. B is read as vectors along N, so it must
have unit stride there; when it does not (a transposed or strided B), or when the tuned parameters ask
for it and its rows would collide in the cache sets (walking a row-major B down K with a power-of-two
leading dimension), B is first packed into NR-column panels (``gemm_pack_b`` / ``gemm_pack_bt``). An A
read down its columns is packed likewise. Operands that fit in L1 are never packed: for small products
one launch fewer matters more (see docs/explanation/gemm.md).

Kernel parameters come from the tuning database (``netcl tune gemm``; netcl.runtime.tuning_db), looked up per
dtype and shape class, falling back to the built-in table for the device kind.
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..runtime import first_step
from ..runtime.cl_activation import ACTIVATIONS
from ..runtime.device import resolve_device
from ..runtime.kernels import VARYING, PreparedLaunch, get_kernel
from ..tensor import Tensor
from ..runtime import tuning_db as db
from . import gemm_standin
from .gemm_packing import TINY_PRODUCT_FLOP, packing, release_workspaces, workspace  # noqa: F401  (release_workspaces: public)

# The template's parameters and their defaults (kernels/gemm.cl documents each).
DEFAULT_PARAMS = {"MR": 4, "VW": 8, "NV": 2, "WG_M": 1, "WG_N": 1, "KU": 1, "LOCAL": 0, "KC": 16, "PACK_A": 0,
                  "PACK_B": 0, "ORDER": "nm"}
PARAM_NAMES = tuple(DEFAULT_PARAMS)
# The device state's tables (netcl.runtime.device_state): looked-up parameters, and launch plans.
PARAMETERS, PLANS = "gemm parameters", "gemm plans"


def normalize(params: dict) -> dict:
    """A complete, canonical parameter set (parameters a variant ignores get their defaults, so equal
    kernels have equal keys); ValueError when a value is out of range."""
    p = {**DEFAULT_PARAMS, **{k: params[k] for k in PARAM_NAMES if k in params}}
    for k in PARAM_NAMES:
        if k != "ORDER" and (not isinstance(p[k], int) or isinstance(p[k], bool) or p[k] < (0 if k in (
                "LOCAL", "PACK_A", "PACK_B") else 1)):
            raise ValueError(f"gemm parameter {k}={p[k]!r} is not a valid count")
    if p["ORDER"] not in ("nm", "mn") or p["VW"] not in (1, 2, 3, 4, 8, 16) or p["LOCAL"] > 1:
        raise ValueError(f"gemm parameters out of range: {params}")
    if p["LOCAL"]:
        p.update(PACK_A=0, PACK_B=0, KU=1)
    else:
        p["KC"] = DEFAULT_PARAMS["KC"]
    return p


# A launch of at least this many products, each one tiny alone (TINY_PRODUCT_FLOP), is a "batched" one:
# the Winograd F(4×4) strategy's 36 products of a layer at a small batch (ResNet's 128×49×128 at batch 1)
BATCHED_MIN = 8


def shape_class(M: int, N: int, K: int, batch: int = 1, batched: bool = True) -> str:
    """The tuning database's key suffix for a product: the tuner measures one representative per class.
    "tiny" products take about one launch's time, so their best tile is the one that keeps the grid
    small and its edges cheap (64x10x500, LeNet's last layer, runs faster with 8x8 tiles than with the
    small_mn class's). "batched" launches are many such products at once (a Winograd layer's at a small
    batch): each product's K loop is short and its edges are a large part of it, and the grid has the
    batch to spread over, so their best tile differs from a single product's of the same shape.
    "small_n" products have many rows and few columns, a convolution's late layers at batch 1 (ResNet's
    512x49x4608): a tile wide along N wastes most of its lanes on their edge, so they are tuned apart from
    "small_mn", whose representatives are few rows by many columns. A batched launch is tiny only if the
    whole batch is. ``batched=False`` gives the class a launch had before the batched class existed
    (the one a device without a batched entry takes its tile from)."""
    if 2 * M * N * K * batch <= TINY_PRODUCT_FLOP:
        return "tiny"
    if batched and batch >= BATCHED_MIN and 2 * M * N * K <= TINY_PRODUCT_FLOP:
        return "batched"
    if K <= 96:
        return "small_k"
    if N <= 96 < M:
        return "small_n"
    if M <= 96 or N <= 96:
        return "small_mn"
    return "large"


def params_for(device, dtype, M: int, N: int, K: int, batch: int = 1) -> dict:
    """Kernel parameters for one product: the tuned entry for (dtype, shape class), else for the dtype
    (a fresh dict; lookups are memoized until the tuning database changes). A batched launch on a device
    tuned without that class takes the entry its products' own class has."""
    name = np.dtype(dtype).name
    classes = class_chain(M, N, K, batch)
    memo = device.state.table(PARAMETERS)
    memo_key = (name, classes, db.generation())
    p = memo.get(memo_key)
    if p is None:
        if len(memo) > 1024:
            memo.clear()
        p = memo[memo_key] = _lookup_params(device, name, classes)
    return dict(p)


def expected_gflops(device, dtype, M: int, N: int, K: int) -> float | None:
    """The rate `netcl tune gemm` measured for this product's (dtype, shape class), or None when untuned."""
    entry = db.lookup(device, "gemm", f"{np.dtype(dtype).name}/{shape_class(M, N, K)}")
    rate = (entry or {}).get("gflops")
    return float(rate) if isinstance(rate, (int, float)) else None


def lanes_in_256_bits(dtype) -> int:
    """Lanes of ``dtype`` in one 256-bit register (AVX2's ymm): 8 floats, 4 doubles."""
    return 8 if np.dtype(dtype).name == "float32" else 4


def native_lanes(device, dtype) -> int:
    """Lanes of the device's native vector for ``dtype``, in which register tiles are counted: what a CPU
    reports (16 floats on AVX-512, 8 on AVX2). A device that reports one lane (a GPU, whose vectors are
    its work-items) or an unusual width counts in 256-bit registers."""
    name = np.dtype(dtype).name
    default = lanes_in_256_bits(name)
    reported = int(getattr(device, "native_vector_width", {}).get(name, 0) or 0)
    if getattr(device, "kind", "cpu") != "cpu" or reported not in (4, 8, 16):
        return default
    return reported


def register_lanes(device, dtype) -> int:
    """Lanes of the vectors a CPU device's compiler really builds: the VW of the GEMM register tile that
    `netcl tune gemm` measured fastest for large products, where the user tuned the device, else
    :func:`native_lanes`. A driver may compile for a narrower ISA than its device reports (the PoCL wheel
    builds AVX2 for a Zen 4 that reports 16 floats), and only a measurement tells. Templates that size
    register blocks by the vector (conv_blocked.cl) take it from here."""
    name = np.dtype(dtype).name
    memo = device.state.table(PARAMETERS)
    memo_key = (name, "register_lanes", db.generation())
    tuned = memo.get(memo_key)
    if tuned is None:
        tuned = 0  # no measurement: the reported width, read afresh below
        if getattr(device, "kind", "cpu") == "cpu" and db.source(device, "gemm", f"{name}/large") == "user":
            tuned = params_for(device, name, 1024, 1024, 1024)["VW"]
        memo[memo_key] = tuned
    return tuned if tuned in (4, 8, 16) else native_lanes(device, name)


# A class with no entry of its own takes its neighbour's before the dtype's: a device tuned before
# "small_n" existed serves those products with its small_mn tile rather than its large one.
CLASS_FALLBACK = {"small_n": "small_mn"}


def class_chain(M: int, N: int, K: int, batch: int = 1) -> tuple[str, ...]:
    """The shape classes whose measurements serve a product, the first measured one winning: its own
    class, for a batched launch then its products' own class (a device tuned before the batched class
    existed), then each one's CLASS_FALLBACK neighbour."""
    classes = [shape_class(M, N, K, batch)]
    if classes[0] == "batched":
        classes.append(shape_class(M, N, K, batch, batched=False))
    classes += [CLASS_FALLBACK[c] for c in classes if c in CLASS_FALLBACK]
    return tuple(dict.fromkeys(classes))


def _lookup_params(device, name: str, classes: tuple[str, ...]) -> dict:
    for served in classes + (None,):  # None: the dtype's own entry, for the product's own class
        key = name if served is None else f"{name}/{served}"
        p = db.lookup(device, "gemm", key) or {}
        if p:
            break
    if served is None:
        served = next(c for c in classes if c != "batched")
    if p and served == "large" and device.kind == "cpu" and db.source(device, "gemm", key) == "builtin":
        # The built-in CPU tiles were measured on 256-bit vectors. For large products an untuned device
        # keeps the tile's shape in vectors at its own vector's width (AVX-512 more than doubles the rate
        # of a large product). Smaller classes stay at 256 bits: their time is launches and edges, and
        # PoCL takes twice as long to compile a 16-lane tile, which a cold first step pays once per class.
        p["VW"] = native_lanes(device, name)
    try:
        return normalize(p)
    except ValueError as exc:
        warnings.warn(f"ignoring the tuned gemm parameters for {name} ({exc}); using the defaults",
                      RuntimeWarning, stacklevel=3)
        return normalize(db.BUILTIN["cpu" if device.kind == "cpu" else "any"]["gemm"][name])


def _spread(p: dict, blocks_m: int, blocks_n: int, batch: int, units: int) -> None:
    """Halve the work-group until there are two groups per compute unit (or it is a single item): a
    small product in one large group would run on one core while the others idle."""
    def groups():
        return -(-blocks_m // p["WG_M"]) * -(-blocks_n // p["WG_N"]) * batch
    while groups() < 2 * units and p["WG_M"] * p["WG_N"] > 1:
        name = "WG_M" if p["WG_M"] >= p["WG_N"] else "WG_N"
        p[name] = max(1, p[name] // 2)


def packing_bytes(device, dtype, M: int, N: int, K: int, a_batches: int, b_batches: int, a_cs: int, b_rs: int,
                  b_cs: int) -> tuple[int, int]:
    """Bytes of the A and B packing buffers that gemm_batched needs for op(A) (M×K) times op(B) (K×N)
    with the given batch counts and element strides of op(A) and op(B). The buffers are kept per device
    and grown on demand, so callers that report workspace (the conv strategies) add up growths."""
    if min(M, N, K) <= 0 or runs_as_dot_products(M, N, max(a_batches, b_batches), a_cs, b_rs):
        return 0, 0
    p = params_for(resolve_device(device), dtype, M, N, K, max(a_batches, b_batches))
    if p["LOCAL"]:
        return 0, 0
    itemsize = np.dtype(dtype).itemsize
    pack_a, pack_b = packing(p, itemsize, M, N, K, a_cs, b_rs, b_cs, max(a_batches, b_batches))
    a_bytes = a_batches * -(-M // p["MR"]) * K * p["MR"] * itemsize if pack_a else 0
    nr = p["VW"] * p["NV"]
    b_bytes = b_batches * -(-N // nr) * K * nr * itemsize if pack_b else 0
    return a_bytes, b_bytes


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
    if a.dtype == np.float64 and not a.device.has_fp64:
        raise DTypeError(f"{what}: {a.device.describe()} has no float64 support")


def _op_dims(t: Tensor, trans: bool):
    """(rows, cols, row stride, col stride) of op(t) for the last two axes."""
    r, k = t.shape[-2:]
    rs, cs = t.strides[-2:]
    return (k, r, cs, rs) if trans else (r, k, rs, cs)


def gemm_batched(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
                 trans_a: bool = False, trans_b: bool = False, params: dict | None = None, *,
                 bias: Tensor | None = None, residual: Tensor | None = None, activation: str = "none") -> Tensor:
    """C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for 3-D operands, in one launch; an operand with a
    batch of 1 is broadcast. ``params`` overrides the tuned kernel parameters (the tuner and the tests
    use it; an explicit PACK_A=1 packs A even where the packing rules would read it in place).

    An inference epilogue applied as C is stored: ``bias`` (M values, one per row of C) is added, then
    ``residual`` (a tensor of C's shape and strides), then ``activation`` (one of
    netcl.runtime.cl_activation.ACTIVATIONS): C[i] = act(alpha · op(A[i]) @ op(B[i]) + beta · C[i] + bias
    + residual[i])."""
    _check_operands(a, b, c, 3, "gemm_batched")
    M, K, a_rs, a_cs = _op_dims(a, trans_a)
    K2, N, b_rs, b_cs = _op_dims(b, trans_b)
    batch = max(a.shape[0], b.shape[0])
    if K != K2 or a.shape[0] not in (1, batch) or b.shape[0] not in (1, batch):
        raise ShapeError(f"gemm_batched: op(a) of shape {(a.shape[0], M, K)} (a {a.shape}) and op(b) of shape "
                         f"{(b.shape[0], K2, N)} (b {b.shape}) do not multiply (trans_a={trans_a}, trans_b={trans_b})")
    written_in_place = c is not None
    if c is None:
        c = Tensor.empty((batch, M, N), a.dtype, a.device)
        beta = 0.0
    elif c.shape != (batch, M, N):
        raise ShapeError(f"gemm_batched: c has shape {c.shape}, expected {(batch, M, N)} for a {a.shape} "
                         f"and b {b.shape}")
    if c.size == 0:
        return c
    layout = (a.dtype.char, M, N, K, batch, a.shape[0], b.shape[0],
              a_rs, a_cs, a.strides[0] if a.shape[0] > 1 else 0,
              b_rs, b_cs, b.strides[0] if b.shape[0] > 1 else 0, c.strides[1], c.strides[2], c.strides[0])
    epilogue = _epilogue(c, bias, residual, activation)
    _plan(a.device, layout, params, epilogue)(a.buffer, a.offset, b.buffer, b.offset, c.buffer, c.offset, alpha,
                                              beta, bias, residual)
    if written_in_place:
        c.mark_written()
    return c


NO_EPILOGUE = (False, False, "none")


def _epilogue(c: Tensor, bias: Tensor | None, residual: Tensor | None, activation: str) -> tuple:
    """The (BIAS, RESIDUAL, ACT) template parameters of a product's epilogue, its operands checked."""
    if bias is None and residual is None and activation == "none":
        return NO_EPILOGUE
    if activation not in ACTIVATIONS:
        raise ShapeError(f"gemm_batched: unknown activation {activation!r}; expected one of {ACTIVATIONS}")
    if bias is not None and (bias.shape != (c.shape[1],) or bias.dtype != c.dtype or bias.device is not c.device):
        raise ShapeError(f"gemm_batched: the bias must be a {c.dtype} vector of the product's {c.shape[1]} rows "
                         f"on its device; got shape {bias.shape}, {bias.dtype}")
    if residual is not None and (residual.shape != c.shape or residual.strides != c.strides
                                 or residual.dtype != c.dtype or residual.device is not c.device):
        raise ShapeError(f"gemm_batched: the residual must have the result's shape {c.shape}, strides {c.strides} "
                         f"and dtype {c.dtype}; got shape {residual.shape}, strides {residual.strides}, "
                         f"{residual.dtype}")
    return (bias is not None, residual is not None, activation)


def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
         trans_a: bool = False, trans_b: bool = False, params: dict | None = None) -> Tensor:
    """alpha * op(a) @ op(b) + beta * c for 2-D operands (op = transpose when trans_* is set)."""
    _check_operands(a, b, c, 2, "gemm")
    M, K, a_rs, a_cs = _op_dims(a, trans_a)
    K2, N, b_rs, b_cs = _op_dims(b, trans_b)
    if K != K2:
        raise ShapeError(f"gemm: op(a) of shape {(M, K)} (a {a.shape}, trans_a={trans_a}) and op(b) of shape "
                         f"{(K2, N)} (b {b.shape}, trans_b={trans_b}) do not multiply")
    written_in_place = c is not None
    if c is None:
        c = Tensor.empty((M, N), a.dtype, a.device)
        beta = 0.0
    elif c.shape != (M, N):
        raise ShapeError(f"gemm: c has shape {c.shape}, expected {(M, N)} for a {a.shape} and b {b.shape}")
    if c.size == 0:
        return c
    layout = (a.dtype.char, M, N, K, 1, 1, 1, a_rs, a_cs, 0, b_rs, b_cs, 0, c.strides[0], c.strides[1], 0)
    _plan(a.device, layout, params)(a.buffer, a.offset, b.buffer, b.offset, c.buffer, c.offset, alpha, beta)
    if written_in_place:
        c.mark_written()
    return c


# Launch plans, one per operand layout, parameter override and tuning-database generation, in the
# device's state: a small product's host work (parameter lookup, packing rules, argument setting) costs
# several times its kernel time on a CPU driver when done at every call.
_MAX_PLANS = 512
# Products with at most this many rows whose B is read along K (a Linear layer's weight at a small batch)
# run as dot products over B's rows (kernels/gemm_dot.cl): B streams once, in place, instead of being
# packed into panels at every call. Above it, the tiled kernel's register reuse wins.
DOT_MAX_ROWS = 8


def _plan(dev, layout: tuple, params: dict | None, epilogue: tuple = NO_EPILOGUE) -> "_Plan":
    override = None if params is None else tuple(sorted(normalize(params).items()))
    key = (layout, override, epilogue, db.generation())
    plans = dev.state.table(PLANS)
    plan = plans.get(key)
    if plan is None or (plan.deferred is not None and plan.deferred.due()):
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plan = plans[key] = _Plan(dev, layout, params, may_borrow=plan is None, epilogue=epilogue)
    return plan


class _Plan:
    """The launches of one product layout: optional packs of A and B into the workspaces, then the tiled
    product. Calling it with the operands' buffers, offsets and the scalars enqueues them. During the cold
    start the product may run on another layout's kernel (netcl.ops.gemm_standin); ``deferred`` then says
    when to make the plan again with its own."""

    def __init__(self, dev, layout: tuple, params: dict | None, may_borrow: bool = True,
                 epilogue: tuple = NO_EPILOGUE):
        (dtype_char, M, N, K, batch, a_batches, b_batches, a_rs, a_cs, a_bs, b_rs, b_cs, b_bs,
         c_rs, c_cs, c_bs) = layout
        dtype = np.dtype(dtype_char)
        i32, i64 = np.int32, np.int64
        self.device = dev
        self.scalar = dtype.type
        self.deferred = None
        self.dot = None
        # An epilogue runs in the tiled kernel's store, so such a product never goes to the dot-product
        # kernel nor borrows another layout's kernel during the cold start.
        fused = epilogue != NO_EPILOGUE
        if params is None and not fused and runs_as_dot_products(M, N, batch, a_cs, b_rs):
            self.dot = _dot_launch(dev, dtype, M, N, K, a_rs, b_cs, c_rs, c_cs)
            return
        p = normalize(params) if params is not None else params_for(dev, dtype, M, N, K, batch)
        T = dtypes.c_type(dtype)
        template_params = p
        if not p["LOCAL"]:
            p["PACK_A"], p["PACK_B"] = packing(p, dtype.itemsize, M, N, K, a_cs, b_rs, b_cs, batch,
                                                explicit=params is not None)
            # One render for the product and its packs (one program to build): the work-group shape is a
            # launch setting here (see kernels/gemm.cl, WG_M), and the pack kernels do not read it.
            template_params = {**p, "WG_M": 1, "WG_N": 1}
            borrowed = (gemm_standin.stand_in(dev, T, template_params, b_cs == 1 or N == 1)
                        if params is None and may_borrow and not fused else None)
            if borrowed is not None:
                template_params, (wg_m, wg_n) = borrowed
                p = {**template_params, "WG_M": wg_m, "WG_N": wg_n}
                self.deferred = first_step.Deferred(dev)
        MR, NR = p["MR"], p["VW"] * p["NV"]
        blocks_n, blocks_m = -(-N // NR), -(-M // MR)
        self.pack_a = self.pack_b = None
        if not p["LOCAL"]:
            if p["PACK_A"]:
                panels = blocks_m
                self.a_bytes = a_batches * panels * K * MR * dtype.itemsize
                kernel = get_kernel(dev, "gemm.cl", "gemm_pack_a", T=T, **template_params)
                self.pack_a = PreparedLaunch(dev, kernel, (K, panels, a_batches), None, (
                    i32(M), i32(K), i32(a_batches), VARYING, VARYING, i64(a_rs), i64(a_cs), i64(a_bs), VARYING))
                a_rs, a_cs = 0, MR
                a_bs = panels * K * MR if a_batches > 1 else 0
            if p["PACK_B"]:
                panels = blocks_n
                self.b_bytes = b_batches * panels * K * NR * dtype.itemsize
                if b_rs == 1 and b_cs != 1:  # K is the unit-stride direction: transpose in 16 x NR blocks
                    kernel = get_kernel(dev, "gemm.cl", "gemm_pack_bt", T=T, **template_params)
                    self.pack_b = PreparedLaunch(dev, kernel, (-(-K // 16), panels, b_batches), None, (
                        i32(K), i32(N), i32(b_batches), VARYING, VARYING, i64(b_cs), i64(b_bs), VARYING))
                else:
                    kernel = get_kernel(dev, "gemm.cl", "gemm_pack_b", T=T, **template_params)
                    self.pack_b = PreparedLaunch(dev, kernel, (K, panels, b_batches), None, (
                        i32(K), i32(N), i32(b_batches), VARYING, VARYING, i64(b_rs), i64(b_cs), i64(b_bs),
                        VARYING))
                b_rs, b_cs = NR, 1
                b_bs = panels * K * NR if b_batches > 1 else 0
            elif N == 1:
                b_cs = 1  # a single column: its stride is never used
            if self.deferred is None:  # a borrowed kernel keeps the work-group it was compiled for
                _spread(p, blocks_m, blocks_n, batch, dev.compute_units)
        bias, residual, activation = epilogue
        kernel = get_kernel(dev, "gemm.cl", "gemm_tiled", T=T, **template_params,
                            **({"BIAS": bias, "RESIDUAL": residual, "ACT": activation} if fused else {}))
        wg_n, wg_m = p["WG_N"], p["WG_M"]
        if p["ORDER"] == "nm":
            grid, local = (blocks_n, blocks_m, batch), (wg_n, wg_m, 1)
        else:
            grid, local = (blocks_m, blocks_n, batch), (wg_m, wg_n, 1)
        self.product = PreparedLaunch(dev, kernel, grid, local, (
            i32(M), i32(N), i32(K), i32(batch), VARYING, VARYING,
            VARYING, VARYING, i64(a_rs), i64(a_cs), i64(a_bs),
            VARYING, VARYING, i64(b_rs), i64(b_cs), i64(b_bs),
            VARYING, VARYING, i64(c_rs), i64(c_cs), i64(c_bs), VARYING, VARYING, VARYING, VARYING))

    def __call__(self, a_buf, a_off: int, b_buf, b_off: int, c_buf, c_off: int, alpha: float, beta: float,
                 bias: Tensor | None = None, residual: Tensor | None = None):
        if self.dot is not None:
            self.dot(self.scalar(alpha), self.scalar(beta), a_buf, np.int64(a_off), b_buf, np.int64(b_off), c_buf,
                     np.int64(c_off))
            return
        dev = self.device
        if self.pack_a is not None:
            packed = workspace(dev, "a", self.a_bytes)
            self.pack_a(a_buf, np.int64(a_off), packed)
            a_buf, a_off = packed, 0
        if self.pack_b is not None:
            packed = workspace(dev, "b", self.b_bytes)
            self.pack_b(b_buf, np.int64(b_off), packed)
            b_buf, b_off = packed, 0
        # without BIAS / RESIDUAL the kernel reads neither: C's buffer stands in
        bias_buf, bias_off = (c_buf, 0) if bias is None else (bias.buffer, bias.offset)
        residual_buf, residual_off = (c_buf, 0) if residual is None else (residual.buffer, residual.offset)
        self.product(self.scalar(alpha), self.scalar(beta), a_buf, np.int64(a_off), b_buf, np.int64(b_off),
                     c_buf, np.int64(c_off), bias_buf, np.int64(bias_off), residual_buf, np.int64(residual_off))


def runs_as_dot_products(M: int, N: int, batch: int, a_cs: int, b_rs: int) -> bool:
    """Whether a product (without tuned-parameter overrides) runs on kernels/gemm_dot.cl: one matrix of at
    most DOT_MAX_ROWS rows, A's rows and op(B)'s columns unit stride along K, and more than one column."""
    return batch == 1 and M <= DOT_MAX_ROWS and N > 1 and a_cs == 1 and b_rs == 1


def _dot_launch(dev, dtype, M: int, N: int, K: int, lda: int, ldb: int, c_rs: int, c_cs: int) -> PreparedLaunch:
    """The launch of kernels/gemm_dot.cl for an M-row product (M <= DOT_MAX_ROWS) against a B read along K.
    Columns per work-item shrink as rows grow, keeping the accumulators (rows x columns vectors) within a
    CPU's vector registers."""
    columns = 4 if M <= 2 else (2 if M <= 4 else 1)
    kernel = get_kernel(dev, "gemm_dot.cl", "gemm_dot", T=dtypes.c_type(dtype), ROWS=M, NB=columns,
                        VW=lanes_in_256_bits(dtype))
    local = (1,) if dev.kind == "cpu" else None  # on a CPU the explicit vectors are the parallelism
    i32, i64 = np.int32, np.int64
    return PreparedLaunch(dev, kernel, (-(-N // columns),), local, (
        i32(N), i32(K), VARYING, VARYING, VARYING, VARYING, i64(lda), VARYING, VARYING, i64(ldb),
        VARYING, VARYING, i64(c_rs), i64(c_cs)))
