"""ONNX exchange: ``nc.onnx.export(model, example_input, path)`` writes a netcl model as an ONNX graph.
Needs the ``onnx`` package (``pip install netcl[onnx]``)."""
from __future__ import annotations

from .export import export

__all__ = ["export"]
