"""`netcl eval CHECKPOINT [--data-dir D] [--json]`."""
from __future__ import annotations

from .train import positive_int


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint written by `netcl train`")
    p.add_argument("--data-dir", default=None, help="directory with the four MNIST IDX files")
    p.add_argument("--device", default=None, help="device index or name substring")
    p.add_argument("--batch-size", type=positive_int, default=500, help="images per evaluation batch")
    p.add_argument("--json", action="store_true", help="end with one JSON object")


def run(args):
    from ..training.cli import eval_command
    return eval_command(args)
