"""Enqueueing kernels: ``launch`` (and ``PreparedLaunch``, for a launch repeated with mostly unchanged
arguments) are the only places that enqueue kernels; they turn driver failures into netcl errors.
netcl.runtime.kernels makes the kernels they launch (and re-exports these names).
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import DeviceError, DeviceMemoryError
from .device import Device
from .observers import skip_launch


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def launch(device: Device, kernel: cl.Kernel, global_size, local_size, *args, wait_for=None,
           dynamic=None) -> cl.Event:
    """Enqueue one kernel. ``global_size`` is rounded up to a multiple of ``local_size``; the kernel
    itself must guard the tail. Driver failures become DeviceMemoryError / DeviceError.

    ``dynamic`` ({argument index: callable}) names the scalar arguments that differ at every call of the
    code making this launch (a random seed): a replay of a recording (netcl.runtime.recording) asks each
    callable for that argument's new value instead of repeating this one. The device's launch observers
    (netcl.runtime.observers) see the launch, or skip it inside ``builds_only``."""
    state = device.state
    observers = state.observers
    if observers:
        observers = state.observers_here()
        skipped = skip_launch(device, observers)
        if skipped is not None:
            return skipped
    global_size, local_size = _geometry(state, global_size, local_size)
    if not getattr(kernel, "_netcl_typed", False):
        _declare_scalar_types(kernel, args)
        kernel._netcl_local_sizes = set()  # work-group sizes launched so far (see the first-launch rule)
    try:
        # PoCL generates a kernel's machine code for each work-group size at its first launch, and does
        # so markedly slower with other kernels queued around it, so a first launch runs on a quiet device.
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
        for observer in observers:
            observer.kernel(device, kernel, global_size, local_size, args, dynamic)
        return event
    except cl.Error as exc:
        raise _launch_error(device, kernel, exc) from None


def _geometry(state, global_size, local_size):
    if type(global_size) is tuple and (local_size is None or type(local_size) is tuple):
        key = (global_size, local_size)  # a launch's host cost counts: tuples are normalized once
        known = state.geometries.get(key)
        if known is None:
            if len(state.geometries) >= 4096:
                state.geometries.clear()
            known = state.geometries[key] = _normalized_geometry(global_size, local_size)
        return known
    return _normalized_geometry(global_size, local_size)  # lists are unhashable: normalized every launch


def _normalized_geometry(global_size, local_size):
    global_size = tuple(int(g) for g in global_size)
    if local_size is not None:
        local_size = tuple(int(x) for x in local_size)
        global_size = tuple(round_up(max(g, 1), l) for g, l in zip(global_size, local_size))
    return global_size, local_size


def _launch_error(device: Device, kernel: cl.Kernel, exc: cl.Error) -> Exception:
    code = getattr(exc, "code", None)
    if isinstance(exc, cl.MemoryError) or code in (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                                                   cl.status_code.OUT_OF_RESOURCES,
                                                   cl.status_code.OUT_OF_HOST_MEMORY):
        return DeviceMemoryError(f"{device.describe()} ran out of memory launching {kernel.function_name}: {exc}",
                                 available_bytes=device.max_alloc_bytes)
    return DeviceError(f"launching {kernel.function_name} on {device.describe()} failed: {exc}")


# pyopencl's Kernel.set_arg tries a scalar as a memory object, local memory, a sampler and an SVM pointer
# first, each a C++ exception caught: many times the cost of handing its bytes over directly, which is
# what pyopencl's own typed invoker does (a GEMM row loop sets three offsets a call).
_set_scalar_arg = getattr(cl.Kernel, "_set_arg_buf", cl.Kernel.set_arg)


class PreparedLaunch:
    """A launch of one kernel with a fixed geometry and fixed arguments, repeated with new values for the
    few arguments that change (buffers, offsets, scalars).

    Setting a kernel's arguments is most of the host cost of a small launch (the GEMM has 21, each set
    through pyopencl's typed path costing about what the enqueue itself does), and on a
    CPU device host time is taken from the cores that run the kernels. So the launch owns a private copy
    of the kernel with the fixed arguments set once, and sets a changing argument only when it differs
    from the previous call. Buffers are compared by their OpenCL handle, so a buffer the pool hands out
    again needs no new setting and no reference to it is kept. Calls must come from one thread at a time.

    ``args`` lists every argument of the kernel, with :data:`VARYING` where a call supplies the value;
    a call passes those values in order.
    """

    def __init__(self, device: Device, kernel: cl.Kernel, global_size, local_size, args):
        self.device = device
        self._state = device.state  # cleared in place, never replaced: safe to hold
        self.kernel = kernel
        self.global_size, self.local_size = _geometry(self._state, global_size, local_size)
        self._args = tuple(args)
        self._slots = tuple(i for i, value in enumerate(self._args) if value is VARYING)
        self._private = None  # made at the first call, which goes through launch()
        self._last: list = []

    def __call__(self, *values, dynamic=None) -> cl.Event:
        """Launch with ``values`` for the varying arguments; ``dynamic`` ({index into values: callable})
        as for :func:`launch`."""
        observers = self._state.observers
        if observers:
            observers = self._state.observers_here()
            skipped = skip_launch(self.device, observers)
            if skipped is not None:
                return skipped
        private = self._private
        if private is None:
            return self._first_call(values, dynamic)
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
        if observers:
            args, dynamic = self._all_args(values), self._argument_indices(dynamic)
            for observer in observers:
                observer.kernel(self.device, self.kernel, self.global_size, self.local_size, args, dynamic)
        return event

    def _all_args(self, values) -> list:
        args = list(self._args)
        for i, value in zip(self._slots, values):
            args[i] = value
        return args

    def _argument_indices(self, dynamic):
        """``dynamic`` keyed by indices into the varying values, re-keyed by the kernel's argument index."""
        return {self._slots[j]: refresh for j, refresh in dynamic.items()} if dynamic else None

    def _first_call(self, values, dynamic=None) -> cl.Event:
        if len(values) != len(self._slots):
            raise TypeError(f"{self.kernel.function_name}: {len(self._slots)} varying arguments, got {len(values)}")
        event = launch(self.device, self.kernel, self.global_size, self.local_size, *self._all_args(values),
                       dynamic=self._argument_indices(dynamic))
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
    arguments in one generated call instead of setting each through the generic path, which costs many
    times more. Our launches always pass the same types for a given kernel."""
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
