"""netcl.Tensor: an n-dimensional view (shape, strides, offset) over an OpenCL buffer on one Device.

Data flows one way: host array -> Tensor -> op (netcl.ops) -> kernel -> Tensor -> host. A Tensor never
launches kernels itself; its operators go through the autograd rules (netcl.autograd.rules), which call
the ops. Strides and offsets are in elements, so a view (reshape, permute, slicing) is free.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import pyopencl as cl

from . import dtypes
from .autograd import function as _ag
from .errors import DeviceError, ShapeError
from .runtime import memory
from .runtime.device import Device, resolve_device
from .runtime.recording import StorageWrites
from .runtime.recording import active as recording_of
from .tensor_math import MathMethods
from .tensor_shape import ShapeMethods


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        if n > 1:
            step *= n
    strides.reverse()
    return tuple(strides)


def _is_plain_shape(shape) -> bool:
    """Whether ``shape`` is already a tuple of non-negative Python ints (what ops pass: the check every
    allocation makes must cost less than the generators of the general path)."""
    if type(shape) is not tuple:
        return False
    for n in shape:
        if type(n) is not int or n < 0:
            return False
    return True


def _check_shape(shape) -> tuple[int, ...]:
    if _is_plain_shape(shape):
        return shape
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise ShapeError(f"a shape is a sequence of non-negative ints, got {shape!r}") from None
    if any(n < 0 for n in shape):
        raise ShapeError(f"negative dimension in shape {shape}")
    return shape


class Tensor(ShapeMethods, MathMethods):
    """An n-d array in device memory. Create with :func:`Tensor.from_host` or the factories.

    Views, conversions and device moves are in tensor_shape.py, reductions and clamp in tensor_math.py.
    """

    __array_priority__ = 1000  # make ndarray <op> Tensor defer to Tensor's reflected operators

    def __init__(self, buffer: cl.Buffer, shape, dtype, device: Device, strides=None, offset: int = 0,
                 requires_grad: bool = False):
        self.buffer = buffer
        self.shape = shape if _is_plain_shape(shape) else tuple(int(n) for n in shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.device = device
        self.strides = (strides if type(strides) is tuple else tuple(strides)) if strides is not None \
            else _contiguous_strides(self.shape)
        self.offset = int(offset)
        self.requires_grad = bool(requires_grad)
        self.grad: Tensor | None = None
        self._grad_node = None
        self._grad_slot = 0
        self._writes: StorageWrites | None = None  # made at the first write or view, shared with every view

    # ---- creation ---------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, dtype=np.float32, device=None) -> "Tensor":
        shape = _check_shape(shape)
        dt = dtypes.as_dtype(dtype)
        dev = device if type(device) is Device else resolve_device(device)
        nbytes = math.prod(shape) * dt.itemsize
        return cls(memory.allocate(dev, nbytes), shape, dt, dev)

    @classmethod
    def from_host(cls, array, device=None, requires_grad: bool = False, dtype=None) -> "Tensor":
        """Copy a host array (anything ``np.asarray`` accepts) to the device. Without ``dtype``, Python
        floats become float32 and Python ints int64 (PyTorch's defaults); NumPy arrays keep their dtype
        where netcl has it (see dtypes.host_dtype_for)."""
        if isinstance(array, Tensor):
            array = array.to_host()
        from_python = not isinstance(array, (np.ndarray, np.generic))
        host = np.asarray(array)
        target = dtypes.as_dtype(dtype) if dtype is not None else dtypes.host_dtype_for(host, from_python)
        host = np.asarray(host, dtype=target, order="C")
        t = cls.empty(host.shape, target, device)
        memory.upload(t.device, t.buffer, host, t.offset * target.itemsize)
        if requires_grad:
            dtypes.require_float(target, "requires_grad")
        t.requires_grad = requires_grad
        return t

    # ---- host round trip ----------------------------------------------------------------------
    def to_host(self) -> np.ndarray:
        src = self if self.is_contiguous() else self.contiguous()
        out = np.empty(src.shape, dtype=src.dtype)
        return memory.download(src.device, src.buffer, out, src.offset * src.dtype.itemsize)

    def __array__(self, dtype=None, copy=None):
        host = self.to_host()
        return host if dtype is None else host.astype(dtype)

    def item(self):
        if self.size != 1:
            raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.to_host().reshape(()).item()

    def tolist(self):
        return self.to_host().tolist()

    # ---- properties -----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def is_contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = np.array2string(self.to_host(), separator=", ", threshold=50, prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{grad}, device={self.device.name!r})"

    def same_device(self, other: "Tensor", what: str = "operation") -> None:
        if other.device is not self.device and other.device.context is not self.device.context:
            raise DeviceError(f"{what} mixes tensors on different devices/contexts: "
                              f"{self.device.describe()} and {other.device.describe()}")

    def _view(self, shape, strides, offset) -> "Tensor":
        view = Tensor(self.buffer, shape, self.dtype, self.device, strides, offset)
        view._writes = self._shared_writes()
        return view

    # ---- in-place writes -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """How many in-place writes this tensor's storage has had, through this tensor or any view of it
        (PyTorch's ``_version``): a value derived from the tensor and kept (BatchNorm folded into a
        convolution's weights) is current while the versions it was derived from are."""
        writes = self._writes
        return 0 if writes is None else writes.count

    def mark_written(self) -> None:
        """Count an in-place write of this tensor's storage. Every op that writes into a tensor it did not
        allocate calls it; inside a recording (netcl.runtime.recording) the count is recorded too, so every
        replay of a recorded training step counts the writes its commands make again."""
        writes = self._shared_writes()
        writes.count += 1
        if self.device.state.observers:
            recording = recording_of(self.device)
            if recording is not None:
                recording.written(writes, self.buffer)

    def _shared_writes(self) -> "StorageWrites":
        writes = self._writes
        if writes is None:
            writes = self._writes = StorageWrites()
        return writes

    # ---- autograd ---------------------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        """Accumulate the gradients of this tensor into the leaves' ``.grad``; the graph's saved tensors
        are freed as the pass goes, unless ``retain_graph`` (needed to call backward through it again)."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad (no graph was recorded)")
        if gradient is None:
            if self.size != 1:
                raise ShapeError(f"backward() without a gradient needs a scalar, got shape {self.shape}")
            from .factories import ones
            gradient = ones(self.shape, self.dtype, self.device)
        elif not isinstance(gradient, Tensor):
            gradient = Tensor.from_host(np.asarray(gradient, dtype=self.dtype), self.device)
        if gradient.shape != self.shape:
            raise ShapeError(f"gradient of shape {gradient.shape} for a tensor of shape {self.shape}")
        _ag.backward(self, gradient, retain_graph)

    def detach(self) -> "Tensor":
        return self._view(self.shape, self.strides, self.offset)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if flag:
            dtypes.require_float(self.dtype, "requires_grad")
        self.requires_grad = flag
        return self

    # ---- arithmetic -----------------------------------------------------------------------------
    def _binary(self, other, op: str, reflected: bool = False) -> "Tensor":
        from .autograd import rules
        a, b = (other, self) if reflected else (self, other)
        return rules.binary(op, a, b)

    def __add__(self, o): return self._binary(o, "add")
    def __radd__(self, o): return self._binary(o, "add", True)
    def __sub__(self, o): return self._binary(o, "sub")
    def __rsub__(self, o): return self._binary(o, "sub", True)
    def __mul__(self, o): return self._binary(o, "mul")
    def __rmul__(self, o): return self._binary(o, "mul", True)
    def __truediv__(self, o): return self._binary(o, "div")
    def __rtruediv__(self, o): return self._binary(o, "div", True)
    def __floordiv__(self, o): return self._binary(o, "floordiv")
    def __rfloordiv__(self, o): return self._binary(o, "floordiv", True)
    def __mod__(self, o): return self._binary(o, "mod")
    def __rmod__(self, o): return self._binary(o, "mod", True)
    def __pow__(self, o): return self._binary(o, "pow")
    def __rpow__(self, o): return self._binary(o, "pow", True)

    def __neg__(self):
        from .autograd import rules
        return rules.unary("neg", self)

    def __matmul__(self, other):
        from .autograd import rules
        return rules.matmul(self, other)

    def __rmatmul__(self, other):
        from .autograd import rules
        return rules.matmul(other, self)

    def __and__(self, o): return self._binary(o, "and")
    def __rand__(self, o): return self._binary(o, "and", True)
    def __or__(self, o): return self._binary(o, "or")
    def __ror__(self, o): return self._binary(o, "or", True)
    def __xor__(self, o): return self._binary(o, "xor")
    def __rxor__(self, o): return self._binary(o, "xor", True)

    def __invert__(self):
        from .autograd import rules
        return rules.unary("invert", self)

    def __eq__(self, o): return self._binary(o, "eq")
    def __ne__(self, o): return self._binary(o, "ne")
    def __lt__(self, o): return self._binary(o, "lt")
    def __le__(self, o): return self._binary(o, "le")
    def __gt__(self, o): return self._binary(o, "gt")
    def __ge__(self, o): return self._binary(o, "ge")
    __hash__ = object.__hash__

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor with {self.size} elements is ambiguous")
        return bool(self.item())

    def relu(self): return self._unary("relu")
    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def tanh(self): return self._unary("tanh")
    def sqrt(self): return self._unary("sqrt")
    def abs(self): return self._unary("abs")
    __abs__ = abs
    def sigmoid(self): return self._unary("sigmoid")

    def _unary(self, op: str) -> "Tensor":
        from .autograd import rules
        return rules.unary(op, self)
