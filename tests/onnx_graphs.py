"""Helpers for the ONNX tests: graphs built with onnx.helper, and onnxruntime as the reference."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs: dict, outputs, initializers: dict, opset: int = 17, as_bytes: bool = True):
    """A model of ``nodes`` reading float32 ``inputs`` (name -> shape, strings for symbolic sizes) and
    ``initializers`` (name -> array); its bytes, or the ModelProto with as_bytes=False."""
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)  # what the installed onnxruntime reads
    return model.SerializeToString() if as_bytes else model


def ort_run(data: bytes, feeds: dict) -> list:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
