"""PyTorch's default initializations, drawn on the host from netcl.random's host generator.

``manual_seed(s)`` (same as ``nc.manual_seed``) makes every layer created afterwards (and every Dropout's
seed) reproducible.
Conv2d and Linear use kaiming_uniform(a=√5) for the weight, i.e. U(−1/√fan_in, 1/√fan_in), and
U(−1/√fan_in, 1/√fan_in) for the bias, where fan_in = in_channels/groups · kh · kw (or in_features).
"""
from __future__ import annotations

import math

import numpy as np

from .. import random as _random


def manual_seed(seed: int) -> None:
    """Same as ``nc.manual_seed``: reseeds every source of randomness, not only initialization."""
    _random.manual_seed(seed)


def kaiming_uniform(shape, fan_in: int, a: float = math.sqrt(5.0), dtype=np.float32) -> np.ndarray:
    """U(−bound, bound) with bound = gain·√(3/fan_in), gain = √(2/(1+a²)) (PyTorch's leaky-ReLU gain)."""
    gain = math.sqrt(2.0 / (1.0 + a * a))
    bound = gain * math.sqrt(3.0 / max(fan_in, 1))
    return _random.host_generator().uniform(-bound, bound, size=shape).astype(dtype)


def kaiming_normal(shape, fan: int, a: float = 0.0, dtype=np.float32) -> np.ndarray:
    """N(0, gain²/fan), gain = √(2/(1+a²)): PyTorch's kaiming_normal_ with the fan of its ``mode`` (fan_out =
    out_channels · kh · kw for a convolution, whatever its groups) and the (leaky) ReLU gain."""
    std = math.sqrt(2.0 / (1.0 + a * a)) / math.sqrt(max(fan, 1))
    return _random.host_generator().normal(0.0, std, size=shape).astype(dtype)


def normal(shape, std: float, mean: float = 0.0, dtype=np.float32) -> np.ndarray:
    return _random.host_generator().normal(mean, std, size=shape).astype(dtype)


def bias_uniform(shape, fan_in: int, dtype=np.float32) -> np.ndarray:
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return _random.host_generator().uniform(-bound, bound, size=shape).astype(dtype)


def seed_value() -> int:
    """A fresh 63-bit seed from netcl.random's kernel stream (for layers that draw random numbers on the device)."""
    return _random.next_seed() & (2**63 - 1)
