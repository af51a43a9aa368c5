"""The device's copy bandwidth: a vectorized copy of a buffer well beyond the last-level cache.

One definition serves the im2col benchmark (its roofline) and the conv planner's calibration (the
bandwidth its cost model charges bytes at). The elementwise copy is no substitute: it moves one element
per work-item and reads a fraction of the bandwidth this kernel reaches.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel, launch
from ..tensor import Tensor


class CopyProbe:
    """``probe()`` enqueues one copy of ``nbytes`` (rounded to float32 elements); ``probe.gbps(seconds)``
    turns a measured time into GB/s with the read and the write both counted."""

    def __init__(self, device, nbytes: int):
        self.device = device
        self.n = max(1, min(nbytes, device.max_alloc_bytes) // 4)
        self.src, self.dst = (Tensor.empty((self.n,), np.float32, device) for _ in range(2))
        # several elements per work-item: lets a CPU compiler vectorize, costs a GPU nothing at this size
        self.per_item = 16 if device.kind == "cpu" else 1
        self.kernel = get_kernel(device, "im2col.cl", "copy_bandwidth", VEC=self.per_item)

    def __call__(self):
        launch(self.device, self.kernel, (-(-self.n // self.per_item),), None, self.src.buffer, self.dst.buffer,
               np.int64(self.n))

    def gbps(self, seconds: float) -> float:
        return 2 * self.n * 4 / seconds / 1e9
