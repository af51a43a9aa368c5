"""OpenCL devices: discovery, selection, and the per-device context and queue that tensors carry.

A :class:`Device` owns one ``pyopencl`` context and one in-order queue. Tensors hold a reference to their
Device, so every operation knows exactly where it runs; the process-wide default is a convenience on top:
``NETCL_DEVICE``, then ``PYOPENCL_CTX``, then the first GPU, then the fastest device whose GEMM rate was
measured (``netcl devices --bench``, ``netcl tune``; netcl.runtime.device_figures), then the first device.

A selector (``NETCL_DEVICE``, ``--device``, :func:`set_default_device`) is an index into :func:`devices`,
a PYOPENCL_CTX-style "platform:device" pair, or words that must each occur, case-insensitively, in the
platform's name, vendor or version, the device's name or its kind: ``pocl``, ``intel``, ``nvidia``,
``haswell``, ``pocl 3.1``, ``gpu``. Several matches take the first in :func:`devices`' order.

Drivers outside the system's vendors directory (Intel's CPU runtime installed from PyPI) are made visible
by ``ci/setup.sh``, which records an OpenCL vendors directory under netcl's configuration directory
(``NETCL_CONFIG_DIR``, else the user's config dir). When the environment does not set ``OCL_ICD_VENDORS``
itself, netcl points it at that directory before it first asks the ICD loader for platforms, so a process
sees the drivers the set-up installed without sourcing anything (docs/howto/devices-and-drivers.md).
Likewise, unless ``POCL_AFFINITY`` or ``POCL_MAX_PTHREAD_COUNT`` is set, a process that may run on every
CPU sets ``POCL_AFFINITY=1``: PoCL's worker threads then each keep a core of their own.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pyopencl as cl

from .. import settings
from ..errors import DeviceError
from .device_figures import stored_figures
from .device_state import DeviceState

_KIND_NAMES = {cl.device_type.GPU: "gpu", cl.device_type.CPU: "cpu", cl.device_type.ACCELERATOR: "accelerator"}

INSTALL_HINT = (
    "No OpenCL device found. Install a driver: on Debian/Ubuntu `apt-get install pocl-opencl-icd` "
    "(a CPU device), or your GPU vendor's OpenCL driver; `bash ci/setup.sh` does this for you."
)


class DeviceSelectorError(DeviceError):
    """A selector (NETCL_DEVICE, --device, set_default_device) that names no device; the message lists
    them all. The CLI exits with status 2 on it, as on any other bad argument."""

    def __init__(self, message: str, selector: str = "", available: tuple[str, ...] = ()):
        super().__init__(message)
        self.selector = selector
        self.available = tuple(available)


# How many kernels the host may queue ahead of the device (several LeNet steps' worth).
MAX_KERNELS_IN_FLIGHT = 128


@dataclass(eq=False)
class Device:
    """One OpenCL device with its own context and command queue."""

    cl_device: cl.Device = field(repr=False)
    index: int = 0

    def __post_init__(self):
        d = self.cl_device
        self.name: str = d.name.strip()
        self.platform: str = d.platform.name.strip()
        self.platform_vendor: str = d.platform.vendor.strip()
        self.platform_version: str = d.platform.version.strip()
        self.kind: str = next((v for k, v in _KIND_NAMES.items() if d.type & k), "accelerator")
        self.opencl_version: str = d.version.strip()
        self.driver_version: str = d.driver_version.strip()
        self.vendor: str = d.vendor.strip()
        self.compute_units: int = int(d.max_compute_units)
        self.global_mem_bytes: int = int(d.global_mem_size)
        self.max_alloc_bytes: int = int(d.max_mem_alloc_size)
        self.local_mem_bytes: int = int(d.local_mem_size)
        self.cache_bytes: int = int(d.global_mem_cache_size)  # the last-level cache on CPU drivers
        self.base_align_bytes: int = int(d.mem_base_addr_align) // 8  # the driver reports bits
        self.max_work_group_size: int = int(d.max_work_group_size)
        extensions = d.extensions.split()
        self.extensions: tuple[str, ...] = tuple(extensions)
        self.has_fp64: bool = "cl_khr_fp64" in extensions or bool(getattr(d, "double_fp_config", 0))
        self.has_fp16: bool = "cl_khr_fp16" in extensions
        self.has_int64_atomics: bool = "cl_khr_int64_base_atomics" in extensions
        # lanes of the device's native vectors per dtype (16 floats on AVX-512 CPUs, 8 on AVX2, 1 on most GPUs)
        self.native_vector_width: dict[str, int] = {"float32": int(d.native_vector_width_float),
                                                     "float64": int(d.native_vector_width_double)}
        self._lock = threading.Lock()
        self._context: cl.Context | None = None
        self._queue: cl.CommandQueue | None = None
        self._memory_pool = None  # netcl.runtime.memory's buffer pool, made at the first allocation
        self._in_flight: collections.deque = collections.deque()
        self._state: DeviceState | None = None

    @property
    def state(self) -> DeviceState:
        """Everything netcl keeps for this device while the process runs: built programs and kernels,
        plans, measurements in memory, the cold-start phase, the launch observers
        (netcl.runtime.device_state)."""
        state = self._state
        if state is None:
            with self._lock:
                if self._state is None:
                    self._state = DeviceState()
                state = self._state
        return state

    def clear_state(self) -> None:
        """Forget what this process built, planned and measured for the device, as if it had just
        started (the disk caches stay): the next calls build, plan and measure again. The device's queue
        is drained first and the buffers its pool holds for reuse go back to the driver."""
        if self._context is not None:
            self.synchronize()
        self.state.clear()
        if self._memory_pool is not None:
            self._memory_pool.free_held()

    # The context is created lazily so that listing devices never allocates driver resources.
    @property
    def context(self) -> cl.Context:
        context = self._context
        if context is not None:  # every launch asks for the queue: no lock once it exists
            return context
        with self._lock:
            if self._context is None:
                try:
                    context = cl.Context([self.cl_device])
                    self._queue = cl.CommandQueue(context, self.cl_device)
                    self._context = context  # last: the lock-free path above reads a context as "both made"
                except cl.Error as exc:
                    raise DeviceError(f"cannot open a context on {self.describe()}: {exc}") from exc
            return self._context

    @property
    def queue(self) -> cl.CommandQueue:
        queue = self._queue
        if queue is None:
            self.context
            queue = self._queue
        return queue

    def throttle(self, event: cl.Event) -> None:
        """Record a launched kernel; once MAX_KERNELS_IN_FLIGHT are queued, wait for the oldest. Without
        this a loop that never reads a result runs arbitrarily far ahead of the device, and every queued
        step keeps its intermediate buffers alive (a LeNet benchmark loop reached 24 GiB)."""
        pending = self._in_flight
        pending.append(event)
        if len(pending) > MAX_KERNELS_IN_FLIGHT:
            pending.popleft().wait()

    @property
    def identity(self) -> str:
        """Platform, device and driver: what a compiled binary or a tuning result is valid for."""
        return f"{self.platform}|{self.name}|{self.driver_version}|{self.opencl_version}"

    def describe(self) -> str:
        return f"[{self.index}] {self.platform} / {self.name} ({self.kind})"

    def synchronize(self) -> None:
        self.queue.finish()

    def as_dict(self) -> dict:
        return {
            "index": self.index, "name": self.name, "platform": self.platform, "kind": self.kind,
            "platform_vendor": self.platform_vendor, "platform_version": self.platform_version,
            "opencl_version": self.opencl_version, "driver_version": self.driver_version, "vendor": self.vendor,
            "compute_units": self.compute_units, "global_mem_bytes": self.global_mem_bytes,
            "max_alloc_bytes": self.max_alloc_bytes, "local_mem_bytes": self.local_mem_bytes,
            "max_work_group_size": self.max_work_group_size, "has_fp64": self.has_fp64, "has_fp16": self.has_fp16,
        }

    @property
    def platform_key(self) -> tuple:
        """Which platform this device is on (two PoCL installs share a name but not a version)."""
        return (self.platform, self.platform_version)

    def selector_text(self) -> str:
        """What a selector's words are matched against (lower case)."""
        return " ".join((self.platform, self.platform_vendor, self.platform_version, self.name, self.kind)).lower()

    def __repr__(self) -> str:
        return f"Device({self.describe()})"


_devices: list[Device] | None = None
_default: Device | None = None
_registry_lock = threading.Lock()


def devices() -> list[Device]:
    """Every OpenCL device on every platform, in platform order (indices are what NETCL_DEVICE takes)."""
    global _devices
    with _registry_lock:
        if _devices is None:
            found = []
            _apply_recorded_vendors()
            _pin_pocl_threads()
            try:
                platforms = cl.get_platforms()
            except cl.Error:
                platforms = []  # the ICD loader reports "no platforms" as an error
            for platform in platforms:
                try:
                    platform_devices = platform.get_devices()
                except cl.Error:
                    continue
                for d in platform_devices:
                    found.append(Device(d, index=len(found)))
            _devices = found
        return list(_devices)


def config_dir() -> Path:
    """Where ci/setup.sh records what it installed: NETCL_CONFIG_DIR, else the user's config directory."""
    configured = settings.CONFIG_DIR.get()
    if configured is not None:
        return configured
    try:
        from platformdirs import user_config_dir
        return Path(user_config_dir("netcl", appauthor=False))
    except ImportError:
        return Path.home() / ".config" / "netcl"


def recorded_vendors_dir() -> Path | None:
    """The OpenCL vendors directory ci/setup.sh recorded (one .icd file per driver), if any."""
    path = config_dir() / "opencl" / "vendors"
    try:
        return path if any(p.suffix == ".icd" for p in path.iterdir()) else None
    except OSError:
        return None


def _apply_recorded_vendors() -> None:
    # The ICD loader reads OCL_ICD_VENDORS at its first call, which is the get_platforms() that follows;
    # a value the user set always wins.
    if settings.environment_has("OCL_ICD_VENDORS"):
        return
    recorded = recorded_vendors_dir()
    if recorded is not None:
        os.environ["OCL_ICD_VENDORS"] = str(recorded)


def _pin_pocl_threads() -> None:
    # PoCL reads POCL_AFFINITY when its platform initializes, at the get_platforms() that follows. Left to
    # the kernel's scheduler, its worker threads at times share one core for tens of launches when the host
    # waits between them (a layer timed on its own, the planner's trials): half the speed, by chance. Each
    # worker pinned to the core of its index never shares one. PoCL pins worker i to CPU i, so only a
    # process free to run on every CPU asks for it, and only when neither variable was set (the
    # distributed launcher sets POCL_MAX_PTHREAD_COUNT for ranks that share a node).
    if settings.environment_has("POCL_AFFINITY") or settings.environment_has("POCL_MAX_PTHREAD_COUNT"):
        return
    if not hasattr(os, "sched_getaffinity"):
        return
    if os.sched_getaffinity(0) != set(range(os.cpu_count() or 0)):
        return
    os.environ["POCL_AFFINITY"] = "1"


def _listing(all_devices) -> str:
    return "\n".join(f"  {d.describe()}: {d.platform_version}" for d in all_devices)


def _no_match(text: str, all_devices, why: str) -> DeviceSelectorError:
    return DeviceSelectorError(f"{why}; the devices are:\n{_listing(all_devices)}", selector=text,
                               available=tuple(d.describe() for d in all_devices))


def _select(selector, source: str = "selector") -> Device:
    if isinstance(selector, Device):
        return selector
    all_devices = devices()
    if not all_devices:
        raise DeviceError(INSTALL_HINT)
    text = str(selector).strip()
    if text.isdigit():
        index = int(text)
        if index >= len(all_devices):
            raise _no_match(text, all_devices, f"device index {index} ({source}) out of range: "
                                               f"{len(all_devices)} device(s) found")
        return all_devices[index]
    if ":" in text and all(part.isdigit() for part in text.split(":", 1)):
        # PYOPENCL_CTX style "platform:device"
        p, d = (int(x) for x in text.split(":", 1))
        platforms = sorted({dev.platform_key for dev in all_devices},
                           key=[x.platform_key for x in all_devices].index)
        if p < len(platforms):
            on_platform = [dev for dev in all_devices if dev.platform_key == platforms[p]]
            if d < len(on_platform):
                return on_platform[d]
        raise _no_match(text, all_devices, f"no device '{text}' ({source})")
    words = text.lower().split()
    for dev in all_devices:
        haystack = dev.selector_text()
        if words and all(word in haystack for word in words):
            return dev
    raise _no_match(text, all_devices, f"no device matches '{text}' ({source})")


def default_device() -> Device:
    """The process-wide default device (see the module docstring for the order of choice)."""
    global _default
    if _default is not None:
        return _default
    for setting in (settings.DEVICE, settings.OPENCL_CONTEXT):
        selector = setting.get()
        if selector:
            _default = _select(selector, setting.name)
            return _default
    all_devices = devices()
    if not all_devices:
        raise DeviceError(INSTALL_HINT)
    _default = next((d for d in all_devices if d.kind == "gpu"), None) or fastest_measured(all_devices) \
        or all_devices[0]
    return _default


def fastest_measured(candidates) -> Device | None:
    """The device with the highest stored GEMM rate (netcl devices --bench), or None if none is measured."""
    rated = [(stored_figures(d).get("gemm_gflops"), d) for d in candidates]
    rated = [(rate, d) for rate, d in rated if isinstance(rate, (int, float))]
    return max(rated, key=lambda pair: pair[0])[1] if rated else None


def set_default_device(dev_or_selector) -> Device:
    """Make a Device (or a selector as NETCL_DEVICE takes it) the default for new tensors."""
    global _default
    _default = _select(dev_or_selector)
    return _default


def resolve_device(device) -> Device:
    return default_device() if device is None else _select(device)
