"""Measure α and β of MPI_Allreduce here: `mpiexec -n N python tests/distributed/alpha_beta.py`.

Times MPI_Allreduce (sum, in place on host float32 arrays) from 4 bytes to 16 MiB, the minimum of several
repetitions (the machine is shared). In T(b) = 2(N−1)α + 2(N−1)/N · b · β it takes α from the messages of
up to 4 KiB and β from those of 1 MiB and more, and it times the device↔host copies of a 1.7 MB bucket on
this rank's device. Rank 0 prints one JSON line (docs/explanation/training-internals.md).
"""
from __future__ import annotations

import json
import time

import numpy as np


def min_seconds(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    import netcl as nc
    from netcl.runtime import memory
    nc.distributed.init_process_group()
    from mpi4py import MPI
    comm, n = MPI.COMM_WORLD, nc.distributed.get_world_size()
    sizes, times = [], []
    for exponent in range(2, 25, 2):
        nbytes = 2 ** exponent
        host = np.ones(nbytes // 4, np.float32)
        comm.Barrier()

        def reduce_once():
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        reduce_once()
        sizes.append(nbytes)
        times.append(comm.allreduce(min_seconds(reduce_once, 30 if nbytes < 2**20 else 8), op=MPI.MAX))
    # α from the small messages, β from the large ones, each the best seen: on a shared machine a least-
    # squares fit over all sizes is led by whichever large message another process happened to slow down.
    alpha = min(t for b, t in zip(sizes, times) if b <= 4096) / (2 * (n - 1))
    beta = min((t - 2 * (n - 1) * alpha) / (2 * (n - 1) / n * b) for b, t in zip(sizes, times) if b >= 2**20)
    bucket = nc.tensor(np.ones(431_080, np.float32))  # LeNet's gradients: 1.7 MB
    host = np.empty(bucket.size, np.float32)
    down = min_seconds(lambda: memory.download(bucket.device, bucket.buffer, host), 10)
    up = min_seconds(lambda: (memory.upload(bucket.device, bucket.buffer, host), bucket.device.synchronize()), 10)
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": n, "alpha_us": alpha * 1e6, "beta_s_per_byte": beta,
                          "bandwidth_GB_per_s": 1e-9 / beta if beta > 0 else None,
                          "allreduce_us": {str(b): t * 1e6 for b, t in zip(sizes, times)},
                          "copy_GB_per_s": {"download": host.nbytes / down * 1e-9, "upload": host.nbytes / up * 1e-9},
                          "device": bucket.device.describe()}))


if __name__ == "__main__":
    main()
