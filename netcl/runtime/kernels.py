"""The kernel pipeline: Mako template -> OpenCL source -> program built once per device -> launch.

``get_kernel(device, "gemm.cl", "gemm_tiled", TILE_M=64, ...)`` renders ``kernels/gemm.cl`` with the given
template parameters (every parameter has a default declared in the template's ``<%page args=...>``),
builds it for the device, memoizes the program per context, and keeps the binary on disk keyed by the
rendered source, the build options, the device identity and the cache-format version. ``launch`` (and
``PreparedLaunch``, for a launch repeated with mostly unchanged arguments) are the only places that
enqueue kernels; they turn driver failures into netcl errors.
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

import numpy as np
import pyopencl as cl
from mako.lookup import TemplateLookup

from ..errors import DeviceError, DeviceMemoryError, KernelBuildError
from . import binaries
from .binaries import save_binaries  # noqa: F401  (public: fill the disk cache now)
from .cache import CACHE_FORMAT_VERSION, cache_enabled, cache_path
from .device import Device

DEFAULT_BUILD_OPTIONS = ("-cl-mad-enable",)
# "-w" (a standard OpenCL build option) keeps the driver's compiler quiet: PoCL's clang wrote "11 warnings
# generated." straight to fd 2, into the middle of the training progress bar. Errors still fill the build
# log (KernelBuildError.log). NETCL_DEBUG=1 (the CLI's --debug) builds without it and prints every
# non-empty build log on stderr.
QUIET_BUILD_OPTIONS = ("-w",)


def debug_enabled() -> bool:
    return os.environ.get("NETCL_DEBUG", "0").strip().lower() not in ("", "0", "false", "no", "off")


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


@functools.lru_cache(maxsize=1)
def templates_digest() -> str:
    """A hash of every kernel template as this process first read them. Measurements of kernels (the conv
    planner's plans and calibration) carry it, so an edited kernel is measured again instead of being
    ranked by its predecessor's times; read once, so an edit during a long run orphans nothing."""
    digest = hashlib.sha256()
    try:
        for path in sorted(kernels_dir().glob("*.cl")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except (OSError, DeviceError):
        return ""
    return digest.hexdigest()[:16]


_lookup: TemplateLookup | None = None
_programs: dict[tuple, cl.Program] = {}
_kernels: dict[tuple, cl.Kernel] = {}
# The same kernels keyed with the parameters as the caller ordered them (no sort on the hot path), with
# the _kernels table they index: replacing that table (the tests do) empties the index too.
_call_index: tuple = (None, {})
_building: dict[tuple, threading.Event] = {}
_lock = threading.RLock()

# Compiler chatter (PoCL prints vectorizer remarks) is not the user's business; real failures raise
# KernelBuildError with the full log. A filter, not catch_warnings: builds run on several threads.
warnings.filterwarnings("ignore", category=cl.CompilerWarning)
build_stats = {"source_builds": 0, "binary_loads": 0, "seconds": 0.0}


def render(template_name: str, **params) -> str:
    global _lookup
    if _lookup is None:
        # Mako's compiled templates are kept on disk: compiling the eleven templates of a LeNet step cost
        # 0.3-0.6 s of every process's first step, the largest part of a warm start. Kept per content of
        # the templates, not per folder: Mako's own staleness test compares whole-second mtimes, so a
        # template edited within a second of its compilation ran the old kernel in every later process.
        folder = hashlib.sha256(f"{kernels_dir()}|{templates_digest()}".encode()).hexdigest()[:16]
        modules = str(cache_path("templates", folder, "x").parent) if cache_enabled() else None
        _lookup = TemplateLookup(directories=[str(kernels_dir())], strict_undefined=True, module_directory=modules)
    try:
        template = _lookup.get_template(template_name)
    except Exception as exc:  # mako raises its own TopLevelLookupException
        raise KernelBuildError(f"cannot load kernel template {template_name!r}: {exc}") from exc
    return template.render(**params)


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
    memo_key = (id(device.context), _cache_key(device, source, options))
    while True:
        with _lock:
            program = _programs.get(memo_key)
            if program is not None:
                return program
            in_flight = _building.get(memo_key)
            if in_flight is None:
                in_flight = _building[memo_key] = threading.Event()
                break
        in_flight.wait()  # then look again: built, or the builder failed and this thread tries itself
    try:
        program = _load_or_build(device, source, options, memo_key[1])
        with _lock:
            _programs[memo_key] = program
        return program
    finally:
        with _lock:
            _building.pop(memo_key, None)
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
    with _lock:
        build_stats[counter] += 1
        build_stats["seconds"] += time.perf_counter() - start
    return program


def _build_hint(log: str) -> str:
    if "unknown target CPU" in log:
        # PoCL names the host CPU with its own LLVM's table; an LLVM older than the CPU answers "generic",
        # which that clang refuses for x86 (the PoCL 3.0 wheel, LLVM 14, on AMD Zen 5: docs/gemm.md).
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
    """A built kernel from a template; memoized on (device, template, parameters, options). The program
    holds every kernel of the template: on PoCL a program costs 0.14 s to build and each further kernel
    in it about 0.01 s, so kernels rendered with the same parameters share one build."""
    fast = (id(device.context), template_name, kernel_name, options, *params.items())
    table, by_call = _call_index
    if table is _kernels:
        kernel = by_call.get(fast)
        if kernel is not None:
            return kernel
    memo = (id(device.context), template_name, kernel_name, options, tuple(sorted(params.items())))
    kernel = _kernels.get(memo)
    if kernel is not None:
        _remember_call(fast, kernel)
        return kernel
    source = render(template_name, **params)
    program = build_program(device, source, build_options(options))
    try:
        kernel = cl.Kernel(program, kernel_name)  # programs are shared across keys: no getattr cache
    except (AttributeError, cl.Error) as exc:
        raise KernelBuildError(f"template {template_name} has no kernel {kernel_name!r}: {exc}") from None
    with _lock:
        _kernels[memo] = kernel
    _remember_call(fast, kernel)
    return kernel


def _remember_call(key: tuple, kernel) -> None:
    global _call_index
    with _lock:
        table, by_call = _call_index
        if table is not _kernels or len(by_call) >= 4096:
            _call_index = (_kernels, {})
        _call_index[1][key] = kernel


def built_variants() -> list[tuple]:
    """((context id, template, kernel, options, sorted parameter items), work-group sizes launched) of
    every kernel made so far."""
    with _lock:
        return [(key, frozenset(getattr(kernel, "_netcl_local_sizes", ()))) for key, kernel in _kernels.items()]


def built_variants_of(device: Device, template_name: str, kernel_name: str) -> list[tuple[dict, frozenset]]:
    """(template parameters, work-group sizes launched) of every variant of one kernel made so far on
    ``device``'s context with the default build options, oldest first."""
    context = id(device.context)
    return [(dict(items), launched) for (ctx, template, name, options, items), launched in built_variants()
            if (ctx, template, name, options) == (context, template_name, kernel_name, ())]


def is_built(device: Device, template_name: str, options: tuple[str, ...] = (), **params) -> bool:
    """Whether a template variant's program is at hand without compiling: built in this process, or its
    binary in the disk cache."""
    opts = build_options(options)
    key = _cache_key(device, render(template_name, **params), opts)
    with _lock:
        if (id(device.context), key) in _programs:
            return True
    return cache_enabled() and cache_path("kernels", key[:2], f"{key}.bin").exists()


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


_launch_watcher = None  # called with every launched kernel while set (see watch_launches)


def watch_launches(watcher) -> None:
    """From now on call ``watcher(kernel)`` at every launch, with the kernel get_kernel made (None: stop).
    For a while at the start of training (netcl.ops.conv_online): it keeps the binaries that are used."""
    global _launch_watcher
    _launch_watcher = watcher


def launch(device: Device, kernel: cl.Kernel, global_size, local_size, *args, wait_for=None) -> cl.Event:
    """Enqueue one kernel. ``global_size`` is rounded up to a multiple of ``local_size``; the kernel
    itself must guard the tail. Driver failures become DeviceMemoryError / DeviceError."""
    global_size, local_size = _geometry(global_size, local_size)
    if not getattr(kernel, "_netcl_typed", False):
        _declare_scalar_types(kernel, args)
        kernel._netcl_local_sizes = set()  # work-group sizes launched so far (see the first-launch rule)
    try:
        # PoCL generates a kernel's machine code for each work-group size at its first launch. With
        # other kernels queued around it that ran 1.35x slower (LeNet's cold first step: 10.9 s, against
        # 8.1 s when the queue is drained before and after), so a first launch runs on a quiet device.
        new_size = local_size not in kernel._netcl_local_sizes
        first = new_size and device.kind == "cpu"
        if first:
            device.queue.finish()
        event = kernel(device.queue, global_size, local_size, *args, wait_for=wait_for)
        if new_size:
            kernel._netcl_local_sizes.add(local_size)
        if first:
            event.wait()
        device.throttle(event)
        if _launch_watcher is not None:
            _launch_watcher(kernel)
        return event
    except cl.Error as exc:
        raise _launch_error(device, kernel, exc) from None


def _geometry(global_size, local_size):
    if type(global_size) is tuple and (local_size is None or type(local_size) is tuple):
        return _remembered_geometry(global_size, local_size)  # a launch's host cost counts
    return _normalized_geometry(global_size, local_size)  # lists are unhashable: normalized every launch


def _normalized_geometry(global_size, local_size):
    global_size = tuple(int(g) for g in global_size)
    if local_size is not None:
        local_size = tuple(int(x) for x in local_size)
        global_size = tuple(round_up(max(g, 1), l) for g, l in zip(global_size, local_size))
    return global_size, local_size


_remembered_geometry = functools.lru_cache(maxsize=4096)(_normalized_geometry)


def _launch_error(device: Device, kernel: cl.Kernel, exc: cl.Error) -> Exception:
    code = getattr(exc, "code", None)
    if isinstance(exc, cl.MemoryError) or code in (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                                                   cl.status_code.OUT_OF_RESOURCES,
                                                   cl.status_code.OUT_OF_HOST_MEMORY):
        return DeviceMemoryError(f"{device.describe()} ran out of memory launching {kernel.function_name}: {exc}",
                                 available_bytes=device.max_alloc_bytes)
    return DeviceError(f"launching {kernel.function_name} on {device.describe()} failed: {exc}")


# pyopencl's Kernel.set_arg tries a scalar as a memory object, local memory, a sampler and an SVM pointer
# first, each a C++ exception caught: 7.2 µs per numpy scalar on PoCL, against 0.4 µs for handing its bytes
# over directly, which is what pyopencl's own typed invoker does (a GEMM row loop sets three offsets a call).
_set_scalar_arg = getattr(cl.Kernel, "_set_arg_buf", cl.Kernel.set_arg)


class PreparedLaunch:
    """A launch of one kernel with a fixed geometry and fixed arguments, repeated with new values for the
    few arguments that change (buffers, offsets, scalars).

    Setting a kernel's arguments is most of the host cost of a small launch (about 17 µs for the GEMM's
    21 arguments through pyopencl's typed path on PoCL, against 2-3 µs for the enqueue itself), and on a
    CPU device host time is taken from the cores that run the kernels. So the launch owns a private copy
    of the kernel with the fixed arguments set once, and sets a changing argument only when it differs
    from the previous call. Buffers are compared by their OpenCL handle, so a buffer the pool hands out
    again needs no new setting and no reference to it is kept. Calls must come from one thread at a time.

    ``args`` lists every argument of the kernel, with :data:`VARYING` where a call supplies the value;
    a call passes those values in order.
    """

    def __init__(self, device: Device, kernel: cl.Kernel, global_size, local_size, args):
        self.device = device
        self.kernel = kernel
        self.global_size, self.local_size = _geometry(global_size, local_size)
        self._args = tuple(args)
        self._slots = tuple(i for i, value in enumerate(self._args) if value is VARYING)
        self._private = None  # made at the first call, which goes through launch()
        self._last: list = []

    def __call__(self, *values) -> cl.Event:
        private = self._private
        if private is None:
            return self._first_call(values)
        last = self._last
        if len(values) != len(last):
            raise TypeError(f"{self.kernel.function_name}: {len(last)} varying arguments, got {len(values)}")
        try:
            for j, value in enumerate(values):
                if isinstance(value, np.generic):
                    if type(last[j]) is not type(value) or last[j] != value:
                        _set_scalar_arg(private, self._slots[j], value)
                        last[j] = value
                else:  # a buffer; anything else (local memory) is set every time
                    handle = getattr(value, "int_ptr", None)
                    if handle is None or last[j] != handle:
                        private.set_arg(self._slots[j], value)
                        last[j] = handle
            event = cl.enqueue_nd_range_kernel(self.device.queue, private, self.global_size, self.local_size)
        except cl.Error as exc:
            self._last = [_UNSET] * len(self._slots)
            raise _launch_error(self.device, self.kernel, exc) from None
        self.device.throttle(event)
        if _launch_watcher is not None:
            _launch_watcher(self.kernel)
        return event

    def _first_call(self, values) -> cl.Event:
        if len(values) != len(self._slots):
            raise TypeError(f"{self.kernel.function_name}: {len(self._slots)} varying arguments, got {len(values)}")
        args = list(self._args)
        for i, value in zip(self._slots, values):
            args[i] = value
        event = launch(self.device, self.kernel, self.global_size, self.local_size, *args)
        private = cl.Kernel(self.kernel.program, self.kernel.function_name)
        for i, value in enumerate(self._args):
            if value is not VARYING:
                private.set_arg(i, value)
        self._last = [_UNSET] * len(self._slots)
        self._private = private
        return event


_UNSET = object()
VARYING = object()  # a PreparedLaunch argument that each call supplies


def _declare_scalar_types(kernel: cl.Kernel, args) -> None:
    """Tell pyopencl the scalar argument types from the first launch's NumPy scalars: it then packs the
    arguments in one generated call (6 µs a launch on PoCL) instead of setting each through the generic
    path (60 µs with eight arguments). Our launches always pass the same types for a given kernel."""
    if all(isinstance(a, np.generic) or not isinstance(a, (int, float, complex)) for a in args):
        kernel.set_scalar_arg_dtypes([a.dtype if isinstance(a, np.generic) else None for a in args])
    kernel._netcl_typed = True


def local_size_1d(device: Device, n: int) -> tuple[int]:
    """A work-group size for flat kernels: large enough for PoCL to vectorize across work-items,
    never larger than the device allows."""
    preferred = 64 if device.kind == "cpu" else 128
    return (min(preferred, device.max_work_group_size),)


def scalar(dtype, value):
    return np.dtype(dtype).type(value)
