"""The α–β cost model of DistributedDataParallel's bucketed allreduce
(docs/explanation/training-internals.md).

A ring allreduce of ``b`` bytes over ``N`` ranks is a reduce-scatter and an all-gather of N−1 steps each,
every step sending b/N bytes: 2(N−1)α + 2(N−1)/N · b · β, where α is a message's latency (s) and β the
time per byte (s/B, the inverse of the link bandwidth). netcl adds a device→host and a host→device copy
of every bucket (``copy_bytes_per_second``). The buckets but the last can hide behind the backward pass
still running; the last bucket holds the first layers' gradients, which backward produces last, so its
allreduce and copies are always exposed.
"""
from __future__ import annotations

import math


def ring_allreduce_seconds(nbytes: float, ranks: int, alpha: float, beta: float) -> float:
    """2(N−1)α + 2(N−1)/N · bytes · β; zero for one rank."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta


def bucket_bytes(model_bytes: float, bucket_cap_bytes: float) -> list[float]:
    """The buckets' sizes: full caps, the remainder last (an approximation: real buckets end at tensors)."""
    full = int(model_bytes // bucket_cap_bytes)
    rest = model_bytes - full * bucket_cap_bytes
    return [bucket_cap_bytes] * full + ([rest] if rest > 0 else [])


def step_overhead_seconds(model_bytes: float, ranks: int, alpha: float, beta: float,
                          copy_bytes_per_second: float, backward_seconds: float,
                          bucket_cap_bytes: float = 25 * 2**20) -> float:
    """Seconds a data-parallel step adds to the single-rank step: the communication and copies that the
    backward pass (``backward_seconds`` of compute) cannot hide. Buckets are reduced one after another;
    all but the last overlap the backward pass, whose remaining compute hides up to its own length."""
    if ranks <= 1:
        return 0.0
    sizes = bucket_bytes(model_bytes, bucket_cap_bytes)
    per_bucket = [ring_allreduce_seconds(b, ranks, alpha, beta) + 2 * b / copy_bytes_per_second for b in sizes]
    hideable = sum(per_bucket[:-1])
    return max(0.0, hideable - backward_seconds) + per_bucket[-1]


def scaling_efficiency(step_seconds: float, backward_fraction: float = 2 / 3, **cost) -> float:
    """Throughput of N ranks over N times one rank's: step / (step + overhead), for a step of
    ``step_seconds`` of which ``backward_fraction`` is backward (about 2/3 for convolutional nets)."""
    overhead = step_overhead_seconds(backward_seconds=backward_fraction * step_seconds, **cost)
    return step_seconds / (step_seconds + overhead) if math.isfinite(overhead) else 0.0
