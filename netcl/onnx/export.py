"""nc.onnx.export: a netcl model as an ONNX graph that onnxruntime (or nc.onnx.load) runs.

The model is walked from its root with one exporter per module type (``EXPORTERS``; a subclass that keeps
its base's forward uses the base's exporter): containers and
blocks (Sequential, the ResNets and their BasicBlock) emit their children in the order their forward
calls them, residual adds included; layers emit their ONNX nodes. Each module is also run on the value
reaching it (the example input at the root), in eval mode and without gradients, so an exporter knows its
input's shape and the graph's declared shapes are the model's. A module type without an exporter raises
``nc.OnnxError`` naming it, its place in the model and the supported types: a block whose forward is
arbitrary Python cannot be written as a graph by guessing. A type of one's own joins by defining
``export_onnx(self, graph, x, path) -> value`` (``graph`` an ``OnnxGraph``, ``x`` and the result
``Value``s) or by ``register(cls)`` here.

Initializers carry the state_dict's names ("layer1.0.conv1.weight", "bn1.running_mean"), so a graph's
weights map back to the model's; constants the graph needs beyond them (a ReLU6's bounds) are named after
the module and what they are. BatchNorm exports its running statistics (eval mode); Dropout is the
identity. With ``dynamic_batch`` the input's and output's first dimension is the symbol "batch".
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..autograd import no_grad
from ..errors import OnnxError
from ..models.mobilenet import InvertedResidual, MobileNetV2
from ..models.resnet import BasicBlock, Bottleneck, ImageNetResNet, ResNet
from ..tensor import Tensor
from .model import OnnxModel

MIN_OPSET, MAX_OPSET = 13, 21


@dataclass(frozen=True)
class Value:
    """A value of the graph: its ONNX name and the netcl tensor the model computes for it."""
    name: str
    tensor: Tensor


class OnnxGraph:
    """The nodes and initializers of the graph being written."""

    def __init__(self, onnx_module, opset: int):
        self.onnx, self.opset = onnx_module, opset
        self.nodes: list = []
        self.initializers: dict[str, object] = {}
        self._used_names: set[str] = set()

    def unique(self, name: str) -> str:
        """``name``, or ``name_k`` for the first k that is free (a module called twice: ResNet's relu)."""
        name = name or "node"
        candidate, k = name, 1
        while candidate in self._used_names:
            candidate, k = f"{name}_{k}", k + 1
        self._used_names.add(candidate)
        return candidate

    def initializer(self, name: str, array: np.ndarray) -> str:
        """An initializer called ``name`` (a module shared by two paths keeps its first)."""
        if name not in self.initializers:
            # np.ascontiguousarray would make a scalar (Clip's bounds) 1-D
            self.initializers[name] = self.onnx.numpy_helper.from_array(np.asarray(array, order="C"), name)
            self._used_names.add(name)
        return name

    def node(self, op_type: str, inputs, name: str, **attributes) -> str:
        """Append a node of one output, named ``name`` (made unique); returns the output's name."""
        output = self.unique(name)
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _param(graph: OnnxGraph, path: str, name: str, tensor: Tensor) -> str:
    return graph.initializer(_join(path, name), tensor.to_host())


def _run(module, x: Value, graph: OnnxGraph, op_type: str, inputs, path: str, **attributes) -> Value:
    return Value(graph.node(op_type, inputs, path or op_type, **attributes), module(x.tensor))


EXPORTERS: dict[type, object] = {}


def register(cls):
    """``@register(cls)`` on ``fn(graph, module, x, path) -> Value``: how modules of exactly ``cls`` export."""
    def wrap(fn):
        EXPORTERS[cls] = fn
        return fn
    return wrap


def exporter_of(cls):
    """The exporter of ``cls``: its own, else that of the nearest base class whose forward it keeps (a
    Sequential subclass that only names its layers exports as a Sequential), else None."""
    for base in cls.__mro__:
        exporter = EXPORTERS.get(base)
        if exporter is not None:
            return exporter if base is cls or cls.forward is base.forward else None
    return None


def emit(graph: OnnxGraph, module, x: Value, path: str) -> Value:
    """The graph of ``module`` applied to ``x`` (its path in the model names its nodes and initializers)."""
    exporter = exporter_of(type(module))
    if exporter is not None:
        return exporter(graph, module, x, path)
    own = getattr(module, "export_onnx", None)
    if callable(own):
        return own(graph, x, path)
    supported = ", ".join(sorted(cls.__name__ for cls in EXPORTERS))
    raise OnnxError(f"nc.onnx.export: no exporter for {type(module).__name__} at "
                    f"'{path or '(the model)'}'; supported modules: {supported} (or a module defining "
                    f"export_onnx(graph, x, path))", node=path or None, op_type=type(module).__name__,
                    opset=graph.opset)


def _chain(graph: OnnxGraph, modules, x: Value, path: str, names) -> Value:
    for name, module in zip(names, modules):
        x = emit(graph, module, x, _join(path, name))
    return x


# ---- containers and blocks ---------------------------------------------------------------------------
@register(nn.Sequential)
def _sequential(graph, module, x, path):
    names = list(module._modules)
    return _chain(graph, [module._modules[n] for n in names], x, path, names)


def _child_name(parent, child) -> str:
    return next(name for name, module in parent._modules.items() if module is child)


def _residual_block(graph, block, x, path):
    """relu(main path + shortcut): the steps of ``main_path()`` under their attribute names, an Add, the ReLU."""
    main = _chain(graph, block.main_path(), x, path, [_child_name(block, m) for m in block.main_path()])
    shortcut = x if block.downsample is None else emit(graph, block.downsample, x, _join(path, "downsample"))
    added = Value(graph.node("Add", [main.name, shortcut.name], _join(path, "add")), main.tensor + shortcut.tensor)
    return emit(graph, block.relu, added, _join(path, "relu"))


register(BasicBlock)(_residual_block)
register(Bottleneck)(_residual_block)


@register(ResNet)
def _resnet(graph, model, x, path):
    names = ["conv1", "bn1", "relu", "layer1", "layer2", "layer3", "avgpool", "flatten", "fc"]
    return _chain(graph, [getattr(model, n) for n in names], x, path, names)


@register(ImageNetResNet)
def _imagenet_resnet(graph, model, x, path):
    names = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "flatten", "fc"]
    return _chain(graph, [getattr(model, n) for n in names], x, path, names)


@register(InvertedResidual)
def _inverted_residual(graph, block, x, path):
    y = emit(graph, block.conv, x, _join(path, "conv"))
    if not block.use_res_connect:
        return y
    return Value(graph.node("Add", [x.name, y.name], _join(path, "add")), x.tensor + y.tensor)


@register(MobileNetV2)
def _mobilenet_v2(graph, model, x, path):
    names = ["features", "avgpool", "flatten", "classifier"]
    return _chain(graph, [getattr(model, n) for n in names], x, path, names)


# ---- layers -------------------------------------------------------------------------------------------
@register(nn.Conv2d)
def _conv2d(graph, conv, x, path):
    inputs = [x.name, _param(graph, path, "weight", conv.weight)]
    if conv.bias is not None:
        inputs.append(_param(graph, path, "bias", conv.bias))
    (ph, pw) = conv.padding
    return _run(conv, x, graph, "Conv", inputs, path, kernel_shape=list(conv.kernel_size), strides=list(conv.stride),
                pads=[ph, pw, ph, pw], dilations=list(conv.dilation), group=conv.groups)


@register(nn.Linear)
def _linear(graph, linear, x, path):
    weight = _param(graph, path, "weight", linear.weight)
    bias = _param(graph, path, "bias", linear.bias) if linear.bias is not None else None
    if x.tensor.ndim == 2:
        return _run(linear, x, graph, "Gemm", [x.name, weight] + ([bias] if bias else []), path, transB=1)
    transposed = graph.node("Transpose", [weight], _join(path, "weight_t"), perm=[1, 0])
    product = graph.node("MatMul", [x.name, transposed], _join(path, "matmul") if bias else path)
    out = graph.node("Add", [product, bias], path) if bias else product
    return Value(out, linear(x.tensor))


def _batch_norm(graph, bn, x, path):
    if not bn.track_running_stats:
        raise OnnxError(f"nc.onnx.export: {type(bn).__name__} at '{path}' has no running statistics "
                        f"(track_running_stats=False): ONNX's BatchNormalization needs them",
                        node=path, op_type="BatchNormalization", opset=graph.opset)
    c, dtype = bn.num_features, bn.running_mean.dtype
    if bn.affine:
        scale, shift = _param(graph, path, "weight", bn.weight), _param(graph, path, "bias", bn.bias)
    else:
        scale = graph.initializer(_join(path, "unit_scale"), np.ones(c, dtype))
        shift = graph.initializer(_join(path, "zero_shift"), np.zeros(c, dtype))
    inputs = [x.name, scale, shift, _param(graph, path, "running_mean", bn.running_mean),
              _param(graph, path, "running_var", bn.running_var)]
    return _run(bn, x, graph, "BatchNormalization", inputs, path, epsilon=bn.eps,
                momentum=1.0 - (bn.momentum if bn.momentum is not None else 0.1))


register(nn.BatchNorm2d)(_batch_norm)
register(nn.BatchNorm1d)(_batch_norm)


def _pool(graph, pool, x, path, op_type: str, **attributes) -> Value:
    """A pooling node whose windows are netcl's. With ``ceil_mode`` netcl (as PyTorch and onnxruntime) drops
    a last window that would start in the end padding, where ONNX's shape formula counts it; so an axis
    that ceil_mode does not lengthen gets the end padding that makes both formulas agree (its windows stay
    the same, so no value changes), and where no axis is lengthened the node has no ceil_mode at all."""
    y = pool(x.tensor)
    ends, ceil_mode = list(pool.padding_end), 0
    for axis, (size, count) in enumerate(zip(x.tensor.shape[2:], y.shape[2:])):
        begin, stride = pool.padding[axis], pool.stride[axis]
        extent = pool.dilation[axis] * (pool.kernel_size[axis] - 1) + 1
        floor_count = (size + begin + ends[axis] - extent) // stride + 1
        if count != floor_count:
            ceil_mode = 1
        elif pool.ceil_mode:
            ends[axis] = (floor_count - 1) * stride + extent - size - begin
    pads = list(pool.padding) + (ends if ceil_mode else list(pool.padding_end))
    node = graph.node(op_type, [x.name], path, kernel_shape=list(pool.kernel_size), strides=list(pool.stride),
                      pads=pads, ceil_mode=ceil_mode, **attributes)
    return Value(node, y)


@register(nn.MaxPool2d)
def _max_pool(graph, pool, x, path):
    return _pool(graph, pool, x, path, "MaxPool", dilations=list(pool.dilation))


@register(nn.AvgPool2d)
def _avg_pool(graph, pool, x, path):
    attributes = {"count_include_pad": int(pool.count_include_pad)}
    if pool.dilation != (1, 1):
        if graph.opset < 19:
            raise OnnxError(f"nc.onnx.export: AvgPool2d at '{path}' has dilation {pool.dilation}: AveragePool "
                            f"takes dilations from opset 19 on, not {graph.opset}", node=path,
                            op_type="AveragePool", opset=graph.opset)
        attributes["dilations"] = list(pool.dilation)
    return _pool(graph, pool, x, path, "AveragePool", **attributes)


@register(nn.AdaptiveAvgPool2d)
def _adaptive_avg_pool(graph, pool, x, path):
    h, w = x.tensor.shape[2:]
    size = pool.output_size
    oh, ow = (size, size) if isinstance(size, int) else size
    oh, ow = h if oh is None else oh, w if ow is None else ow
    if (oh, ow) == (1, 1):
        return _run(pool, x, graph, "GlobalAveragePool", [x.name], path)
    if h % oh or w % ow:
        raise OnnxError(f"nc.onnx.export: AdaptiveAvgPool2d at '{path}' maps {h}×{w} to {oh}×{ow}, bins of "
                        f"unequal sizes that no ONNX pooling computes", node=path, op_type="AveragePool",
                        opset=graph.opset)
    kernel = [h // oh, w // ow]
    return _run(pool, x, graph, "AveragePool", [x.name], path, kernel_shape=kernel, strides=kernel)


@register(nn.Flatten)
def _flatten(graph, flatten, x, path):
    start = flatten.start_dim % max(x.tensor.ndim, 1)
    if start == 1:
        return _run(flatten, x, graph, "Flatten", [x.name], path, axis=1)
    shape = graph.initializer(_join(path, "shape"), np.array([0] * start + [-1], np.int64))
    return _run(flatten, x, graph, "Reshape", [x.name, shape], path)


def _identity(graph, module, x, path):
    return x


register(nn.Dropout)(_identity)
register(nn.Identity)(_identity)


def _unary(op_type: str, **attributes):
    def export(graph, module, x, path):
        return _run(module, x, graph, op_type, [x.name], path, **attributes)
    return export


register(nn.ReLU)(_unary("Relu"))
register(nn.Tanh)(_unary("Tanh"))
register(nn.Sigmoid)(_unary("Sigmoid"))


@register(nn.LeakyReLU)
def _leaky_relu(graph, module, x, path):
    return _run(module, x, graph, "LeakyRelu", [x.name], path, alpha=module.negative_slope)


@register(nn.Softmax)
def _softmax(graph, module, x, path):
    return _softmax_like(graph, module, x, path, "Softmax")


@register(nn.LogSoftmax)
def _log_softmax(graph, module, x, path):
    return _softmax_like(graph, module, x, path, "LogSoftmax")


def _softmax_like(graph, module, x, path, op_type):
    if module.dim is None:
        raise OnnxError(f"nc.onnx.export: {type(module).__name__} at '{path}' has no dim", node=path,
                        op_type=op_type, opset=graph.opset)
    return _run(module, x, graph, op_type, [x.name], path, axis=int(module.dim))


@register(nn.GELU)
def _gelu(graph, module, x, path):
    if graph.opset < 20:
        raise OnnxError(f"nc.onnx.export: GELU at '{path}' needs opset 20 or later (ONNX's Gelu), not "
                        f"{graph.opset}", node=path, op_type="Gelu", opset=graph.opset)
    return _run(module, x, graph, "Gelu", [x.name], path, approximate=module.approximate)


def _clip(graph, module, x, path, low: float, high: float):
    dtype = x.tensor.dtype
    bounds = [graph.initializer(_join(path, "min"), np.array(low, dtype)),
              graph.initializer(_join(path, "max"), np.array(high, dtype))]
    return _run(module, x, graph, "Clip", [x.name] + bounds, path)


def _hardtanh(graph, module, x, path):  # and ReLU6, a Hardtanh(0, 6)
    return _clip(graph, module, x, path, module.min_val, module.max_val)


def _hardsigmoid(graph, module, x, path):
    return _run(module, x, graph, "HardSigmoid", [x.name], path, alpha=1.0 / 6.0, beta=0.5)


def _hardswish(graph, module, x, path):
    if graph.opset >= 14:
        return _run(module, x, graph, "HardSwish", [x.name], path)
    gate = graph.node("HardSigmoid", [x.name], _join(path, "gate"), alpha=1.0 / 6.0, beta=0.5)
    return Value(graph.node("Mul", [x.name, gate], path), module(x.tensor))


def _silu(graph, module, x, path):
    gate = graph.node("Sigmoid", [x.name], _join(path, "gate"))
    return Value(graph.node("Mul", [x.name, gate], path), module(x.tensor))


register(nn.Hardtanh)(_hardtanh)
register(nn.ReLU6)(_hardtanh)
register(nn.Hardsigmoid)(_hardsigmoid)
register(nn.Hardswish)(_hardswish)
register(nn.SiLU)(_silu)


# ---- the model ----------------------------------------------------------------------------------------
def _onnx():
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401  (a submodule the graph uses)
    except ImportError as exc:
        raise OnnxError("nc.onnx.export needs the onnx package: pip install netcl[onnx]") from exc
    return onnx


def _export_imported(onnx, model: OnnxModel, path):
    """An imported model's own graph (nodes, opset, inputs and outputs as loaded), its weights taken from the
    model's current parameters and buffers: a fine-tuned import goes back out as the graph it came in as."""
    if model.source_graph is None:
        raise OnnxError("this imported model kept no source graph to export (nc.onnx.load keeps one)")
    proto = type(model.source_graph)()
    proto.CopyFrom(model.source_graph)
    values = {}
    for key, tensor in model.state_dict().items():
        name = model.initializer_names.get(key, key)
        if name not in model.source_weights:
            continue
        array = tensor.to_host()
        if name in values and not np.array_equal(values[name], array):
            raise OnnxError(f"the graph stores {name!r} once, but the model's {key!r} now differs from the other "
                            f"layer that was imported from it; it cannot be written back as one weight",
                            initializer=name)
        values[name] = array
    for name, (dims, data_type) in model.source_weights.items():
        array = values.get(name)
        if array is None or array.size != int(np.prod(dims, dtype=np.int64)):
            raise OnnxError(f"the model holds no value of the graph's weight {name!r} with {dims} elements",
                            initializer=name, dims=dims)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(data_type)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array.astype(dtype).reshape(dims), name))
    if path is not None:
        onnx.save(proto, os.fspath(path))
    return proto


def export(model, example_input, path=None, opset: int = 17, dynamic_batch: bool = True,
           input_name: str = "input", output_name: str = "output"):
    """Write ``model`` as an ONNX graph to ``path`` (a file name; None writes nothing) and return the
    ``onnx.ModelProto``. ``example_input``: a netcl Tensor (or array) of the input's shape; the model runs
    once on it in eval mode (its mode is restored after). ``opset``: 13 to 21. ``dynamic_batch``: the
    first dimension of input and output is the symbol "batch", so any batch size runs. The graph is
    checked with ``onnx.checker`` (shapes inferred) before it is written.

    A model made by ``nc.onnx.load`` is written as the graph it was loaded from (its opset, inputs and
    outputs; ``example_input``, ``opset`` and ``dynamic_batch`` do not apply) with the weights it holds now."""
    onnx = _onnx()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise OnnxError(f"nc.onnx.export writes opsets {MIN_OPSET} to {MAX_OPSET}, not {opset!r}", opset=opset)
    if not isinstance(model, nn.Module):
        raise OnnxError(f"nc.onnx.export exports a netcl nn.Module, got {type(model).__name__}")
    if isinstance(model, OnnxModel):
        return _export_imported(onnx, model, path)
    if not isinstance(example_input, Tensor):  # on the model's device
        device = next((p.device for p in model.parameters()), None)
        example_input = Tensor.from_host(np.asarray(example_input, np.float32), device)
    x = example_input
    graph = OnnxGraph(onnx, opset)
    graph.unique(input_name)
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            y = emit(graph, model, Value(input_name, x), "")
    finally:
        model.train(was_training)
    if y.name == input_name or y.name in graph.initializers:  # an identity model: the output needs a node
        y = Value(graph.node("Identity", [y.name], output_name), y.tensor)
    _rename(graph, y.name, output_name)
    model_proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, type(model).__name__, [_value_info(onnx, input_name, x, dynamic_batch)],
                               [_value_info(onnx, output_name, y.tensor, dynamic_batch)],
                               list(graph.initializers.values())),
        opset_imports=[onnx.helper.make_opsetid("", opset)], producer_name="netcl")
    model_proto.ir_version = min(model_proto.ir_version, _IR_VERSION_OF_OPSET.get(opset, model_proto.ir_version))
    try:
        onnx.checker.check_model(model_proto, full_check=True)
    except onnx.checker.ValidationError as exc:  # an exporter's mistake, reported with what it wrote
        raise OnnxError(f"nc.onnx.export wrote a graph onnx.checker rejects: {exc}", opset=opset) from exc
    if path is not None:
        onnx.save(model_proto, os.fspath(path))
    return model_proto


# the IR version each opset came with: a graph is readable by the runtimes of its opset's time
_IR_VERSION_OF_OPSET = {13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10}


def _rename(graph: OnnxGraph, old: str, new: str) -> None:
    """The last node's output becomes the graph's output name."""
    for node in graph.nodes:
        node.output[:] = [new if o == old else o for o in node.output]
        node.input[:] = [new if i == old else i for i in node.input]


def _value_info(onnx, name: str, tensor: Tensor, dynamic_batch: bool):
    shape = list(tensor.shape)
    if dynamic_batch and shape:
        shape[0] = "batch"
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(tensor.dtype), shape)


__all__ = ["export", "register", "OnnxGraph", "Value", "EXPORTERS"]
