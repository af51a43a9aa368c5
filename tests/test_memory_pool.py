"""The device buffer pool: freed buffers are reused, can be released, and ops never read what a reused
buffer held before."""
from __future__ import annotations

import contextlib
import gc

import numpy as np

import netcl as nc
from netcl.runtime import memory


@contextlib.contextmanager
def _no_garbage_reaches_the_pool():
    """Garbage left by earlier tests must not reach the pool while a test counts what it holds: the pool
    hands out the most recently freed buffer of a size class, and a collection could free one of the
    same class in between."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_freed_buffer_serves_the_next_request_of_its_size(device):
    with _no_garbage_reaches_the_pool():
        memory.release_cached(device)
        t = nc.Tensor.empty((1013,), np.float32, device)
        buffer_id = t.buffer.int_ptr
        del t
        assert memory.pool_stats(device)["held_blocks"] == 1
        again = nc.Tensor.empty((1011,), np.float32, device)  # same size class
        assert again.buffer.int_ptr == buffer_id


def test_release_cached_hands_held_buffers_back(device):
    tensors = [nc.Tensor.empty((n,), np.float32, device) for n in (7, 300, 9001)]
    del tensors
    gc.collect()
    assert memory.release_cached(device) >= 3
    assert memory.pool_stats(device)["held_blocks"] == 0


def _lenet_step(device, x, y):
    model = nc.models.lenet(seed=3, dropout=0.0, device=device)
    loss = nc.nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    return [loss.to_host()] + [p.grad.to_host() for p in model.parameters()]


def test_ops_ignore_what_a_reused_buffer_held(device, rng):
    """Every op writes its whole output: poison the pool with NaN buffers of many sizes, then a LeNet
    training step gives the same loss and gradients as with a clean pool."""
    x = nc.tensor(rng.standard_normal((5, 1, 28, 28)).astype(np.float32), device=device)
    y = nc.tensor(rng.integers(0, 10, 5), device=device)
    memory.release_cached(device)
    clean = _lenet_step(device, x, y)
    poison = [nc.full((n,), np.nan, device=device) for n in np.unique(np.geomspace(1, 2 ** 20, 60).astype(int))]
    device.synchronize()
    del poison
    gc.collect()
    poisoned = _lenet_step(device, x, y)
    for a, b in zip(clean, poisoned):
        assert np.all(np.isfinite(b)) and np.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_pool_releases_what_it_holds_past_its_limit(device, monkeypatch):
    monkeypatch.setattr(memory, "held_limit", lambda device: 1 << 20)
    with _no_garbage_reaches_the_pool():
        memory.release_cached(device)
        tensors = [nc.Tensor.empty((n,), np.float32, device) for n in (100_000, 200_000, 300_000)]  # > 1 MiB
        del tensors
        assert memory.pool_stats(device)["held_bytes"] > 1 << 20
        kept = nc.Tensor.empty((10,), np.float32, device)  # the next allocation finds too much held
        assert memory.pool_stats(device)["held_bytes"] < 1 << 20 and kept.size == 10


def test_buffers_handed_back_while_queued_and_made_anew_compute_right(device, rng):
    """The GEMM's launch plans set a changing buffer argument only when its OpenCL handle differs from
    the last call's. Here every product's operands go back to the driver while its kernels may still be
    queued, and the driver's next buffers may reuse the released handles: each product must still be
    computed from its own operands."""
    shape = (37, 29)
    for _ in range(12):
        a_h = rng.standard_normal(shape).astype(np.float32)
        b_h = rng.standard_normal(shape[::-1]).astype(np.float32)
        a, b = nc.tensor(a_h, device=device), nc.tensor(b_h, device=device)
        product = a @ b
        del a, b  # queued behind the product's kernels, then released with the pool's held buffers
        memory.release_cached(device)
        np.testing.assert_allclose(product.to_host(), a_h.astype(np.float64) @ b_h, rtol=1e-4, atol=1e-4)
