"""`netcl` / `python -m netcl`: argument parsing, error reporting and exit codes.

Exit status: 0 on success, 2 on bad arguments, 1 on any other error, with a one-line message on stderr
(and a traceback only with --debug). With --json the last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from .. import settings

# subcommand -> module in netcl.cli defining add_arguments(parser) and run(args) -> dict | None
COMMANDS = {
    "devices": ("devices", "list every OpenCL platform and device"),
    "train": ("train", "train a model (lenet, resnet8/20/32) on MNIST"),
    "eval": ("evaluate", "score a checkpoint on the MNIST test set"),
    "plan": ("plan", "explain the convolution strategy chosen for each layer and pass (built-in or ONNX model)"),
    "run": ("run", "run an ONNX model on a .npy input"),
    "bench": ("bench", "benchmarks: gemm, im2col, conv, lenet, resnet, dense, imagenet, or a MODEL.onnx against onnxruntime"),
    "tune": ("tune", "tune kernel parameters for the current device"),
}


class ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgumentError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="netcl", description="netcl: deep learning on any OpenCL device")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"netcl {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        importlib.import_module(f".{module}", __package__).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def emit_json(obj) -> None:
    print(json.dumps(obj, default=_json_default))


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if hasattr(o, "as_dict"):
        return o.as_dict()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    if debug and not settings.DEBUG.is_set():  # compiler build logs too (netcl.runtime.kernels)
        settings.DEBUG.choose("1")
    try:
        args = build_parser().parse_args(argv)
    except ArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    if not getattr(args, "command", None):
        build_parser().print_help()
        return 2
    from ..runtime.device import DeviceSelectorError
    try:
        module = importlib.import_module(f".{args._module}", __package__)
        result = module.run(args)
        if getattr(args, "json", False) and result is not None:
            emit_json(result)
        return 0
    except ArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DeviceSelectorError as exc:  # an unknown device is a bad argument; the message lists the devices
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the CLI's contract: one line, no traceback unless --debug
        if debug or getattr(args, "debug", False):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {type(exc).__name__}: {message}", file=sys.stderr)
        _abort_distributed_job(f"{type(exc).__name__}: {message}")
        return 1


def _abort_distributed_job(message: str) -> None:
    """Under mpiexec a failed rank ends the whole job (nc.distributed.abort), so that no other rank waits
    forever in a collective this one will never join."""
    process_group = sys.modules.get("netcl.distributed.process_group")
    if process_group is not None and process_group.is_initialized() and process_group.get_world_size() > 1:
        process_group.abort(message)
