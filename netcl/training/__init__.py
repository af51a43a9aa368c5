"""Training loops, recipes and the `netcl train` / `netcl eval` commands (netcl.training.cli)."""
from .loop import evaluate, predict_counts, train_epoch
from .recipes import MODELS, RECIPES

__all__ = ["MODELS", "RECIPES", "evaluate", "predict_counts", "train_epoch"]
