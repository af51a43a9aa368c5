"""Measure α and β of MPI_Allreduce here: `mpiexec -n N python tests/distributed/alpha_beta.py`.

Times MPI_Allreduce (sum, in place on host float32 arrays) from 4 bytes to 16 MiB, the minimum of several
repetitions (the machine is shared), fits T(b) = 2(N−1)α + 2(N−1)/N · b · β by least squares, and times the
device↔host copies of a bucket on this rank's device. Rank 0 prints one JSON line (docs/distributed.md).
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
    design = np.array([[2 * (n - 1), 2 * (n - 1) / n * b] for b in sizes], dtype=np.float64)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.array(times), rcond=None)
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
