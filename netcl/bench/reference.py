"""Fair comparisons: the reference (PyTorch, NumPy) runs in a process of its own, in alternating rounds.

Measured inside netcl's process, PyTorch shared the cores with PoCL's worker threads and lost a third of
its speed (LeNet at batch 64: 28.8 it/s there, 34-48 alone). So a :class:`ReferenceProcess` runs
netcl.bench.reference_worker in a child process (under ``NETCL_REFERENCE_PYTHON`` if set, so PyTorch can
live in another environment than netcl), and :func:`alternate` times netcl and the reference in turns,
one after the other, never at once: a burst of load from elsewhere on the machine then hits both sides of
some rounds alike, and the median of the per-round ratios is what a benchmark reports.

Usage::

    with ReferenceProcess() as ref:
        if ref.has_torch:
            r = alternate(lambda: netcl_seconds_per_step(), lambda: ref.seconds(model="lenet", mode="train",
                          batch=64, seconds=1.0), rounds=5)
            r["ratio"]  # median over rounds of reference seconds / netcl seconds (> 1: netcl is faster)

or :func:`compare`, which does the same and falls back to netcl alone when the reference has no PyTorch.
:func:`interleave` times several netcl runners and several reference workloads in the same rounds
(`netcl bench gemm`: netcl's GEMM one call at a time and pipelined, against NumPy's both ways).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import settings

WORKER = Path(__file__).with_name("reference_worker.py")
QUIET_SECONDS = 0.25  # between the two sides of a round (see interleave)
WAKE_SECONDS = 0.02  # of untimed calls before each sample (see interleave)


class ReferenceError(RuntimeError):
    """The reference process could not start or answer."""


class ReferenceProcess:
    """A child process that measures reference workloads on request (see reference_worker's protocol)."""

    def __init__(self, python: str | None = None):
        self.python = python or settings.REFERENCE_PYTHON.get() or sys.executable
        self._stderr = tempfile.TemporaryFile(mode="w+")
        env = settings.child_environment(PYTHONPATH=None)
        try:
            command = [self.python, str(WORKER), "--device", settings.REFERENCE_DEVICE.get()]
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr, text=True, env=env)
        except OSError as exc:
            raise ReferenceError(f"cannot start the reference process {self.python}: {exc}") from exc
        self.info = self._read()
        self.torch_version: str | None = self.info.get("torch")
        self.has_torch = self.torch_version is not None
        self.onnxruntime_version: str | None = self.info.get("onnxruntime")

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].strip()
            raise ReferenceError(f"the reference process ({self.python}) stopped: {tail or 'no message'}")
        return json.loads(line)

    def ask(self, **request) -> dict:
        """The worker's answer to one request (reference_worker's protocol); its error as a ReferenceError."""
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise ReferenceError(f"reference {request.get('model')}: {answer['error']}")
        return answer

    def seconds(self, **request) -> float:
        """Seconds per iteration of one workload (built and warmed up at its first request)."""
        return float(self.ask(**request)["seconds_per_iteration"])

    def missing_torch_note(self) -> str:
        return (f"PyTorch is not installed for {self.python}: no comparison (pip install torch, or point "
                f"NETCL_REFERENCE_PYTHON at an interpreter that has it)")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def alternate(netcl_seconds, reference_seconds, rounds: int, quiet_s: float = QUIET_SECONDS) -> dict:
    """Time both sides ``rounds`` times in turns (which goes first alternates too) and summarize.

    Each side starts ``quiet_s`` after the other ended, as in :func:`interleave`: PyTorch's OpenMP threads
    and OpenBLAS's keep spinning on the cores for a while after their last call.

    Each argument is a callable returning seconds per iteration. Returns the medians of both, the median
    of the per-round ratios reference / netcl (above 1 means netcl is faster) and every round's figures.
    """
    ours, theirs = [], []

    def quietly(side):
        time.sleep(quiet_s)
        return side()
    for i in range(rounds):
        if i % 2 == 0:
            ours.append(quietly(netcl_seconds))
            theirs.append(quietly(reference_seconds))
        else:
            theirs.append(quietly(reference_seconds))
            ours.append(quietly(netcl_seconds))
    ratios = [t / o for o, t in zip(ours, theirs)]
    return {"netcl_seconds": statistics.median(ours), "reference_seconds": statistics.median(theirs),
            "ratio": statistics.median(ratios), "rounds": [{"netcl": o, "reference": t} for o, t in zip(ours, theirs)]}


def compare(netcl_seconds, ref: ReferenceProcess, request: dict, rounds: int, quiet_s: float = QUIET_SECONDS) -> dict:
    """:func:`alternate` against ``ref.seconds(**request)``; netcl alone (the median of ``rounds``
    measurements, no "ratio" key) when the reference process has no PyTorch."""
    if not ref.has_torch:
        return {"netcl_seconds": statistics.median(netcl_seconds() for _ in range(rounds))}
    return alternate(netcl_seconds, lambda: ref.seconds(**request), rounds, quiet_s)


def interleave(netcl_runners: dict, device, ref: ReferenceProcess, reference_requests: dict, rounds: int,
               warmup: int = 1, quiet_s: float = QUIET_SECONDS, wake_s: float = WAKE_SECONDS) -> dict:
    """Samples of every netcl runner and every reference workload, taken in the same rounds: {name: [s]}.

    ``netcl_runners`` are callables timed here between waits on ``device``'s queue (``(fn, calls)`` pairs
    time ``calls`` back-to-back calls and divide); ``reference_requests`` are :meth:`ReferenceProcess.seconds`
    requests. Within a round the netcl runners' order rotates, and the reference side goes first in odd
    rounds and last in even ones, so neither side always follows the other's load. Names must not clash.
    Each side starts ``quiet_s`` after the other ended: OpenBLAS's threads spin on the cores for a while
    after a product, and a netcl product run in that time competes with them for the cores. Then, on both
    sides, untimed calls wake the threads that went to sleep in the quiet time, so each sample is the
    runner's steady state.
    """
    from ..runtime.timing import timed_call
    runners = {name: (r if isinstance(r, tuple) else (r, 1)) for name, r in netcl_runners.items()}
    clash = set(runners) & set(reference_requests)
    if clash:
        raise ValueError(f"runner names used on both sides: {sorted(clash)}")
    for _ in range(warmup):
        for fn, calls in runners.values():
            timed_call(fn, device, calls)
        for request in reference_requests.values():
            ref.seconds(**request)
    samples = {name: [] for name in [*runners, *reference_requests]}
    names = list(runners)

    def reference_side():
        time.sleep(quiet_s)
        for name, request in reference_requests.items():
            samples[name].append(ref.seconds(**dict(request, settle_s=wake_s)))
        time.sleep(quiet_s)
    for round_ in range(rounds):
        if round_ % 2:
            reference_side()
        shift = round_ % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            fn, calls = runners[name]
            _wake(fn, device, wake_s)
            samples[name].append(timed_call(fn, device, calls))
        if round_ % 2 == 0:
            reference_side()
    return samples


def _wake(fn, device, seconds: float) -> None:
    """Untimed calls for about ``seconds``: after a quiet gap a single call does not wake a driver's
    threads, and the sample that follows it is slowed by their waking."""
    start = time.perf_counter()
    while True:
        fn()
        device.synchronize()
        if time.perf_counter() - start >= seconds:
            return
