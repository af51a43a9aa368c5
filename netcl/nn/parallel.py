"""nc.nn.parallel: DistributedDataParallel, where PyTorch users look for it.

The Module lives with the rest of data-parallel training in netcl/distributed/ddp.py (a layer below nn).
"""
from ..distributed.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
