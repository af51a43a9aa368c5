"""The one source of netcl's randomness: ``manual_seed`` reseeds everything, like ``torch.manual_seed``.

Two streams derive from one seed, so host-side draws (initialization, shuffling, transforms) never shift
the seeds handed to device kernels (rand/randn, Dropout) and vice versa:

- ``host_generator()``: a NumPy Generator for randomness computed on the host;
- ``next_seed()``: a fresh 64-bit seed per call for the counter-based random kernels (kernels/random.cl);
  call k after ``manual_seed(s)`` always returns the same value.

Without ``manual_seed`` both streams start from OS entropy, so unseeded runs differ. ``get_rng_state`` /
``set_rng_state`` save and restore both streams' positions (for checkpoints that resume exactly).
"""
from __future__ import annotations

import numbers
import threading

import numpy as np

_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: consecutive counters give well-spread seeds
_MASK64 = 2**64 - 1

_lock = threading.Lock()
_host_generator: np.random.Generator
_kernel_base: int
_kernel_counter = 0
_initial_seed: int | None = None


def _splitmix64(x: int) -> int:
    # Scrambles base + k·γ so that seeds of consecutive calls share no visible bit pattern.
    x = (x + _GOLDEN_GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _reset(entropy) -> None:
    global _host_generator, _kernel_base, _kernel_counter
    sequence = np.random.SeedSequence(entropy)
    host_sequence, kernel_sequence = sequence.spawn(2)
    with _lock:
        _host_generator = np.random.default_rng(host_sequence)
        _kernel_base = int(kernel_sequence.generate_state(1, np.uint64)[0])
        _kernel_counter = 0


def manual_seed(seed: int) -> None:
    """Reseed host and kernel randomness; everything drawn afterwards replays for the same seed.

    Like ``torch.manual_seed`` any Python/NumPy int is accepted (negative ones too, taken modulo 2**64).
    """
    global _initial_seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"manual_seed takes an int, got {type(seed).__name__} {seed!r}")
    _initial_seed = int(seed)
    _reset(int(seed) & _MASK64)


def initial_seed() -> int | None:
    """The seed last given to ``manual_seed`` (None while seeded from OS entropy)."""
    return _initial_seed


def host_generator() -> np.random.Generator:
    """The NumPy Generator for host-side randomness; replaced (not advanced) by ``manual_seed``."""
    return _host_generator


def next_seed() -> int:
    """A fresh 64-bit seed for a random kernel, from the kernel stream (the k-th call after a seed is fixed)."""
    global _kernel_counter
    with _lock:
        k, base = _kernel_counter, _kernel_base
        _kernel_counter += 1
    return _splitmix64((base + k * _GOLDEN_GAMMA) & _MASK64)


_reset(None)


def get_rng_state() -> dict:
    """Both streams' positions (picklable), for a checkpoint that must resume bit-exactly."""
    with _lock:
        return {"host": _host_generator.bit_generator.state, "kernel_base": _kernel_base,
                "kernel_counter": _kernel_counter, "initial_seed": _initial_seed}


def set_rng_state(state: dict) -> None:
    """Restore what ``get_rng_state`` returned: later draws continue exactly where they were."""
    global _kernel_base, _kernel_counter, _initial_seed
    try:
        host, base, counter = state["host"], int(state["kernel_base"]), int(state["kernel_counter"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a netcl.random state: {exc}") from None
    with _lock:
        _host_generator.bit_generator.state = host
        _kernel_base, _kernel_counter = base & _MASK64, counter
        _initial_seed = state.get("initial_seed")
