"""He et al.'s ResNets (Deep Residual Learning): the CIFAR ResNet-8/20/32 (Section 4.2) and torchvision's
ImageNet ResNet-18/34/50.

CIFAR, 6n + 2 layers:
  conv1 3×3 16 → bn1 → ReLU → layer1 (n BasicBlocks, 16 channels, 32×32) → layer2 (n, 32, stride 2)
  → layer3 (n, 64, stride 2) → global average pool → fc (64 → num_classes)
A BasicBlock is conv1 3×3 (stride s) → bn1 → ReLU → conv2 3×3 → bn2, plus the shortcut (identity, or
downsample = Sequential(1×1 conv stride s, BatchNorm2d) where the shape changes), then ReLU. Convolutions
have no bias. Parameter and buffer names are PyTorch's (torchvision's BasicBlock and layer naming), so a
state_dict moves between the two frameworks as NumPy arrays. Initialization as torchvision's ResNet:
Kaiming-normal convolutions (fan_out, ReLU gain), BatchNorm weight 1 and bias 0, PyTorch's default Linear.

ImageNet (torchvision.models.resnet18/34/50, the same module names, state_dict keys and initialization):
  conv1 7×7/2 64 → bn1 → ReLU → maxpool 3×3/2 padding 1 → layer1 (64 channels) → layer2 (128, stride 2)
  → layer3 (256, stride 2) → layer4 (512, stride 2) → global average pool → fc (512·expansion → num_classes)
with [2, 2, 2, 2] BasicBlocks (ResNet-18), [3, 4, 6, 3] BasicBlocks (ResNet-34) or [3, 4, 6, 3]
Bottlenecks (ResNet-50). A Bottleneck (expansion 4) is conv1 1×1 → bn1 → ReLU → conv2 3×3 (stride s: the
"v1.5" placement torchvision uses) → bn2 → ReLU → conv3 1×1 (4× the width) → bn3, plus the shortcut, then
ReLU. At 224×224 the last stage is 7×7; any input of at least 32×32 works (the average pool adapts).

The forward passes go through netcl.nn.fusion: BN + ReLU and BN + residual add + ReLU are one kernel each
in training; in eval every BatchNorm folds into the convolution before it.
"""
from __future__ import annotations

from .. import nn
from .. import random as _random
from ..errors import ShapeError
from ..nn import fusion, init
from ..tensor import Tensor


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, device, groups: int = 1) -> nn.Conv2d:
    """A bias-free convolution padded to keep the size (odd kernels), initialized as torchvision's models
    initialize theirs: kaiming_normal_(mode="fan_out"), std = √(2 / (out_ch · kh · kw))."""
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False,
                     device=device)
    conv.weight = Tensor.from_host(init.kaiming_normal(conv.weight.shape, out_ch * kernel * kernel), device,
                                   requires_grad=True)
    return conv


def _check_positive(values: dict, what: str) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ShapeError(f"{what} {name} must be a positive int, got {value!r}")


def _downsample(in_ch: int, out_ch: int, stride: int, device):
    """The shortcut's projection where the shape changes (a strided 1×1 convolution and BatchNorm), else None."""
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(_conv(in_ch, out_ch, 1, stride, device), nn.BatchNorm2d(out_ch, device=device))


class _ResidualBlock(nn.Module):
    """relu(main path(x) + shortcut(x)), fused by netcl.nn.fusion; subclasses list the main path's steps."""

    def main_path(self) -> list:
        raise NotImplementedError

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return fusion.run(self.main_path() + [fusion.Residual(shortcut), self.relu], x)


class BasicBlock(_ResidualBlock):
    expansion = 1

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, device=None):
        super().__init__()
        self.conv1 = _conv(in_ch, out_ch, 3, stride, device)
        self.bn1 = nn.BatchNorm2d(out_ch, device=device)
        self.relu = nn.ReLU()
        self.conv2 = _conv(out_ch, out_ch, 3, 1, device)
        self.bn2 = nn.BatchNorm2d(out_ch, device=device)
        self.downsample = _downsample(in_ch, out_ch, stride, device)
        self.stride = stride

    def main_path(self) -> list:
        return [self.conv1, self.bn1, self.relu, self.conv2, self.bn2]


class Bottleneck(_ResidualBlock):
    """torchvision's Bottleneck (ResNet-50 and deeper): 1×1 reduce, 3×3 with the block's stride, 1×1 expand
    to ``expansion`` × ``width`` channels; ``width`` is the stage's width (64, 128, 256, 512)."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1, device=None):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 1, 1, device)
        self.bn1 = nn.BatchNorm2d(width, device=device)
        self.conv2 = _conv(width, width, 3, stride, device)
        self.bn2 = nn.BatchNorm2d(width, device=device)
        self.conv3 = _conv(width, out_ch, 1, 1, device)
        self.bn3 = nn.BatchNorm2d(out_ch, device=device)
        self.relu = nn.ReLU()
        self.downsample = _downsample(in_ch, out_ch, stride, device)
        self.stride = stride

    def main_path(self) -> list:
        return [self.conv1, self.bn1, self.relu, self.conv2, self.bn2, self.relu, self.conv3, self.bn3]


class ResNet(nn.Module):
    """The CIFAR ResNet with ``blocks`` BasicBlocks per stage (3 → ResNet-20)."""

    def __init__(self, blocks: int, num_classes: int = 10, in_channels: int = 3, device=None):
        super().__init__()
        _check_positive({"blocks": blocks, "num_classes": num_classes, "in_channels": in_channels}, "ResNet")
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


class ImageNetResNet(nn.Module):
    """torchvision's ResNet: ``block`` (BasicBlock or Bottleneck) repeated ``layers[i]`` times in stage i+1,
    after the 7×7/2 stem and the 3×3/2 max-pool; module names and state_dict keys are torchvision's."""

    def __init__(self, block, layers, num_classes: int = 1000, in_channels: int = 3, device=None):
        super().__init__()
        if block not in (BasicBlock, Bottleneck):
            raise ShapeError(f"ImageNetResNet block must be BasicBlock or Bottleneck, got {block!r}")
        if len(layers) != 4:
            raise ShapeError(f"ImageNetResNet needs four stages, got layers={layers!r}")
        _check_positive({"num_classes": num_classes, "in_channels": in_channels,
                         **{f"layers[{i}]": n for i, n in enumerate(layers)}}, "ImageNetResNet")
        self.conv1 = _conv(in_channels, 64, 7, 2, device)
        self.bn1 = nn.BatchNorm2d(64, device=device)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels = 64
        for index, (width, stride, count) in enumerate(zip((64, 128, 256, 512), (1, 2, 2, 2), layers), start=1):
            stage = [block(channels, width, stride, device)]
            channels = width * block.expansion
            stage += [block(channels, width, 1, device) for _ in range(count - 1)]
            setattr(self, f"layer{index}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512 * block.expansion, num_classes, device=device)
        self.block_name, self.layers = block.__name__, tuple(layers)

    def forward(self, x):
        return fusion.run([self.conv1, self.bn1, self.relu, self.maxpool, self.layer1, self.layer2, self.layer3,
                           self.layer4, self.avgpool, self.flatten, self.fc], x)

    def extra_repr(self):
        return f"block={self.block_name}, layers={list(self.layers)}"


def _imagenet_resnet(block, layers, num_classes: int, in_channels: int, seed, device) -> ImageNetResNet:
    if seed is not None:
        _random.manual_seed(seed)
    return ImageNetResNet(block, layers, num_classes, in_channels, device)


def resnet18(num_classes: int = 1000, in_channels: int = 3, seed: int | None = None, device=None) -> ImageNetResNet:
    """ResNet-18 (torchvision.models.resnet18): BasicBlocks [2, 2, 2, 2], 11.7M parameters at 1000 classes;
    its state_dict keys are torchvision's (conv1.weight, layer1.0.bn2.running_var, layer2.0.downsample.0.weight,
    fc.bias, ...), so weights move both ways as NumPy arrays."""
    return _imagenet_resnet(BasicBlock, (2, 2, 2, 2), num_classes, in_channels, seed, device)


def resnet34(num_classes: int = 1000, in_channels: int = 3, seed: int | None = None, device=None) -> ImageNetResNet:
    """ResNet-34 (torchvision.models.resnet34): BasicBlocks [3, 4, 6, 3], 21.8M parameters at 1000 classes."""
    return _imagenet_resnet(BasicBlock, (3, 4, 6, 3), num_classes, in_channels, seed, device)


def resnet50(num_classes: int = 1000, in_channels: int = 3, seed: int | None = None, device=None) -> ImageNetResNet:
    """ResNet-50 (torchvision.models.resnet50, "v1.5": the stride on each Bottleneck's 3×3 conv2):
    Bottlenecks [3, 4, 6, 3], 25.6M parameters at 1000 classes; keys such as layer1.0.conv3.weight and
    layer4.2.bn3.running_mean."""
    return _imagenet_resnet(Bottleneck, (3, 4, 6, 3), num_classes, in_channels, seed, device)
