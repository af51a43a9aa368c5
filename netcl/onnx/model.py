"""OnnxModel: an imported graph as an nc.nn.Module that runs its layers in the graph's order."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, OnnxError, ShapeError
from ..module import Module
from ..tensor import Tensor
from .graph import Dim


class OnnxModel(Module):
    """The layers of an ONNX graph (children named after the graph's initializers; layers without weights
    under ``nodes``), called in topological order on the graph's inputs.

    ``model(x)`` or ``model(**{input_name: x})`` takes Tensors or NumPy arrays and returns the graph's
    output (a tuple when it has several). Inputs are checked against the graph's declared shapes: a
    symbolic dimension (the exporter's dynamic batch) takes any size, the same size wherever the same name
    appears; a fixed one must match. ``initializer_names`` maps state_dict keys to the graph's initializer
    names where they differ from them or name a layer's weight; ``conv_layers(batch)`` lists the
    convolutions' geometry for the planner.
    """

    def __init__(self, graph, device):
        super().__init__()
        self._graph_inputs = [(n, graph.shapes.get(n), graph.input_types.get(n)) for n in graph.inputs]
        self._graph_outputs = list(graph.outputs)
        self._shapes = graph.shapes
        self._device = device
        self.opset = graph.opset
        self.producer = graph.producer
        self._steps = self._constant_sources = self._convs = self.initializer_names = None
        self.source_graph = None  # the graph less its weights (keep_source), for nc.onnx.export
        self.source_weights: dict = {}  # initializer name -> (dims, ONNX data type) of each weight left out

    def finish(self, builder) -> "OnnxModel":
        """Take the steps a converters.Builder made of the graph's nodes."""
        self._steps = builder.steps
        self._constant_sources = dict(builder.constant_sources)
        self._convs = builder.convs
        self.initializer_names = dict(builder.initializer_names)
        self._plan_releases()
        return self

    def keep_source(self, model_proto) -> "OnnxModel":
        """Keep the graph the model came from, less the initializers the model's parameters and buffers
        hold (state_dict keys map to them through ``initializer_names``), so that ``nc.onnx.export`` can
        write the graph back with the model's current, possibly fine-tuned, values."""
        initializers = {t.name for t in model_proto.graph.initializer}
        held = {self.initializer_names.get(key, key) for key in self.state_dict()} & initializers
        source = type(model_proto)()
        source.CopyFrom(model_proto)
        kept = [t for t in source.graph.initializer if t.name not in held]
        self.source_weights = {t.name: (tuple(t.dims), t.data_type)
                               for t in source.graph.initializer if t.name in held}
        del source.graph.initializer[:]
        source.graph.initializer.extend(kept)
        self.source_graph = source
        return self

    def to(self, device) -> "OnnxModel":
        from ..runtime.device import resolve_device
        super().to(device)
        self._device = resolve_device(device)
        return self

    @property
    def input_names(self) -> list:
        return [name for name, _, _ in self._graph_inputs]

    @property
    def output_names(self) -> list:
        return list(self._graph_outputs)

    def input_shape(self, name: str | None = None) -> tuple:
        """The declared shape of an input (the first by default): ints, and strings for symbolic sizes."""
        name = name or self._graph_inputs[0][0]
        shape = dict((n, s) for n, s, _ in self._graph_inputs).get(name)
        return None if shape is None else tuple(str(d) if isinstance(d, Dim) else d for d in shape)

    def _plan_releases(self) -> None:
        """Group the steps into chains that netcl.nn.fusion runs (see ``_chains``), then let each group forget
        the values no later group reads, so inference holds only live activations."""
        groups = _chains(self._steps, self._graph_outputs, self._shapes)
        last = {}
        for k, group in enumerate(groups):
            for name in group.reads:
                last[name] = k
        keep = set(self._graph_outputs)
        for name, k in last.items():
            if name not in keep:
                groups[k].release.append(name)
        self._groups = groups

    # ---- running -------------------------------------------------------------------------------------
    def _bind(self, args, kwargs) -> dict:
        names = self.input_names
        if len(args) > len(names):
            raise OnnxError(f"the model takes {len(names)} input(s) {names}, got {len(args)} positional arguments",
                            inputs=names)
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise OnnxError(f"the model has no input {name!r}; its inputs are {names}", inputs=names)
            if name in values:
                raise OnnxError(f"input {name!r} given twice", inputs=names)
            values[name] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise OnnxError(f"missing model input(s) {missing}; the model takes {names}", inputs=names, missing=missing)
        sizes = {}
        for name, declared, elem_type in self._graph_inputs:
            value = values[name]
            if not isinstance(value, Tensor):
                value = Tensor.from_host(np.asarray(value, dtype=_np_type(elem_type)), self._device)
                values[name] = value
            expected = _np_type(elem_type)
            if expected is not None and value.dtype != expected:
                raise OnnxError(f"input {name!r} is {value.dtype}; the graph declares {expected}", input=name,
                                expected_dtype=str(expected), dtype=str(value.dtype))
            if declared is None:
                continue
            ok = len(declared) == value.ndim
            for d, n in zip(declared, value.shape) if ok else ():
                if isinstance(d, Dim):
                    ok = ok and sizes.setdefault(d.name, n) == n
                else:
                    ok = ok and d == n
            if not ok:
                shown = [str(d) for d in declared]
                raise OnnxError(f"input {name!r} has the shape {value.shape}; the graph declares {shown}"
                                + (f" with {sizes}" if sizes else ""), input=name, expected=shown, got=value.shape)
        return values, sizes

    def forward(self, *args, **kwargs):
        env, sizes = self._bind(args, kwargs)
        for name, (holder, attr) in self._constant_sources.items():
            env[name] = holder._parameters[attr] if attr in holder._parameters else holder._buffers[attr]
        for group in self._groups:
            try:
                group.run(env, sizes)
            except (ShapeError, DTypeError) as exc:
                step = group.steps[0]
                raise OnnxError(f"node {step.name!r} ({step.op_type}, opset {self.opset}"
                                + (f", run with the {len(group.steps) - 1} nodes after it" if len(group.steps) > 1 else "")
                                + f"): {exc}", node=step.name, op_type=step.op_type, opset=self.opset) from exc
            for name in group.release:
                env.pop(name, None)
        outputs = tuple(env[n] for n in self._graph_outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    # ---- planning ------------------------------------------------------------------------------------
    def conv_layers(self, batch: int | None = None, dtype: str = "float32") -> list:
        """[(module path, nc.ops.conv_common.ConvLayer)] for every convolution at batch ``batch`` (default:
        the graph's fixed batch, else 1)."""
        from ..ops.conv_common import ConvLayer
        batch_dim = self._batch_dim()
        if batch is None:
            batch = batch_dim if isinstance(batch_dim, int) else 1
        elif isinstance(batch_dim, int) and batch != batch_dim:
            raise OnnxError(f"the graph's batch size is fixed at {batch_dim}; it cannot be planned at batch {batch}",
                            batch=batch, fixed_batch=batch_dim)
        layers = []
        for site in self._convs:
            shape = self._shapes.get(site.value)
            if shape is None or len(shape) != 4:
                raise OnnxError(f"the input shape of the convolution {site.path} is unknown ({shape})", node=site.path)
            dims = [batch if (k == 0 and d == batch_dim) else d for k, d in enumerate(shape)]
            if any(isinstance(d, Dim) for d in dims):
                raise OnnxError(f"the convolution {site.path} reads the shape {[str(d) for d in shape]}, which has "
                                "symbolic sizes other than the batch", node=site.path)
            left, right, top, bottom = site.extra_pads
            n, c, h, w = dims
            m = site.module
            layers.append((site.path, ConvLayer.from_shapes((n, c, h + top + bottom, w + left + right),
                                                            tuple(m.weight.shape), m.stride, m.padding, m.dilation,
                                                            m.groups, dtype)))
        return layers

    def _batch_dim(self):
        """The first input's first dimension: an int, a Dim, or None for a scalar input."""
        shape = self._graph_inputs[0][1] if self._graph_inputs else None
        return shape[0] if shape else None


class _Group:
    """Steps run together: one step, or a chain whose values flow only from each step to the next, handed
    to netcl.nn.fusion.run so that Conv2d + BatchNorm2d + ReLU, residual adds and ReLU + MaxPool2d fuse as in
    netcl's own models. ``links`` holds each step's residual input (for an Add) or None."""

    def __init__(self, step, source, shortcut=None):
        self.steps, self.links, self.source = [step], [shortcut], source
        self.release = []

    @property
    def reads(self) -> list:
        head = list(self.steps[0].inputs) if self.source is None else [self.source]
        return head + [s for s in self.links if s is not None]

    @property
    def output(self) -> str:
        return self.steps[-1].outputs[0]

    def run(self, env: dict, sizes: dict) -> None:
        step = self.steps[0]
        if self.source is None or (len(self.steps) == 1 and self.links[0] is None):
            inputs = [env[n] for n in step.inputs]
            out = step.module(*inputs, sizes=sizes) if step.takes_sizes else step.module(*inputs)
            if len(self.steps) > 1:  # a head of several inputs, then the chain after it
                env[self.output] = self._run_chain(1, out, env)
            elif len(step.outputs) == 1:
                env[step.outputs[0]] = out
            else:
                for name, value in zip(step.outputs, out):
                    if name:
                        env[name] = value
            return
        env[self.output] = self._run_chain(0, env[self.source], env)

    def _run_chain(self, start: int, x, env: dict):
        from ..nn import fusion
        chain = [fusion.Residual(env[link]) if link is not None else s.module
                 for s, link in zip(self.steps[start:], self.links[start:])]
        return fusion.run(chain, x)


def _chains(steps, graph_outputs, shapes) -> list:
    """Steps grouped into chains: a step joins the chain ending in its input when that value is read by it
    alone (and is no graph output). An Add of two values of the same declared shape joins as a residual.
    A group runs where its last step stood, when every value it reads exists."""
    from .layers import Elementwise
    readers = {}
    for step in steps:
        for name in step.inputs:
            readers[name] = readers.get(name, 0) + 1
    for name in graph_outputs:
        readers[name] = readers.get(name, 0) + 2
    open_chains, done = {}, []
    for k, step in enumerate(steps):
        single = len(step.outputs) == 1 and not step.takes_sizes
        is_residual = (single and isinstance(step.module, Elementwise) and step.module.op_type == "Add"
                       and len(step.inputs) == 2 and step.inputs[0] != step.inputs[1]
                       and shapes.get(step.inputs[0]) is not None
                       and shapes.get(step.inputs[0]) == shapes.get(step.inputs[1]))
        group = None
        if single and (len(step.inputs) == 1 or is_residual):
            for position, name in enumerate(step.inputs):
                chain = open_chains.get(name)
                if chain is not None and readers.get(name) == 1:
                    del open_chains[name]
                    chain.steps.append(step)
                    chain.links.append(step.inputs[1 - position] if is_residual else None)
                    group = chain
                    break
        if group is None:
            if is_residual:
                group = _Group(step, step.inputs[0], step.inputs[1])
            elif single and len(step.inputs) == 1:
                group = _Group(step, step.inputs[0])
            else:
                group = _Group(step, None)
        done.append((k, group))
        if single:
            open_chains[step.outputs[0]] = group
    last_index = {}
    for k, group in done:
        last_index[group] = (k, group)  # a group's last position in the steps
    return [group for _, group in sorted(last_index.values(), key=lambda item: item[0])]


def _np_type(elem_type):
    if not elem_type:
        return None
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
