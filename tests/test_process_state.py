"""What netcl keeps outside the per-device state, found by reading the source (ast): every module-level
table written at run time, every ``global`` rebinding and every memoizing decorator is one of the
process-wide things docs/architecture.md lists, each for a reason given here; no table in runtime/ or ops/
is keyed by ``id()``; the environment is written only where a driver or a child reads it."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "netcl"

MUTABLE_CALLS = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter", "WeakValueDictionary",
                 "WeakKeyDictionary", "WeakSet", "local"}
MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend", "insert", "remove",
            "discard", "appendleft"}
MEMOIZERS = ("lru_cache", "cache", "cached_property")

# (file, name): why it is process-wide rather than a device's. Each is named in docs/architecture.md.
PROCESS_WIDE = {
    ("autograd/function.py", "_leaf_hook_count"): "how many post-accumulate hooks exist: backward skips "
                                                  "counting contributions while none does",
    ("autograd/function.py", "_state"): "the thread's autograd switches (no_grad, the backward callbacks)",
    ("bench/reference_worker.py", "_workloads"): "the benchmark worker process's built workloads",
    ("distributed/process_group.py", "_group"): "the MPI process group: one per process",
    ("onnx/export.py", "EXPORTERS"): "module class -> its exporter, filled by @register at import",
    ("ops/conv_registry.py", "_registry"): "the convolution strategies, BUILTIN plus register()",
    ("ops/conv_registry.py", "_loaded"): "which built-in strategy modules are imported",
    ("random.py", "_host_generator"): "the random streams nc.manual_seed reseeds",
    ("random.py", "_kernel_base"): "the random streams nc.manual_seed reseeds",
    ("random.py", "_kernel_counter"): "the random streams nc.manual_seed reseeds",
    ("random.py", "_initial_seed"): "the random streams nc.manual_seed reseeds",
    ("runtime/binaries.py", "_unsaved"): "binaries waiting for the disk cache (keyed by the cache key)",
    ("runtime/cache.py", "_root_for"): "the cache directory of a setting's value",
    ("runtime/cache.py", "_made_dirs"): "cache directories this process created",
    ("runtime/device.py", "_devices"): "the list of OpenCL devices",
    ("runtime/device.py", "_default"): "the default device",
    ("runtime/device_figures.py", "_overlay"): "the device-figures file's stand-in when NETCL_CACHE=0",
    ("runtime/kernels.py", "templates_digest"): "the kernel templates as this process first read them",
    ("runtime/kernels.py", "_lookup"): "the Mako template loader",
    ("runtime/tuning_db.py", "_memo"): "the in-memory copy of the tuning database file",
    ("runtime/tuning_db.py", "_generation_memo"): "the in-memory copy of the tuning database file",
    ("runtime/tuning_db.py", "_overlay"): "the tuning database's stand-in when NETCL_CACHE=0",
    ("runtime/tuning_db.py", "_overlay_edits"): "the tuning database's stand-in when NETCL_CACHE=0",
    ("settings.py", "_chosen"): "values chosen in code (use_deterministic, --debug) over the environment",
}


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in MUTABLE_CALLS
    return False


def process_wide_state(tree: ast.Module) -> dict[str, int]:
    """{name: line} of the module's state that run time changes: module-level mutable containers that a
    function writes or mutates, thread-local objects, names a ``global`` statement rebinds, functions under
    a memoizer."""
    tables = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _is_mutable(node.value):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    tables[target.id] = node.lineno
    # a thread-local object is state by what it is, whatever writes it
    found = {target.id: node.lineno for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Call) and getattr(node.value.func, "attr", None) == "local"
             for target in node.targets if isinstance(target, ast.Name)}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if not isinstance(function, ast.Lambda) and any(
                any(m in ast.unparse(d) for m in MEMOIZERS) for d in function.decorator_list):
            found.setdefault(function.name, function.lineno)
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                for name in node.names:
                    found.setdefault(name, node.lineno)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id in tables and \
                    node.func.attr in MUTATORS:
                found.setdefault(node.func.value.id, node.lineno)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and \
                            target.value.id in tables:
                        found.setdefault(target.value.id, node.lineno)
    return found


def test_process_wide_state_is_only_what_the_architecture_lists():
    found = {(str(path.relative_to(PACKAGE)), name): line for path in sorted(PACKAGE.rglob("*.py"))
             for name, line in process_wide_state(ast.parse(path.read_text(), str(path))).items()}
    unlisted = [f"netcl/{file}:{line} {name}" for (file, name), line in found.items()
                if (file, name) not in PROCESS_WIDE]
    assert not unlisted, "keep it in device.state (runtime/device_state.py), or list it with its reason:\n" + \
        "\n".join(unlisted)
    gone = sorted(set(PROCESS_WIDE) - set(found))
    assert not gone, f"listed but no longer process-wide state: {gone}"


def test_the_state_finder_sees_writes_globals_and_memoizers():
    code = ("import functools\nA = {}\nB = []\nC = {}\nD = None\n"
            "def f(x):\n    A[x] = 1\n    B.append(x)\n    return C.get(x)\n"
            "def g():\n    global D\n    D = 1\n"
            "@functools.lru_cache(maxsize=None)\ndef h(device):\n    return device\n")
    assert process_wide_state(ast.parse(code)) == {"A": 7, "B": 8, "D": 11, "h": 14}


def _id_keyed_tables(tree: ast.Module) -> list[int]:
    """Lines that store into or look up a table by ``id(...)``: ``t[id(x)]``, ``t.get(id(x))``,
    ``t.setdefault(id(x), ...)``, ``id(x) in t``, ``{id(x): ...}``."""
    def is_id(node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_id(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "setdefault", "pop") and node.args and is_id(node.args[0]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and is_id(node.left) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Dict, ast.DictComp)):
            keys = node.keys if isinstance(node, ast.Dict) else [node.key]
            lines += [node.lineno for key in keys if key is not None and is_id(key)]
    return lines


def test_no_table_in_runtime_or_ops_is_keyed_by_id():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}" for layer in ("runtime", "ops")
                 for path in sorted((PACKAGE / layer).rglob("*.py"))
                 for line in _id_keyed_tables(ast.parse(path.read_text(), str(path)))]
    assert not offenders, "key tables by values (shapes, names, parameters):\n" + "\n".join(offenders)


def test_the_id_finder_sees_id_keys():
    code = "t = {}\nt[id(a)] = 1\nt.get(id(b))\nid(c) in t\nu = {id(d): 1}\nv = id(e)\n"
    assert _id_keyed_tables(ast.parse(code)) == [2, 3, 4, 5]


# Where netcl writes the environment, and for whom: the OpenCL ICD loader reads OCL_ICD_VENDORS at its
# first call; the drivers' thread pools (and MPI's children) read their thread counts at start.
ENVIRONMENT_WRITERS = {"runtime/device.py", "distributed/process_group.py"}


def _environment_writes(tree: ast.Module) -> list[int]:
    """Lines that change the environment: ``os.environ[...] = / del``, os.environ's mutating methods,
    os.putenv and os.unsetenv."""
    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ"
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            lines += [node.lineno for t in targets if isinstance(t, ast.Subscript) and is_environ(t.value)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_environ(node.func.value) and node.func.attr in MUTATORS:
                lines.append(node.lineno)
            elif node.func.attr in ("putenv", "unsetenv"):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_environment_is_written_only_for_a_driver_or_a_child():
    writers = {str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
               if _environment_writes(ast.parse(path.read_text(), str(path)))}
    assert writers == ENVIRONMENT_WRITERS, writers


def test_the_environment_write_finder_sees_writes():
    code = ("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\ndel os.environ['C']\n"
            "os.putenv('D', '3')\nx = os.environ.get('E')\n")
    assert _environment_writes(ast.parse(code)) == [2, 3, 4, 5]
