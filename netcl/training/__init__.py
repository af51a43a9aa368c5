"""Training loops and the `netcl train` / `netcl eval` commands (netcl.training.cli)."""
from .loop import RECIPE, evaluate, learning_rate, train_epoch

__all__ = ["RECIPE", "evaluate", "learning_rate", "train_epoch"]
