"""The MPI process group: start-up under mpiexec, each rank's device and core share, and failure handling.

``init_process_group`` imports mpi4py (which initializes MPI), learns the rank's place on its node from
MPI's shared-memory split, gives the rank its share of the node's cores *before* the first OpenCL call
(PoCL reads ``POCL_MAX_PTHREAD_COUNT`` once, when the platform initializes; Intel's CPU runtime reads
``CL_CONFIG_CPU_TBB_NUM_WORKERS``), then picks the rank's device: ``NETCL_DEVICE`` if set, else the
GPUs (and accelerators) round-robin by local rank, else the default device, shared by the node's ranks.

A rank that raises must not leave the others waiting forever inside a collective: the installed
``sys.excepthook`` (and :func:`abort` for callers that catch errors themselves, such as the CLI) prints
``netcl rank r/N failed: ...``, tells the other ranks on a private communicator so that those waiting in
netcl's collectives print why they stop, and ends the job with ``MPI_Abort``.
"""
from __future__ import annotations

import os
import sys
import time

from .. import settings
from ..errors import NetclError

INSTALL_HINT = "pip install mpi4py mpich"
# Seconds the failing rank waits for the others to acknowledge its notice (each prints its line first)
# before MPI_Abort ends them all: ranks busy computing never answer; short against the 30 s bound.
NOTICE_GRACE_SECONDS = 2.0
# Environment variables through which CPU drivers take a thread count at platform initialization.
THREAD_COUNT_VARIABLES = ("POCL_MAX_PTHREAD_COUNT", "CL_CONFIG_CPU_TBB_NUM_WORKERS")
_FAILURE_TAG, _ACK_TAG = 7, 8


class DistributedError(NetclError, RuntimeError):
    """MPI is missing, the process group is not initialized, or another rank failed."""


class _Group:
    """What init_process_group learned; one per process."""

    def __init__(self, mpi, comm, local_rank: int, local_size: int, threads: dict, device, cores=None):
        self.mpi = mpi
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.local_rank = local_rank
        self.local_size = local_size
        self.threads = threads  # the thread-count variables init_process_group set (name -> value)
        self.device = device
        self.failure_comm = comm.Dup()  # failure notices never match a user's or DDP's messages
        self.notice = bytearray(4096)
        self.notice_request = self.failure_comm.Irecv(self.notice, source=mpi.ANY_SOURCE, tag=_FAILURE_TAG)
        self.notice_status = mpi.Status()
        self.failing = False
        self.cores = cores  # the cores init_process_group pinned this rank to (None: not pinned)
        # Whether this rank runs on cores no other rank uses (pinned here or by the launcher): then a
        # busy wait takes nothing from another rank.
        self.owns_cores = cores is not None or _bound(_available_cores())


_group: _Group | None = None


def _import_mpi():
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError without mpi4py; RuntimeError when its MPI library is missing
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DistributedError(f"nc.distributed needs mpi4py and an MPI library ({reason}): "
                               f"{INSTALL_HINT}") from None
    return MPI


def is_available() -> bool:
    """Whether mpi4py and an MPI library can be loaded (importing mpi4py.MPI initializes MPI)."""
    try:
        _import_mpi()
    except DistributedError:
        return False
    return True


def is_initialized() -> bool:
    return _group is not None


def group() -> _Group:
    if _group is None:
        raise DistributedError("the process group is not initialized: call "
                               "nc.distributed.init_process_group(backend='mpi') first (under mpiexec)")
    return _group


def _local_placement(mpi, comm) -> tuple[int, int]:
    """(local rank, ranks on this node): MPI's shared-memory split, else the launcher's variables."""
    try:
        node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
        placement = node.Get_rank(), node.Get_size()
        node.Free()
        return placement
    except Exception:  # an MPI without MPI-3 split types
        pass
    return settings.launcher_placement() or (0, 1)


def _available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cores_per_rank(local_size: int) -> int:
    """The cores this rank may use: what the launcher bound it to, else an equal share of the node's."""
    available = _available_cores()
    if _bound(available):
        return available  # its cores are its share
    return max(1, available // max(local_size, 1))


def _bound(available: int) -> bool:
    """Whether this process runs on fewer cores than the node has: a launcher (mpiexec -bind-to core) or
    bind_share pinned it."""
    return available < (os.cpu_count() or available)


def bind_share(local_rank: int, local_size: int) -> list[int] | None:
    """Pin this rank to its own share of the node's cores (contiguous, as equal as they divide) when the
    launcher left it the whole node; the cores it now runs on, or None where nothing was bound (one rank
    per node, more ranks than cores, a launcher's binding, NETCL_BIND_CORES=0, or no affinity API).

    What Open MPI's launcher does by default for few ranks and MPICH's does with ``-bind-to core``: a rank
    stays on its cores (its caches stay warm) and its host thread and driver threads no longer compete
    with the other ranks' (2 LeNet ranks on 2 cores: 3,800-3,830 against 3,690-3,790 images/s unpinned).
    Only the calling thread is pinned; threads it starts later (the drivers') inherit
    the mask, which is why this runs before the first OpenCL call."""
    if local_size < 2 or not settings.BIND_CORES.get() or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if _bound(len(cores)) or len(cores) < local_size:
        return None
    start, stop = (len(cores) * local_rank) // local_size, (len(cores) * (local_rank + 1)) // local_size
    share = cores[start:stop]
    try:
        os.sched_setaffinity(0, share)
    except OSError:
        return None
    return share


def _split_cores(local_rank: int, local_size: int) -> tuple[dict, list[int] | None]:
    """If no OpenCL platform is open yet: pin the rank to its share of the cores (bind_share) and set the
    CPU drivers' thread counts the user left unset to its size. (variables set, cores pinned)"""
    from ..runtime import device as device_registry
    if device_registry._devices is not None:
        if local_size > 1 and not all(settings.environment_has(name) for name in THREAD_COUNT_VARIABLES):
            import warnings
            warnings.warn(f"init_process_group() came after the first OpenCL call, so the {local_size} ranks on "
                          f"this node could not split its cores (POCL_MAX_PTHREAD_COUNT is read when the "
                          f"platform initializes): call it before creating tensors, or set the variable",
                          RuntimeWarning, stacklevel=3)
        return {}, None
    cores = bind_share(local_rank, local_size)
    threads = str(cores_per_rank(local_size))
    chosen = {}
    for name in THREAD_COUNT_VARIABLES:
        if not settings.environment_has(name):
            os.environ[name] = threads
            chosen[name] = threads
    return chosen, cores


def _pick_device(local_rank: int):
    from ..runtime import device as device_registry
    if settings.DEVICE.is_set():
        return device_registry.default_device()
    accelerators = [d for d in device_registry.devices() if d.kind in ("gpu", "accelerator")]
    if accelerators:
        return device_registry.set_default_device(accelerators[local_rank % len(accelerators)])
    return device_registry.default_device()


def init_process_group(backend: str = "mpi") -> None:
    """Join the job started by mpiexec/mpirun: MPI, this rank's device, failure handling.

    Pins the rank to its share of the node's cores when several ranks share a node the launcher did not
    bind (``NETCL_BIND_CORES=0`` keeps them free) and sets ``POCL_MAX_PTHREAD_COUNT`` (and Intel's
    ``CL_CONFIG_CPU_TBB_NUM_WORKERS``) to that share's size when they are unset, both only when no OpenCL
    platform was opened yet, so call it before creating tensors. Calling it again is a no-op."""
    global _group
    if backend != "mpi":
        raise DistributedError(f"unknown backend {backend!r}: netcl's only backend is 'mpi'")
    if _group is not None:
        return
    mpi = _import_mpi()
    comm = mpi.COMM_WORLD
    local_rank, local_size = _local_placement(mpi, comm)
    threads, cores = _split_cores(local_rank, local_size)
    device = _pick_device(local_rank)
    _group = _Group(mpi, comm, local_rank, local_size, threads, device, cores)
    _install_excepthook()
    import atexit
    atexit.register(_withdraw_notice_receive)  # runs before mpi4py's MPI_Finalize (atexit is LIFO)


def get_rank() -> int:
    return group().rank


def get_world_size() -> int:
    return group().size


def get_local_rank() -> int:
    return group().local_rank


def describe() -> dict:
    """This rank's placement, for logs and metrics."""
    g = group()
    return {"rank": g.rank, "world_size": g.size, "local_rank": g.local_rank, "local_size": g.local_size,
            "device": g.device.describe(), "threads": dict(g.threads), "cores": g.cores}


# ---- failure handling ------------------------------------------------------------------------------
def check_failures() -> None:
    """If another rank announced its failure: print why this rank stops, acknowledge (the failing rank
    waits for that before it ends the job), and end the job if the failing rank has not by then."""
    g = _group
    if g is None or g.failing:
        return
    status = g.notice_status  # one Status for every poll: making one each time cost more than the test
    if not g.notice_request.Test(status):
        return
    message = bytes(g.notice).rstrip(b"\0").decode("utf-8", "replace")
    g.failing = True
    print(f"netcl rank {g.rank}/{g.size}: stopping because {message}", file=sys.stderr, flush=True)
    g.failure_comm.Send(b"\1", dest=status.Get_source(), tag=_ACK_TAG)
    time.sleep(NOTICE_GRACE_SECONDS + 1.0)
    g.comm.Abort(1)


def wait(request, first_sleep_seconds: float = 5e-5, longest_sleep_seconds: float = 2e-4,
         spin: bool = False) -> None:
    """Wait for a non-blocking MPI request, watching for other ranks' failure notices meanwhile.

    Polls with growing sleeps instead of MPI's blocking wait, which spins: ranks sharing a node's cores
    would take them from the devices (PoCL's threads) that the late rank still computes on. With ``spin``
    (for a rank on cores of its own whose device has nothing to do meanwhile) it tests without sleeping,
    and looks for failure notices every millisecond."""
    wait_until(request.Test, first_sleep_seconds, longest_sleep_seconds, spin)


def wait_until(done, first_sleep_seconds: float = 5e-5, longest_sleep_seconds: float = 2e-4,
               spin: bool = False) -> None:
    """``wait`` for any progress test: ``done()`` is called until it returns True."""
    if spin:
        next_check = time.monotonic() + 1e-3
        while not done():
            os.sched_yield()
            if time.monotonic() > next_check:
                check_failures()
                next_check = time.monotonic() + 1e-3
        return
    delay = 0.0
    while not done():
        check_failures()
        time.sleep(delay)
        delay = min(first_sleep_seconds if delay == 0.0 else delay * 2, longest_sleep_seconds)


def abort(message: str, errorcode: int = 1) -> None:
    """Print ``netcl rank r/N failed: message``, tell the other ranks, and end the whole job."""
    g = _group
    if g is None:
        return
    g.failing = True
    print(f"netcl rank {g.rank}/{g.size} failed: {message}", file=sys.stderr, flush=True)
    notice = f"rank {g.rank}/{g.size} failed: {message}".encode("utf-8", "replace")[:len(g.notice) - 1]
    try:
        others = [r for r in range(g.size) if r != g.rank]
        sends = [g.failure_comm.Isend(notice, dest=r, tag=_FAILURE_TAG) for r in others]
        acks = [bytearray(1) for _ in others]
        receives = [g.failure_comm.Irecv(ack, source=r, tag=_ACK_TAG) for ack, r in zip(acks, others)]
        deadline = time.monotonic() + NOTICE_GRACE_SECONDS
        while time.monotonic() < deadline and not g.mpi.Request.Testall(receives):
            g.mpi.Request.Testall(sends)
            time.sleep(0.005)
    finally:
        g.comm.Abort(errorcode)


def _withdraw_notice_receive() -> None:
    g = _group
    if g is not None and not g.failing and not g.notice_request.Test():
        g.notice_request.Cancel()
        g.notice_request.Wait()


def _install_excepthook() -> None:
    previous = sys.excepthook

    def netcl_excepthook(exc_type, exc, tb):
        if _group is None or _group.size == 1:
            return previous(exc_type, exc, tb)
        previous(exc_type, exc, tb)  # the traceback first, then the one line every rank's log shows
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        abort(f"{exc_type.__name__}: {text}" if text else exc_type.__name__)

    sys.excepthook = netcl_excepthook
