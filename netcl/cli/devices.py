"""`netcl devices [--json] [--bench]`: every platform and device with the fields a user checks first.

``--bench`` measures each device's GEMM rate (netcl's own 512^3 float32 product) and copy bandwidth in a
child process per device (netcl.bench.device_rates), the best of ``--rounds`` rounds, and stores them
(netcl.runtime.device_figures); afterwards every listing shows them, and ``nc.default_device()`` prefers
the fastest measured device when no selector and no GPU decides. A NETCL_DEVICE that matches no device is reported after the listing
and the command exits with status 2.
"""
from __future__ import annotations

import json
import subprocess
import sys

from .. import settings

BENCH_TIMEOUT_SECONDS = 600
BENCH_ROUNDS = 2


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--bench", action="store_true",
                   help="measure and store each device's GEMM rate and copy bandwidth")
    p.add_argument("--rounds", type=int, default=BENCH_ROUNDS,
                   help=f"with --bench: rounds of measurements, each device keeping its best (default {BENCH_ROUNDS})")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def bench_device(index: int, log) -> dict:
    """Measure one device in a child process; {"error": ...} if it fails there."""
    proc = subprocess.run([sys.executable, "-m", "netcl.bench.device_rates", str(index)], capture_output=True,
                          text=True, timeout=BENCH_TIMEOUT_SECONDS,
                          env=settings.child_environment(NETCL_DEVICE=str(index)))
    for line in proc.stdout.splitlines():
        if line.startswith("DEVICE_RATES "):
            return json.loads(line.split(" ", 1)[1])
    tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    log(f"  [{index}] measurement failed: {tail}")
    return {"error": tail}


def _figures_line(fig: dict) -> str | None:
    if "gemm_gflops" not in fig:
        return None
    line = f"      measured: GEMM {fig['gemm_gflops']:.1f} GFLOP/s ({fig.get('gemm_shape', '512^3')}"
    if fig.get("gemm_params"):
        line += f", {fig['gemm_params']} parameters"
    line += ")"
    if "copy_gbps" in fig:
        line += f", copy bandwidth {fig['copy_gbps']:.1f} GB/s"
    return line + f" [{fig.get('source', '?')}, {fig.get('measured_at', '?')}]"


def run(args):
    import netcl as nc
    from ..runtime.device import INSTALL_HINT, DeviceSelectorError
    from ..runtime.device_figures import store_figures, stored_figures
    found = nc.devices()
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    if getattr(args, "bench", False):
        # Devices take turns over BENCH_ROUNDS rounds and each keeps its best round: on a shared machine a
        # burst of load during one device's only measurement would otherwise decide the default.
        best: dict = {}
        rounds = max(1, args.rounds)
        for round_index in range(rounds):
            for d in found:
                log(f"measuring [{d.index}] {d.platform} / {d.name} (round {round_index + 1} of {rounds}) ...")
                measured = bench_device(d.index, log)
                if "error" in measured:
                    continue
                log(f"  GEMM 512^3 {measured['gemm_gflops']:.1f} GFLOP/s, copy {measured['copy_gbps']:.1f} GB/s")
                kept = best.setdefault(d.index, dict(measured))
                for figure in ("gemm_gflops", "copy_gbps"):
                    kept[figure] = max(kept[figure], measured[figure])
        for d in found:
            if d.index in best:
                store_figures(d, dict(best[d.index], rounds=rounds), source="netcl devices --bench")
    default, selector_error = None, None
    if found:
        try:
            default = nc.default_device().index
        except DeviceSelectorError as exc:
            selector_error = exc
    figures = {d.index: stored_figures(d) for d in found}
    if args.json:
        listing = []
        for d in found:
            entry = dict(d.as_dict(), default=(d.index == default))
            fig = figures[d.index]
            entry.update({k: fig.get(k) for k in ("gemm_gflops", "copy_gbps")})
            entry["measured_at"] = fig.get("measured_at")
            listing.append(entry)
        result = {"devices": listing}
        if selector_error is not None:
            print(json.dumps(result))
            raise selector_error
        return result
    if not found:
        print(INSTALL_HINT)
        return None
    for d in found:
        mark = "*" if d.index == default else " "
        print(f"{mark}[{d.index}] {d.platform} / {d.name}")
        print(f"      kind {d.kind}, {d.compute_units} compute units, {d.opencl_version}, driver {d.driver_version}")
        print(f"      platform {d.platform_version}")
        print(f"      global memory {_gib(d.global_mem_bytes)}, max allocation {_gib(d.max_alloc_bytes)}, "
              f"local memory {_gib(d.local_mem_bytes)}, max work-group {d.max_work_group_size}")
        print(f"      fp64 {'yes' if d.has_fp64 else 'no'}, fp16 {'yes' if d.has_fp16 else 'no'}")
        print(f"      conv planner: {__import__('netcl.ops.conv_profile', fromlist=['_']).calibration_summary(d)}")
        line = _figures_line(figures[d.index])
        print(line or "      not measured (netcl devices --bench)")
    print("(* = default device; choose another with NETCL_DEVICE=<index, or words of the platform or device name "
          "such as pocl, intel, nvidia>)")
    if selector_error is not None:
        raise selector_error
    return None
