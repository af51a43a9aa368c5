"""nc.nn.Module: parameters, sub-modules, state_dict and train/eval, as in torch.nn.

It holds Tensors and nothing from the layers above the core, so the layers of netcl/nn/ and
DistributedDataParallel (netcl/distributed/ddp.py, below nn) both build on it.

Assigning a Tensor with ``requires_grad=True`` to an attribute registers it as a parameter; assigning a
Module registers a sub-module; ``register_buffer`` keeps state that is saved but not trained.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .errors import CheckpointError, ShapeError
from .runtime import memory
from .tensor import Tensor


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration ------------------------------------------------------------------------------
    def _registry(self, kind: str) -> OrderedDict:
        try:
            return object.__getattribute__(self, kind)
        except AttributeError:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning "
                               "parameters or sub-modules") from None

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._registry("_modules")[name] = value
            self._forget(name, "_parameters", "_buffers")
        elif isinstance(value, Tensor) and (value.requires_grad or name in self._registry("_parameters")):
            self._parameters[name] = value
            self._forget(name, "_modules", "_buffers")
        elif isinstance(value, Tensor) and name in self._registry("_buffers"):
            self._buffers[name] = value
        else:
            if value is None and name in self.__dict__.get("_parameters", {}):
                self._parameters[name] = None
                return
            object.__setattr__(self, name, value)

    def _forget(self, name, *kinds):
        for kind in kinds:
            self._registry(kind).pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        for kind in ("_parameters", "_buffers", "_modules"):
            registry = self.__dict__.get(kind)
            if registry is not None and name in registry:
                return registry[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        for kind in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__.get(kind, {}):
                del self.__dict__[kind][name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, tensor: Tensor | None) -> None:
        if tensor is not None:
            tensor.requires_grad_(True)
        self._registry("_parameters")[name] = tensor

    def register_buffer(self, name: str, tensor: Tensor | None) -> None:
        self._registry("_buffers")[name] = tensor

    # ---- traversal -----------------------------------------------------------------------------------
    def named_modules(self, prefix: str = ""):
        """Depth-first, parents before children (torch.nn's order, which fixes the state_dict order)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{n}" if name else n, c) for n, c in module._modules.items() if c is not None]
            stack.extend(reversed(children))

    def modules(self):
        return [m for _, m in self.named_modules()]

    def named_children(self):
        return [(n, m) for n, m in self._modules.items() if m is not None]

    def children(self):
        return [m for _, m in self.named_children()]

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_name, module in modules:
            for name, p in module._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{module_name}.{name}" if module_name else name), p

    def parameters(self, recurse: bool = True):
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_name, module in modules:
            for name, b in module._buffers.items():
                if b is not None:
                    yield (f"{module_name}.{name}" if module_name else name), b

    def buffers(self, recurse: bool = True):
        return [b for _, b in self.named_buffers(recurse=recurse)]

    def to(self, device) -> "Module":
        """Move every parameter and buffer (and existing gradients) to ``device`` (a Device or a selector);
        returns self. Parameters stay leaves that require grad, so build optimizers after moving."""
        from .runtime.device import resolve_device
        target = resolve_device(device)
        for module in self.modules():
            for kind in ("_parameters", "_buffers"):
                registry = module.__dict__[kind]
                for name, t in list(registry.items()):
                    if t is not None and t.device is not target:
                        registry[name] = _moved(t, target, kind == "_parameters")
        return self

    def apply(self, fn):
        for m in self.modules():
            fn(m)
        return self

    # ---- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """Parameters and buffers by dotted name; the tensors share memory with the module."""
        out = OrderedDict()
        for module_name, module in self.named_modules():
            for kind in ("_parameters", "_buffers"):
                for name, t in module.__dict__[kind].items():
                    if t is not None:
                        out[f"{module_name}.{name}" if module_name else name] = t.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy values (Tensors or NumPy arrays) into the existing parameters and buffers, in place, so an
        optimizer built on this module keeps working. Returns (missing_keys, unexpected_keys); with
        ``strict`` either being non-empty raises nc.CheckpointError."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise CheckpointError(f"state_dict does not match {type(self).__name__}: missing keys {missing}, "
                                  f"unexpected keys {unexpected}")
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            host = value.to_host() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(host.shape) != target.shape:
                raise ShapeError(f"state_dict entry {key!r} has shape {tuple(host.shape)}, the module expects "
                                 f"{target.shape}")
            host = np.ascontiguousarray(host, dtype=target.dtype)
            if not target.is_contiguous():
                raise ShapeError(f"cannot load into non-contiguous {key!r}")
            memory.upload(target.device, target.buffer, host, target.offset * target.dtype.itemsize)
            target.mark_written()
        return missing, unexpected

    # ---- modes and gradients --------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                from .ops.elementwise import fill
                fill(p.grad, 0)

    # ---- calling ---------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = self.named_children()
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        lines.append(")")
        return "\n".join(lines)


def _moved(t: Tensor, device, parameter: bool) -> Tensor:
    """A detached copy of t on device (through Tensor.to where it exists, else through the host)."""
    to = getattr(Tensor, "to", None)
    copy = t.detach().to(device) if to is not None else Tensor.from_host(t.to_host(), device)
    if t.grad is not None:
        copy_grad = t.grad.to(device) if to is not None else Tensor.from_host(t.grad.to_host(), device)
    else:
        copy_grad = None
    if parameter:
        copy.requires_grad_(True)
        copy.grad = copy_grad
    return copy
