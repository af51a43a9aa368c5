"""Kernel-level tests meant to run on the Oclgrind simulator (ci/oclgrind.sh); they also run on any device
with ``pytest -m oclgrind tests/oclgrind``, which checks the results but not the memory accesses.

Under Oclgrind (``oclgrind --check-api --data-races --uninitialized python3 -m pytest ...``) every report
the simulator writes to stderr (an invalid read or write, a data race, an uninitialized value reaching
memory or control flow, a failed OpenCL call) lands in the test's captured stderr; the hook below turns
such a report into a failure of that test, quoting it. A few OpenCL API "errors" are pyopencl probing
optional device properties Oclgrind does not implement (oclgrind_reports.BENIGN_API_ERRORS).

While tests run, every kernel launch is recorded (template, kernel name, template parameters). At the end
the session prints how many kernels and variants ran and which kernels of kernels/*.cl never ran;
NETCL_OCLGRIND_REPORT=path writes the same as JSON, and NETCL_OCLGRIND_REQUIRE_COVERAGE=1 makes a kernel
that never ran fail the session (ci/oclgrind.sh sets both).
"""
from __future__ import annotations

import collections
import fnmatch
import importlib
import json
import os
import pkgutil
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import netcl
from netcl.runtime import kernels as _kernels_mod
from netcl.runtime import memory as _memory_mod

# ---- Oclgrind 21.10's blind spots (docs/explanation/testing.md) ------------------------------------------

_ON_OCLGRIND = False  # set at collection when the default device is Oclgrind

# Oclgrind 21.10's uninitialized-value checker aborts a kernel at LLVM's `freeze` instruction (which the
# optimizer inserts, e.g. for a division and a remainder by the same value): the kernel then does not run
# at all. Unoptimized builds have no freeze.
OCLGRIND_BUILD_OPTIONS = ("-cl-opt-disable",)


_original_fill = _memory_mod.fill


def _fill_by_upload(device, buffer, value, nbytes, offset_bytes=0):
    """memory.fill as a host upload. Oclgrind 21.10 does not mark memory written by clEnqueueFillBuffer
    as initialized, so every kernel reading a zero-filled buffer (col2im's scatter-add target, ...) would
    be reported; uploads it tracks correctly."""
    value = np.asarray(value)
    if nbytes == 0:
        return None
    host = np.full(int(nbytes) // value.itemsize, value, dtype=value.dtype)
    return _memory_mod.upload(device, buffer, host, offset_bytes)


_original_allocate = _memory_mod.allocate
_held_buffers: list = []
_held_bytes = [0]


def _allocate_and_hold(device, nbytes):
    """memory.allocate, keeping every buffer alive until the session ends. Oclgrind 21.10 reuses the
    address of a released buffer for the next allocation, and its uninitialized-value tracking then keeps
    the old buffer's extent: in a larger new buffer everything past the old size reads as uninitialized
    although it was written (a small layer then a larger one reports thousands of false positives, the
    reverse order none, and nothing is reported when no buffer is ever released; docs/explanation/testing.md).
    ci/oclgrind.sh raises the simulator's global memory size to make room."""
    buffer = _original_allocate(device, nbytes)
    _held_buffers.append(buffer)
    _held_bytes[0] += int(nbytes)
    return buffer


def _install_patches() -> None:
    """Point every netcl module's `launch` at the recorder and, on Oclgrind, `fill` and `allocate` at the
    forms above (modules import them by name, so each module's reference is replaced)."""
    swaps = {id(_original_launch): _recording_launch}
    if _ON_OCLGRIND:
        swaps[id(_original_fill)] = _fill_by_upload
        swaps[id(_original_allocate)] = _allocate_and_hold
    for name, module in list(sys.modules.items()):
        if name == "netcl" or name.startswith("netcl."):
            for attr in ("launch", "fill", "allocate"):
                replacement = swaps.get(id(getattr(module, attr, None)))
                if replacement is not None:
                    setattr(module, attr, replacement)


# ---- Oclgrind reports ----------------------------------------------------------------------------------

from oclgrind_reports import oclgrind_reports  # noqa: E402  (tests/oclgrind is on sys.path)


def _summarize(reports: list[str]) -> str:
    """Distinct problems (kind, kernel, source line) with counts, each with one full example and the
    rendered netcl source line it points at."""
    groups: dict[tuple, list] = {}
    for r in reports:
        lines = r.splitlines()
        kind = re.sub(r"0x[0-9a-fA-F]+", "ADDR", lines[0].strip())
        kernel = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("Kernel:")), "")
        at = next((ln.strip() for ln in lines if ln.strip().startswith("At line")), "")
        groups.setdefault((kind, kernel, at), []).append(r)
    out = [f"Oclgrind reported {len(reports)} problem(s), {len(groups)} distinct:"]
    for (kind, kernel, at), members in groups.items():
        out.append(f"  {len(members):6d} x {kind} [{kernel}] {at}")
    for (kind, kernel, at), members in list(groups.items())[:6]:
        out.append("")
        out.append(members[0])
        line = re.match(r"At line (\d+)", at)
        if kernel and line:
            out.extend(_source_lines(kernel, int(line.group(1))))
    return "\n".join(out)


def _source_lines(kernel_name: str, line: int) -> list[str]:
    out = []
    for template, name, _options, params in sorted(_test_launches, key=repr):
        if name != kernel_name:
            continue
        try:
            source = _kernels_mod.render(template, **dict(params)).splitlines()
        except Exception:  # noqa: BLE001
            continue
        around = range(max(1, line - 2), min(len(source), line + 2) + 1)
        shown = "\n".join(f"        {n:4d}| {source[n - 1]}" for n in around)
        out.append(f"    rendered kernels/{template} with {dict(params)}:\n{shown}")
        if len(out) >= 2:
            break
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    captured = "\n".join(content for name, content in rep.sections if "stderr" in name and rep.when in name)
    reports = oclgrind_reports(captured)
    if not reports:
        return
    summary = f"during {rep.when}: " + _summarize(reports)
    # thousands of reports would bury the log: the captured stderr keeps its first part only
    rep.sections = [(name, content if len(content) < 20000 else content[:20000] + "\n[... truncated]")
                    for name, content in rep.sections]
    if rep.failed:
        rep.sections.append(("Oclgrind", summary))
    else:
        rep.outcome = "failed"
        rep.longrepr = summary


# ---- launch recording and coverage ---------------------------------------------------------------------

_original_launch = _kernels_mod.launch
_launches: collections.Counter = collections.Counter()
_kernel_keys: dict[int, tuple] = {}
_test_launches: set = set()  # what the current test launched, to quote the source of a report


def _key_of(device, kernel) -> tuple:
    key = _kernel_keys.get(id(kernel))
    if key is None:
        for memo, k in list(device.state.kernels.items()):
            _kernel_keys[id(k)] = memo  # (template, kernel name, options, params)
        key = _kernel_keys.get(id(kernel), ("?", getattr(kernel, "function_name", "?"), (), ()))
    return key


def _recording_launch(device, kernel, *args, **kwargs):
    key = _key_of(device, kernel)
    _launches[key] += 1
    _test_launches.add(key)
    return _original_launch(device, kernel, *args, **kwargs)


def _import_all_netcl() -> None:
    """Import every netcl submodule up front so each one's `launch` can be redirected; a module that does
    not import here is not this job's concern (its own tests report it)."""
    for info in pkgutil.walk_packages(netcl.__path__, "netcl."):
        if info.name.endswith("__main__") or ".bench" in info.name or ".cli" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001
            pass


def template_kernels() -> dict[str, list[str]]:
    """Every `__kernel` definition in every template under kernels/, by template file; a name built by
    the template (``igemm_${MODE}``) becomes a glob pattern (``igemm_*``)."""
    found = {}
    pattern = re.compile(r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+([A-Za-z_$][\w${}]*)\s*\(", re.S)
    for path in sorted(_kernels_mod.kernels_dir().glob("*.cl")):
        text = re.sub(r"<%doc>.*?</%doc>", "", path.read_text(), flags=re.S)
        text = re.sub(r"^\s*##.*$", "", text, flags=re.M)  # Mako comments
        found[path.name] = sorted({re.sub(r"\$\{[^}]*\}", "*", name) for name in pattern.findall(text)})
    return found


def coverage() -> dict:
    kernels = collections.Counter()
    variants = set()
    for (template, name, options, params), count in _launches.items():
        kernels[f"{template}:{name}"] += count
        variants.add((template, name, options, params))
    definitions = [f"{t}:{k}" for t, names in template_kernels().items() for k in names]
    # a kernel no netcl module names is dead code in its template: reported, but nothing can run it
    python = "\n".join(p.read_text() for p in Path(netcl.__file__).parent.rglob("*.py"))
    referenced = [d for d in definitions
                  if re.search(r"\b" + re.escape(d.split(":", 1)[1]).replace(r"\*", r"\w*") + r"\b", python)]
    return {
        "device": netcl.default_device().describe(),
        "kernels_run": len(kernels),
        "variants_run": len(variants),
        "launches": sum(kernels.values()),
        "kernel_definitions": len(definitions),
        "bytes_allocated": _held_bytes[0],
        "never_run": sorted(d for d in referenced if not any(fnmatch.fnmatchcase(k, d) for k in kernels)),
        "unreferenced": sorted(set(definitions) - set(referenced)),
        "per_kernel": {k: {"launches": kernels[k],
                           "variants": sum(1 for v in variants if f"{v[0]}:{v[1]}" == k)} for k in sorted(kernels)},
    }


def _active(session) -> bool:
    return any("oclgrind" in str(getattr(item, "path", item.fspath)) for item in session.items)


def on_oclgrind() -> bool:
    return "oclgrind" in netcl.default_device().platform.lower()


def pytest_collection_finish(session):
    global _ON_OCLGRIND
    if _active(session):
        session.config._netcl_oclgrind = True
        _ON_OCLGRIND = on_oclgrind()
        if _ON_OCLGRIND:
            _kernels_mod.DEFAULT_BUILD_OPTIONS = (tuple(_kernels_mod.DEFAULT_BUILD_OPTIONS)
                                                  + OCLGRIND_BUILD_OPTIONS)
        _import_all_netcl()
        _install_patches()


def pytest_runtest_setup(item):
    _test_launches.clear()
    if getattr(item.config, "_netcl_oclgrind", False):
        _install_patches()  # modules first imported by an earlier test


def pytest_sessionfinish(session, exitstatus):
    if not getattr(session.config, "_netcl_oclgrind", False):
        return
    report = coverage()
    session.config._netcl_oclgrind_report = report
    path = os.environ.get("NETCL_OCLGRIND_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    required = os.environ.get("NETCL_OCLGRIND_REQUIRE_COVERAGE") == "1"
    if report["never_run"] and required and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = getattr(config, "_netcl_oclgrind_report", None)
    if report is None:
        return
    tr = terminalreporter
    tr.section("kernel coverage")
    tr.write_line(f"device: {report['device']}")
    tr.write_line(f"{report['kernels_run']} kernels in {report['variants_run']} template variants ran "
                  f"({report['launches']} launches); kernels/*.cl hold {report['kernel_definitions']} "
                  f"__kernel definitions")
    for name, info in report["per_kernel"].items():
        tr.write_line(f"  {name:45s} {info['variants']:4d} variants {info['launches']:6d} launches")
    if report["never_run"]:
        tr.write_line("never ran (add a kernel-level test in tests/oclgrind/): " + ", ".join(report["never_run"]))
    if report["unreferenced"]:
        tr.write_line("defined in kernels/ but named by no netcl module (dead code): "
                      + ", ".join(report["unreferenced"]))
