"""Ready-made models: nc.models.lenet()."""
from .lenet import lenet

__all__ = ["lenet"]
