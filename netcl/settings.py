"""Every environment variable netcl reads, each parsed here and nowhere else.

Library code asks this module (``settings.CACHE.get()``), never ``os.environ``. A setting is read each
time it is asked for, so a variable set after import (by a launcher, or by a test's
``monkeypatch.setenv``) counts from the next call; nothing is cached. Each setting has one parser: an
empty value counts as unset, and a value the parser refuses raises :class:`netcl.SettingError` naming
the variable, the value and what it accepts.

A process can also choose a value in code, which wins over the environment and is passed on to the child
processes netcl starts (:func:`child_environment`): ``nc.use_deterministic`` does so for
``NETCL_DETERMINISTIC``, and the command line's ``--debug`` for ``NETCL_DEBUG``.

Besides its own ``NETCL_*`` settings netcl reads a few variables of other programs: pyopencl's device
selector (``PYOPENCL_CTX``), and, to leave a user's choice alone, whether the ICD loader's or a CPU
driver's variable is set (:func:`environment_has`); MPI launchers' placement variables say which rank
runs where (:func:`launcher_placement`). The README's settings table lists the same settings as
:data:`ALL` (tests/test_settings.py checks).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import SettingError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    word = text.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("1 or 0 (also true/false, yes/no, on/off)")


def _text(text: str) -> str:
    return text


def _directory(text: str) -> Path:
    return Path(text).expanduser()


def _byte_count(text: str) -> int:
    digits = text.upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(digits[-1:], 1)
    digits = digits[:-1] if scale > 1 else digits
    try:
        value = float(digits) * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError("a byte count ≥ 0 such as 268435456 or 256M (suffixes K, M, G, T)")
    return int(value)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError("a number of seconds > 0")
    return value


def _one_of(*choices: str) -> Callable[[str], str]:
    listed = f"{', '.join(choices[:-1])} or {choices[-1]}"

    def parse(text: str) -> str:
        word = text.lower()
        if word not in choices:
            raise ValueError(listed)
        return word
    return parse


def _strategy_name(text: str) -> str | None:
    # Which names exist is the strategy registry's to say (netcl.ops.conv_registry, which also takes
    # strategies registered at run time): an unknown one raises a ShapeError listing them where it is used.
    name = text.lower()
    return None if name == "auto" else name


@dataclass(frozen=True)
class Setting:
    """One environment variable: its parser, its value when unset and what it changes."""
    name: str
    parse: Callable[[str], object] = field(repr=False)
    default: object
    effect: str = field(repr=False)

    def text(self) -> str | None:
        """The value as written (chosen in code, else in the environment), or None when unset or empty."""
        value = _chosen.get(self.name)
        if value is None:
            value = os.environ.get(self.name)
        value = value.strip() if value is not None else ""
        return value or None

    def get(self):
        """The parsed value, or the default when unset."""
        text = self.text()
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise SettingError(f"{self.name}={text!r} is not valid: expected {exc}", variable=self.name,
                               value=text) from None

    def is_set(self) -> bool:
        return self.text() is not None

    def choose(self, value: str | None) -> None:
        """Make ``value`` (as it would be written in the environment) this process's value and its
        children's, over the environment; None follows the environment again. Checked at once."""
        if value is None:
            _chosen.pop(self.name, None)
            return
        previous = _chosen.get(self.name)
        _chosen[self.name] = str(value)
        try:
            self.get()
        except SettingError:
            self.choose(previous)
            raise


# Values chosen in code (Setting.choose), as text: what use_deterministic and --debug set.
_chosen: dict[str, str] = {}

DEVICE = Setting(
    "NETCL_DEVICE", _text, None,
    "the default device: an index into nc.devices(), or words that must each occur in the platform's or "
    "device's name, vendor, version or kind")
OPENCL_CONTEXT = Setting(
    "PYOPENCL_CTX", _text, None,
    "pyopencl's device selector (platform:device, or an index): the default device when NETCL_DEVICE is unset")
CONFIG_DIR = Setting(
    "NETCL_CONFIG_DIR", _directory, None,
    "where ci/setup.sh records the OpenCL vendors directory it wrote (unset: the user's config directory)")
CACHE = Setting(
    "NETCL_CACHE", _flag, True,
    "0: no on-disk caches at all (kernels, tuning, device figures and conv plans live in the process only)")
CACHE_DIR = Setting(
    "NETCL_CACHE_DIR", _directory, None,
    "where compiled kernels, tuning results, device figures and conv plans live (unset: the user's cache "
    "directory)")
DEFER_BUILDS = Setting(
    "NETCL_DEFER_BUILDS", _flag, True,
    "0: a fresh process's first training step builds every kernel it will keep, instead of running a "
    "product or convolution whose own kernel is not built yet on one that is")
DETERMINISTIC = Setting(
    "NETCL_DETERMINISTIC", _flag, False,
    "1: only kernels whose result does not depend on scheduling (as nc.use_deterministic(True))")
DEBUG = Setting(
    "NETCL_DEBUG", _flag, False,
    "1: kernels are built without -w and every non-empty build log is printed (the command line's --debug)")
DATA = Setting(
    "NETCL_DATA", _directory, None,
    "the directory holding the four MNIST IDX files (or their mnist/ sub-directory)")
CONV_STRATEGY = Setting(
    "NETCL_CONV_STRATEGY", _strategy_name, None,
    "a convolution strategy every conv2d called with strategy=\"auto\" runs (auto: the planner chooses)")
CONV_PLAN_MODE = Setting(
    "NETCL_CONV_PLAN_MODE", _one_of("online", "heuristic", "measure", "exhaustive"), "online",
    "how conv2d's planner chooses: online (training measures its choices over the first steps, other "
    "calls use the heuristic), heuristic (no kernel runs), measure or exhaustive (times candidates once "
    "per layer and stores the plan)")
CONV_WORKSPACE_LIMIT = Setting(
    "NETCL_CONV_WORKSPACE_LIMIT", _byte_count, None,
    "the conv planner's workspace budget in bytes, or with a K/M/G suffix (unset: the smaller of the "
    "device's largest allocation and half its memory)")
DDP_TRANSPORT = Setting(
    "NETCL_DDP_TRANSPORT", _one_of("auto", "mpi", "shared", "shared-host"), "auto",
    "how DistributedDataParallel averages gradients: auto (shared memory when every rank is on one node, "
    "else MPI), mpi, shared (as auto on one node; an error across nodes) or shared-host (shared memory, "
    "summed on the host)")
BIND_CORES = Setting(
    "NETCL_BIND_CORES", _flag, True,
    "0: init_process_group leaves ranks that share a node unpinned (by default each gets its own cores "
    "when the launcher bound none)")
REFERENCE_PYTHON = Setting(
    "NETCL_REFERENCE_PYTHON", _text, None,
    "the interpreter that runs PyTorch for the benchmarks' comparisons (unset: this one)")
REFERENCE_DEVICE = Setting(
    "NETCL_REFERENCE_DEVICE", _text, "cpu",
    "the torch device the benchmarks' PyTorch side runs on, e.g. cuda to compare netcl on a GPU with "
    "PyTorch on the same GPU (onnxruntime stays on the CPU)")
BENCH_CONV_MAX_S = Setting(
    "NETCL_BENCH_CONV_MAX_S", _positive_seconds, 60.0,
    "`netcl bench conv` skips (and reports) a case predicted to take longer than this many seconds a run")

ALL = (DEVICE, OPENCL_CONTEXT, CONFIG_DIR, CACHE, CACHE_DIR, DEFER_BUILDS, DETERMINISTIC, DEBUG, DATA,
       CONV_STRATEGY, CONV_PLAN_MODE, CONV_WORKSPACE_LIMIT, DDP_TRANSPORT, BIND_CORES, REFERENCE_PYTHON,
       REFERENCE_DEVICE, BENCH_CONV_MAX_S)


def use_deterministic(flag: bool = True) -> None:
    """Make every op choose a kernel whose result does not depend on scheduling (e.g. col2im by gather
    instead of atomic scatter-add), over NETCL_DETERMINISTIC."""
    DETERMINISTIC.choose("1" if flag else "0")


def deterministic_enabled() -> bool:
    return DETERMINISTIC.get()


# MPI launchers' variables for (rank on this node, ranks on this node): MPICH/Hydra, Open MPI, Slurm.
LAUNCHER_PLACEMENT = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                      ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                      ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"))


def launcher_placement() -> tuple[int, int] | None:
    """(local rank, ranks on this node) as the first launcher that set both of its variables says."""
    for rank_var, size_var in LAUNCHER_PLACEMENT:
        rank, size = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
        if rank.isdigit() and size.isdigit():
            return int(rank), int(size)
    return None


def environment_has(name: str) -> bool:
    """Whether the environment sets another program's variable (the ICD loader's OCL_ICD_VENDORS, a CPU
    driver's thread count), which netcl then leaves as the user set it."""
    return name in os.environ


def child_environment(python_path_first: str | None = None, **changes: str | None) -> dict[str, str]:
    """The environment for a child process netcl starts: this one's, the values chosen in code
    (:meth:`Setting.choose`), then ``changes`` (None removes a variable); ``python_path_first`` goes in
    front of PYTHONPATH."""
    env = dict(os.environ)
    env.update(_chosen)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    if python_path_first:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (python_path_first, env.get("PYTHONPATH"))))
    return env
