"""Run under `mpiexec -n N python tests/distributed/worker.py SCENARIO OUTDIR` by tests/test_distributed.py.

Each scenario leaves its results in OUTDIR/<scenario>-rank<r>.npz for the test to check; nothing is
asserted here, so a failure shows up as a test failure with the data, not as a hung job.
  equivalence  k SGD steps of a small conv net with DistributedDataParallel, each rank on its own
               BATCH-image share of one global batch, for several bucket caps; and 2k steps as written
               and replayed (netcl.training.CapturedStep)
  collectives  all_reduce with each op, broadcast and barrier on odd sizes
  semantics    BatchNorm buffers equal after eval(), no_sync accumulation, parameters one rank leaves unused
  fail         rank FAILING_RANK raises while the others wait in an all_reduce
"""
from __future__ import annotations

import gc
import json
import os
import sys
from collections import OrderedDict
import weakref
from pathlib import Path

import numpy as np

import netcl as nc

STEPS = 3
BATCH = 7          # per rank; the single-process reference takes world_size * BATCH
IMAGE = (1, 9, 9)
CLASSES = 3
LR, MOMENTUM = 0.1, 0.9
# MiB: PyTorch's default (one bucket here) and a cap below the smallest parameter (one bucket each).
BUCKET_CAPS = (25, 1e-4)
FAILING_RANK = 1


def small_convnet(seed: int):
    """Conv -> ReLU -> max pool -> Linear -> ReLU -> Linear: no batch statistics, no dropout."""
    nc.manual_seed(seed)
    return nc.nn.Sequential(OrderedDict([
        ("conv", nc.nn.Conv2d(1, 5, 3)), ("relu1", nc.nn.ReLU()), ("pool", nc.nn.MaxPool2d(2)),
        ("flatten", nc.nn.Flatten()), ("fc1", nc.nn.Linear(5 * 3 * 3, 13)), ("relu2", nc.nn.ReLU()),
        ("fc2", nc.nn.Linear(13, CLASSES)),
    ]))


def global_batches(seed: int, world_size: int):
    """STEPS global batches (images, labels) of world_size * BATCH samples, the same on every process."""
    rng = np.random.default_rng(seed)
    n = world_size * BATCH
    return [(rng.standard_normal((n,) + IMAGE).astype(np.float32), rng.integers(0, CLASSES, n).astype(np.int64))
            for _ in range(STEPS)]


def train(model, batches, rank: int, world_size: int, replay: bool = False):
    """SGD steps on this rank's contiguous share of each global batch; the parameters afterwards. With
    ``replay`` through CapturedStep without warm-up: steps 1 and 2 recorded, the later ones replayed."""
    optimizer = nc.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step = nc.training.CapturedStep(model, optimizer, nc.nn.CrossEntropyLoss(), warmup=0, enabled=replay)
    for images, labels in batches:
        share = slice(rank * BATCH, (rank + 1) * BATCH) if world_size > 1 else slice(None)
        step(nc.tensor(images[share]), nc.tensor(labels[share]))
    train.status = step.status
    return OrderedDict((name, p.to_host()) for name, p in model.named_parameters())


def equivalence(out: Path, seed: int) -> None:
    rank, world = nc.distributed.get_rank(), nc.distributed.get_world_size()
    batches = global_batches(seed, world)
    results, buckets = {}, {}
    for cap in BUCKET_CAPS:
        # Every rank but 0 starts from other weights: the wrap's broadcast must make them equal.
        ddp = nc.nn.parallel.DistributedDataParallel(small_convnet(seed + rank), bucket_cap_mb=cap, min_buckets=1)
        buckets[cap] = ddp.bucket_sizes
        transport, averaging = ddp.transport, ddp.averaging
        for name, value in train(ddp, batches, rank, world).items():
            results[f"cap{cap}/{name}"] = value
    buckets["default"] = nc.nn.parallel.DistributedDataParallel(small_convnet(seed)).bucket_sizes
    statuses = {}
    for replay in (False, True):  # twice the steps, as written and replayed, one bucket per tensor
        ddp = nc.nn.parallel.DistributedDataParallel(small_convnet(seed + rank), bucket_cap_mb=BUCKET_CAPS[1])
        for name, value in train(ddp, batches * 2, rank, world, replay).items():
            results[f"replay{int(replay)}/{name}"] = value
        statuses[str(replay)] = train.status
    np.savez(out / f"equivalence-rank{rank}.npz", **results)
    (out / f"equivalence-rank{rank}.json").write_text(json.dumps({"world_size": world, "buckets": {
        str(k): v for k, v in buckets.items()}, "replay": statuses, "transport": transport,
        "averaging": averaging}))


def collectives(out: Path, seed: int) -> None:
    rank, world = nc.distributed.get_rank(), nc.distributed.get_world_size()
    results = {}
    for size in (1, 7, 13, 31):
        for dtype in (np.float32, np.int32):
            data = np.random.default_rng([seed, rank, size]).integers(-50, 50, size).astype(dtype)
            results[f"input/{size}/{np.dtype(dtype).name}"] = data
            for op in nc.distributed.REDUCE_OPS:
                if op == "avg" and np.dtype(dtype).kind != "f":
                    continue
                t = nc.tensor(data)
                returned = nc.distributed.all_reduce(t, op=op)
                results[f"{op}/{size}/{np.dtype(dtype).name}"] = t.to_host()
                results[f"same_object/{op}/{size}/{np.dtype(dtype).name}"] = np.array(returned is t)
        t = nc.tensor(np.full(size, rank, dtype=np.float32))
        nc.distributed.broadcast(t, src=world - 1)
        results[f"broadcast/{size}"] = t.to_host()
    # a contiguous view inside a larger buffer: only its elements change, its neighbours stay as they were
    whole = nc.tensor(np.arange(31, dtype=np.float32) + 100 * rank)
    nc.distributed.all_reduce(whole[7:20], op="sum")
    results["view/whole"] = whole.to_host()
    results["affinity"] = np.array(sorted(os.sched_getaffinity(0)))
    results["pinned"] = np.array(nc.distributed.describe()["cores"] or [], dtype=np.int64)
    nc.distributed.barrier()
    np.savez(out / f"collectives-rank{rank}.npz", **results)


class TwoHeads(nc.nn.Module):
    """Rank r's forward uses head r only: every head's parameters go unused on the other rank."""

    def __init__(self):
        super().__init__()
        self.head0, self.head1 = nc.nn.Linear(5, 3), nc.nn.Linear(5, 3)

    def forward(self, x, which: int):
        return (self.head0 if which == 0 else self.head1)(x)


def semantics(out: Path, seed: int) -> None:
    """BatchNorm buffers after eval(), no_sync accumulation, parameters unused on one rank."""
    rank = nc.distributed.get_rank()
    rng = np.random.default_rng([seed, rank])
    results = {}
    nc.manual_seed(seed + rank)  # different initial weights and statistics: the wrap must equalize them
    bn_net = nc.nn.parallel.DistributedDataParallel(nc.nn.Sequential(
        nc.nn.Conv2d(1, 3, 3), nc.nn.BatchNorm2d(3), nc.nn.ReLU(), nc.nn.Flatten(), nc.nn.Linear(3 * 5 * 5, CLASSES)))
    optimizer = nc.optim.SGD(bn_net.parameters(), lr=LR)
    for _ in range(2):
        optimizer.zero_grad()
        x = nc.tensor(rng.standard_normal((BATCH, 1, 7, 7)).astype(np.float32))
        nc.nn.CrossEntropyLoss()(bn_net(x), nc.tensor(rng.integers(0, CLASSES, BATCH))).backward()
        optimizer.step()
    bn_net.eval()
    for name, t in bn_net.state_dict().items():
        results[f"bn/{name}"] = t.to_host()

    linear = nc.nn.parallel.DistributedDataParallel(nc.nn.Linear(5, 3), bucket_cap_mb=1e-5)
    inputs = [rng.standard_normal((BATCH, 5)).astype(np.float32) for _ in range(2)]
    with linear.no_sync():
        linear(nc.tensor(inputs[0])).sum().backward()
    results["no_sync/local_weight_grad"] = linear.module.weight.grad.to_host()
    linear(nc.tensor(inputs[1])).sum().backward()
    results["no_sync/inputs"] = np.stack(inputs)
    results["no_sync/weight_grad"] = linear.module.weight.grad.to_host()
    results["no_sync/bias_grad"] = linear.module.bias.grad.to_host()

    heads = nc.nn.parallel.DistributedDataParallel(TwoHeads())
    x = rng.standard_normal((BATCH, 5)).astype(np.float32)
    heads(nc.tensor(x), rank % 2).sum().backward()
    results["heads/input"] = x
    for name, p in heads.module.named_parameters():
        results[f"heads/{name}"] = p.grad.to_host()
    # A rank whose device cannot average the window in place (a GPU's) makes every rank sum on the host.
    from netcl.distributed import bucket_reduce
    real_probe = bucket_reduce.kernels_read_host_memory
    bucket_reduce.kernels_read_host_memory = lambda device: rank != 1 and real_probe(device)
    mixed = nc.nn.parallel.DistributedDataParallel(nc.nn.Linear(5, 3))
    bucket_reduce.kernels_read_host_memory = real_probe
    mixed(nc.tensor(x)).sum().backward()
    results["mixed/averaging_on_host"] = np.array(mixed.averaging == "host")
    results["mixed/weight_grad"] = mixed.module.weight.grad.to_host()
    # Released by reference counts, not by the garbage collector, which runs at another moment on each
    # rank: freeing a shared window is collective.
    gc.disable()
    transport = weakref.ref(mixed._gradients.transport)
    del mixed
    results["released/without_collector"] = np.array(transport() is None)
    gc.enable()
    np.savez(out / f"semantics-rank{rank}.npz", **results)


def fail(out: Path, seed: int) -> None:
    rank = nc.distributed.get_rank()
    t = nc.tensor(np.ones(13, dtype=np.float32))
    nc.distributed.all_reduce(t)  # every rank is up and talking before the failure
    if rank == FAILING_RANK:
        raise ValueError("deliberate failure for the test")
    nc.distributed.all_reduce(t)  # never completes: the failing rank does not join
    (out / f"fail-rank{rank}-finished").write_text("the all_reduce returned")


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    nc.distributed.init_process_group(backend="mpi")
    {"equivalence": equivalence, "collectives": collectives, "semantics": semantics,
     "fail": fail}[scenario](out_dir, int(sys.argv[3]))
