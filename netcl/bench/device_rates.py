"""One device's GEMM rate and copy bandwidth, as `netcl devices --bench` stores them.

GEMM: netcl's own float32 product at 512 x 512 x 512 with whatever parameters the tuning database holds
for the device (tuned ones if `netcl tune gemm` ran), the median of several samples after a warm-up that
compiles. Bandwidth: netcl.ops.copy_probe's vectorized copy of a buffer well beyond the last-level cache.

`netcl devices --bench` runs this module once per device in a child process (``python -m
netcl.bench.device_rates INDEX``): two drivers' compilers in one process (Intel's runtime bundles its own
LLVM) are a risk not worth taking, and a fresh process measures each driver without the other's threads.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

GEMM_SIZE = 512
SAMPLES = 7
SAMPLE_SECONDS = 0.05  # each sample repeats the call until it lasts about this long


def _median_seconds(call, device, samples: int) -> float:
    """Median seconds per call; a sample repeats ``call`` enough times to outlast the timer's noise."""
    call()
    device.synchronize()
    start = time.perf_counter()
    call()
    device.synchronize()
    repeats = max(1, int(SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-6)))
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        device.synchronize()
        times.append((time.perf_counter() - start) / repeats)
    return statistics.median(times)


def measure(device, samples: int = SAMPLES) -> dict:
    """{"gemm_gflops", "copy_gbps", ...} for one device; the product is checked against NumPy."""
    from ..ops.copy_probe import CopyProbe
    from ..ops.gemm import gemm
    from ..tensor import Tensor
    from ..runtime import tuning_db as db
    n = GEMM_SIZE
    rng = np.random.default_rng(0)
    ha, hb = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a, b = Tensor.from_host(ha, device), Tensor.from_host(hb, device)
    c = Tensor.empty((n, n), np.float32, device)
    gemm_seconds = _median_seconds(lambda: gemm(a, b, c), device, samples)
    reference = ha.astype(np.float64) @ hb
    error = float(np.linalg.norm(c.to_host() - reference) / np.linalg.norm(reference))
    if not error < 1e-4:
        raise RuntimeError(f"GEMM {n}^3 on {device.describe()} is wrong (relative L2 error {error:.2e})")
    # four times the last-level cache, at least 64 MiB: the copy measures memory, not cache
    probe = CopyProbe(device, max(64 << 20, 4 * device.cache_bytes))
    copy_seconds = _median_seconds(probe, device, samples)
    return {"gemm_gflops": round(2.0 * n ** 3 / gemm_seconds / 1e9, 2), "gemm_shape": f"{n}x{n}x{n} float32",
            "gemm_params": db.source(device, "gemm", "float32"), "copy_gbps": round(probe.gbps(copy_seconds), 2)}


def main(argv) -> int:
    import netcl as nc
    device = nc.devices()[int(argv[0])]
    print("DEVICE_RATES " + json.dumps(measure(device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
