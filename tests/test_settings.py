"""netcl.settings: the one reader of the environment, its parsers and errors, and the README's table."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import netcl as nc
from netcl import settings

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "netcl"


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "settings.py")


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read the environment: any use of os.environ but as the target of an assignment
    (``os.environ[NAME] = value``, for a driver or child), and any os.getenv or ``from os import environ``."""
    stores = {id(node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr in ("getenv", "getenvb", "environb") or (node.attr == "environ" and id(node) not in stores):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv", "environb", "getenvb") for alias in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def test_only_the_settings_module_reads_the_environment():
    offenders = [f"{path.relative_to(REPO)}:{line}" for path in _modules()
                 for line in _environment_reads(ast.parse(path.read_text(), str(path)))]
    assert not offenders, f"read the environment through netcl.settings instead: {', '.join(offenders)}"


def test_the_environment_check_finds_reads():
    code = ("import os\nfrom os import getenv\na = os.environ.get('NETCL_X')\nb = os.environ['Y']\n"
            "c = 'Z' in os.environ\nos.environ['W'] = '1'\nd = dict(os.environ)\n")
    assert _environment_reads(ast.parse(code)) == [2, 3, 4, 5, 7]


def test_every_variable_named_in_the_package_is_a_setting():
    known = {s.name for s in settings.ALL}
    named = {m for path in PACKAGE.rglob("*.py") for m in re.findall(r"\bNETCL_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert named <= known, f"not in netcl.settings: {sorted(named - known)}"
    assert len({s.name for s in settings.ALL}) == len(settings.ALL)


def _readme_settings_table() -> dict[str, str]:
    """{variable: default column} of the README's settings table."""
    lines = (REPO / "README.md").read_text().splitlines()
    header = lines.index("| variable | default | effect |")
    rows = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    return rows


def test_the_readme_lists_every_setting_once():
    table = _readme_settings_table()
    listed = [name for name in table if name.startswith("NETCL_")]
    assert sorted(listed) == sorted(s.name for s in settings.ALL if s.name.startswith("NETCL_"))
    for setting in settings.ALL:
        assert setting.name in table, f"{setting.name} is missing from the README's settings table"
        written = table[setting.name].strip("`")
        if setting.default is None:
            assert written == "unset", (setting.name, written)
        elif isinstance(setting.default, bool):
            assert written == str(int(setting.default)), (setting.name, written)
        elif isinstance(setting.default, float):
            assert float(written) == setting.default, (setting.name, written)
        else:
            assert written == setting.default, (setting.name, written)


def test_read_when_asked_and_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    assert settings.CACHE.get() is True and not settings.CACHE.is_set()
    monkeypatch.setenv("NETCL_CACHE", "0")
    assert settings.CACHE.get() is False
    monkeypatch.setenv("NETCL_CACHE", "  ")
    assert settings.CACHE.get() is True and settings.CACHE.text() is None
    monkeypatch.setenv("NETCL_CACHE", " Off ")
    assert settings.CACHE.get() is False


@pytest.mark.parametrize("setting, text, value", [
    (settings.DEBUG, "yes", True), (settings.DEBUG, "0", False),
    (settings.CONV_WORKSPACE_LIMIT, "1K", 1024), (settings.CONV_WORKSPACE_LIMIT, "256MiB", 256 << 20),
    (settings.CONV_WORKSPACE_LIMIT, "1000", 1000),
    (settings.CONV_STRATEGY, "auto", None), (settings.CONV_STRATEGY, "Direct", "direct"),
    (settings.CONV_PLAN_MODE, "MEASURE", "measure"), (settings.DDP_TRANSPORT, "shared-host", "shared-host"),
    (settings.BENCH_CONV_MAX_S, "2.5", 2.5), (settings.DATA, "~/mnist", Path("~/mnist").expanduser()),
    (settings.DEVICE, "pocl 3.1", "pocl 3.1"),
])
def test_values_are_parsed_to_their_type(monkeypatch, setting, text, value):
    monkeypatch.setenv(setting.name, text)
    assert setting.get() == value


@pytest.mark.parametrize("setting, text, expected", [
    (settings.CACHE, "maybe", "1 or 0"),
    (settings.CONV_WORKSPACE_LIMIT, "lots", "byte count"),
    (settings.CONV_WORKSPACE_LIMIT, "-5", "byte count"),
    (settings.CONV_PLAN_MODE, "guess", "online, heuristic, measure or exhaustive"),
    (settings.DDP_TRANSPORT, "carrier-pigeon", "auto, mpi, shared or shared-host"),
    (settings.BENCH_CONV_MAX_S, "0", "seconds > 0"),
    (settings.BIND_CORES, "2", "1 or 0"),
])
def test_a_bad_value_names_the_variable(monkeypatch, setting, text, expected):
    monkeypatch.setenv(setting.name, text)
    with pytest.raises(nc.SettingError, match=f"{setting.name}='{re.escape(text)}'.*{expected}") as caught:
        setting.get()
    assert isinstance(caught.value, ValueError)
    assert caught.value.variable == setting.name and caught.value.value == text


def test_a_value_chosen_in_code_wins_and_reaches_child_processes(monkeypatch):
    monkeypatch.setattr(settings, "_chosen", {})
    monkeypatch.setenv("NETCL_DETERMINISTIC", "0")
    nc.use_deterministic(True)
    assert settings.DETERMINISTIC.get() is True and nc.deterministic_enabled()
    env = settings.child_environment(NETCL_DEVICE="1", PYTHONPATH=None, python_path_first="/here")
    assert env["NETCL_DETERMINISTIC"] == "1" and env["NETCL_DEVICE"] == "1" and env["PYTHONPATH"] == "/here"
    with pytest.raises(nc.SettingError, match="NETCL_DETERMINISTIC"):
        settings.DETERMINISTIC.choose("sometimes")
    assert settings.DETERMINISTIC.get() is True  # a refused choice keeps the previous one
    settings.DETERMINISTIC.choose(None)
    assert settings.DETERMINISTIC.get() is False


def test_launcher_placement(monkeypatch):
    for pair in settings.LAUNCHER_PLACEMENT:
        for name in pair:
            monkeypatch.delenv(name, raising=False)
    assert settings.launcher_placement() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert settings.launcher_placement() is None  # the size is missing
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert settings.launcher_placement() == (1, 4)
