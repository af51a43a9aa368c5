"""Data-parallel training over MPI (mpi4py): ``nc.distributed``.

    import netcl as nc
    nc.distributed.init_process_group(backend="mpi")     # under mpiexec / mpirun
    rank, world = nc.distributed.get_rank(), nc.distributed.get_world_size()
    nc.distributed.all_reduce(t, op="sum")                # in place on a device tensor
    model = nc.nn.parallel.DistributedDataParallel(model)

mpi4py is optional (``pip install mpi4py mpich``); without it init_process_group raises a one-line
DistributedError saying so. See docs/howto/distributed.md.
"""
from .collectives import REDUCE_OPS, all_reduce, barrier, broadcast
from .ddp import DistributedDataParallel
from .process_group import (DistributedError, abort, describe, get_local_rank, get_rank, get_world_size,
                            init_process_group, is_available, is_initialized)

__all__ = ["init_process_group", "get_rank", "get_world_size", "get_local_rank", "barrier", "all_reduce",
           "broadcast", "abort", "describe", "is_available", "is_initialized", "DistributedError", "REDUCE_OPS",
           "DistributedDataParallel"]
