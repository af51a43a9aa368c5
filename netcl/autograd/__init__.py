"""Reverse-mode automatic differentiation: the engine (function.py) and the backward rules (rules*.py).

The engine imports nothing from netcl.ops, so an op may define its rule beside its kernels on it
(conv2d does, in netcl.ops.conv2d); the rules here call the ops."""
from .function import Function, enable_grad, is_grad_enabled, no_grad

__all__ = ["Function", "no_grad", "enable_grad", "is_grad_enabled"]
