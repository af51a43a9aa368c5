"""netcl: a deep-learning framework whose every tensor lives in an OpenCL buffer."""
from __future__ import annotations

__version__ = "0.1.0"

from .autograd import enable_grad, is_grad_enabled, no_grad
from .errors import (CheckpointError, ClassIndexError, DataError, DeviceError, DeviceMemoryError, DTypeError,
                     KernelBuildError, NetclError, OnnxError, SettingError, ShapeError)
from .random import manual_seed
from .factories import arange, empty, full, ones, rand, randn, tensor, zeros, zeros_like
from .runtime.device import Device, default_device, devices, set_default_device
from .tensor import Tensor
from .autograd.rules_tensor import cat, clamp, maximum, minimum, stack, where

float32 = "float32"
float64 = "float64"
int32 = "int32"
int64 = "int64"
bool = "bool"  # noqa: A001 — nc.bool, as torch.bool

__all__ = [
    "Tensor", "tensor", "empty", "zeros", "ones", "full", "rand", "randn", "arange", "zeros_like",
    "manual_seed", "cat", "stack", "where", "clamp", "maximum", "minimum",
    "Device", "devices", "default_device", "set_default_device", "no_grad", "enable_grad", "is_grad_enabled",
    "NetclError", "ShapeError", "DTypeError", "DeviceError", "KernelBuildError", "DeviceMemoryError",
    "CheckpointError", "ClassIndexError", "DataError", "OnnxError", "SettingError", "__version__",
]


def __getattr__(name):
    # Subpackages that pull in much code are imported on first use, keeping `import netcl` fast.
    import importlib
    if name in ("nn", "optim", "data", "models", "dense", "ops", "distributed", "training", "onnx"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("save", "load"):
        from . import serialization
        return getattr(serialization, name)
    if name in ("use_deterministic", "deterministic_enabled"):
        from . import settings
        return getattr(settings, name)
    raise AttributeError(f"module 'netcl' has no attribute {name!r}")
