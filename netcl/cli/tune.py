"""`netcl tune gemm|conv|all [--quick]`: measure on the current device and store the results.

gemm: search the GEMM kernel's parameters; conv: calibrate the conv planner's cost model (which uses the
GEMM's rates, so `all` tunes the GEMM first)."""
from __future__ import annotations

import importlib

TUNABLE = ("gemm", "conv")


def add_arguments(p) -> None:
    p.add_argument("name", choices=TUNABLE + ("all",), help="what to tune (all: gemm, then conv)")
    p.add_argument("--quick", action="store_true", help="a smaller search (gemm: a few minutes; conv: under 30 s)")
    p.add_argument("--json", action="store_true", help="end with one JSON object")
    p.add_argument("--device", default=None, help="device index or name substring")


def run(args):
    if args.device is not None:
        import netcl as nc
        nc.set_default_device(args.device)
    names = TUNABLE if args.name == "all" else (args.name,)
    results = {name: importlib.import_module(f"netcl.tuning.{name}").run_cli(args) for name in names}
    return results[args.name] if args.name != "all" else {"tuned": "all", **results}
