"""Typed errors raised at netcl's public boundary.

Every error derives from :class:`NetclError` and also from the built-in exception a Python user would
expect (``ValueError`` for shapes, ``TypeError`` for dtypes, ...), so ``except ValueError`` keeps working.
Each carries the data needed to act on it: shapes, dtypes, byte counts, the build log.
"""
from __future__ import annotations


class NetclError(Exception):
    """Base class of every error netcl raises on purpose."""


class ShapeError(NetclError, ValueError):
    """Shapes (or layer geometry) that an operation cannot accept."""


class DTypeError(NetclError, TypeError):
    """A dtype an operation does not support, or operands whose dtypes do not match."""


class DeviceError(NetclError, RuntimeError):
    """No usable device, a bad device selector, or tensors on different devices/contexts."""


class KernelBuildError(NetclError, RuntimeError):
    """An OpenCL program failed to build; carries the log, the options and the saved source."""

    def __init__(self, message: str, log: str = "", options: tuple[str, ...] = (), source_path: str | None = None):
        detail = message
        if source_path:
            detail += f"\n  rendered source saved at: {source_path}"
        if options:
            detail += f"\n  build options: {' '.join(options)}"
        if log:
            detail += f"\n  build log:\n{log}"
        super().__init__(detail)
        self.log = log
        self.options = tuple(options)
        self.source_path = source_path


class DeviceMemoryError(NetclError, MemoryError):
    """The device could not provide the memory an operation asked for."""

    def __init__(self, message: str, requested_bytes: int | None = None, available_bytes: int | None = None):
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.available_bytes = available_bytes


class CheckpointError(NetclError):
    """A checkpoint or cache file that cannot be read back."""


class DataError(NetclError, OSError):
    """A dataset that is missing, unreadable or malformed."""


class ClassIndexError(NetclError, IndexError):
    """A loss was given a class index outside [0, num_classes) that is not its ``ignore_index`` (PyTorch
    raises ``IndexError`` here too). ``index``: the first bad index found; ``position``: where it is in
    the targets (the row of a batch; a flat index for per-pixel targets); ``num_classes``;
    ``ignore_index`` (None for a loss without one); ``loss``: the loss that met it."""

    def __init__(self, loss: str, index: int, num_classes: int, position: int | None = None,
                 ignore_index: int | None = None):
        where = f" at position {position}" if position is not None else ""
        ignored = f" other than ignore_index={ignore_index}" if ignore_index is not None else ""
        super().__init__(f"{loss}: class index {index}{where} is out of range for {num_classes} classes: targets "
                         f"must lie in [0, {num_classes - 1}]{ignored}")
        self.loss = loss
        self.index = int(index)
        self.num_classes = int(num_classes)
        self.position = None if position is None else int(position)
        self.ignore_index = None if ignore_index is None else int(ignore_index)


class SettingError(NetclError, ValueError):
    """An environment variable netcl reads (netcl.settings) holds a value its parser refuses; carries the
    variable's name and the value."""

    def __init__(self, message: str, variable: str = "", value: str = ""):
        super().__init__(message)
        self.variable = variable
        self.value = value


class OnnxError(NetclError, ValueError):
    """An ONNX model netcl cannot import: a damaged or non-ONNX file, an unsupported operator or opset,
    missing external data, a malformed graph, or an input that contradicts the graph's declared shape.

    ``node`` (the node's name, or its first output when unnamed), ``op_type`` and ``opset`` say where;
    ``details`` holds the rest (the missing names, the shapes, the operators supported ...)."""

    def __init__(self, message: str, node: str | None = None, op_type: str | None = None, opset: int | None = None,
                 **details):
        super().__init__(message)
        self.node = node
        self.op_type = op_type
        self.opset = opset
        self.details = details
