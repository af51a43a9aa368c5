"""Training loops, recipes and the `netcl train` / `netcl eval` commands (netcl.training.cli)."""
from .inference import CapturedInference
from .loop import evaluate, predict_counts, train_epoch
from .recipes import MODELS, RECIPES
from .replay import CapturedStep

__all__ = ["MODELS", "RECIPES", "CapturedInference", "CapturedStep", "evaluate", "predict_counts", "train_epoch"]
