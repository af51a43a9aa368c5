"""`netcl devices [--json]`: every platform and device with the fields a user checks first."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def run(args):
    import netcl as nc
    from ..runtime.device import INSTALL_HINT
    found = nc.devices()
    default = None
    if found:
        try:
            default = nc.default_device().index
        except nc.DeviceError:
            default = None
    if args.json:
        return {"devices": [dict(d.as_dict(), default=(d.index == default)) for d in found]}
    if not found:
        print(INSTALL_HINT)
        return None
    for d in found:
        mark = "*" if d.index == default else " "
        print(f"{mark}[{d.index}] {d.platform} / {d.name}")
        print(f"      kind {d.kind}, {d.compute_units} compute units, {d.opencl_version}, driver {d.driver_version}")
        print(f"      global memory {_gib(d.global_mem_bytes)}, max allocation {_gib(d.max_alloc_bytes)}, "
              f"local memory {_gib(d.local_mem_bytes)}, max work-group {d.max_work_group_size}")
        print(f"      fp64 {'yes' if d.has_fp64 else 'no'}, fp16 {'yes' if d.has_fp16 else 'no'}")
    print("(* = default device; choose another with NETCL_DEVICE=<index or name substring>)")
    return None
