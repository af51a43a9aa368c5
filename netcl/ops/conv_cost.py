"""The planner's cost model: a predicted time for one pass of one convolution strategy on one device.

time = launches · launch overhead + bytes moved / bandwidth + flops / (GEMM rate · shape efficiency · strategy
efficiency). The device numbers come, best first, from the tuning database (the GEMM rate the tuner
measured), from this module's own calibration run (``calibrate``: a copy kernel and the GEMM, stored in the
cache), else from a rough estimate by device kind. Each strategy's formula says how many flops it does,
which bytes it moves (im2col's lowered matrix, MEC's smaller one, Winograd's transformed tiles) and how
well its inner loop uses the arithmetic units (direct convolution poorly). Measured plans also record how far
the model was off per strategy and pass; later predictions on that device are scaled by those ratios.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .conv_common import ConvLayer

# Each strategy's speed per pass relative to the calibrated GEMM rate of its products' shape class (for
# implicit_gemm, once its tile padding and occupancy are accounted for; Winograd's flops are already those
# of its transformed products); above 1 where the products run faster than the calibration's
# representative ones. Fitted on PoCL 3.1 (pthread, 2 cores) with `benchmarks/planner_accuracy.py --fit`
# over the LeNet and MEC layers (run 13 of docs/planner.md, after the MEC, implicit GEMM and Winograd
# kernel changes); "gemm" (1×1) takes im2col's. A measured plan refines them per device (the planner's
# corrections).
EFFICIENCY = {
    "direct": {"forward": 0.023, "backward_data": 0.022, "backward_weight": 0.023},
    "im2col": {"forward": 1.366, "backward_data": 0.928, "backward_weight": 0.776},
    "implicit_gemm": {"forward": 0.241, "backward_data": 0.228, "backward_weight": 4.881},
    "winograd": {"forward": 1.201, "backward_data": 0.702, "backward_weight": 0.464},
    "mec": {"forward": 1.286, "backward_data": 0.803, "backward_weight": 1.065},
}
EFFICIENCY["gemm"] = EFFICIENCY["im2col"]  # the same products, without the lowering
DEFAULT_EFFICIENCY = 0.3  # a strategy this model does not know

# (rows, columns, inner) tile of implicit_gemm's kernel: a dimension that is not a multiple of its tile
# wastes the padding's arithmetic.
IMPLICIT_GEMM_TILE = (32, 64, 16)
WORK_PER_UNIT = 4   # work-groups per compute unit needed to keep it busy


@dataclass
class DeviceProfile:
    gemm_gflops: float       # a mid-sized square GEMM (the "large" shape class), the dtype's rate
    bandwidth_gbs: float     # sustained copy bandwidth (read + write counted)
    launch_ms: float         # one kernel launch, enqueue to completion of an empty kernel
    source: str              # "calibration", "tuning database", "estimate" (joined when mixed)
    class_gflops: dict = field(default_factory=dict)  # GEMM rate per netcl.ops.gemm.shape_class

    def rate(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """GFLOP/s of a (batched) product of this shape: its shape class's measured rate, else the square one."""
        from .gemm import shape_class
        return float(self.class_gflops.get(shape_class(m, n, k, batch)) or self.gemm_gflops)

    def as_dict(self) -> dict:
        return {"gemm_gflops": round(self.gemm_gflops, 2), "bandwidth_gbs": round(self.bandwidth_gbs, 2),
                "launch_ms": round(self.launch_ms, 4), "source": self.source,
                "class_gflops": {k: round(v, 2) for k, v in sorted(self.class_gflops.items())}}


# One representative product per GEMM shape class (netcl.ops.gemm.shape_class), conv-like and quick.
CLASS_SHAPES = {"large": (256, 256, 256), "small_k": (32, 9216, 50), "small_mn": (50, 2048, 500),
                "tiny": (64, 10, 500)}
# Bumped whenever calibrate() measures differently: stored calibrations of another version are not used.
CALIBRATION_VERSION = 2


def estimate(device) -> DeviceProfile:
    """A rough profile from the device's description alone (no kernel runs)."""
    cu = max(1, int(getattr(device, "compute_units", 1) or 1))
    kind = getattr(device, "kind", "cpu")
    if kind == "gpu":
        return DeviceProfile(gemm_gflops=40.0 * cu, bandwidth_gbs=150.0, launch_ms=0.01, source="estimate")
    # a CPU core sustains some 40 GFLOP/s of float32 GEMM and 20 GB/s of copy (this 2-core VM calibrates
    # at 87-128 GFLOP/s and 54-63 GB/s); memory bandwidth stops growing with the cores long before 10
    return DeviceProfile(gemm_gflops=40.0 * cu, bandwidth_gbs=20.0 * min(cu, 10), launch_ms=0.1, source="estimate")


def winograd_tile(strategy) -> tuple[int, int]:
    """(m, r) of the F(m×m, r×r) transform a Winograd strategy uses (it may say so as .tile or .m)."""
    m = getattr(strategy, "tile", None) or getattr(strategy, "m", None) or 2
    try:
        m = int(m[0] if isinstance(m, (tuple, list)) else m)
    except (TypeError, ValueError):
        m = 2
    return m, 3


def _implicit_geometry(strategy, layer: ConvLayer, pass_: str):
    """((rows, columns, inner), tile, slices, padding) of implicit_gemm's product: from the strategy's own
    module (gemm_dims, choose_tile, padding_granularity) when it has them, so that the model follows the
    kernel, else the plain GEMM."""
    module = sys.modules.get(type(strategy).__module__) if strategy is not None else None
    g, cg, kg = layer.groups, layer.c // layer.groups, layer.k // layer.groups
    dims = {"forward": (kg, layer.n * layer.out_h * layer.out_w, cg * layer.r * layer.s),
            "backward_data": (cg, layer.n * layer.h * layer.w, kg * layer.r * layer.s),
            "backward_weight": (kg, cg * layer.r * layer.s, layer.n * layer.out_h * layer.out_w)}[pass_]
    tile, slices, padding = IMPLICIT_GEMM_TILE, g, None
    try:
        dims = tuple(int(d) for d in module.gemm_dims(layer, pass_))
        tile = tuple(int(t) for t in module.choose_tile(layer, pass_)[:3])
        if pass_ == "backward_data":  # one slice per residue class of the stride
            slices = g * layer.stride_h * layer.stride_w
        padding = tuple(int(t) for t in module.padding_granularity(tile))
    except (AttributeError, TypeError, ValueError):
        pass
    return dims, tile, slices, padding


def _padded(d: int, tile: int) -> float:
    return d / (math.ceil(d / tile) * tile)


def tile_efficiency(m: int, n: int, k: int, tile=IMPLICIT_GEMM_TILE, batch: int = 1, units: int = 1,
                    padding=None) -> float:
    """Useful fraction of a tiled GEMM's arithmetic: padding (to the tile, or to the finer ``padding``
    granularity a kernel that trims its partial tiles pays), and work-groups too few to fill the device."""
    tm, tn, tk = tile
    pm, pn, pk = padding or tile
    groups = math.ceil(m / tm) * math.ceil(n / tn) * batch
    busy = min(1.0, groups / (WORK_PER_UNIT * units))
    return _padded(m, pm) * _padded(n, pn) * _padded(k, pk) * busy


@dataclass
class Terms:
    """A prediction split into its parts (the benchmark fits the efficiencies from these)."""
    arith_ms: float      # at the full GEMM rate, after shape efficiency; divided by the strategy's efficiency
    other_ms: float      # memory traffic and launches

    def total(self, efficiency: float) -> float:
        return self.arith_ms / max(efficiency, 1e-6) + self.other_ms


def terms(name: str, layer: ConvLayer, pass_: str, profile: DeviceProfile, strategy=None,
          workspace_bytes: int = 0, units: int = 1) -> Terms:
    """The cost model's formula for one strategy and pass (see the module docstring)."""
    b = layer.itemsize
    g, cg, kg = layer.groups, layer.c // layer.groups, layer.k // layer.groups
    rs, pq, hw, n = layer.r * layer.s, layer.out_h * layer.out_w, layer.h * layer.w, layer.n
    x_bytes, y_bytes = n * layer.c * hw * b, n * layer.k * pq * b
    w_bytes = layer.k * cg * rs * b
    rate = profile.gemm_gflops * 1e6  # flops per ms
    launch = profile.launch_ms

    def bw(nbytes):
        return nbytes / (profile.bandwidth_gbs * 1e6)

    def gemm(m, ncols, k, batch=1, tile=None, padding=None):
        # netcl's GEMM runs at its shape class's measured rate (the class already reflects thin or short
        # products); implicit_gemm's own kernel pays for its tile padding and occupancy.
        shaped = profile.rate(m, ncols, k, batch) * 1e6
        efficiency = tile_efficiency(m, ncols, k, tile, batch, units, padding) if tile else 1.0
        return 2.0 * m * ncols * k * batch / (shaped * efficiency)

    # (rows, columns, inner) of one group's product per pass, as implicit_gemm and im2col lay them out.
    dims = {"forward": (kg, n * pq, cg * rs), "backward_data": (cg * rs, n * pq, kg),
            "backward_weight": (kg, cg * rs, n * pq)}[pass_]
    if name == "im2col":
        cols = n * pq * cg * rs * g * b
        transform = 2 * y_bytes if n > 1 else 0  # (K, NPQ) <-> (N, K, PQ)
        lowering = x_bytes + cols if pass_ != "backward_data" else 2 * cols + x_bytes  # im2col / col2im
        moved = lowering + transform + cols + w_bytes + y_bytes
        return Terms(gemm(*dims, g), bw(moved) + launch * 3)
    if name == "gemm":
        calls = g if not (g > 1 and n < g) else n
        if pass_ == "backward_weight":
            return Terms(gemm(kg, cg, hw, g) * n, bw(x_bytes + y_bytes + n * w_bytes) + launch * n)
        m, k = (kg, cg) if pass_ == "forward" else (cg, kg)
        return Terms(gemm(m, hw, k, n * g), bw(x_bytes + y_bytes + w_bytes) + launch * calls)
    if name == "implicit_gemm":
        (rows, cols_, inner), tile, slices, padding = _implicit_geometry(strategy, layer, pass_)
        return Terms(gemm(rows, cols_, inner, slices, tile, padding), bw(x_bytes + y_bytes + w_bytes) + launch)
    if name == "mec":
        # The compact lowering L (n·ow rows of padded height × S × C, about R/stride times smaller than
        # im2col's), then GEMMs over shifted partitions of it: Solution A is oh calls of
        # (n·ow × RSC)·(RSC × K), Solution B n·oh calls of (ow × RSC)·(RSC × K) batched per image.
        hp = layer.h + 2 * layer.pad_h
        lowered = n * layer.out_w * hp * layer.s * layer.c * b
        width = cg * rs
        solution = "A"
        if strategy is not None and hasattr(strategy, "solution"):
            try:
                solution = strategy.solution(layer)
            except Exception:
                solution = "A"
        if pass_ == "forward":
            if solution == "A":
                arith, calls = gemm(n * layer.out_w, kg, width, layer.out_h * g), 3
            else:
                arith, calls = gemm(layer.out_w, kg, width, n * layer.out_h * g), n * g + 2
        elif pass_ == "backward_data":
            arith, calls = gemm(width, layer.out_w, kg, n * layer.out_h * g), layer.out_h * g + 2
        else:
            arith, calls = gemm(kg, width, n * layer.out_w, layer.out_h * g), layer.out_h * g + 2
        return Terms(arith, bw(x_bytes + 3 * lowered + w_bytes + 2 * y_bytes) + launch * calls)
    if name == "winograd":
        m, r = winograd_tile(strategy)
        a = m + r - 1
        oh, ow = (layer.h, layer.w) if pass_ == "backward_data" else (layer.out_h, layer.out_w)
        tiles = n * math.ceil(oh / m) * math.ceil(ow / m)
        # a² products in the transformed domain, batched over the a² positions and the groups.
        prod = {"forward": (kg, tiles, cg), "backward_data": (cg, tiles, kg), "backward_weight": (kg, cg, tiles)}[pass_]
        transformed = tiles * a * a * (cg + kg) * g * b + layer.k * cg * a * a * b
        return Terms(gemm(*prod, a * a * g), bw(x_bytes + w_bytes + y_bytes + 2 * max(transformed, workspace_bytes))
                     + launch * 4)
    # direct and strategies this model does not know: the definition's flops, one work-item per output
    # element, every tensor read once.
    outputs = {"forward": n * layer.k * pq, "backward_data": n * layer.c * hw,
               "backward_weight": layer.k * cg * rs}[pass_]
    busy = min(1.0, outputs / (256 * units))
    return Terms(layer.flops / (rate * busy), bw(x_bytes + y_bytes + w_bytes) + launch * g)


def predict_ms(name: str, layer: ConvLayer, pass_: str, profile: DeviceProfile, strategy=None,
               workspace_bytes: int = 0, units: int = 1) -> float:
    """Predicted milliseconds of ``pass_`` of ``layer`` with strategy ``name`` (before corrections)."""
    eff = EFFICIENCY.get(name, {}).get(pass_, DEFAULT_EFFICIENCY)
    return terms(name, layer, pass_, profile, strategy, workspace_bytes, units).total(eff)


def calibrate(device, dtype: str = "float32") -> dict:
    """Measure this device's copy bandwidth, launch overhead and GEMM rate per shape class (a second or
    two, most of it building the kernels the first time)."""
    from ..tensor import Tensor
    from ..tuning.gemm import calls_per_sample
    from .copy_probe import CopyProbe
    from .elementwise import copy_into
    from .gemm import gemm
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    tiny_src = Tensor.from_host(np.ones(1, dt), device=device)
    tiny_dst = Tensor.empty((1,), dt, device)
    copy = CopyProbe(device, 64 << 20)  # beyond the last-level cache of today's CPUs

    def best_s(fn, repeats, calls=1):
        # The fastest run, not the median: a device characteristic, which load from other processes
        # on a shared CPU can only slow down. The first run builds kernels and warms the buffers.
        fn()
        device.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            device.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)

    launch_s = best_s(lambda: copy_into(tiny_dst, tiny_src), 20)
    copy_s = best_s(copy, 9)
    rates = {}
    for cls, (m, nn, k) in CLASS_SHAPES.items():
        a = Tensor.from_host(rng.uniform(-1, 1, (m, k)).astype(dt), device=device)
        b = Tensor.from_host(rng.uniform(-1, 1, (k, nn)).astype(dt), device=device)
        c = Tensor.empty((m, nn), dt, device)
        flop = 2.0 * m * nn * k
        # a small product as a run of calls with one wait (as a conv pass issues its products)
        calls = calls_per_sample(flop)
        seconds = (best_s(lambda: gemm(a, b, c), 15, calls) - launch_s) / calls
        rates[cls] = flop / max(seconds, 1e-7) / 1e9
    return {"bandwidth_gbs": copy.gbps(max(copy_s - launch_s, 1e-7)), "launch_ms": launch_s * 1e3,
            f"gemm_gflops_{dt.name}": rates["large"], f"gemm_class_gflops_{dt.name}": rates,
            "calibration_version": CALIBRATION_VERSION}
