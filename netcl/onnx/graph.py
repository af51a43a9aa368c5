"""Reading an ONNX model and checking it before anything is built.

`read_model` turns a path or bytes into a ModelProto (external data loaded relative to the model's
folder); `Graph` checks it (opset, names defined once and before use, no cycles, initializers whose
bytes match their shapes) and holds what the later passes need: nodes in topological order, initializers
as NumPy arrays, and every value's shape from onnx's shape inference, with symbolic dimensions as `Dim`.
Every problem raises nc.OnnxError naming the node, the operator and the opset.
"""
from __future__ import annotations

import collections

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import OnnxError

# The default domain's opsets this importer reads (its converters handle each operator's forms across them).
MIN_OPSET, MAX_OPSET = 11, 21


def require_onnx():
    """The onnx package (the protobuf reader), or an ImportError that says how to get it."""
    try:
        import onnx
    except ImportError as exc:
        raise ImportError("netcl's ONNX import needs the onnx package: pip install netcl[onnx]") from exc
    return onnx


class Dim:
    """A dimension the graph leaves symbolic (an exporter's dynamic batch, "batch_size"), or an expression
    of such dimensions; folded shape arithmetic carries it as an object in NumPy arrays. Equal names mean
    equal sizes; ``value(sizes)`` evaluates it once the graph's inputs have bound the names."""

    __slots__ = ("name", "parts")

    def __init__(self, name: str, parts=None):
        self.name = name
        self.parts = parts  # (operator, left, right) for an expression

    def __repr__(self):
        return self.name

    def __eq__(self, other):
        return isinstance(other, Dim) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def value(self, sizes: dict) -> int:
        if self.parts is None:
            if self.name not in sizes:
                raise KeyError(self.name)
            return int(sizes[self.name])
        op, a, b = self.parts
        a, b = (v.value(sizes) if isinstance(v, Dim) else int(v) for v in (a, b))
        return int(DIM_OPERATORS[op](a, b))

    def _op(self, other, symbol, reflected=False):
        if not isinstance(other, (Dim, int, np.integer)):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        return Dim(f"({a!r}{symbol}{b!r})", (symbol, a, b))

    def __add__(self, o): return self._op(o, "+")
    def __radd__(self, o): return self._op(o, "+", True)
    def __sub__(self, o): return self._op(o, "-")
    def __rsub__(self, o): return self._op(o, "-", True)
    def __mul__(self, o): return self._op(o, "*")
    def __rmul__(self, o): return self._op(o, "*", True)
    def __floordiv__(self, o): return self._op(o, "//")
    def __rfloordiv__(self, o): return self._op(o, "//", True)
    __truediv__ = __floordiv__
    __rtruediv__ = __rfloordiv__


DIM_OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
                 "//": lambda a, b: int(a / b)}  # ONNX's integer Div truncates


def has_dims(value) -> bool:
    """Whether a folded value holds symbolic dimensions."""
    return isinstance(value, np.ndarray) and value.dtype == object and any(isinstance(v, Dim) for v in value.flat)


def resolve_reshape(target: list, source_shape, allow_zero: bool):
    """A Reshape target holding symbolic sizes (the batch) as a fixed one where the input's shape allows:
    a size equal to the input's at the same axis becomes 0 (copy it), and a single other unknown becomes
    −1 (inferred). None when it must be evaluated at each call."""
    source = source_shape or ()
    out = []
    for k, d in enumerate(target):
        copy = isinstance(d, Dim) and k < len(source) and source[k] == d and not allow_zero
        out.append(0 if copy else d)
    unknown = [k for k, d in enumerate(out) if isinstance(d, Dim)]
    if len(unknown) == 1 and -1 not in out:
        out[unknown[0]] = -1
    elif unknown:
        return None
    return out


def read_model(source):
    """(ModelProto, folder for external data or None, description of the source)."""
    onnx = require_onnx()
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, folder, where = bytes(source), None, f"<{len(source)} bytes>"
    else:
        path = os.fspath(source)
        where, folder = path, os.path.dirname(os.path.abspath(path))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise OnnxError(f"cannot read the ONNX model {path}: {exc.strerror or exc}", path=path) from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends: truncated or not protobuf at all
        raise OnnxError(f"{where} is not an ONNX model, or is truncated ({len(data):,} bytes; the protobuf "
                        f"reader says: {exc})", path=where, bytes=len(data)) from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import or not model.graph.output:
        raise OnnxError(f"{where} is not an ONNX model ({len(data):,} bytes without an IR version, opset imports "
                        "or graph outputs)", path=where, bytes=len(data))
    _load_external_data(model, folder, where)
    return model, where


def _load_external_data(model, folder, where) -> None:
    """Initializers stored in files next to the model are read into the model; missing files are errors."""
    onnx = require_onnx()
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    for tensor in external:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if folder is None:
            raise OnnxError(f"initializer {tensor.name!r} is stored in the external file {location!r}; load the "
                            "model from its path (not from bytes) so that the file can be found",
                            initializer=tensor.name, location=location)
        file = os.path.normpath(os.path.join(folder, location))
        if not location or os.path.isabs(location) or not file.startswith(folder + os.sep):
            raise OnnxError(f"initializer {tensor.name!r} names the external file {location!r}, which is not inside "
                            f"the model's folder {folder}", initializer=tensor.name, location=location)
        try:
            with open(file, "rb") as f:
                f.seek(int(info.get("offset", 0)))
                length = int(info["length"]) if "length" in info else -1
                raw = f.read(length)
        except OSError as exc:
            raise OnnxError(f"initializer {tensor.name!r} of {where} is stored in {file}, which cannot be read: "
                            f"{exc.strerror or exc}", initializer=tensor.name, location=file) from None
        if length >= 0 and len(raw) != length:
            raise OnnxError(f"initializer {tensor.name!r}: {file} holds {len(raw):,} bytes at its offset, the model "
                            f"says {length:,}", initializer=tensor.name, location=file)
        tensor.raw_data = raw
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


# Initializers up to this many elements stay in the model shape inference reads (its data propagation
# needs the values of shape constants); larger ones are passed as typed inputs, so the weights are not
# serialized again for it.
INFERENCE_CONSTANT_ELEMENTS = 64


def _without_weights(model, onnx):
    graph = model.graph
    names = {v.name for v in graph.input}
    small, typed = [], []
    for t in graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= INFERENCE_CONSTANT_ELEMENTS:
            small.append(t)
        elif t.name not in names:
            typed.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    light = onnx.helper.make_graph(list(graph.node), graph.name, list(graph.input) + typed, list(graph.output),
                                   small, value_info=list(graph.value_info))
    out = onnx.helper.make_model(light, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


@dataclass
class Node:
    """One node, with its attributes decoded to Python values."""

    name: str
    op_type: str
    domain: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    index: int = 0


class Graph:
    """A checked ONNX graph: nodes in topological order, initializers and shapes."""

    def __init__(self, model, where: str = "<model>"):
        onnx = require_onnx()
        self.where = where
        self.producer = f"{model.producer_name} {model.producer_version}".strip()
        self.opset = self._opset(model)
        graph = model.graph
        self.initializers = {}
        for t in graph.initializer:
            self.initializers[t.name] = self._array(t, "initializer")
        self.inputs = [v.name for v in graph.input if v.name not in self.initializers]
        self.outputs = [v.name for v in graph.output]
        nodes = [Node(n.name or (n.output[0] if n.output else f"node{i}"), n.op_type, n.domain, list(n.input),
                      list(n.output), {a.name: self._attribute(a, n) for a in n.attribute}, i)
                 for i, n in enumerate(graph.node)]
        self.nodes = self._initializer_copies(self._sorted(nodes))
        self.model = model
        self.shapes = self._infer_shapes(model, onnx)
        self.input_types = {v.name: v.type.tensor_type.elem_type for v in graph.input}

    # ---- checks --------------------------------------------------------------------------------------
    def _opset(self, model) -> int:
        versions = {o.domain: o.version for o in model.opset_import}
        opset = versions.get("", versions.get("ai.onnx"))
        if opset is None:
            raise OnnxError(f"{self.where} imports no version of the default ONNX operator set (imports: "
                            f"{versions})", opset=None, imports=versions)
        if not MIN_OPSET <= opset <= MAX_OPSET:
            raise OnnxError(f"{self.where} uses ONNX opset {opset}; netcl imports opsets {MIN_OPSET}–{MAX_OPSET} "
                            "(re-export it, e.g. torch.onnx.export(..., opset_version=17))", opset=opset,
                            supported=(MIN_OPSET, MAX_OPSET))
        return int(opset)

    def _array(self, tensor, what: str) -> np.ndarray:
        from onnx import numpy_helper
        try:
            return numpy_helper.to_array(tensor)
        except Exception as exc:  # wrong byte count, unknown data type
            raise OnnxError(f"{what} {tensor.name!r} of {self.where} cannot be read (dims {list(tensor.dims)}): "
                            f"{exc}", initializer=tensor.name, dims=list(tensor.dims)) from None

    def _attribute(self, attribute, node):
        from onnx import helper
        if attribute.type == attribute.TENSOR:
            return self._array(attribute.t, f"attribute {attribute.name} of node {node.name!r}")
        if attribute.type in (attribute.GRAPH, attribute.GRAPHS):
            return attribute  # subgraphs: only the unsupported-operator error looks at them
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return [v.decode("utf-8", "replace") for v in value]
        return value

    def _sorted(self, nodes: list) -> list:
        """Nodes in an order where every input is computed first; dangling names and cycles are errors."""
        defined = set(self.initializers) | set(self.inputs)
        producer = {}
        for node in nodes:
            for out in node.outputs:
                if not out:
                    continue
                if out in producer or out in defined:
                    raise OnnxError(f"node {node.name!r} ({node.op_type}) writes {out!r}, which is already "
                                    f"{'written by node ' + repr(producer[out].name) if out in producer else 'a graph input or initializer'}",
                                    node=node.name, op_type=node.op_type, opset=self.opset, value=out)
                producer[out] = node
        for node in nodes:
            for name in node.inputs:
                if name and name not in defined and name not in producer:
                    raise OnnxError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which no node, graph input "
                                    "or initializer defines", node=node.name, op_type=node.op_type, opset=self.opset,
                                    missing=name)
        for name in self.outputs:
            if name not in defined and name not in producer:
                raise OnnxError(f"graph output {name!r} is not computed by any node", missing=name, opset=self.opset)
        # Kahn's order over node positions: waiting[k] counts node k's inputs still to be produced
        waiting = [sum(1 for i in n.inputs if i in producer) for n in nodes]
        users = {}
        for k, node in enumerate(nodes):
            for name in node.inputs:
                if name in producer:
                    users.setdefault(name, []).append(k)
        ready = collections.deque(k for k, count in enumerate(waiting) if count == 0)
        ordered = []
        while ready:
            node = nodes[ready.popleft()]
            ordered.append(node)
            for out in node.outputs:
                for k in users.get(out, ()):
                    waiting[k] -= 1
                    if waiting[k] == 0:
                        ready.append(k)
        if len(ordered) != len(nodes):
            stuck = [n.name for n, count in zip(nodes, waiting) if count > 0]
            raise OnnxError(f"the graph has a cycle through the nodes {stuck[:8]}{' ...' if len(stuck) > 8 else ''}",
                            node=stuck[0], op_type=next(n.op_type for n in nodes if n.name == stuck[0]),
                            opset=self.opset, cycle=stuck)
        return ordered

    def _initializer_copies(self, nodes: list) -> list:
        """torch.onnx.export stores equal weights once and writes the others as Identity nodes of it: each
        copy becomes an initializer of its own (under the copy's name, as in the exported model's
        state_dict), so that every layer owns its weights."""
        kept = []
        for node in nodes:
            if (node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.inputs
                    and node.inputs[0] in self.initializers and node.outputs[0] not in self.outputs):
                self.initializers[node.outputs[0]] = self.initializers[node.inputs[0]].copy()
            else:
                kept.append(node)
        return kept

    # ---- shapes --------------------------------------------------------------------------------------
    def _infer_shapes(self, model, onnx, light=None) -> dict:
        """name -> tuple of int | Dim for every value whose rank onnx's inference knows."""
        try:
            inferred = onnx.shape_inference.infer_shapes(light or _without_weights(model, onnx), check_type=False,
                                                         strict_mode=False, data_prop=True)
            values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
        except Exception:  # inference is a help for folding Shape; a model it cannot handle may still import
            values = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
        shapes = {}
        for v in values:
            t = v.type.tensor_type
            if not t.HasField("shape"):
                continue
            dims = []
            for k, d in enumerate(t.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:
                    dims.append(Dim(d.dim_param or f"{v.name}[{k}]"))
            shapes.setdefault(v.name, tuple(dims))
        for name, array in self.initializers.items():
            shapes[name] = tuple(array.shape)
        return shapes

    def refine_shapes(self, constants: dict, nodes: list) -> bool:
        """Infer the shapes again over the folded graph: the nodes left, the folded values as initializers,
        and Reshape targets with symbolic sizes resolved where the input's shape allows. Onnx's inference
        cannot follow a target computed from Shape (ShuffleNet's channel shuffle), so the shapes after such
        a Reshape, and the Shape nodes reading them, become known this way. True when a shape gained
        static sizes."""
        onnx = require_onnx()
        from onnx import numpy_helper
        proto_nodes, initializers, typed = [], {}, []
        for node in nodes:
            inputs = list(node.inputs)
            if node.op_type == "Reshape" and len(inputs) > 1 and inputs[1] in constants:
                target = constants[inputs[1]].reshape(-1)
                if target.dtype == object:
                    resolved = resolve_reshape(list(target), self.shapes.get(inputs[0]), bool(node.attrs.get("allowzero")))
                    if resolved is None:
                        continue
                    inputs[1] = inputs[1] + "::resolved"
                    initializers[inputs[1]] = np.asarray(resolved, np.int64)
            for name in inputs:
                if name in constants and name not in initializers and constants[name].dtype != object:
                    initializers[name] = constants[name]
            attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in node.attrs.items()
                     if not hasattr(v, "type")}  # subgraph attributes stay out: no converter reads them
            proto_nodes.append(onnx.helper.make_node(node.op_type, inputs, node.outputs, name=node.name,
                                                     domain=node.domain, **attrs))
        graph_inputs = [v for v in self.model.graph.input if v.name not in self.initializers]
        for name, array in self.initializers.items():
            if name not in initializers and any(name in n.inputs for n in nodes):
                typed.append(onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
        small = [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()]
        light = onnx.helper.make_graph(proto_nodes, "refined", graph_inputs + typed, list(self.model.graph.output),
                                       small)
        model = onnx.helper.make_model(light, opset_imports=list(self.model.opset_import),
                                       ir_version=self.model.ir_version)
        changed = False
        for name, shape in self._infer_shapes(self.model, onnx, model).items():
            old = self.shapes.get(name)
            if old is None or (len(old) == len(shape) and sum(isinstance(d, Dim) for d in shape)
                               < sum(isinstance(d, Dim) for d in old)):
                self.shapes[name] = shape
                changed = True
        return changed

    def error(self, node: Node, message: str, **details) -> OnnxError:
        return OnnxError(f"node {node.name!r} ({node.op_type}, opset {self.opset}): {message}", node=node.name,
                         op_type=node.op_type, opset=self.opset, **details)
