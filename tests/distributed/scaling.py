"""Data-parallel throughput: `mpiexec -n N python tests/distributed/scaling.py MODEL [--batch B] [--steps S]`.

Each rank trains MODEL (lenet, or resnet20 on 3x32x32) on synthetic batches of B images with SGD; with
N > 1 the model is wrapped in DistributedDataParallel, with N = 1 it is not (the baseline). Rank 0 prints
one JSON line: global images/s over the timed steps (after --warmup untimed ones), the mean step time, and
per step, the host's waits at the end of backward: for the device's last gradients and for MPI. The scaling efficiency of
N ranks is their global images/s over N times the images/s of one rank with the same per-rank threads
(POCL_MAX_PTHREAD_COUNT); `--rounds R` alternates R runs of each and reports the median of the per-round
ratios and the ratio of the best runs (docs/howto/distributed.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def build(model_name: str):
    import netcl as nc
    if model_name == "lenet":
        return nc.models.lenet(seed=0), (1, 28, 28)
    return getattr(nc.models, model_name)(num_classes=10, in_channels=3), (3, 32, 32)


def measure(model_name: str, batch: int, steps: int, warmup: int, bucket_cap_mb: float = 25,
            replay: bool = True, min_buckets: int = 4) -> dict | None:
    import netcl as nc
    from netcl.training.replay import CapturedStep
    nc.distributed.init_process_group(backend="mpi")
    rank, world = nc.distributed.get_rank(), nc.distributed.get_world_size()
    model, image = build(model_name)
    if world > 1:
        model = nc.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, min_buckets=min_buckets)
    optimizer = nc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_once = CapturedStep(model, optimizer, nc.nn.CrossEntropyLoss(), enabled=replay)
    rng = np.random.default_rng(rank)
    x = nc.tensor(rng.standard_normal((batch,) + image).astype(np.float32))
    y = nc.tensor(rng.integers(0, 10, batch).astype(np.int64))
    for step in range(warmup + steps):
        if step == warmup:
            loss.item()
            nc.distributed.barrier()
            stats_before = dict(getattr(model, "stats", {}))
            start, host_cpu, process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        loss = step_once(x, y)
    loss.item()
    nc.distributed.barrier()
    seconds = time.perf_counter() - start
    host_cpu, process_cpu = time.thread_time() - host_cpu, time.process_time() - process_cpu
    if rank != 0:
        return None
    waits = {f"{key[:-2]}_ms": 1e3 * (value - stats_before[key]) / steps
             for key, value in getattr(model, "stats", {}).items() if key.endswith("_s")}
    return {"model": model_name, "ranks": world, "batch_per_rank": batch, "steps": steps,
            "threads_per_rank": os.environ.get("POCL_MAX_PTHREAD_COUNT"),
            "global_images_per_second": world * batch * steps / seconds, "step_ms": 1e3 * seconds / steps,
            # CPU per step: the Python thread (launches, autograd, DDP, MPI) and the whole process (with
            # the driver's threads); rank 0's
            "host_cpu_ms": 1e3 * host_cpu / steps, "process_cpu_ms": 1e3 * process_cpu / steps,
            "replay": step_once.status, "transport": getattr(model, "transport", None),
            "averaging": getattr(model, "averaging", None), **waits}


def alternate(args) -> dict:
    """Alternate one-rank and N-rank runs; the median efficiency over the rounds."""
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT=os.environ.get("POCL_MAX_PTHREAD_COUNT", "1"))
    runs = {1: [], args.ranks: []}
    for _ in range(args.rounds):
        for n in (1, args.ranks):
            binding = ["-bind-to", "core"] if args.bind_to_core else []
            out = subprocess.run(["mpiexec", *binding, "-n", str(n), sys.executable, __file__, args.model,
                                  "--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
                                  str(args.warmup), "--bucket-cap-mb", str(args.bucket_cap_mb),
                                  "--min-buckets", str(args.min_buckets),
                                  *([] if args.replay else ["--no-replay"])],
                                 env=env, capture_output=True, text=True, check=True).stdout
            runs[n].append(json.loads(out.strip().splitlines()[-1]))
    efficiencies = [m["global_images_per_second"] / (args.ranks * s["global_images_per_second"])
                    for s, m in zip(runs[1], runs[args.ranks])]
    best = {n: max(r["global_images_per_second"] for r in runs[n]) for n in runs}
    return {"model": args.model, "ranks": args.ranks, "batch_per_rank": args.batch, "bound_to_cores": args.bind_to_core,
            "replay": {n: sorted({r["replay"] for r in runs[n]}) for n in runs},
            "efficiency_median": statistics.median(efficiencies), "efficiencies": efficiencies,
            # the least disturbed run of each: on a shared machine the closest to what an idle one gives
            "efficiency_best_of": best[args.ranks] / (args.ranks * best[1]),
            "one_rank_images_per_second": [r["global_images_per_second"] for r in runs[1]],
            "host_cpu_ms": {n: [r["host_cpu_ms"] for r in runs[n]] for n in runs},
            "process_cpu_ms": {n: [r["process_cpu_ms"] for r in runs[n]] for n in runs},
            "n_ranks_images_per_second": [r["global_images_per_second"] for r in runs[args.ranks]],
            "device_wait_ms": [r["device_wait_ms"] for r in runs[args.ranks]],
            "mpi_wait_ms": [r["mpi_wait_ms"] for r in runs[args.ranks]]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=("lenet", "resnet8", "resnet20", "resnet32"))
    parser.add_argument("--batch", type=int, default=64, help="images per rank and step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=0, help="alternate this many 1-rank / N-rank runs")
    parser.add_argument("--ranks", type=int, default=2, help="N for --rounds")
    parser.add_argument("--bucket-cap-mb", type=float, default=25)
    parser.add_argument("--min-buckets", type=int, default=4)
    parser.add_argument("--bind-to-core", action="store_true",
                        help="mpiexec -bind-to core for both runs: each rank, the single one included, on a core "
                             "of its own (its host thread shares it with its PoCL thread)")
    parser.add_argument("--no-replay", dest="replay", action="store_false",
                        help="run every step as written instead of replaying the recorded step "
                             "(netcl.training.CapturedStep)")
    cli = parser.parse_args()
    result = (alternate(cli) if cli.rounds else
              measure(cli.model, cli.batch, cli.steps, cli.warmup, cli.bucket_cap_mb, cli.replay, cli.min_buckets))
    if result is not None:
        print(json.dumps(result))
