"""Ready-made models: nc.models.lenet(), nc.models.resnet8/20/32()."""
from .lenet import lenet
from .resnet import BasicBlock, ResNet, resnet8, resnet20, resnet32

__all__ = ["lenet", "resnet8", "resnet20", "resnet32", "ResNet", "BasicBlock"]
