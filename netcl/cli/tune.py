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
    _record_gemm_rate(results.get("gemm"))
    return results[args.name] if args.name != "all" else {"tuned": "all", **results}


def _record_gemm_rate(result) -> None:
    """The tuned 512^3 float32 rate is the figure `netcl devices --bench` measures: store it the same way,
    so the default device follows the tuned speed (netcl.runtime.device_figures)."""
    rate = (((result or {}).get("results") or {}).get("float32/large") or {}).get("rates", {}).get("512x512x512")
    if isinstance(rate, (int, float)):
        import netcl as nc
        from ..runtime.device_figures import store_figures
        store_figures(nc.default_device(), {"gemm_gflops": float(rate), "gemm_shape": "512x512x512 float32",
                                            "gemm_params": "user"}, source="netcl tune gemm")
