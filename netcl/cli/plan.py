"""`netcl plan lenet|mec|conv ...`: the arguments of shared/API.md; the work is in netcl.ops.conv2d_planner."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("network", choices=("lenet", "mec", "conv"), help="which layers to plan")
    p.add_argument("--batch", type=int, default=64, help="batch size (lenet, mec)")
    p.add_argument("--input", default=None, help="NxCxHxW (conv)")
    p.add_argument("--weight", default=None, help="KxCxRxS (conv)")
    p.add_argument("--stride", default="1", help="S or SHxSW (conv)")
    p.add_argument("--padding", default="0", help="P or PHxPW (conv)")
    p.add_argument("--dilation", default="1", help="D or DHxDW (conv)")
    p.add_argument("--groups", type=int, default=1, help="groups (conv)")
    p.add_argument("--pass", dest="pass_", default="all",
                   choices=("forward", "backward_data", "backward_weight", "all"), help="which pass")
    p.add_argument("--mode", default="heuristic", choices=("heuristic", "measure", "exhaustive"))
    p.add_argument("--budget", type=int, default=None, help="workspace budget in bytes")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--json", action="store_true", help="end with one JSON object")


def run(args):
    from ..ops.conv2d_planner import plan_command
    return plan_command(args)
