"""Everything `netcl train --distributed` does differently, in one place, through nc.distributed's public API.

- ``Ranks.start(distributed)``: init_process_group("mpi") and this process's rank and world size (a plain run
  is rank 0 of 1 and never touches MPI);
- ``local_batch_size``: the global batch ``--batch-size`` split evenly over the ranks;
- ``train_sampler``: a DistributedSampler (each rank a disjoint shard of one per-epoch permutation);
- ``wrap``: the model in nn.parallel.DistributedDataParallel (gradients averaged over ranks after backward);
- ``eval_shard`` / ``sum_over_ranks``: the test set split over the ranks without padding (each image scored
  once) and the counts combined with all_reduce;
- rank 0 alone prints progress and writes checkpoints and metrics (``Ranks.is_main``).
A checkpoint holds the unwrapped model's state and the epoch; shuffling depends on (seed, epoch) only, so a
run resumes with any number of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    distributed: bool = False

    @classmethod
    def start(cls, distributed: bool) -> "Ranks":
        if not distributed:
            return cls()
        from .. import distributed as dist
        if not dist.is_initialized():  # a second train() in the same process joins the same group
            dist.init_process_group(backend="mpi")
        return cls(dist.get_rank(), dist.get_world_size(), True)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def local_batch_size(global_batch: int, ranks: Ranks) -> int:
    if global_batch % ranks.world_size:
        raise ShapeError(f"--batch-size {global_batch} does not split evenly over {ranks.world_size} ranks "
                         f"(the global batch is divided among them)")
    return global_batch // ranks.world_size


def train_sampler(dataset, ranks: Ranks, seed: int):
    """None for a single process (the DataLoader shuffles); else this rank's DistributedSampler."""
    if not ranks.distributed:
        return None
    from ..data import DistributedSampler
    return DistributedSampler(dataset, num_replicas=ranks.world_size, rank=ranks.rank, shuffle=True, seed=seed)


def wrap(model, ranks: Ranks):
    if not ranks.distributed:
        return model
    from ..nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model)


def eval_shard(num_images: int, ranks: Ranks) -> np.ndarray | None:
    """The test images this rank scores: positions rank, rank + N, ... (no padding: each scored once)."""
    if not ranks.distributed:
        return None
    return np.arange(ranks.rank, num_images, ranks.world_size)


def sum_over_ranks(values, ranks: Ranks, device=None) -> list[float]:
    """Element-wise sums of a few numbers over all ranks (counts, loss sums), through all_reduce."""
    values = [float(v) for v in values]
    if not ranks.distributed:
        return values
    from .. import distributed as dist
    from ..runtime.device import resolve_device
    from ..tensor import Tensor
    # float64 keeps counts and loss sums exact where the device has it; float32 is exact for counts < 2**24
    dtype = np.float64 if resolve_device(device).has_fp64 else np.float32
    t = Tensor.from_host(np.asarray(values, dtype=dtype), device=device)
    dist.all_reduce(t, op="sum")
    return [float(v) for v in t.to_host()]


def throughput(images_per_second_this_rank: float, ranks: Ranks) -> dict:
    """{"images_per_second": global (summed over ranks)}, plus for a distributed run "world_size" and
    "images_per_second_per_rank" (the mean over ranks)."""
    if not ranks.distributed:
        return {"images_per_second": images_per_second_this_rank}
    total = sum_over_ranks([images_per_second_this_rank], ranks)[0]
    return {"images_per_second": total, "world_size": ranks.world_size,
            "images_per_second_per_rank": total / ranks.world_size}
