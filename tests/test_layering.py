"""Imports run downward: the ops and the runtime reach no layer above them, and nothing works around that
with importlib."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "netcl"

# What each lower layer may not import (the autograd engine, netcl.autograd.function, sits below ops).
ABOVE = {
    "runtime": ("netcl.ops", "netcl.autograd", "netcl.nn", "netcl.optim", "netcl.training", "netcl.models",
                "netcl.data", "netcl.distributed", "netcl.cli", "netcl.bench"),
    "ops": ("netcl.autograd.rules", "netcl.nn", "netcl.optim", "netcl.training", "netcl.models", "netcl.data",
            "netcl.distributed", "netcl.cli", "netcl.bench"),
    # DistributedDataParallel's Module (nn/parallel.py) and DistributedSampler (data/) build on it
    "distributed": ("netcl.nn", "netcl.optim", "netcl.training", "netcl.models", "netcl.data", "netcl.cli",
                    "netcl.bench"),
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
    return found


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_lower_layer_imports_nothing_above_it(layer):
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
                 for path in sorted((PACKAGE / layer).rglob("*.py")) for line, module in _imports(path)
                 if module.startswith(ABOVE[layer])]
    assert not offenders, "\n".join(offenders)


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
