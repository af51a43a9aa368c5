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
import time
from dataclasses import dataclass

import numpy as np

from .conv_common import ConvLayer

# Fraction of the GEMM rate each strategy's inner loop reaches, per pass, before the shape penalty.
# Calibrated on PoCL 3.1 (pthread, 2 cores): measured time / modelled arithmetic time over the LeNet and
# MEC layers; a measured plan refines them per device (see ``Corrections``).
EFFICIENCY = {
    "direct": {"forward": 0.35, "backward_data": 0.25, "backward_weight": 0.2},
    "im2col": {"forward": 1.0, "backward_data": 1.0, "backward_weight": 0.9},
    "gemm": {"forward": 1.0, "backward_data": 1.0, "backward_weight": 0.9},
    "implicit_gemm": {"forward": 0.6, "backward_data": 0.5, "backward_weight": 0.45},
    "winograd": {"forward": 0.7, "backward_data": 0.6, "backward_weight": 0.5},
    "mec": {"forward": 0.85, "backward_data": 0.8, "backward_weight": 0.75},
}
DEFAULT_EFFICIENCY = 0.3  # a strategy this model does not know


@dataclass
class DeviceProfile:
    gemm_gflops: float       # large square GEMM, the dtype's rate
    bandwidth_gbs: float     # sustained copy bandwidth (read + write counted)
    launch_ms: float         # one kernel launch, enqueue to completion of an empty kernel
    source: str              # "tuning database", "calibration", "estimate" (joined when mixed)

    def as_dict(self) -> dict:
        return {"gemm_gflops": round(self.gemm_gflops, 2), "bandwidth_gbs": round(self.bandwidth_gbs, 2),
                "launch_ms": round(self.launch_ms, 4), "source": self.source}


def estimate(device) -> DeviceProfile:
    """A rough profile from the device's description alone (no kernel runs)."""
    cu = max(1, int(getattr(device, "compute_units", 1) or 1))
    kind = getattr(device, "kind", "cpu")
    if kind == "gpu":
        return DeviceProfile(gemm_gflops=40.0 * cu, bandwidth_gbs=150.0, launch_ms=0.01, source="estimate")
    return DeviceProfile(gemm_gflops=4.0 * cu, bandwidth_gbs=4.0 * cu, launch_ms=0.03, source="estimate")


def gemm_shape_efficiency(m: int, n: int, k: int) -> float:
    """Fraction of the large-GEMM rate a product of this shape reaches: thin or short products lose
    to tile padding and too little parallel work."""
    def f(d, half):
        return d / (d + half)
    return f(m, 12.0) * f(n, 12.0) * f(k, 8.0) / (f(1024, 12.0) ** 2 * f(1024, 8.0))


def _gemm_ms(profile: DeviceProfile, m: int, n: int, k: int, batch: int = 1, efficiency: float = 1.0) -> float:
    flops = 2.0 * m * n * k * batch
    rate = profile.gemm_gflops * 1e6 * gemm_shape_efficiency(m, n, k) * efficiency  # flops per ms
    return flops / max(rate, 1e-9)


def _bytes_ms(profile: DeviceProfile, nbytes: float) -> float:
    return nbytes / (profile.bandwidth_gbs * 1e6)


def _dims(layer: ConvLayer):
    g = layer.groups
    return g, layer.c // g, layer.k // g, layer.out_h * layer.out_w, layer.r * layer.s


def winograd_tile(strategy) -> tuple[int, int]:
    """(m, r) of the F(m×m, r×r) transform a Winograd strategy uses (it may say so as .tile / .m)."""
    m = getattr(strategy, "tile", None) or getattr(strategy, "m", None) or 2
    try:
        m = int(m if not isinstance(m, (tuple, list)) else m[0])
    except (TypeError, ValueError):
        m = 2
    return m, 3


def predict_ms(name: str, layer: ConvLayer, pass_: str, profile: DeviceProfile, strategy=None,
               workspace_bytes: int = 0) -> float:
    """Predicted milliseconds of ``pass_`` of ``layer`` with strategy ``name`` (before corrections)."""
    b = layer.itemsize
    g, cg, kg, hw_out, rs = _dims(layer)
    n = layer.n
    x_bytes = n * layer.c * layer.h * layer.w * b
    w_bytes = layer.k * cg * rs * b
    y_bytes = n * layer.k * hw_out * b
    eff = EFFICIENCY.get(name, {}).get(pass_, DEFAULT_EFFICIENCY)
    launch = profile.launch_ms
    if name in ("im2col", "gemm"):
        cols = n * hw_out * cg * rs * g * b if name == "im2col" else 0
        if pass_ == "forward":
            gemm = _gemm_ms(profile, kg, n * hw_out, cg * rs, g, eff)
            moved = x_bytes + 2 * cols + w_bytes + 2 * y_bytes
        elif pass_ == "backward_data":
            gemm = _gemm_ms(profile, cg * rs, n * hw_out, kg, g, eff)
            moved = 2 * y_bytes + w_bytes + 2 * cols + 2 * x_bytes
        else:
            gemm = _gemm_ms(profile, kg, cg * rs, n * hw_out, g, eff)
            moved = x_bytes + 2 * cols + 2 * y_bytes + w_bytes
        return 3 * launch * g + gemm + _bytes_ms(profile, moved)
    if name == "mec":
        # Lowered matrix: per image, out_w rows of (padded height × S × C): S/… of im2col's size.
        hp = layer.h + 2 * layer.pad_h
        lowered = n * layer.out_w * hp * layer.s * layer.c * b
        if pass_ == "forward":
            gemm = _gemm_ms(profile, n * layer.out_w, kg, cg * rs, layer.out_h * g, eff)
        elif pass_ == "backward_data":
            gemm = _gemm_ms(profile, n * layer.out_w, cg * rs, kg, layer.out_h * g, eff)
        else:
            gemm = _gemm_ms(profile, kg, cg * rs, n * layer.out_w, layer.out_h * g, eff)
        moved = x_bytes + 2 * lowered + w_bytes + 2 * y_bytes
        return 3 * launch * g + gemm + _bytes_ms(profile, moved)
    if name == "winograd":
        m, r = winograd_tile(strategy)
        a = m + r - 1
        tiles = n * math.ceil(layer.out_h / m) * math.ceil(layer.out_w / m)
        # Element-wise products in the transformed domain: a² batched GEMMs of (K × C) @ (C × tiles).
        if pass_ == "backward_weight":
            gemm = _gemm_ms(profile, kg, cg, tiles, a * a * g, eff)
        else:
            gemm = _gemm_ms(profile, kg, tiles, cg, a * a * g, eff)
        transformed = tiles * a * a * (layer.c + layer.k) * b + layer.k * cg * a * a * b
        moved = x_bytes + w_bytes + y_bytes + 2 * max(transformed, workspace_bytes)
        return 4 * launch + gemm + _bytes_ms(profile, moved)
    # direct, implicit_gemm and unknown strategies: the direct definition's flops, each tensor once.
    flops = layer.flops
    shape_eff = gemm_shape_efficiency(kg, n * hw_out, cg * rs)
    if name == "direct":
        shape_eff = max(shape_eff, 0.5)  # no tiles to pad: thin layers lose less than a GEMM would
    arith = flops / max(profile.gemm_gflops * 1e6 * shape_eff * eff, 1e-9)
    return launch * g + arith + _bytes_ms(profile, x_bytes + w_bytes + y_bytes)


def calibrate(device, dtype: str = "float32") -> dict:
    """Measure this device's copy bandwidth, launch overhead and GEMM rate (well under a second)."""
    from ..tensor import Tensor
    from .elementwise import copy_into
    from .gemm import gemm
    dt = np.dtype(dtype)
    n = 1 << 22
    src = Tensor.from_host(np.ones(n, dt), device=device)
    dst = Tensor.empty((n,), dt, device)
    tiny_src = Tensor.from_host(np.ones(1, dt), device=device)
    tiny_dst = Tensor.empty((1,), dt, device)
    side = 256
    a = Tensor.from_host(np.random.default_rng(0).uniform(-1, 1, (side, side)).astype(dt), device=device)
    out = Tensor.empty((side, side), dt, device)

    def median_s(fn, repeats):
        fn()
        device.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            device.synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    launch_s = median_s(lambda: copy_into(tiny_dst, tiny_src), 20)
    copy_s = median_s(lambda: copy_into(dst, src), 7)
    gemm_s = median_s(lambda: gemm(a, a, out), 5)
    return {"bandwidth_gbs": 2 * n * dt.itemsize / max(copy_s - launch_s, 1e-7) / 1e9,
            "launch_ms": launch_s * 1e3,
            f"gemm_gflops_{dt.name}": 2 * side ** 3 / max(gemm_s - launch_s, 1e-7) / 1e9}
