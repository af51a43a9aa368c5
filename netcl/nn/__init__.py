"""Layers and losses (torch.nn's names and semantics): nc.nn.Conv2d, nc.nn.Linear, ..., nc.nn.Module."""
from . import functional, init
from .activation import (GELU, Hardsigmoid, Hardswish, Hardtanh, Identity, LeakyReLU, LogSoftmax, ReLU, ReLU6,
                         Sigmoid, SiLU, Softmax, Tanh)
from .containers import ModuleDict, ModuleList, Sequential
from .layers import AdaptiveAvgPool2d, AvgPool2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
from ..module import Module
from .normalization import BatchNorm1d, BatchNorm2d
from .shaping import Concat, ConstantPad2d, Permute, Reshape
from . import fusion, utils
from . import parallel  # nc.nn.parallel.DistributedDataParallel (mpi4py only when one is made)

__all__ = ["Module", "Conv2d", "Linear", "ReLU", "Tanh", "MaxPool2d", "AvgPool2d", "Dropout", "Flatten",
           "Sequential", "CrossEntropyLoss", "functional", "init"]
__all__ += ["parallel"]
__all__ += ["Sigmoid", "LeakyReLU", "GELU", "Identity", "Softmax", "LogSoftmax", "AdaptiveAvgPool2d", "ModuleList",
            "ModuleDict", "BatchNorm1d", "BatchNorm2d", "NLLLoss", "MSELoss", "fusion", "utils"]
__all__ += ["ReLU6", "Hardtanh", "Hardswish", "Hardsigmoid", "SiLU"]
__all__ += ["Reshape", "Permute", "Concat", "ConstantPad2d"]
