"""Samplers: which dataset indices a DataLoader visits, in which order (PyTorch's protocol: an iterable of
indices with ``__len__``; a plain list or array of indices serves as well).

``DistributedSampler`` gives each of N ranks a disjoint shard of one per-epoch permutation, as
torch.utils.data.distributed.DistributedSampler does: the permutation depends on (seed, epoch) only, so
every rank draws the same one; it is padded by repeating its head to a multiple of N (or, with drop_last,
cut to one), and rank r takes positions r, r + N, r + 2N, ... Call ``set_epoch(e)`` before each epoch (a
DataLoader's ``set_epoch`` forwards it), or every epoch repeats the same order.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError


class Sampler:
    """Base class: define ``__iter__`` (indices) and ``__len__``."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} does not define __iter__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not define __len__")


class DistributedSampler(Sampler):
    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if num_replicas is None or rank is None:
            from .. import distributed  # only a distributed run needs it (and mpi4py behind it)
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
            raise ShapeError(f"DistributedSampler num_replicas must be a positive int, got {num_replicas!r}")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
            raise ShapeError(f"DistributedSampler rank must be in [0, {num_replicas - 1}], got {rank!r}")
        self.dataset, self.num_replicas, self.rank = dataset, int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        n = len(dataset)
        if self.drop_last and n % self.num_replicas:
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def indices(self) -> np.ndarray:
        n = len(self.dataset)
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle
                 else np.arange(n))
        if self.drop_last:
            order = order[:self.total_size]
        elif self.total_size > n:
            order = np.resize(order, self.total_size)  # repeats from the head, as PyTorch pads
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())
