"""`netcl train lenet|resnet8|resnet20|resnet32 ...`: the arguments (README, "Command line"); the work is
in netcl.training."""
from __future__ import annotations

import argparse
import math

MODELS = ("lenet", "resnet8", "resnet20", "resnet32")  # netcl.training.recipes.MODELS, without importing it


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def add_arguments(p) -> None:
    p.add_argument("model", choices=MODELS, help="which model")
    p.add_argument("--epochs", type=positive_int, default=3, help="passes over the training set (default 3)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="images per step, over all ranks (default: the model's recipe, 64 for lenet, 32 for resnets)")
    p.add_argument("--lr", type=positive_float, default=None, help="learning rate (default: the model's recipe)")
    p.add_argument("--data-dir", default=None, help="directory with the four MNIST IDX files")
    p.add_argument("--out", default=None, help="directory for checkpoints and metrics (default runs/MODEL)")
    p.add_argument("--device", default=None, help="device index or name substring (see `netcl devices`)")
    p.add_argument("--seed", type=int, default=0, help="seed for initialization and shuffling")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--stop-after", type=positive_int, default=None,
                   help="end this invocation after this many epochs (continue later with --resume)")
    p.add_argument("--limit-steps", type=positive_int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel over the ranks of `mpiexec -n N` (--batch-size is the global batch)")
    p.add_argument("--no-replay", dest="replay", action="store_false",
                   help="run every step as written (by default steps after the first few replay a recorded "
                        "one: the same arithmetic for a fraction of the host's work)")
    p.add_argument("--json", action="store_true", help="end with one JSON summary object")


def run(args):
    from ..training.cli import train_command
    return train_command(args)
