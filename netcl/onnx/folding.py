"""Constant folding: the graph's shape arithmetic (Shape, Gather, Unsqueeze, Concat, Constant, Cast, ...)
evaluated with NumPy at load, so the netcl model only holds the layers that compute.

A node folds when every input is a constant (an initializer no layer owns, or an earlier folded value),
or when it is Shape/Size of a value whose shape is known. Symbolic dimensions (graph.Dim) ride along in
object arrays: a Reshape to (batch_size, -1) is still resolved at load (see converters.reshape).
"""
from __future__ import annotations

import numpy as np

from ..errors import OnnxError
from .graph import Dim, Graph, Node, has_dims

INT64_MAX = np.iinfo(np.int64).max


def _axes(node: Node, values, position: int, opset_with_input: int, graph: Graph):
    """An operator's axes: the attribute before ``opset_with_input``, the optional input from it on."""
    if graph.opset >= opset_with_input:
        if len(node.inputs) > position and node.inputs[position]:
            return [int(a) for a in np.asarray(values[position]).reshape(-1)]
        return None
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _onnx_dtype(code: int):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(code)


def _constant(node, values, graph):
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise graph.error(node, f"a Constant with {sorted(attrs)} is not supported (value, value_float(s), value_int(s))")


def _shape(node, values, graph, shape):
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    dims = list(shape)[start:end]
    return np.array(dims, dtype=object if any(isinstance(d, Dim) for d in dims) else np.int64)


def _size(node, values, graph, shape):
    total = 1
    for d in shape:
        total = total * d
    return np.array(total, dtype=object if isinstance(total, Dim) else np.int64)


def _gather(node, values, graph):
    data, indices = values
    return np.take(data, np.asarray(indices, dtype=np.int64), axis=node.attrs.get("axis", 0))


def _unsqueeze(node, values, graph):
    x = values[0]
    axes = _axes(node, values, 1, 13, graph)
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return x


def _squeeze(node, values, graph):
    x = values[0]
    axes = _axes(node, values, 1, 13, graph)
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(a % x.ndim for a in axes))


def _concat(node, values, graph):
    parts = [np.asarray(v) for v in values]
    if any(p.dtype == object for p in parts):
        parts = [p.astype(object) for p in parts]
    return np.concatenate(parts, axis=node.attrs["axis"])


def _cast(node, values, graph):
    x = values[0]
    if x.dtype == object:
        return x
    return x.astype(_onnx_dtype(node.attrs["to"]))


def _slice(node, values, graph):
    x = values[0]
    if graph.opset >= 10:
        starts, ends = (np.asarray(v).reshape(-1) for v in values[1:3])
        axes = values[3] if len(values) > 3 and values[3] is not None else range(len(starts))
        steps = values[4] if len(values) > 4 and values[4] is not None else [1] * len(starts)
    else:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes", range(len(starts))), [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, np.asarray(axes).reshape(-1), np.asarray(steps).reshape(-1)):
        e = None if int(e) >= INT64_MAX else int(e)
        if int(st) < 0 and e is not None and e < -x.shape[int(a)]:
            e = None
        index[int(a)] = slice(int(s), e, int(st))
    return x[tuple(index)]


def _reshape(node, values, graph):
    x, shape = values
    shape = [int(d) for d in np.asarray(shape).reshape(-1)]
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _binary(fn):
    def apply(node, values, graph):
        a, b = values
        if a.dtype == object or b.dtype == object:
            return np.vectorize(fn, otypes=[object])(a, b)
        return fn(a, b).astype(np.result_type(a, b))
    return apply


def _int_div(a, b):
    if isinstance(a, Dim) or isinstance(b, Dim):
        return a // b
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(np.trunc(a / b))  # ONNX's integer Div truncates
    return a / b


def _div(node, values, graph):
    a, b = values
    if a.dtype == object or b.dtype == object:
        return np.vectorize(_int_div, otypes=[object])(a, b)
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _constant_of_shape(node, values, graph):
    value = node.attrs.get("value", np.zeros(1, np.float32))
    return np.full([int(d) for d in values[0]], np.asarray(value).reshape(-1)[0], dtype=np.asarray(value).dtype)


def _range(node, values, graph):
    start, limit, delta = (np.asarray(v).item() for v in values)
    return np.arange(start, limit, delta, dtype=np.asarray(values[0]).dtype)


def _where(node, values, graph):
    cond, a, b = values
    return np.where(cond, a, b)


def _reduce(fn):
    def apply(node, values, graph):
        x = values[0]
        axes = _axes(node, values, 1, 18 if node.op_type != "ReduceSum" else 13, graph)
        keep = bool(node.attrs.get("keepdims", 1))
        return fn(x, axis=None if axes is None else tuple(axes), keepdims=keep)
    return apply


def _transpose(node, values, graph):
    return np.transpose(values[0], node.attrs.get("perm"))


def _unary(fn):
    return lambda node, values, graph: fn(values[0])


# op_type -> fn(node, values, graph) over NumPy inputs (None for an absent optional input)
FOLDERS = {
    "Constant": _constant, "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Cast": _cast, "Slice": _slice, "Reshape": _reshape, "Identity": _unary(lambda x: x),
    "Add": _binary(lambda a, b: a + b), "Sub": _binary(lambda a, b: a - b), "Mul": _binary(lambda a, b: a * b),
    "Div": _div, "Neg": _unary(lambda x: -x), "Equal": _binary(lambda a, b: a == b),
    "ConstantOfShape": _constant_of_shape, "Range": _range, "Where": _where, "Transpose": _transpose,
    "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min), "Floor": _unary(np.floor), "Ceil": _unary(np.ceil), "Sqrt": _unary(np.sqrt),
    "Max": lambda node, values, graph: np.maximum.reduce([np.asarray(v) for v in values]),
    "Min": lambda node, values, graph: np.minimum.reduce([np.asarray(v) for v in values]),
    "Not": _unary(np.logical_not), "Flatten": lambda node, values, graph: values[0].reshape(
        int(np.prod(values[0].shape[:node.attrs.get("axis", 1)])), -1),
}
SHAPE_FOLDERS = {"Shape": _shape, "Size": _size}


def fold(graph: Graph, owned: set) -> tuple[dict, list]:
    """(constants: name -> array, the nodes left to run). ``owned`` initializers belong to layers
    (weights, batch-norm statistics) and never fold into anything."""
    constants = {name: value for name, value in graph.initializers.items() if name not in owned}
    remaining = []
    for node in graph.nodes:
        present = [i for i in node.inputs if i]
        if node.op_type in SHAPE_FOLDERS and present and present[0] in graph.shapes:
            shape = graph.shapes[present[0]]
            constants[node.outputs[0]] = SHAPE_FOLDERS[node.op_type](node, None, graph, shape)
            continue
        if node.op_type in FOLDERS and node.domain in ("", "ai.onnx") and all(i in constants for i in present):
            if node.op_type in ("ConstantOfShape", "Range") and any(constants[i].dtype == object for i in present):
                remaining.append(node)  # a tensor sized by the symbolic batch: not foldable, and not supported
                continue
            values = [constants[i] if i else None for i in node.inputs]
            try:
                result = FOLDERS[node.op_type](node, values, graph)
            except OnnxError:
                raise
            except Exception as exc:
                raise graph.error(node, f"folding its constant inputs failed: {exc}") from None
            result = np.asarray(result)
            if result.dtype == object and not has_dims(result):  # symbolic sizes that cancelled out
                result = np.array(result.tolist(), dtype=np.int64)
            constants[node.outputs[0]] = result
            continue
        remaining.append(node)
    return constants, remaining

