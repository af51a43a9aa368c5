"""Training loops, recipes and the `netcl train` / `netcl eval` commands (netcl.training.cli)."""
from .loop import evaluate, predict_counts, train_epoch
from .recipes import MODELS, RECIPES
from .replay import CapturedStep

__all__ = ["MODELS", "RECIPES", "CapturedStep", "evaluate", "predict_counts", "train_epoch"]
