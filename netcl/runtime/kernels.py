"""The kernel pipeline: Mako template -> OpenCL source -> program built once per device -> launch.

``get_kernel(device, "gemm.cl", "gemm_tiled", TILE_M=64, ...)`` renders ``kernels/gemm.cl`` with the given
template parameters (every parameter has a default declared in the template's ``<%page args=...>``),
builds it for the device, memoizes the program per context, and keeps the binary on disk keyed by the
rendered source, the build options, the device identity and the cache-format version. ``launch`` and
``PreparedLaunch`` (netcl.runtime.launching, re-exported here) enqueue them.
Binaries are written off the critical path (netcl.runtime.binaries says why and when).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import pyopencl as cl
from mako.lookup import TemplateLookup

from .. import settings
from ..errors import DeviceError, KernelBuildError
from . import binaries
from .binaries import save_binaries  # noqa: F401  (public: fill the disk cache now)
from .cache import CACHE_FORMAT_VERSION, cache_enabled, cache_path
from .device import Device
from .launching import VARYING, PreparedLaunch, launch, local_size_1d, round_up, scalar  # noqa: F401  (public)

DEFAULT_BUILD_OPTIONS = ("-cl-mad-enable",)
# "-w" (a standard OpenCL build option) keeps the driver's compiler quiet: PoCL's clang wrote "11 warnings
# generated." straight to fd 2, into the middle of the training progress bar. Errors still fill the build
# log (KernelBuildError.log). NETCL_DEBUG=1 (the CLI's --debug) builds without it and prints every
# non-empty build log on stderr.
QUIET_BUILD_OPTIONS = ("-w",)


def debug_enabled() -> bool:
    return settings.DEBUG.get()


def build_options(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The options every netcl program is built with, then ``extra``."""
    quiet = () if debug_enabled() else QUIET_BUILD_OPTIONS
    return tuple(DEFAULT_BUILD_OPTIONS) + quiet + tuple(extra)


def kernels_dir() -> Path:
    """The installed copy (netcl/kernels) or, in a source checkout, the repository's kernels/."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if candidate.is_dir() and any(candidate.glob("*.cl")):
            return candidate
    raise DeviceError(f"netcl's kernel templates are missing (looked in {here / 'kernels'} and "
                      f"{here.parent / 'kernels'}); reinstall netcl")


# Templates that no convolution pass launches (the optimizers, losses, pooling, normalization, random
# fills, data-parallel averaging): editing or adding one leaves the conv planner's measured plans and
# calibration valid. A template missing here only costs a needless recalibration.
NOT_IN_CONVOLUTION = frozenset({"adaptive_pool.cl", "batchnorm.cl", "loss.cl", "mean_rows.cl", "optim.cl",
                                "pool.cl", "random.cl"})


@functools.lru_cache(maxsize=4)
def templates_digest(skip: frozenset = frozenset()) -> str:
    """A hash of every kernel template (but those named in ``skip``) as this process first read them.
    Measurements of kernels carry it, so an edited kernel is measured again instead of being ranked by
    its predecessor's times; read once, so an edit during a long run orphans nothing."""
    digest = hashlib.sha256()
    try:
        for path in sorted(kernels_dir().glob("*.cl")):
            if path.name in skip:
                continue
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except (OSError, DeviceError):
        return ""
    return digest.hexdigest()[:16]


def convolution_templates_digest() -> str:
    """The digest the conv planner's plans and calibration carry: the templates a convolution pass may
    launch (GEMM, every strategy's kernels, the copies and maps around them), and no other: a change to an
    optimizer's or a loss's kernel must not send every device back to the uncalibrated fallback."""
    return templates_digest(NOT_IN_CONVOLUTION)


_lookup: TemplateLookup | None = None  # the installation's templates, shared by every device
_lookup_lock = threading.Lock()

# Compiler chatter (PoCL prints vectorizer remarks) is not the user's business; real failures raise
# KernelBuildError with the full log. A filter, not catch_warnings: builds run on several threads.
warnings.filterwarnings("ignore", category=cl.CompilerWarning)


def build_stats(device: Device) -> dict:
    """{source_builds, binary_loads, seconds} of the programs this process made for ``device``."""
    return device.state.table("build statistics") or {"source_builds": 0, "binary_loads": 0, "seconds": 0.0}


def _count_build(device: Device, counter: str, seconds: float) -> None:
    state = device.state
    with state.lock:
        stats = state.table("build statistics")
        if not stats:
            stats.update(source_builds=0, binary_loads=0, seconds=0.0)
        stats[counter] += 1
        stats["seconds"] += seconds


def render(template_name: str, **params) -> str:
    global _lookup
    if _lookup is None:
        with _lookup_lock:
            if _lookup is None:
                _lookup = _template_lookup()
    try:
        template = _lookup.get_template(template_name)
    except Exception as exc:  # mako raises its own TopLevelLookupException
        raise KernelBuildError(f"cannot load kernel template {template_name!r}: {exc}") from exc
    return template.render(**params)


def _template_lookup() -> TemplateLookup:
    # Mako's compiled templates are kept on disk: compiling the templates of a training step is the
    # largest part of a warm start otherwise. Kept per content of the templates, not per folder: Mako's own staleness test compares whole-second mtimes, so a
    # template edited within a second of its compilation ran the old kernel in every later process.
    folder = hashlib.sha256(f"{kernels_dir()}|{templates_digest()}".encode()).hexdigest()[:16]
    modules = str(cache_path("templates", folder, "x").parent) if cache_enabled() else None
    return TemplateLookup(directories=[str(kernels_dir())], strict_undefined=True, module_directory=modules)


def _cache_key(device: Device, source: str, options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (str(CACHE_FORMAT_VERSION), device.identity, " ".join(options), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _save_failed_source(key: str, source: str) -> str:
    path = cache_path("failed", f"{key[:24]}.cl") if cache_enabled() else None
    if path is None:
        import tempfile
        fd, name = tempfile.mkstemp(prefix="netcl-failed-", suffix=".cl")
        os.close(fd)
        path = Path(name)
    path.write_text(source)
    return str(path)


def build_program(device: Device, source: str, options: tuple[str, ...] | None = None) -> cl.Program:
    """Build (or fetch from memory or disk) a program for one device. Threads may build different
    programs at the same time; a thread asking for a program that another is building waits for that
    build instead of repeating it. ``options``: build_options() by default."""
    options = build_options() if options is None else tuple(options)
    key = _cache_key(device, source, options)
    state = device.state
    while True:
        with state.lock:
            program = state.programs.get(key)
            if program is not None:
                return program
            in_flight = state.building.get(key)
            if in_flight is None:
                in_flight = state.building[key] = threading.Event()
                break
        in_flight.wait()  # then look again: built, or the builder failed and this thread tries itself
    try:
        program = _load_or_build(device, source, options, key)
        with state.lock:
            state.programs[key] = program
        return program
    finally:
        with state.lock:
            state.building.pop(key, None)
        in_flight.set()


def _load_or_build(device: Device, source: str, options: tuple[str, ...], key: str) -> cl.Program:
    start = time.perf_counter()
    binary_path = cache_path("kernels", key[:2], f"{key}.bin") if cache_enabled() else None
    program = binaries.load(device.context, device.cl_device, binary_path, options, source) if binary_path else None
    if program is not None:
        counter = "binary_loads"
    else:
        try:
            program = cl.Program(device.context, source).build(options=list(options))
        except cl.Error as exc:
            raise KernelBuildError(f"OpenCL build failed on {device.describe()}{_build_hint(str(exc))}",
                                   log=str(exc), options=options,
                                   source_path=_save_failed_source(key, source)) from None
        missing = binaries.missing_kernels(program, source)
        if missing:
            raise KernelBuildError(
                f"the OpenCL driver on {device.describe()} built a program without its kernels "
                f"{', '.join(sorted(missing))} (a driver bug; clearing the driver's own kernel cache, e.g. "
                f"PoCL's ~/.cache/pocl, may help)", log="", options=options,
                source_path=_save_failed_source(key, source))
        counter = "source_builds"
        if debug_enabled():
            _show_build_log(device, program, key)
    if counter == "source_builds" and binary_path is not None:
        binaries.remember(binary_path, program, device)
    _count_build(device, counter, time.perf_counter() - start)
    return program


def _build_hint(log: str) -> str:
    if "unknown target CPU" in log:
        # PoCL names the host CPU with its own LLVM's table; an LLVM older than the CPU answers "generic",
        # which that clang refuses for x86 (the PoCL 3.0 wheel, LLVM 14, on AMD Zen 5;
        # docs/explanation/gemm.md).
        return (" (this driver's compiler does not know this CPU; no setting of that driver changes the "
                "target: use a driver built with a newer LLVM, e.g. the distribution's PoCL)")
    return ""


def _show_build_log(device: Device, program: cl.Program, key: str) -> None:
    try:
        log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
    except cl.Error:
        return
    if log and log.strip():
        sys.stderr.write(f"[netcl] build log of program {key[:12]} on {device.describe()}:\n{log.rstrip()}\n")


def get_kernel(device: Device, template_name: str, kernel_name: str, options: tuple[str, ...] = (),
               **params) -> cl.Kernel:
    """A built kernel from a template; memoized per device on (template, kernel, options, parameters).
    The program holds every kernel of the template: on PoCL a further kernel in a program costs a small
    fraction of the program's build, so kernels rendered with the same parameters share one build."""
    state = device.state
    fast = (template_name, kernel_name, options, *params.items())
    kernel = state.kernels_by_call.get(fast)
    if kernel is not None:
        return kernel
    memo = (template_name, kernel_name, options, tuple(sorted(params.items())))
    kernel = state.kernels.get(memo)
    if kernel is None:
        source = render(template_name, **params)
        program = build_program(device, source, build_options(options))
        try:
            kernel = cl.Kernel(program, kernel_name)  # programs are shared across keys: no getattr cache
        except (AttributeError, cl.Error) as exc:
            raise KernelBuildError(f"template {template_name} has no kernel {kernel_name!r}: {exc}") from None
    with state.lock:
        kernel = state.kernels.setdefault(memo, kernel)
        if len(state.kernels_by_call) >= 4096:
            state.kernels_by_call.clear()
        state.kernels_by_call[fast] = kernel
    return kernel


def built_variants(device: Device) -> list[tuple]:
    """((template, kernel, options, sorted parameter items), work-group sizes launched) of every kernel
    made so far on ``device``."""
    state = device.state
    with state.lock:
        return [(key, frozenset(getattr(kernel, "_netcl_local_sizes", ()))) for key, kernel in state.kernels.items()]


def built_variants_of(device: Device, template_name: str, kernel_name: str) -> list[tuple[dict, frozenset]]:
    """(template parameters, work-group sizes launched) of every variant of one kernel made so far on
    ``device`` with the default build options, oldest first."""
    return [(dict(items), launched) for (template, name, options, items), launched in built_variants(device)
            if (template, name, options) == (template_name, kernel_name, ())]


def is_built(device: Device, template_name: str, options: tuple[str, ...] = (), **params) -> bool:
    """Whether a template variant's program is at hand without compiling: built in this process, or its
    binary in the disk cache."""
    opts = build_options(options)
    key = _cache_key(device, render(template_name, **params), opts)
    if key in device.state.programs:
        return True
    return cache_enabled() and cache_path("kernels", key[:2], f"{key}.bin").exists()
