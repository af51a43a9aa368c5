"""Imports run downward: the ops and the runtime reach no layer above them, and nothing works around that
with importlib."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "netcl"

# What each layer may not import (the autograd engine, netcl.autograd.function, sits below ops; the rules
# above them). From the top: cli and bench, training, onnx, models and dense, nn/optim/data, distributed,
# the core (module.py, tensor.py ...), tuning above ops, ops, runtime (docs/architecture.md).
_TOP = ("netcl.cli", "netcl.bench", "netcl.training")
_RULES = tuple(f"netcl.autograd.{path.stem}" for path in sorted((PACKAGE / "autograd").glob("rules*.py")))
ABOVE = {
    "runtime": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                       "netcl.distributed", "netcl.module", "netcl.tuning", "netcl.ops", "netcl.autograd"),
    "ops": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                   "netcl.distributed", "netcl.module", "netcl.tuning") + _RULES,
    "tuning": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                      "netcl.distributed"),
    "module.py": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                         "netcl.distributed", "netcl.tuning"),
    # DistributedDataParallel (distributed/ddp.py) builds on netcl/module.py, below nn
    "distributed": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                           "netcl.tuning"),
    "nn": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.tuning"),
    "optim": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.tuning"),
    "data": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.tuning"),
    "models": _TOP + ("netcl.onnx", "netcl.tuning"),
    "dense": _TOP + ("netcl.onnx", "netcl.tuning"),
    "onnx": _TOP + ("netcl.tuning",),
    "training": ("netcl.cli", "netcl.bench"),
    "autograd": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim", "netcl.data",
                        "netcl.distributed", "netcl.module", "netcl.tuning"),
    "autograd/function.py": _TOP + ("netcl.onnx", "netcl.models", "netcl.dense", "netcl.nn", "netcl.optim",
                                    "netcl.data", "netcl.distributed", "netcl.module", "netcl.tuning",
                                    "netcl.ops") + _RULES,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, at any depth (lazy imports count)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}" if not node.module else base) for alias in node.names]
            if node.module:  # from package import submodule
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                          if _module_file(f"{base}.{alias.name}") is not None]
    return found


def _files(layer: str) -> list[Path]:
    return [PACKAGE / layer] if layer.endswith(".py") else sorted((PACKAGE / layer).rglob("*.py"))


def _is_within(module: str, packages: tuple) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_lower_layer_imports_nothing_above_it(layer):
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
                 for path in _files(layer) for line, module in _imports(path) if _is_within(module, ABOVE[layer])]
    assert not offenders, "\n".join(offenders)


def _module_file(module: str) -> Path | None:
    base = PACKAGE.parent / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


# The Tensor type: every layer passes Tensors, and a Tensor's operators and methods (x + y, x.reshape)
# dispatch to autograd's rules at call time. Its lazy imports are the core's one documented cycle, not a
# step of anyone's call path.
TENSOR_TYPE = ("netcl.tensor", "netcl.tensor_math", "netcl.tensor_shape", "netcl.factories")


def _reached_from(module: str) -> dict[str, str]:
    """Every netcl module that importing ``module`` and calling into it can import, lazy imports included,
    each with the module that imports it (not following the Tensor type's own imports)."""
    reached, todo = {module: ""}, [module]
    while todo:
        current = todo.pop()
        path = _module_file(current)
        if path is None or current in TENSOR_TYPE:  # (a name imported from a package has no file)
            continue
        for _, imported in _imports(path):
            if imported.startswith("netcl.") and imported not in reached:
                reached[imported] = current
                todo.append(imported)
    return reached


def test_the_convolutions_call_path_runs_downward():
    """nn.Conv2d -> nn.functional.conv2d -> ops.conv2d (its Function) -> the chooser -> a strategy ->
    runtime's launch: nothing reached from ops.conv2d belongs to a layer above ops."""
    assert "netcl.nn.functional" in {m for _, m in _imports(PACKAGE / "nn" / "layers.py")}
    assert "netcl.ops.conv2d" in {m for _, m in _imports(PACKAGE / "nn" / "functional.py")}
    above_ops = ABOVE["ops"]
    reached = _reached_from("netcl.ops.conv2d")
    offenders = [f"{via} imports {m}" for m, via in reached.items() if _is_within(m, above_ops)]
    assert not offenders, "\n".join(offenders)
    assert "netcl.ops.conv_chooser" in reached and "netcl.runtime.launching" in reached


def test_the_import_resolution_sees_relative_imports():
    ops_conv2d = dict((module, line) for line, module in _imports(PACKAGE / "ops" / "conv2d.py"))
    assert "netcl.autograd.function" in ops_conv2d and "netcl.ops.conv_chooser" in ops_conv2d


def _cycle(graph: dict) -> list:
    """A cycle of ``graph`` ({node: {nodes it imports}}) as a list of nodes, or []."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return []
    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return []


def test_the_convolution_modules_import_one_way():
    """The convolution's modules (netcl/ops/conv*.py and what they import from ops) form no import cycle,
    lazy imports included: the chooser sits above the trials, the trials above the planner."""
    graph = {}
    todo = [f"netcl.ops.{path.stem}" for path in sorted((PACKAGE / "ops").glob("conv*.py"))]
    while todo:
        module = todo.pop()
        if module in graph:
            continue
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        graph[module] = {m for _, m in _imports(path) if m.startswith("netcl.ops.")
                         and (PACKAGE.parent / (m.replace(".", "/") + ".py")).exists()}
        todo += sorted(graph[module])
    assert _cycle(graph) == [], " -> ".join(_cycle(graph))
    assert "netcl.ops.conv_chooser" not in graph["netcl.ops.conv2d_planner"] | graph["netcl.ops.conv_online"]


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_importlib_below_the_command_line():
    users = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                   if any(module == "importlib" or module.startswith("importlib.") for _, module in _imports(path)))
    # netcl/__init__.py loads its subpackages on first use (PEP 562); the command line dispatches to the
    # module a subcommand names. Both import downward.
    assert set(users) <= {"netcl/__init__.py", "netcl/cli/main.py", "netcl/cli/bench.py", "netcl/cli/tune.py"}, users


def test_ops_make_no_graph_through_tensor_methods():
    """Ops make a tensor contiguous with ops.elementwise.as_contiguous, not Tensor.contiguous (whose rule
    lives above ops); numpy arrays have no such methods, so any call of them in ops/ is a Tensor's."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .{node.func.attr}()"
                 for path in sorted((PACKAGE / "ops").rglob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("contiguous", "detach", "requires_grad_", "backward")]
    assert not offenders, "\n".join(offenders)
