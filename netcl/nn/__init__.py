"""Layers and losses (torch.nn's names and semantics): nc.nn.Conv2d, nc.nn.Linear, ..., nc.nn.Module."""
from . import functional, init
from .layers import (AvgPool2d, Conv2d, CrossEntropyLoss, Dropout, Flatten, Linear, MaxPool2d, ReLU, Sequential,
                     Tanh)
from .module import Module
from . import parallel  # nc.nn.parallel.DistributedDataParallel (mpi4py only when one is made)

__all__ = ["Module", "Conv2d", "Linear", "ReLU", "Tanh", "MaxPool2d", "AvgPool2d", "Dropout", "Flatten",
           "Sequential", "CrossEntropyLoss", "functional", "init"]
__all__ += ["parallel"]
