"""Ready-made models: nc.models.lenet(), the CIFAR nc.models.resnet8/20/32(), and torchvision's ImageNet
nc.models.resnet18/34/50() and nc.models.mobilenet_v2() (same module names and state_dict keys)."""
from .lenet import lenet
from .mobilenet import InvertedResidual, MobileNetV2, mobilenet_v2
from .resnet import (BasicBlock, Bottleneck, ImageNetResNet, ResNet, resnet8, resnet18, resnet20, resnet32, resnet34,
                     resnet50)

__all__ = ["lenet", "resnet8", "resnet20", "resnet32", "ResNet", "BasicBlock"]
__all__ += ["resnet18", "resnet34", "resnet50", "ImageNetResNet", "Bottleneck", "mobilenet_v2", "MobileNetV2",
            "InvertedResidual"]
