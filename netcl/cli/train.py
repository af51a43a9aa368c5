"""`netcl train lenet ...`: the arguments of shared/API.md; the work is in netcl.training."""
from __future__ import annotations

MODELS = ("lenet",)


def add_arguments(p) -> None:
    p.add_argument("model", choices=MODELS, help="which model")
    p.add_argument("--epochs", type=int, default=3, help="passes over the training set (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="images per step (default 64)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the model's recipe)")
    p.add_argument("--data-dir", default=None, help="directory with the four MNIST IDX files")
    p.add_argument("--out", default="runs/lenet", help="directory for checkpoints and metrics (default runs/lenet)")
    p.add_argument("--device", default=None, help="device index or name substring (see `netcl devices`)")
    p.add_argument("--seed", type=int, default=0, help="seed for initialization and shuffling")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--limit-steps", type=int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--json", action="store_true", help="end with one JSON summary object")


def run(args):
    from ..training.cli import train_command
    return train_command(args)
