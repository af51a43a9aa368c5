"""Containers: Sequential (whose forward fuses through netcl.nn.fusion), ModuleList, ModuleDict."""
from __future__ import annotations

from collections import OrderedDict

from . import fusion
from ..module import Module


def _check_module(module, owner: str, name) -> None:
    if not isinstance(module, Module):
        raise TypeError(f"{owner} takes Modules, got {type(module).__name__} for {name!r}")


class Sequential(Module):
    """Modules applied in order; built from modules (named "0", "1", ...) or from an OrderedDict of names.
    Consecutive layers that netcl.nn.fusion.FUSIONS covers (ReLU + MaxPool2d, BatchNorm + ReLU, in eval
    Conv2d + BatchNorm2d, ...) run as one fused call with the same result."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (OrderedDict, dict)):
            items = list(modules[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(modules)]
        for name, module in items:
            _check_module(module, "Sequential", name)
            setattr(self, name, module)

    def forward(self, x):
        return fusion.run(list(self._modules.values()), x)

    def append(self, module) -> "Sequential":
        _check_module(module, "Sequential", len(self))
        setattr(self, str(len(self._modules)), module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        if isinstance(index, str):
            return self._modules[index]
        return items[index][1]

    def named_layers(self):
        return list(self._modules.items())


class ModuleList(Module):
    """A list of sub-modules registered under "0", "1", ... (so their parameters have PyTorch's names)."""

    def __init__(self, modules=None):
        super().__init__()
        for module in modules or ():
            self.append(module)

    def append(self, module) -> "ModuleList":
        _check_module(module, "ModuleList", len(self))
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        self.extend(items)

    def _index(self, index: int) -> int:
        n = len(self._modules)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a ModuleList of {n}")
        return index % n

    def __getitem__(self, index):
        items = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(items[index])
        return items[self._index(index)]

    def __setitem__(self, index: int, module) -> None:
        _check_module(module, "ModuleList", index)
        setattr(self, str(self._index(index)), module)

    def __delitem__(self, index) -> None:
        items = list(self._modules.values())
        del items[index if isinstance(index, slice) else self._index(index)]
        self._modules.clear()
        self.extend(items)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward; iterate over it and call its modules")


class ModuleDict(Module):
    """Sub-modules by name (insertion order kept), registered under their keys."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules) -> None:
        items = modules.items() if hasattr(modules, "items") else modules
        for name, module in items:
            self[name] = module

    def __getitem__(self, name: str):
        return self._modules[name]

    def __setitem__(self, name: str, module) -> None:
        if not isinstance(name, str):
            raise TypeError(f"ModuleDict keys are strings, got {type(name).__name__}")
        _check_module(module, "ModuleDict", name)
        setattr(self, name, module)

    def __delitem__(self, name: str) -> None:
        del self._modules[name]

    def __contains__(self, name) -> bool:
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, name: str):
        return self._modules.pop(name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward; call its modules by name")
