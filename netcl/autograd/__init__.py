"""Reverse-mode automatic differentiation: the engine (function.py) and every backward rule (rules*.py)."""
from .function import Function, enable_grad, is_grad_enabled, no_grad

__all__ = ["Function", "no_grad", "enable_grad", "is_grad_enabled"]
