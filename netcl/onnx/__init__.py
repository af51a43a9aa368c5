"""ONNX import (and export) for netcl: ``nc.onnx.load(path_or_bytes, device=None)``.

The onnx package (``pip install netcl[onnx]``) is imported when a model is read, not with netcl.
"""
from .graph import MAX_OPSET, MIN_OPSET
from .converters import supported_operators
from .loader import load
# export: nc.onnx.export(model, example_input, path, opset=17, dynamic_batch=True) is imported here.

__all__ = ["load", "supported_operators", "MIN_OPSET", "MAX_OPSET"]
