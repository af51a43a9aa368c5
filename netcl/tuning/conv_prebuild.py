"""Compiling a calibration's kernels before it times them, in two processes where that pays.

A cold `netcl tune conv` builds about 160 programs. On Intel's OpenCL CPU runtime a build takes a
second or so, and builds serialize inside one process (two threads building at once take as long as one
after the other), so builds are most of a cold calibration. Two *processes* do build at the same time,
and that driver hands a built program over as a binary for next to nothing (milliseconds to fetch and
load). So before any timing the calibration runs each GEMM product and each
conv pass it will time once with nothing launched (netcl.runtime.observers.builds_only), sharing them
with a helper process (``python -m netcl.tuning.conv_prebuild``) that writes what it builds to netcl's
kernel cache; the timed passes then load those binaries instead of building.

Whether it pays is measured, not read from the driver's name: the binary of a program just built here
must come back in under :data:`BINARY_SHARE` of the program's build time. On PoCL it does not (asking for
a binary compiles the program again), and there the costly code generation happens at a kernel's first
launch, which no build ahead captures, so there the calibration builds as it times, as before.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from .. import settings

BINARY_SHARE = 0.25   # a binary must come back in under this share of its program's build time
HELPER_GRACE_S = 60.0  # how long the helper may run on after this process has built its share


def jobs(layers, grid: dict | None, dtype: str = "float32") -> list:
    """What the calibration will run, as JSON-able jobs: the GEMM products of the device quantities and
    the rate surface (``grid``) in ``dtype``, one job per shape class, then one job per layer (its three
    passes). Jobs that share programs are one job: two processes would otherwise build them twice (a
    helper taking passes while this process built the surface's products built 28 programs twice, the
    GEMM's among them at 2 s each)."""
    from ..ops import gemm_surface
    from ..ops.conv_profile import CLASS_SHAPES
    from ..ops.gemm import shape_class
    products = [(0, m, n, k) for m, n, k in CLASS_SHAPES.values()]  # batch 0: a plain 2-D product
    if grid is not None:
        products += [(batch, m, n, k) for m, n, k, batch in gemm_surface.points(grid)]
    classes: dict = {}
    for batch, m, n, k in products:
        classes.setdefault(shape_class(m, n, k, max(batch, 1)), []).append([batch, m, n, k])
    return ([["gemm", dtype, shapes] for shapes in classes.values()]
            + [["layer", dataclasses.asdict(layer)] for layer in layers])


def build(device, job) -> None:
    """Build the programs ``job`` needs on ``device``, launching nothing. A strategy that fails here is
    left to the timed pass, which records its error."""
    from ..errors import NetclError
    from ..ops.conv_common import ConvLayer
    from ..ops.conv2d_planner import answers, operand_shapes
    from ..ops.conv_registry import strategies
    from ..ops.gemm import gemm, gemm_batched
    from ..runtime.observers import builds_only
    from ..tensor import Tensor
    with builds_only(device):
        if job[0] == "gemm":
            dtype = job[1]
            for batch, m, n, k in job[2]:
                lead = (batch,) if batch else ()
                with contextlib.suppress(NetclError):
                    a, b, c = (Tensor.empty(lead + shape, dtype, device) for shape in ((m, k), (k, n), (m, n)))
                    (gemm_batched if batch else gemm)(a, b, c)
            return
        layer = ConvLayer(**job[1])
        registry = strategies()
        for pass_ in ("forward", "backward_data", "backward_weight"):
            with contextlib.suppress(NetclError):
                a, b = (Tensor.empty(shape, layer.dtype, device) for shape in operand_shapes(layer, pass_))
                for found in answers(layer, pass_, device):
                    if found.why_not is None:
                        with contextlib.suppress(NetclError):
                            registry[found.strategy].run(pass_, a, b, layer)


def binaries_pay(device) -> bool:
    """Whether handing built programs between processes is cheap on ``device``: the binary of the most
    recent program built here from source comes back in under BINARY_SHARE of the mean build time."""
    from ..runtime import binaries, kernels
    from ..runtime.cache import cache_enabled
    built = binaries.unsaved_programs()
    stats = kernels.build_stats(device)
    if not cache_enabled() or not built or not stats["source_builds"]:
        return False
    mean_build_s = stats["seconds"] / (stats["source_builds"] + stats["binary_loads"])
    return binaries.fetch_seconds(list(built.values())[-1]) < BINARY_SHARE * mean_build_s


def compile_ahead(device, layers, grid: dict | None, dtype: str = "float32", progress=None) -> dict:
    """Build what a calibration on ``layers`` (and the rate surface's ``grid``) will run, in this process
    and, where binaries_pay, a helper process; returns {"jobs", "helper_jobs", "seconds", "helper"}.
    Without a helper only the first job is built (the one that decides), the rest as the passes run.
    ``progress(n)`` is called as jobs are handed out."""
    from ..runtime import first_step
    # Timing ends the first step (netcl.runtime.first_step): the kernels built here must be those the
    # timed runs will use, not the cold start's stand-ins.
    first_step.end(device)
    started = time.perf_counter()
    todo = collections.deque(jobs(layers, grid, dtype))
    total = len(todo)

    def result(helper=None) -> dict:
        return {"jobs": total, "helper_jobs": helper.jobs if helper else 0,
                "seconds": round(time.perf_counter() - started, 1), "helper": helper is not None}

    build(device, todo.popleft())
    report = lambda: progress(1) if progress else None  # noqa: E731
    report()
    if not todo or not binaries_pay(device):
        return result()
    lock = threading.Lock()

    def take():
        with lock:
            job = todo.popleft() if todo else None
        if job is not None:
            report()
        return job

    try:
        helper = _Helper(device)
    except OSError as exc:  # no helper: the passes build what this process does not
        warnings.warn(f"the calibration's build helper did not start ({exc})", RuntimeWarning, stacklevel=2)
        return result()
    feeder = threading.Thread(target=helper.serve, args=(take,), daemon=True)
    feeder.start()
    try:
        while (job := take()) is not None:
            build(device, job)
    except BaseException:
        helper.stop()
        raise
    helper.finish(HELPER_GRACE_S)
    feeder.join(timeout=1.0)
    return result(helper)


class _Helper:
    """The helper process and its conversation: it writes ``next`` when it wants a job, and is answered
    with the job as one JSON line, or ``end``."""

    def __init__(self, device):
        self.jobs = 0
        self.log = tempfile.TemporaryFile(mode="w+")
        from ..runtime.cache import cache_root
        # the same cache and the same netcl as this process, however this one found them
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = settings.child_environment(package_root, PYTHONUNBUFFERED="1", NETCL_CACHE_DIR=str(cache_root()))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "netcl.tuning.conv_prebuild", "--device-identity", device.identity],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def serve(self, take) -> None:
        try:
            for line in self.process.stdout:
                if line.strip() != "next":
                    continue
                job = take()
                self.process.stdin.write(("end" if job is None else json.dumps(job)) + "\n")
                self.process.stdin.flush()
                if job is None:
                    return
                self.jobs += 1
        except (OSError, ValueError):  # the helper died: finish() says why
            return

    def stop(self) -> None:
        """End the helper now (this process failed or was interrupted)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def finish(self, grace_s: float) -> None:
        """Wait for the helper's last job (at most ``grace_s``); warn, with its last words, if it failed
        or overran. Either way the timed passes build whatever it did not."""
        try:
            code = self.process.wait(timeout=grace_s)
            why = None if code == 0 else f"it exited with status {code}"
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            why = f"it was still building {grace_s:.0f} s after this process had finished its share"
        if why:
            self.log.seek(0)
            tail = "".join(self.log.readlines()[-5:]).rstrip()
            warnings.warn(f"the calibration's build helper stopped early ({why}); the passes build what it "
                          f"did not{': ' + tail if tail else ''}", RuntimeWarning, stacklevel=3)
        self.log.close()


def _serve_as_helper(identity: str) -> int:
    from ..runtime import binaries, first_step
    from ..runtime.device import devices
    device = next((d for d in devices() if d.identity == identity), None)
    if device is None:
        print(f"no OpenCL device with identity {identity!r} in this process", file=sys.stderr)
        return 2
    first_step.end(device)
    while True:
        print("next", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "end":
            return 0
        build(device, json.loads(line))
        binaries.save_binaries()  # each job's binaries at once: what is done counts if this is stopped


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m netcl.tuning.conv_prebuild",
                                     description="Build the calibration jobs read from stdin (netcl tune conv).")
    parser.add_argument("--device-identity", required=True)
    return _serve_as_helper(parser.parse_args(argv).device_identity)


if __name__ == "__main__":
    sys.exit(main())
