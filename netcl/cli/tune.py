"""`netcl tune gemm [--quick]`: search kernel parameters on the current device and store the winners."""
from __future__ import annotations

import importlib

TUNABLE = ("gemm",)


def add_arguments(p) -> None:
    p.add_argument("name", choices=TUNABLE, help="which kernel family")
    p.add_argument("--quick", action="store_true", help="a smaller search (a few minutes on a CPU)")
    p.add_argument("--json", action="store_true", help="end with one JSON object")
    p.add_argument("--device", default=None, help="device index or name substring")


def run(args):
    if args.device is not None:
        import netcl as nc
        nc.set_default_device(args.device)
    return importlib.import_module(f"netcl.tuning.{args.name}").run_cli(args)
