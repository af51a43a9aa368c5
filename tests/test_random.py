"""netcl.random: one seed replays initialization, rand/randn, Dropout masks and host draws."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import random as nc_random


def _draw_everything(device):
    """Every consumer of randomness, in a fixed order, as host arrays."""
    layer = nc.nn.Linear(7, 5, device=device)
    conv = nc.nn.Conv2d(3, 4, 3, device=device)
    uniform = nc.rand(13, device=device).to_host()
    normal = nc.randn(3, 7, device=device).to_host()
    dropout = nc.nn.Dropout(0.5)
    dropout.train()
    mask = dropout(nc.ones((31,), device=device)).to_host()
    host = nc_random.host_generator().standard_normal(7)
    return [layer.weight.to_host(), layer.bias.to_host(), conv.weight.to_host(), uniform, normal, mask, host]


def test_same_seed_replays_every_source(device):
    nc.manual_seed(1234)
    first = _draw_everything(device)
    nc.manual_seed(1234)
    second = _draw_everything(device)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_different_seeds_differ_in_every_source(device):
    nc.manual_seed(1)
    first = _draw_everything(device)
    nc.manual_seed(2)
    second = _draw_everything(device)
    for a, b in zip(first, second):
        assert not np.array_equal(a, b)


def test_nn_init_manual_seed_is_the_same_seed(device):
    nc.nn.init.manual_seed(5)
    via_init = _draw_everything(device)
    nc.manual_seed(5)
    via_netcl = _draw_everything(device)
    for a, b in zip(via_init, via_netcl):
        assert np.array_equal(a, b)


def test_host_draws_do_not_shift_kernel_seeds(device):
    nc.manual_seed(9)
    plain = nc.rand(17, device=device).to_host()
    nc.manual_seed(9)
    nc_random.host_generator().standard_normal(1000)
    nc.nn.Linear(11, 3, device=device)
    assert np.array_equal(nc.rand(17, device=device).to_host(), plain)


def test_next_seed_stream_is_fresh_and_replayable():
    nc.manual_seed(77)
    seeds = [nc_random.next_seed() for _ in range(64)]
    assert len(set(seeds)) == 64
    assert all(0 <= s < 2**64 for s in seeds)
    nc.manual_seed(77)
    assert [nc_random.next_seed() for _ in range(64)] == seeds
    assert nc_random.initial_seed() == 77


def test_explicit_seed_overrides_the_stream(device):
    a = nc.rand(9, seed=3, device=device).to_host()
    nc.manual_seed(0)
    assert np.array_equal(nc.rand(9, seed=3, device=device).to_host(), a)


def test_negative_and_numpy_seeds_are_accepted():
    nc.manual_seed(-1)
    a = nc_random.host_generator().random()
    nc.manual_seed(np.int64(-1))
    assert nc_random.host_generator().random() == a


@pytest.mark.parametrize("bad", [1.5, "3", None, True])
def test_manual_seed_rejects_non_integers(bad):
    with pytest.raises(TypeError):
        nc.manual_seed(bad)


def test_rng_state_round_trip(device):
    nc.manual_seed(21)
    nc.rand(5, device=device)
    nc_random.host_generator().random(3)
    state = nc_random.get_rng_state()
    first = (nc.rand(7, device=device).to_host(), nc_random.host_generator().random(4), nc_random.next_seed())
    nc.manual_seed(99)
    nc_random.set_rng_state(state)
    second = (nc.rand(7, device=device).to_host(), nc_random.host_generator().random(4), nc_random.next_seed())
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError):
        nc_random.set_rng_state({"host": None})
