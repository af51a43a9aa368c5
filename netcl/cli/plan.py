"""`netcl plan lenet|mec|resnet20|conv|MODEL.onnx ...`: which strategy runs each pass of each layer, and why.

The layer tables are netcl.cli.conv_layers, or an imported ONNX model's convolutions; the decisions are
netcl.ops.conv2d_planner's, each printed with what decided it (a "decided by" line; "decided_by" in JSON).
"""
from __future__ import annotations

from .main import ArgumentError

PASSES = ("forward", "backward_data", "backward_weight")


def add_arguments(p) -> None:
    p.add_argument("network", metavar="lenet|mec|resnet20|conv|MODEL.onnx", help="which layers to plan: lenet, mec, resnet20, conv, or an ONNX file")
    p.add_argument("--batch", type=int, default=None,
                   help="batch size (default 64; mec: 1; an ONNX model: its fixed batch, else 1)")
    p.add_argument("--input", default=None, help="NxCxHxW (conv)")
    p.add_argument("--weight", default=None, help="KxCxRxS (conv)")
    p.add_argument("--stride", default="1", help="S or SHxSW (conv)")
    p.add_argument("--padding", default="0", help="P or PHxPW (conv)")
    p.add_argument("--dilation", default="1", help="D or DHxDW (conv)")
    p.add_argument("--groups", type=int, default=1, help="groups (conv)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--pass", dest="pass_", default="all", choices=PASSES + ("all",), help="which pass")
    p.add_argument("--mode", default="heuristic", choices=("heuristic", "measure", "exhaustive"))
    p.add_argument("--budget", type=int, default=None, help="workspace budget in bytes")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--json", action="store_true", help="end with one JSON object")


def parse_dims(text, flag: str, count: int) -> tuple:
    """``count`` (4) positive ints as NxCxHxW, or one or two (V or HxW) for stride, padding, dilation."""
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) not in ((count,) if count == 4 else (1, 2)) or any(d < (1 if count == 4 else 0) for d in dims):
        form = "NxCxHxW" if flag == "--input" else ("KxCxRxS" if flag == "--weight" else "V or HxW")
        raise ArgumentError(f"{flag} must look like {form} with positive integers, got {text!r}")
    return dims


def command_layers(args) -> list:
    """[(name, ConvLayer)] the arguments ask for."""
    import dataclasses
    from ..errors import NetclError
    from ..ops.conv_common import ConvLayer
    from .conv_layers import NETWORKS
    batch = getattr(args, "batch", None)
    if batch is not None and batch < 1:
        raise ArgumentError(f"--batch must be ≥ 1, got {batch}")
    dtype = getattr(args, "dtype", "float32")
    if args.network in NETWORKS:
        batch = batch if batch is not None else (1 if args.network == "mec" else 64)
        return [(n, dataclasses.replace(l, dtype=dtype)) for n, l in NETWORKS[args.network](batch)]
    if args.network.lower().endswith(".onnx"):
        return onnx_layers(args.network, batch, dtype, getattr(args, "device", None))
    if args.network != "conv":
        raise ArgumentError(f"netcl plan takes lenet, mec, resnet20, conv or an .onnx file, got {args.network!r}")
    if not args.input or not args.weight:
        raise ArgumentError("netcl plan conv needs --input NxCxHxW and --weight KxCxRxS")
    single = lambda dims: dims if len(dims) == 2 else dims[0]
    try:
        layer = ConvLayer.from_shapes(parse_dims(args.input, "--input", 4), parse_dims(args.weight, "--weight", 4),
                                      single(parse_dims(args.stride, "--stride", 2)),
                                      single(parse_dims(args.padding, "--padding", 2)),
                                      single(parse_dims(args.dilation, "--dilation", 2)), args.groups, dtype)
    except NetclError as exc:
        raise ArgumentError(str(exc)) from None
    return [("conv", layer)]


def onnx_layers(path: str, batch, dtype: str, device) -> list:
    """The convolutions of an ONNX model, named by their layers' paths (its initializers' names)."""
    from .. import onnx as nc_onnx
    from ..errors import OnnxError
    model = nc_onnx.load(path, device=device)
    try:
        layers = model.conv_layers(batch, dtype)
    except OnnxError as exc:
        if "fixed_batch" in exc.details:
            raise ArgumentError(str(exc)) from None
        raise
    if not layers:
        raise ArgumentError(f"{path} has no convolutions to plan")
    return layers


def table(name: str, plan) -> str:
    """One layer and pass: every candidate with its rule, workspace and times, then the choice."""
    from ..ops.conv_plan import mib
    rows = [("", "strategy", "applicable / why not", "workspace", "predicted ms", "measured ms")]
    for c in plan.candidates:
        status = "yes" if c.applicable and c.within_budget else ("over budget" if c.applicable else f"no: {c.why_not}")
        rows.append(("*" if c.strategy == plan.strategy else "", c.strategy, status,
                     "-" if c.workspace_bytes is None else mib(c.workspace_bytes),
                     "-" if c.predicted_ms is None else f"{c.predicted_ms:.3f}",
                     "-" if c.measured_ms is None else f"{c.measured_ms:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{name} {plan.pass_}: {plan.layer.describe()}"]
    for r in rows:
        lines.append("  " + "  ".join(v.ljust(widths[i]) if i < 3 else v.rjust(widths[i])
                                      for i, v in enumerate(r)).rstrip())
    lines.append(f"  -> {plan.strategy}: {plan.reason}")
    if plan.inputs is not None:
        lines.append(f"  decided by: {plan.inputs.describe()}")
    return "\n".join(lines)


def run(args) -> dict:
    from ..ops import conv2d_planner as planner
    from ..ops.conv_plan import mib
    from ..runtime.device import resolve_device
    if args.budget is not None and args.budget < 0:
        raise ArgumentError(f"--budget must be ≥ 0 bytes, got {args.budget}")
    layers = command_layers(args)
    device = resolve_device(args.device)
    dtype = layers[0][1].dtype
    passes = PASSES if args.pass_ == "all" else (args.pass_,)
    budget = args.budget if args.budget is not None else planner.default_budget(device)
    calibration = planner.calibration_summary(device, dtype)
    print(f"device: {device.describe()}; {calibration}; mode {args.mode}; workspace budget {mib(budget)}")
    out = []
    for name, layer in layers:
        for pass_ in passes:
            plan = planner.plan_conv2d_layer(layer, pass_, args.mode, args.budget, device)
            print(table(name, plan))
            out.append({"name": name, **plan.as_dict(), "layer": layer.describe()})
    used = sorted({entry["strategy"] for entry in out})
    print(f"strategies used: {', '.join(used)}")
    profile = planner.device_profile(device, dtype)
    return {"device": device.describe(), "mode": args.mode, "calibrated": profile.calibrated,
            "calibration": calibration, "profile": profile.as_dict(), "strategies_used": used, "layers": out}
