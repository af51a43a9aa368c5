"""Optimizers with PyTorch's update rules, each a fused in-place kernel per parameter (kernels/optim.cl),
and learning-rate schedules (nc.optim.lr_scheduler)."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
