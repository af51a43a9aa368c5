"""Optimizers with PyTorch's update rules, each a fused in-place kernel per parameter (kernels/optim.cl)."""
from .adam import Adam
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam"]
