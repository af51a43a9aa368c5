"""netcl: a deep-learning framework whose every tensor lives in an OpenCL buffer."""
from __future__ import annotations

__version__ = "0.1.0"

from .autograd import enable_grad, is_grad_enabled, no_grad
from .errors import (CheckpointError, DataError, DeviceError, DeviceMemoryError, DTypeError, KernelBuildError,
                     NetclError, ShapeError)
from .random import manual_seed
from .factories import arange, empty, full, ones, rand, randn, tensor, zeros, zeros_like
from .runtime.device import Device, default_device, devices, set_default_device
from .tensor import Tensor

float32 = "float32"
float64 = "float64"

__all__ = [
    "Tensor", "tensor", "manual_seed", "empty", "zeros", "ones", "full", "rand", "randn", "arange", "zeros_like",
    "Device", "devices", "default_device", "set_default_device", "no_grad", "enable_grad", "is_grad_enabled",
    "NetclError", "ShapeError", "DTypeError", "DeviceError", "KernelBuildError", "DeviceMemoryError",
    "CheckpointError", "DataError", "__version__",
]


def __getattr__(name):
    # Subpackages that pull in much code are imported on first use, keeping `import netcl` fast.
    import importlib
    if name in ("nn", "optim", "data", "models", "dense", "ops", "distributed"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("save", "load"):
        from . import serialization
        return getattr(serialization, name)
    if name in ("use_deterministic", "deterministic_enabled"):
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module 'netcl' has no attribute {name!r}")
