"""ONNX nodes -> netcl modules.

`Builder` turns the nodes left after folding into steps of an OnnxModel: each converter in CONVERTERS
reads a node's attributes and constant inputs and adds the nc.nn module that computes it. Layers with
weights (Conv2d, BatchNorm, Linear, Gemm, MatMul by a stored matrix) own their initializers under the
names the graph gives them: a Conv whose weight and bias are "layer1.0.conv1.weight" and
"layer1.0.conv1.bias" becomes the Conv2d at layer1.0.conv1, so the state_dict keys are the initializer
names. Other initializers that a node reads at run time are registered under their own dotted names
(trainable when they are floats with a module-path name, buffers otherwise).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..module import Module
from ..tensor import Tensor
from . import layers as L
from .graph import Dim, Graph, Node, has_dims, resolve_reshape

# Which inputs of an operator are weights its layer owns (position -> the layer's attribute).
OWNED_INPUTS = {
    "Conv": {1: "weight", 2: "bias"},
    "BatchNormalization": {1: "weight", 2: "bias", 3: "running_mean", 4: "running_var"},
    "Gemm": {1: "weight", 2: "bias"},
    "MatMul": {1: "weight"},
}
FLOAT_TYPES = (np.float32, np.float64)


_Missing = object()  # a path whose levels do not exist yet: free for a new layer


class Namespace(Module):
    """A level of the module tree that only groups layers (as "layer1" groups ResNet's first stage)."""

    def forward(self, *args):
        raise TypeError("a Namespace of an imported ONNX model only holds layers; call the model itself")


@dataclass
class Step:
    """One node at run time: its module, the values it reads and writes, and those no later step reads."""

    name: str
    op_type: str
    module: Module
    inputs: list
    outputs: list
    release: list = field(default_factory=list)
    takes_sizes: bool = False  # the module reads the symbolic sizes the inputs bind (sizes=...)


@dataclass
class ConvSite:
    """A convolution of the graph, for planning: the module's path, the value it reads (with the padding a
    separate pad step adds) and the module."""

    path: str
    value: str
    extra_pads: tuple
    module: Module


def sanitize(name: str) -> str:
    cleaned = re.sub(r"[^0-9A-Za-z_]", "_", name).strip("_")
    return cleaned or "value"


def owned_initializers(graph: Graph) -> dict:
    """initializer name -> (node, attribute) for every weight a layer will own."""
    owned = {}
    for node in graph.nodes:
        for position, attr in OWNED_INPUTS.get(node.op_type, {}).items():
            name = node.inputs[position] if len(node.inputs) > position else ""
            if not name or name not in graph.initializers:
                continue
            if node.op_type == "MatMul" and graph.initializers[name].ndim != 2:
                continue
            if name in owned:
                raise graph.error(node, f"shares the weight {name!r} with node {owned[name][0].name!r}; netcl "
                                  "imports each stored weight into one layer", initializer=name)
            owned[name] = (node, attr)
    return owned


class Builder:
    def __init__(self, graph: Graph, constants: dict, owned: dict, root: Module, device):
        self.graph, self.constants, self.owned, self.root, self.device = graph, constants, owned, root, device
        self.steps: list[Step] = []
        self.convs: list[ConvSite] = []
        self.constant_sources: dict = {}   # value name -> (holder module, attribute)
        self.initializer_names: dict = {}  # state_dict key -> initializer name
        self.nodes_namespace = None
        self.constants_path = None

    # ---- values ----------------------------------------------------------------------------------------
    def static(self, node: Node, position: int, what: str, default=None):
        """A constant input (shape, axes, bounds ...) as a NumPy array; ``default`` when absent."""
        name = node.inputs[position] if len(node.inputs) > position else ""
        if not name:
            if default is None:
                raise self.graph.error(node, f"needs its input {position} ({what})")
            return default
        if name not in self.constants:
            raise self.graph.error(node, f"its {what} ({name!r}) is computed at run time; netcl needs it constant "
                                   "at load", value=name)
        return self.constants[name]

    def weight(self, node: Node, position: int, required: bool = True):
        """(array, initializer name) of an owned input, or (None, None) when the optional input is absent."""
        name = node.inputs[position] if len(node.inputs) > position else ""
        if not name:
            if required:
                raise self.graph.error(node, f"needs its input {position}")
            return None, None
        if name not in self.owned:
            raise self.graph.error(node, f"its input {name!r} must be a stored initializer (weights computed at run "
                                   "time are not supported)", value=name)
        array = self.graph.initializers[name]
        if array.dtype not in FLOAT_TYPES:
            raise self.graph.error(node, f"the weight {name!r} is {array.dtype}; netcl imports float32 and float64 "
                                   "models", value=name, dtype=str(array.dtype))
        return array, name

    def tensor(self, array: np.ndarray, trainable: bool) -> Tensor:
        return Tensor.from_host(np.ascontiguousarray(array), self.device, requires_grad=trainable)

    def shape_of(self, name: str):
        return self.graph.shapes.get(name)

    # ---- the module tree -------------------------------------------------------------------------------
    def _parent(self, segments, create: bool) -> Module | None:
        """The module that holds (or would hold) ``segments[-1]``: every level above it a Namespace (made
        when ``create``), and no top-level name the model itself uses. None where that cannot be."""
        top = segments[0] if segments else ""
        if not all(segments) or top.startswith("_") or top in self.root.__dict__:
            return None
        here = self.root
        for segment in segments[:-1]:
            child = here._modules.get(segment)
            if child is None:
                if not create:
                    return _Missing
                child = here._modules[segment] = Namespace()
            if not isinstance(child, Namespace):
                return None
            here = child
        return here

    def _free_path(self, segments) -> bool:
        """Whether a layer can be attached at ``segments`` (nothing there yet, only Namespaces above)."""
        parent = self._parent(segments, create=False)
        return parent is _Missing or (parent is not None and segments[-1] not in parent._modules)

    def _attach(self, segments, module: Module) -> None:
        self._parent(segments, create=True)._modules[segments[-1]] = module

    def _unique_top(self, base: str) -> str:
        name, k = base, 2
        while not self._free_path([name]):
            name, k = f"{base}_{k}", k + 1
        return name

    def place(self, node: Node, module: Module, names: dict) -> str:
        """Put a layer owning initializers (attribute -> initializer name) into the tree; returns its path."""
        names = {a: n for a, n in names.items() if n}
        prefixes = {n[:-len(a) - 1] if n.endswith("." + a) else None for a, n in names.items()}
        prefix = prefixes.pop() if len(prefixes) == 1 else None
        if prefix and self._free_path(prefix.split(".")):
            path = prefix
        else:
            first = next(iter(names.values()), node.name)
            path = self._unique_top(sanitize(re.sub(r"\.(weight|bias)$", "", first)))
        self._attach(path.split("."), module)
        for attr, name in names.items():
            self.initializer_names[f"{path}.{attr}"] = name
        return path

    def node_module(self, node: Node, module: Module) -> None:
        """Put a layer without initializers under ``nodes``, keyed by its node's name."""
        if self.nodes_namespace is None:
            self.nodes_namespace = Namespace()
            self.root._modules[self._unique_top("nodes")] = self.nodes_namespace
        key, k = sanitize(node.name), 2
        base = key
        while key in self.nodes_namespace._modules:
            key, k = f"{base}_{k}", k + 1
        self.nodes_namespace._modules[key] = module

    def constant_input(self, node: Node, name: str) -> None:
        """Register a constant that a node reads at run time as a tensor of the model."""
        if name in self.constant_sources:
            return
        value = self.constants[name]
        if has_dims(value) or value.dtype == object:
            raise self.graph.error(node, f"reads {name!r}, a value that depends on the symbolic dimensions "
                                   f"{value.tolist()}, as a tensor; netcl resolves such values only in Reshape",
                                   value=name)
        initializer = name in self.graph.initializers
        trainable = initializer and value.dtype in FLOAT_TYPES and "::" not in name and not name.startswith("/")
        segments = name.split(".") if initializer else []
        holder = self._holder(segments[:-1]) if len(segments) >= 2 else None
        path, attr = ".".join(segments[:-1]), segments[-1] if holder is not None else None
        if holder is None or any(attr in registry for registry in (holder._parameters, holder._buffers,
                                                                     holder._modules, holder.__dict__)):
            holder, path, attr = self._constants_namespace(), self.constants_path, sanitize(name)
            while attr in holder._parameters or attr in holder._buffers:
                attr += "_"
        tensor = self.tensor(value, trainable)
        (holder._parameters if trainable else holder._buffers)[attr] = tensor
        self.constant_sources[name] = (holder, attr)
        if initializer:
            self.initializer_names[f"{path}.{attr}"] = name

    def _holder(self, segments) -> Module | None:
        """The module at ``segments`` (Namespaces made on the way), or None where that cannot be."""
        parent = self._parent(segments, create=True)
        if parent is None:
            return None
        if segments[-1] not in parent._modules:
            parent._modules[segments[-1]] = Namespace()
        return parent._modules[segments[-1]]

    def _constants_namespace(self) -> Module:
        """``constants``: the tensors whose names are no module path (exporter-generated, Constant nodes)."""
        if self.constants_path is None:
            self.constants_path = self._unique_top("constants")
            self.root._modules[self.constants_path] = Namespace()
        return self.root._modules[self.constants_path]

    # ---- steps -----------------------------------------------------------------------------------------
    def step(self, node: Node, module: Module, inputs, outputs=None) -> None:
        for name in inputs:
            if name in self.constants:
                self.constant_input(node, name)
        self.steps.append(Step(node.name, node.op_type, module, list(inputs), list(outputs or node.outputs[:1])))

    def simple(self, node: Node, module: Module, inputs=None) -> None:
        """A layer without initializers reading ``inputs`` (default: the node's first input)."""
        self.node_module(node, module)
        self.step(node, module, inputs if inputs is not None else node.inputs[:1])

    def unused_outputs(self, node: Node, first: int, what: str) -> None:
        """Optional outputs netcl does not compute must not be read by anything."""
        read = {i for n in self.graph.nodes for i in n.inputs} | set(self.graph.outputs)
        for name in node.outputs[first:]:
            if name and name in read:
                raise self.graph.error(node, f"its output {name!r} ({what}) is used; netcl computes only the first "
                                       "output of this operator", value=name)

    # ---- padding ---------------------------------------------------------------------------------------
    def pads(self, node: Node, kernel, strides, dilations) -> tuple:
        """(top, left, bottom, right) from pads or auto_pad."""
        auto = node.attrs.get("auto_pad", "NOTSET")
        if auto in ("NOTSET", ""):
            pads = list(node.attrs.get("pads", [0] * 4))
            if len(pads) != 4:
                raise self.graph.error(node, f"pads {pads} are not those of a 2-D operator")
            return tuple(int(p) for p in pads)
        if auto == "VALID":
            return (0, 0, 0, 0)
        if auto not in ("SAME_UPPER", "SAME_LOWER"):
            raise self.graph.error(node, f"auto_pad {auto!r} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
        shape = self.shape_of(node.inputs[0])
        if shape is None or len(shape) != 4 or any(isinstance(d, Dim) for d in shape[2:]):
            raise self.graph.error(node, f"auto_pad {auto} needs the input's height and width at load; the graph "
                                   f"gives the shape {shape}", shape=shape)
        begin, end = [], []
        for size, k, s, d in zip(shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return (begin[0], begin[1], end[0], end[1])


# ---- converters ---------------------------------------------------------------------------------------
def _ints(node: Node, key: str, default):
    return tuple(int(v) for v in node.attrs.get(key, default))


def _spatial_2d(b: Builder, node: Node, kernel) -> None:
    if len(kernel) != 2:
        raise b.graph.error(node, f"has {len(kernel)} spatial dimensions; netcl imports 2-D {node.op_type} only",
                            kernel_shape=list(kernel))


def convert_conv(b: Builder, node: Node) -> None:
    w, w_name = b.weight(node, 1)
    bias, b_name = b.weight(node, 2, required=False)
    kernel = tuple(int(k) for k in w.shape[2:])
    _spatial_2d(b, node, kernel)
    if tuple(node.attrs.get("kernel_shape", kernel)) != kernel:
        raise b.graph.error(node, f"kernel_shape {node.attrs['kernel_shape']} contradicts the weight's shape {w.shape}")
    groups = int(node.attrs.get("group", 1))
    strides, dilations = _ints(node, "strides", (1, 1)), _ints(node, "dilations", (1, 1))
    top, left, bottom, right = b.pads(node, kernel, strides, dilations)
    ph, pw = min(top, bottom), min(left, right)
    module = nn.Conv2d(w.shape[1] * groups, w.shape[0], kernel, strides, (ph, pw), dilations, groups,
                       bias=bias is not None, device=b.device, dtype=w.dtype, initial_weight=w, initial_bias=bias)
    path = b.place(node, module, {"weight": w_name, "bias": b_name})
    source = node.inputs[0]
    extra = (left - pw, right - pw, top - ph, bottom - ph)
    if any(extra):
        pad = nn.ConstantPad2d(extra)
        b.node_module(Node(node.name + "_pad", "Pad", "", [], []), pad)
        padded = node.outputs[0] + "::padded"
        b.step(node, pad, [source], [padded])
        source = padded
    b.step(node, module, [source])
    b.convs.append(ConvSite(path, node.inputs[0], extra, module))


def convert_batchnorm(b: Builder, node: Node) -> None:
    arrays = [b.weight(node, k) for k in range(1, 5)]
    scale = arrays[0][0]
    if node.attrs.get("training_mode", 0):
        b.unused_outputs(node, 1, "running statistics")
    else:
        b.unused_outputs(node, 1, "training outputs")
    shape = b.shape_of(node.inputs[0])
    rank = len(shape) if shape is not None else 4
    if rank not in (2, 3, 4):
        raise b.graph.error(node, f"normalizes a {rank}-D input; netcl has BatchNorm1d (2-D, 3-D) and BatchNorm2d",
                            shape=shape)
    layer = nn.BatchNorm2d if rank == 4 else nn.BatchNorm1d
    momentum = round(1.0 - float(node.attrs.get("momentum", 0.9)), 6)  # a float32 attribute: 0.1, not 0.10000002
    module = layer(scale.shape[0], eps=float(node.attrs.get("epsilon", 1e-5)), momentum=momentum, device=b.device,
                   dtype=scale.dtype)
    names = {}
    for (array, name), attr in zip(arrays, ("weight", "bias", "running_mean", "running_var")):
        if array.shape != (scale.shape[0],):
            raise b.graph.error(node, f"{attr} {name!r} has the shape {array.shape}, expected ({scale.shape[0]},)")
        tensor = b.tensor(array.astype(scale.dtype), attr in ("weight", "bias"))
        if attr in ("weight", "bias"):
            setattr(module, attr, tensor)
        else:
            module._buffers[attr] = tensor
        names[attr] = name
    b.place(node, module, names)
    b.step(node, module, node.inputs[:1])


def convert_gemm(b: Builder, node: Node) -> None:
    trans_a, trans_b = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    inputs = [node.inputs[0]]
    weight = bias = None
    w_name = c_name = None
    if node.inputs[1] in b.owned:
        weight, w_name = b.weight(node, 1)
    else:
        inputs.append(node.inputs[1])
    if len(node.inputs) > 2 and node.inputs[2]:
        if node.inputs[2] in b.owned:
            bias, c_name = b.weight(node, 2)
        else:
            inputs.append(node.inputs[2])
    runtime_c = len(node.inputs) > 2 and node.inputs[2] and bias is None
    if (weight is not None and weight.ndim == 2 and trans_b and not trans_a and alpha == 1.0 and not runtime_c
            and (bias is None or (beta == 1.0 and bias.shape == (weight.shape[0],)))):
        module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=b.device,
                           dtype=weight.dtype, initial_weight=weight, initial_bias=bias)
    else:
        module = L.Gemm(alpha, beta, trans_a, trans_b, None if weight is None else b.tensor(weight, True),
                        None if bias is None else b.tensor(bias, True))
    if w_name or c_name:
        b.place(node, module, {"weight": w_name, "bias": c_name})
        b.step(node, module, inputs)
    else:
        b.simple(node, module, inputs)


def convert_matmul(b: Builder, node: Node) -> None:
    if node.inputs[1] in b.owned:
        weight, name = b.weight(node, 1)
        module = L.MatMulWeight(b.tensor(weight, True))
        b.place(node, module, {"weight": name})
        b.step(node, module, node.inputs[:1])
    else:
        b.simple(node, L.MatMul(), node.inputs[:2])


def _pool(b: Builder, node: Node, average: bool) -> None:
    kernel = _ints(node, "kernel_shape", ())
    _spatial_2d(b, node, kernel)
    strides, dilations = _ints(node, "strides", (1, 1)), _ints(node, "dilations", (1, 1))
    if node.attrs.get("storage_order", 0):
        raise b.graph.error(node, "storage_order=1 (column-major indices) is not supported")
    b.unused_outputs(node, 1, "indices")
    top, left, bottom, right = b.pads(node, kernel, strides, dilations)
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    if average:
        module = nn.AvgPool2d(kernel, strides, (top, left), ceil_mode, bool(node.attrs.get("count_include_pad", 0)),
                              dilation=dilations, padding_end=(bottom, right))
    else:
        module = nn.MaxPool2d(kernel, strides, (top, left), dilations, ceil_mode=ceil_mode, padding_end=(bottom, right))
    b.simple(node, module)


def convert_reshape(b: Builder, node: Node) -> None:
    shape = np.asarray(b.static(node, 1, "shape")).reshape(-1)
    allow_zero = bool(node.attrs.get("allowzero", 0))
    if has_dims(shape):
        resolved = resolve_reshape(list(shape), b.shape_of(node.inputs[0]), allow_zero)
        if resolved is None:
            b.simple(node, L.SymbolicReshape(shape.tolist()))
            b.steps[-1].takes_sizes = True
            return
        shape = resolved
    b.simple(node, nn.Reshape([int(d) for d in shape], copy_zeros=not allow_zero))


def convert_transpose(b: Builder, node: Node) -> None:
    perm = node.attrs.get("perm")
    if perm is None:
        shape = b.shape_of(node.inputs[0])
        if shape is None:
            raise b.graph.error(node, "has no perm and the input's rank is unknown")
        perm = list(range(len(shape)))[::-1]
    b.simple(node, nn.Permute(perm))


def convert_split(b: Builder, node: Node) -> None:
    axis = int(node.attrs.get("axis", 0))
    if b.graph.opset >= 13:
        sizes = b.static(node, 1, "split", default=np.empty(0, np.int64)) if len(node.inputs) > 1 else np.empty(0)
    else:
        sizes = np.asarray(node.attrs.get("split", []))
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)] or None
    parts = int(node.attrs.get("num_outputs", len(node.outputs)))
    module = L.Split(axis, sizes, parts)
    b.node_module(node, module)
    b.step(node, module, node.inputs[:1], node.outputs)


def convert_slice(b: Builder, node: Node) -> None:
    starts = np.asarray(b.static(node, 1, "starts")).reshape(-1)
    ends = np.asarray(b.static(node, 2, "ends")).reshape(-1)
    axes = np.asarray(b.static(node, 3, "axes", default=np.arange(len(starts)))).reshape(-1)
    steps = np.asarray(b.static(node, 4, "steps", default=np.ones(len(starts), np.int64))).reshape(-1)
    if any(has_dims(v) for v in (starts, ends, axes, steps)):
        raise b.graph.error(node, "slices by symbolic sizes")
    if (steps <= 0).any():
        raise b.graph.error(node, f"steps {steps.tolist()}: netcl slices with positive steps only")
    shape = b.shape_of(node.inputs[0])
    if shape is not None:
        axes = np.array([a % len(shape) for a in axes])
    elif (axes < 0).any():
        raise b.graph.error(node, "negative axes on an input of unknown rank")
    clip = lambda v: int(max(min(int(v), 2**62), -2**62))
    b.simple(node, L.Slice([clip(v) for v in starts], [clip(v) for v in ends], axes, steps))


def convert_gather(b: Builder, node: Node) -> None:
    indices = b.static(node, 1, "indices")
    b.simple(node, L.Gather(int(node.attrs.get("axis", 0)), indices))


def _axes(b: Builder, node: Node, input_from: int):
    if b.graph.opset >= input_from:
        if len(node.inputs) > 1 and node.inputs[1]:
            return [int(a) for a in np.asarray(b.static(node, 1, "axes")).reshape(-1)]
        return None
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def convert_unsqueeze(b: Builder, node: Node) -> None:
    b.simple(node, L.Unsqueeze(_axes(b, node, 13)))


def convert_squeeze(b: Builder, node: Node) -> None:
    b.simple(node, L.Squeeze(_axes(b, node, 13)))


def _reduce(op: str, axes_input_from: int):
    def convert(b: Builder, node: Node) -> None:
        axes = _axes(b, node, axes_input_from)
        if not axes and node.attrs.get("noop_with_empty_axes", 0):
            b.simple(node, nn.Identity())
            return
        b.simple(node, L.Reduce(op, axes or None, bool(node.attrs.get("keepdims", 1))))
    return convert


def convert_clip(b: Builder, node: Node) -> None:
    if b.graph.opset >= 11:
        bounds = [b.static(node, k, what, default=np.array(None, object)) for k, what in ((1, "min"), (2, "max"))]
        low, high = (None if v.dtype == object else float(v) for v in (np.asarray(x) for x in bounds))
    else:
        low, high = node.attrs.get("min"), node.attrs.get("max")
    if (low, high) == (0.0, 6.0):
        module = nn.ReLU6()                   # MobileNetV2's ReLU6, one kernel
    elif low == 0.0 and high is None:
        module = nn.ReLU()
    elif low is not None and high is not None and low < high:
        module = nn.Hardtanh(low, high)
    else:
        module = L.Clip(low, high)
    b.simple(node, module)


def convert_hardsigmoid(b: Builder, node: Node) -> None:
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    pytorch_form = abs(alpha - 1.0 / 6.0) < 1e-7 and beta == 0.5  # relu6(x + 3) / 6, one kernel
    b.simple(node, nn.Hardsigmoid() if pytorch_form else L.HardSigmoid(alpha, beta))


def convert_softmax(log: bool):
    def convert(b: Builder, node: Node) -> None:
        axis = int(node.attrs.get("axis", -1 if b.graph.opset >= 13 else 1))
        if b.graph.opset < 13:
            shape = b.shape_of(node.inputs[0])
            if shape is None or axis % len(shape) != len(shape) - 1:
                raise b.graph.error(node, f"before opset 13 Softmax flattens the axes from {axis} on; netcl imports "
                                    "it only over the last axis", axis=axis, shape=shape)
        b.simple(node, nn.LogSoftmax(axis) if log else nn.Softmax(axis))
    return convert


def convert_pad(b: Builder, node: Node) -> None:
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":
        raise b.graph.error(node, f"mode {mode!r}: netcl pads with a constant only", mode=mode)
    if b.graph.opset >= 11:
        pads = [int(p) for p in np.asarray(b.static(node, 1, "pads")).reshape(-1)]
        value = np.asarray(b.static(node, 2, "constant_value", default=np.zeros(()))).reshape(-1)
        value = float(value[0]) if value.size else 0.0
        axes = np.asarray(b.static(node, 3, "axes", default=np.empty(0, np.int64))).reshape(-1)
    else:
        pads, value, axes = list(node.attrs["pads"]), float(node.attrs.get("value", 0.0)), np.empty(0)
    half = len(pads) // 2
    shape = b.shape_of(node.inputs[0])
    rank = len(shape) if shape is not None else half
    axes = [int(a) % rank for a in axes] if len(axes) else list(range(rank - half, rank)) if half <= rank else []
    if len(axes) != half:
        raise b.graph.error(node, f"pads {pads} do not fit an input of rank {rank}")
    widths = {a: (pads[k], pads[k + half]) for k, a in enumerate(axes)}
    first = min(widths) if widths else rank
    flat = []
    for a in range(rank - 1, first - 1, -1):
        flat += list(widths.get(a, (0, 0)))
    b.simple(node, nn.ConstantPad2d(flat or (0, 0), value))


def convert_flatten(b: Builder, node: Node) -> None:
    axis = int(node.attrs.get("axis", 1))
    b.simple(node, nn.Flatten(1) if axis == 1 else L.Flatten(axis))


def convert_dropout(b: Builder, node: Node) -> None:
    b.unused_outputs(node, 1, "mask")
    if b.graph.opset >= 12:
        ratio = float(np.asarray(b.static(node, 1, "ratio", default=np.array(0.5))).reshape(-1)[0])
    else:
        ratio = float(node.attrs.get("ratio", 0.5))
    b.simple(node, nn.Dropout(ratio))


def convert_cast(b: Builder, node: Node) -> None:
    from onnx import helper
    b.simple(node, L.Cast(helper.tensor_dtype_to_np_dtype(node.attrs["to"])))


def convert_global_pool(op: str):
    def convert(b: Builder, node: Node) -> None:
        shape = b.shape_of(node.inputs[0])
        if shape is not None and len(shape) != 4:
            raise b.graph.error(node, f"pools a {len(shape)}-D input; netcl imports the 2-D form", shape=shape)
        b.simple(node, nn.AdaptiveAvgPool2d(1) if op == "mean" else L.Reduce(op, (2, 3), True))
    return convert


def _activation(factory):
    return lambda b, node: b.simple(node, factory(node))


def _elementwise(b: Builder, node: Node) -> None:
    b.simple(node, L.Elementwise(node.op_type), [i for i in node.inputs if i])


CONVERTERS = {
    "Conv": convert_conv, "BatchNormalization": convert_batchnorm, "Gemm": convert_gemm, "MatMul": convert_matmul,
    "MaxPool": lambda b, n: _pool(b, n, False), "AveragePool": lambda b, n: _pool(b, n, True),
    "GlobalAveragePool": convert_global_pool("mean"), "GlobalMaxPool": convert_global_pool("max"),
    "Relu": _activation(lambda n: nn.ReLU()), "Sigmoid": _activation(lambda n: nn.Sigmoid()),
    "Tanh": _activation(lambda n: nn.Tanh()),
    "LeakyRelu": _activation(lambda n: nn.LeakyReLU(float(n.attrs.get("alpha", 0.01)))),
    "Gelu": _activation(lambda n: nn.GELU(n.attrs.get("approximate", "none"))),
    "HardSigmoid": convert_hardsigmoid, "HardSwish": _activation(lambda n: nn.Hardswish()),
    "Identity": _activation(lambda n: nn.Identity()),
    "Clip": convert_clip, "Softmax": convert_softmax(False), "LogSoftmax": convert_softmax(True),
    "Dropout": convert_dropout, "Flatten": convert_flatten, "Reshape": convert_reshape, "Transpose": convert_transpose,
    "Concat": lambda b, n: b.simple(n, nn.Concat(int(n.attrs["axis"])), [i for i in n.inputs if i]),
    "Split": convert_split, "Slice": convert_slice, "Gather": convert_gather, "Unsqueeze": convert_unsqueeze,
    "Squeeze": convert_squeeze, "Pad": convert_pad, "Cast": convert_cast,
    "ReduceMean": _reduce("mean", 18), "ReduceSum": _reduce("sum", 13), "ReduceMax": _reduce("max", 18),
    "ReduceMin": _reduce("min", 18),
}
for _op in list(L.BINARY) + list(L.VARIADIC) + list(L.UNARY):
    CONVERTERS[_op] = _elementwise


def supported_operators() -> list:
    """The operators of the default domain that netcl imports (besides those folded at load)."""
    from .folding import FOLDERS, SHAPE_FOLDERS
    return sorted(set(CONVERTERS) | set(FOLDERS) | set(SHAPE_FOLDERS))
