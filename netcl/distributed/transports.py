"""The transports that average DistributedDataParallel's gradient buckets over the ranks: MPI's
allreduce, or shared memory when every rank runs on one node (netcl.distributed.bucket_reduce chooses).

A bucket (netcl.distributed.data_parallel.Bucket) is a run of parameters whose gradients travel
together. Each transport keeps, per bucket, memory that the rank's gradients are copied into
(``contribution``, ``copy_in``), ``start``s a bucket once its copies have landed, makes progress in
``test`` (True once the average is ready) and is reused pass after pass; buckets start in the same order
on every rank. Each transport also runs its own part of a
backward pass (netcl.distributed.data_parallel drives it):

- ``gradient_ready(buckets, bucket, position)``: from the gradient hook of the parameter at ``position``
  of ``bucket``, while backward still runs;
- ``start_remaining(buckets)``: once backward has ended, start every bucket not started yet;
- ``write_back(bucket)``: after ``test``, the averages into the parameters' ``.grad``;
- ``pass_ended()``: ready for the next pass.

MPI (``MpiBuckets``) starts each bucket's allreduce as soon as its gradients have landed on the host,
while backward goes on, and tests the running ones, because MPI moves a non-blocking allreduce only
inside MPI calls. Over shared memory nothing moves before every rank's contribution is in, so both
shared-memory transports do nothing during backward and start every bucket at its end.

Why shared memory: on one node MPI's non-blocking allreduce moves a bucket through its shared-memory
cells in about five handshakes, each made only when the host calls MPI_Test, and copies every byte in
and out of those cells, host CPU that on a CPU device is taken from the kernels. Here the ranks download
straight into one window of shared memory (``MPI_Win_allocate_shared``), each rank sums its own slice of
every rank's contribution into the result and all read the result: two flags to look at instead of
handshakes, one pass over the data (``SharedMemoryBuckets``). Better still, on a device whose kernels work
in host memory the window is also a device buffer: each device averages every rank's contribution
straight into its gradients, and the host only raises and watches one flag per bucket
(``DeviceAveragedBuckets``).
"""
from __future__ import annotations

import time

import numpy as np

from ..ops.reduce import MeanOfRows
from ..runtime import memory
from ..tensor import Tensor
from . import collectives, process_group
from .shared_window import SharedWindow

_ARRIVED, _REDUCED, _DONE = 0, 1, 2  # the two flags a rank raises per bucket and pass, and the end


class _StartsAtPassEnd:
    """Shared memory: nothing moves before every rank's contribution is in, so the hooks do nothing, and
    the pass's end queues every bucket's copies, sleeps in the driver until the last lands (one in-order
    queue: all have then) and starts every bucket."""

    def gradient_ready(self, buckets, bucket, position: int) -> int:
        return 0

    def start_remaining(self, buckets) -> None:
        for bucket in buckets:
            bucket.download(self)
        last = next((b.events[-1] for b in reversed(buckets) if b.events), None)
        if last is not None:
            last.wait()
        for bucket in buckets:
            self.start(bucket.index)

    def pass_ended(self) -> None:
        pass


class _HostAveraged:
    """Gradients reach a bucket's host array by downloads, and its averages come back by uploads."""

    averaging = "host"

    def copy_in(self, i: int, start: int, grad):
        """Queue the copy of contiguous ``grad`` into bucket i's contribution from element ``start``;
        returns its event (the caller keeps it: pyopencl waits for a download whose event is dropped)."""
        return collectives.download_async(grad, self.contribution(i)[start:start + grad.size])

    def write_back(self, bucket) -> None:
        result = self.result(bucket.index)
        for p, start, stop in zip(bucket.params, bucket.offsets, bucket.offsets[1:]):
            # asynchronous: the next pass downloads into this host buffer only behind this upload
            memory.upload(p.device, p.grad.buffer, result[start:stop], p.grad.offset * p.dtype.itemsize, wait=False)
            p.grad.mark_written()


class MpiBuckets(_HostAveraged):
    """Each bucket reduced in place by ``MPI_Iallreduce`` on the host array, then divided; a bucket starts
    as soon as its copies have landed, in bucket order, while backward goes on."""

    name = "mpi"

    def __init__(self, comm, mpi, specs):
        self._comm, self._mpi, self._size = comm, mpi, comm.Get_size()
        self._hosts = [np.empty(n, dtype) for n, dtype in specs]
        self._requests = [None] * len(specs)
        self._averaged = [False] * len(specs)
        self._next_to_start = 0  # buckets start in order: those before it have this pass

    # ---- the pass ------------------------------------------------------------------------------------
    def gradient_ready(self, buckets, bucket, position: int) -> int:
        """Queue a bucket's copies once its last gradient is in, start the buckets whose copies have
        landed and test the running ones; how many buckets started."""
        bucket.waiting.discard(position)
        if not bucket.waiting and bucket.events is None:
            bucket.download(self)
        started = 0
        while self._next_to_start < len(buckets):
            bucket = buckets[self._next_to_start]
            if bucket.events is None or not bucket.landed():
                break
            self._start_next(buckets)
            started += 1
        self._test_started(buckets)
        return started

    def start_remaining(self, buckets) -> None:
        """Start the remaining buckets in order, each once its copies have landed, testing the running
        ones meanwhile so that a bucket's allreduce proceeds while the device still computes the next
        one's gradients."""
        delay = 0.0
        while self._next_to_start < len(buckets):
            bucket = buckets[self._next_to_start]
            if bucket.events is None:  # a parameter that got no gradient this pass kept it waiting
                bucket.download(self)
            if bucket.landed():
                self._start_next(buckets)
            elif not self._test_started(buckets):
                bucket.events[-1].wait()  # nothing to move: sleep in the driver until the copies land
            else:
                process_group.check_failures()
                time.sleep(delay)
                delay = min(2 * delay or 5e-5, 2e-4)
        self._test_started(buckets)

    def pass_ended(self) -> None:
        self._next_to_start = 0

    def _start_next(self, buckets) -> None:
        self.start(buckets[self._next_to_start].index)
        self._next_to_start += 1

    def _test_started(self, buckets) -> bool:
        """Test the started allreduces (MPI progresses non-blocking collectives only inside MPI calls);
        whether any is still running."""
        running = False
        for bucket in buckets[:self._next_to_start]:
            if not self.test(bucket.index):
                running = True
        return running

    # ---- one bucket ----------------------------------------------------------------------------------
    def contribution(self, i: int) -> np.ndarray:
        return self._hosts[i]

    def start(self, i: int) -> None:
        self._averaged[i] = False
        self._requests[i] = self._comm.Iallreduce(self._mpi.IN_PLACE, self._hosts[i], op=self._mpi.SUM)

    def test(self, i: int) -> bool:
        if self._averaged[i]:
            return True
        if not self._requests[i].Test():
            return False
        self._hosts[i] *= self._hosts[i].dtype.type(1.0 / self._size)
        self._averaged[i] = True
        return True

    def result(self, i: int) -> np.ndarray:
        return self._hosts[i]


class SharedMemoryBuckets(_StartsAtPassEnd, _HostAveraged):
    """The buckets in one shared-memory window of the node's ranks (all of the job's ranks), summed on
    the host.

    Bucket i holds N contributions of n_i elements, the result, and per rank two pass counters: "my
    contribution has landed" and "my slice of the result is written". A rank sums its slice once every
    rank's contribution has landed, and the result is complete once every slice is. A contribution is
    overwritten only by the next pass's download, which the rank queues after uploading this pass's
    result, that is after every rank has read it; the result is overwritten only after every rank's next
    contribution has landed, so after every upload of this one."""

    name = "shared memory"

    def __init__(self, comm, mpi, specs):
        size, rank = comm.Get_size(), comm.Get_rank()
        blocks = []
        for n, dtype in specs:
            blocks += [size * n * np.dtype(dtype).itemsize, n * np.dtype(dtype).itemsize]
        self._window = SharedWindow(comm, mpi, blocks, (len(specs), 2, size))
        self._rank = rank
        self._contributions, self._results, self._slices = [], [], []
        for i, (n, dtype) in enumerate(specs):
            self._contributions.append(self._window.blocks[2 * i].view(dtype).reshape(size, n))
            self._results.append(self._window.blocks[2 * i + 1].view(dtype))
            self._slices.append(slice(n * rank // size, n * (rank + 1) // size))
        self._passes = [0] * len(specs)
        self._state = [None] * len(specs)

    def contribution(self, i: int) -> np.ndarray:
        return self._contributions[i][self._rank]

    def start(self, i: int) -> None:
        self._passes[i] += 1
        self._raise(i, _ARRIVED)

    def test(self, i: int) -> bool:
        state, count = self._state[i], self._passes[i]
        if state == _ARRIVED and self._window.all_raised((i, _ARRIVED), count):
            mine = self._slices[i]
            result = self._results[i][mine]
            np.sum(self._contributions[i][:, mine], axis=0, out=result)
            result *= result.dtype.type(1.0 / self._window.size)
            self._raise(i, _REDUCED)
            state = _REDUCED
        if state == _REDUCED and self._window.all_raised((i, _REDUCED), count):
            self._state[i] = _DONE
        return self._state[i] == _DONE

    def result(self, i: int) -> np.ndarray:
        return self._results[i]

    def _raise(self, i: int, which: int) -> None:
        self._window.raise_flag((i, which, self._rank), self._passes[i])
        self._state[i] = which


class DeviceAveragedBuckets(_StartsAtPassEnd):
    """The buckets in one shared-memory window of the node's ranks, averaged by each rank's device.

    For a device that works in host memory (a CPU driver): the window's contributions are also device
    buffers (``memory.over_host_array``), so once every rank's contribution has landed each rank's device
    averages all of them straight into its parameters' ``.grad`` (``write_back``). Against summing on
    the host (:class:`SharedMemoryBuckets`) this saves the host's sum, the flag round that announces it
    and the uploads: work that on a CPU device takes the cores the kernels run on.

    One flag per rank and bucket ("my contribution has landed"), and two sets of contributions used in
    alternate passes. A rank copies into set p % 2 in pass p only after it has seen every rank's flag
    for pass p - 1; a rank raises that flag once its copies of pass p - 1 have landed, and its
    in-order queue ran its averaging of pass p - 2 (which read set p % 2) before them. So no rank
    overwrites a contribution another still has to read."""

    name = "shared memory"
    averaging = "device"

    def __init__(self, comm, mpi, specs, device):
        self._size, self._rank = comm.Get_size(), comm.Get_rank()
        self._window = SharedWindow(comm, mpi, [2 * self._size * n * np.dtype(dtype).itemsize for n, dtype in specs],
                                     (len(specs), self._size), device)
        self._contributions, self._on_device = [], []
        for block, (n, dtype) in zip(self._window.blocks, specs):
            self._contributions.append(block.view(dtype).reshape(2, self._size, n))
            self._on_device.append(Tensor(memory.over_host_array(device, block), (2, self._size, n), dtype, device))
        self._averages = {}  # (bucket, set) -> a MeanOfRows per parameter, over its slice of the set
        self._passes = [0] * len(specs)

    def _filling(self, i: int) -> int:
        """The set of bucket i's contributions this pass copies into (it starts with ``start``)."""
        return (self._passes[i] + 1) % 2

    def contribution(self, i: int) -> np.ndarray:
        return self._contributions[i][self._filling(i), self._rank]

    def start(self, i: int) -> None:
        self._passes[i] += 1
        self._window.raise_flag((i, self._rank), self._passes[i])

    def copy_in(self, i: int, start: int, grad):
        """Queue the device-side copy of contiguous ``grad`` into bucket i's contribution from element
        ``start`` (the window is a buffer too); returns its event. A copy between buffers costs the host
        less than a download into host memory."""
        contributions = self._on_device[i]
        _, size, n = contributions.shape
        first = contributions.offset + (self._filling(i) * size + self._rank) * n + start
        itemsize = contributions.dtype.itemsize
        return memory.copy(contributions.device, contributions.buffer, grad.buffer, grad.size * itemsize,
                           first * itemsize, grad.offset * itemsize)

    def test(self, i: int) -> bool:
        return self._window.all_raised(i, self._passes[i])

    def write_back(self, bucket) -> None:
        """Enqueue each parameter's ``.grad`` <- the mean over ranks of its elements of the bucket (after
        ``test``): one launch per parameter, prepared at the first pass of each set."""
        i, offsets, outs = bucket.index, bucket.offsets, [p.grad for p in bucket.params]
        key = (i, self._passes[i] % 2)
        averages = self._averages.get(key)
        if averages is None:
            contributions = self._on_device[i]
            n, first = contributions.shape[2], contributions.offset + key[1] * self._size * contributions.shape[2]
            averages = self._averages[key] = [
                MeanOfRows(contributions._view((self._size, stop - start), (n, 1), first + start))
                for start, stop in zip(offsets, offsets[1:])]
        for average, out in zip(averages, outs):
            average(out)
            out.mark_written()
