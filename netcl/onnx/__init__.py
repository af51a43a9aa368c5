"""ONNX import and export for netcl: ``nc.onnx.load(path_or_bytes, device=None)`` and
``nc.onnx.export(model, example_input, path, opset=17, dynamic_batch=True)``.

The onnx package (``pip install netcl[onnx]``) is imported when a model is read or written, not with netcl.
"""
from .graph import MAX_OPSET, MIN_OPSET
from .converters import supported_operators
from .export import export
from .loader import load

__all__ = ["load", "export", "supported_operators", "MIN_OPSET", "MAX_OPSET"]
