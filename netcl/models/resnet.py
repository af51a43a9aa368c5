"""He et al.'s CIFAR ResNets (Deep Residual Learning, Section 4.2): ResNet-8/20/32 = 6n + 2 layers.

  conv1 3×3 16 → bn1 → ReLU → layer1 (n BasicBlocks, 16 channels, 32×32) → layer2 (n, 32, stride 2)
  → layer3 (n, 64, stride 2) → global average pool → fc (64 → num_classes)
A BasicBlock is conv1 3×3 (stride s) → bn1 → ReLU → conv2 3×3 → bn2, plus the shortcut (identity, or
downsample = Sequential(1×1 conv stride s, BatchNorm2d) where the shape changes), then ReLU. Convolutions
have no bias. Parameter and buffer names are PyTorch's (torchvision's BasicBlock and layer naming), so a
state_dict moves between the two frameworks as NumPy arrays. Initialization as torchvision's ResNet:
Kaiming-normal convolutions (fan_out, ReLU gain), BatchNorm weight 1 and bias 0, PyTorch's default Linear.

The forward passes go through netcl.nn.fusion: BN + ReLU and BN + residual add + ReLU are one kernel each
in training; in eval every BatchNorm folds into the convolution before it.
"""
from __future__ import annotations

import math

import numpy as np

from .. import nn
from .. import random as _random
from ..errors import ShapeError
from ..nn import fusion
from ..tensor import Tensor


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, device) -> nn.Conv2d:
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False, device=device)
    # kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (out_ch * kh * kw))
    std = math.sqrt(2.0 / (out_ch * kernel * kernel))
    weight = _random.host_generator().normal(0.0, std, size=conv.weight.shape).astype(np.float32)
    conv.weight = Tensor.from_host(weight, device, requires_grad=True)
    return conv


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, device=None):
        super().__init__()
        self.conv1 = _conv(in_ch, out_ch, 3, stride, device)
        self.bn1 = nn.BatchNorm2d(out_ch, device=device)
        self.relu = nn.ReLU()
        self.conv2 = _conv(out_ch, out_ch, 3, 1, device)
        self.bn2 = nn.BatchNorm2d(out_ch, device=device)
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(_conv(in_ch, out_ch, 1, stride, device), nn.BatchNorm2d(out_ch, device=device))
        else:
            self.downsample = None
        self.stride = stride

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return fusion.run([self.conv1, self.bn1, self.relu, self.conv2, self.bn2, fusion.Residual(shortcut),
                           self.relu], x)


class ResNet(nn.Module):
    """The CIFAR ResNet with ``blocks`` BasicBlocks per stage (3 → ResNet-20)."""

    def __init__(self, blocks: int, num_classes: int = 10, in_channels: int = 3, device=None):
        super().__init__()
        for value, name in ((blocks, "blocks"), (num_classes, "num_classes"), (in_channels, "in_channels")):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ShapeError(f"ResNet {name} must be a positive int, got {value!r}")
        self.conv1 = _conv(in_channels, 16, 3, 1, device)
        self.bn1 = nn.BatchNorm2d(16, device=device)
        self.relu = nn.ReLU()
        channels = 16
        for index, (width, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
            stage = [BasicBlock(channels, width, stride, device)]
            stage += [BasicBlock(width, width, 1, device) for _ in range(blocks - 1)]
            setattr(self, f"layer{index}", nn.Sequential(*stage))
            channels = width
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes, device=device)
        self.depth = 6 * blocks + 2

    def forward(self, x):
        return fusion.run([self.conv1, self.bn1, self.relu, self.layer1, self.layer2, self.layer3, self.avgpool,
                           self.flatten, self.fc], x)

    def extra_repr(self):
        return f"depth={self.depth}"


def _resnet(blocks: int, num_classes: int, in_channels: int, seed, device) -> ResNet:
    if seed is not None:
        _random.manual_seed(seed)
    return ResNet(blocks, num_classes, in_channels, device)


def resnet8(num_classes: int = 10, in_channels: int = 3, seed: int | None = None, device=None) -> ResNet:
    """ResNet-8: one BasicBlock per stage (78k parameters at 10 classes)."""
    return _resnet(1, num_classes, in_channels, seed, device)


def resnet20(num_classes: int = 10, in_channels: int = 3, seed: int | None = None, device=None) -> ResNet:
    """ResNet-20: three BasicBlocks per stage (0.27M parameters at 10 classes)."""
    return _resnet(3, num_classes, in_channels, seed, device)


def resnet32(num_classes: int = 10, in_channels: int = 3, seed: int | None = None, device=None) -> ResNet:
    """ResNet-32: five BasicBlocks per stage (0.46M parameters at 10 classes)."""
    return _resnet(5, num_classes, in_channels, seed, device)
