"""nc.onnx.load: an ONNX file or bytes -> an OnnxModel of netcl layers.

The passes, in order: read and check the graph (graph.py), decide which initializers the layers own
(converters.owned_initializers), fold the shape arithmetic into constants (folding.py), and convert each
remaining node into a module (converters.py).
"""
from __future__ import annotations

from ..runtime.device import resolve_device
from . import converters
from .folding import fold
from .graph import Graph, Node, read_model
from .model import OnnxModel


# Rounds of shape inference over the folded graph: each may fix the shapes after one more Reshape whose
# target came from Shape (ShuffleNet's stages chain them).
MAX_REFINEMENTS = 64


def load(path_or_bytes, device=None) -> OnnxModel:
    """Import an ONNX model (a path, or the file's bytes) as an nc.nn.Module of netcl layers on ``device``.

    Convolutions become nc.nn.Conv2d (planned per layer and pass like any other), BatchNormalization
    nc.nn.BatchNorm2d (batch statistics in .train(), running ones in .eval()), Gemm nc.nn.Linear, and so
    on; parameters keep the graph's initializer names as state_dict keys. The model starts in eval mode.
    Anything netcl cannot import faithfully raises nc.OnnxError naming the node, operator and opset.
    """
    model, where = read_model(path_or_bytes)
    graph = Graph(model, where)
    device = resolve_device(device)
    owned = converters.owned_initializers(graph)
    constants, nodes = fold(graph, set(owned))
    for _ in range(MAX_REFINEMENTS):
        if not any(n.op_type in ("Shape", "Size") or any(constants.get(i) is not None and constants[i].dtype == object
                                                         for i in n.inputs) for n in nodes):
            break
        try:
            refined = graph.refine_shapes(constants, nodes)
        except Exception:  # a node onnx cannot re-create: the shapes stay as the first inference gave them
            refined = False
        if not refined:
            break
        constants, nodes = fold(graph, set(owned))
    root = OnnxModel(graph, device)
    builder = converters.Builder(graph, constants, owned, root, device)
    for node in nodes:
        convert = converters.CONVERTERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if convert is None:
            raise _unsupported(graph, node)
        convert(builder, node)
    for name in graph.outputs:
        if name in constants:
            builder.constant_input(Node(name, "Constant", "", [], [name]), name)
    return root.finish(builder).keep_source(model).eval()


def _unsupported(graph: Graph, node):
    supported = converters.supported_operators()
    if node.op_type in ("Shape", "Size"):
        return graph.error(node, f"reads the shape of {node.inputs[0]!r}, which the graph's shape inference does not "
                           "know", supported=supported)
    domain = f" of the domain {node.domain!r}" if node.domain not in ("", "ai.onnx") else ""
    return graph.error(node, f"the operator {node.op_type}{domain} is not supported by netcl's ONNX import; "
                       f"supported: {', '.join(supported)}", supported=supported, domain=node.domain)
