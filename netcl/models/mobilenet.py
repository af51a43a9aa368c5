"""MobileNetV2 (Sandler et al., Inverted Residuals and Linear Bottlenecks), as torchvision.models.mobilenet_v2
builds it: the same modules, names, state_dict keys and initialization.

  features.0   Conv2dNormActivation: 3×3/2 convolution → BatchNorm2d → ReLU6 (32·width_mult channels)
  features.1…17  InvertedResidual blocks, stages (t expansion, c channels, n blocks, s first stride):
               (1, 16, 1, 1) (6, 24, 2, 2) (6, 32, 3, 2) (6, 64, 4, 2) (6, 96, 3, 1) (6, 160, 3, 2) (6, 320, 1, 1)
  features.18  Conv2dNormActivation: 1×1 → BatchNorm2d → ReLU6 (1280·max(1, width_mult) channels)
  global average pool → classifier: Dropout(0.2) → Linear (→ num_classes)
Channel counts c·width_mult round to multiples of 8 (torchvision's _make_divisible). An InvertedResidual's
``conv`` is [1×1 expand Conv2dNormActivation (when t ≠ 1),] 3×3 depthwise Conv2dNormActivation (groups =
channels, the block's stride), 1×1 Conv2d, BatchNorm2d (linear: no activation); the input is added back
where the stride is 1 and the channels stay. Keys: features.0.0.weight, features.1.conv.0.0.weight,
features.2.conv.1.1.running_mean, features.18.1.running_var, classifier.1.weight, ...

Convolutions are kaiming_normal_(mode="fan_out") with no bias, BatchNorm weight 1 and bias 0, the Linear
normal(0, 0.01) with bias 0. Every Conv2d → BatchNorm2d → ReLU6 runs through netcl.nn.fusion: BN + ReLU6 in
one kernel in training, the BatchNorm folded into the convolution in inference.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import nn
from .. import random as _random
from ..errors import ShapeError
from ..nn import init
from ..tensor import Tensor
from .resnet import _check_positive, _conv

# (expansion t, output channels c, blocks n, first stride s) of each stage
INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1))


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: the nearest multiple of ``divisor`` (at least ``divisor``), one more
    multiple where rounding down would lose more than 10 %."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation with BatchNorm2d and ReLU6: "0" the convolution (bias-free,
    padded to keep the size), "1" the BatchNorm, "2" the ReLU6."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3, stride: int = 1, groups: int = 1, device=None):
        super().__init__(_conv(in_ch, out_ch, kernel_size, stride, device, groups),
                         nn.BatchNorm2d(out_ch, device=device), nn.ReLU6())
        self.out_channels = out_ch


class InvertedResidual(nn.Module):
    """Expand (1×1, ``expand_ratio`` × the input channels), filter (3×3 depthwise, ``stride``), project
    (1×1, linear); plus the input where stride is 1 and the channel count stays."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand_ratio: int, device=None):
        super().__init__()
        if stride not in (1, 2):
            raise ShapeError(f"InvertedResidual stride must be 1 or 2, got {stride!r}")
        hidden = int(round(in_ch * expand_ratio))
        self.stride = stride
        self.use_res_connect = stride == 1 and in_ch == out_ch
        layers = [Conv2dNormActivation(in_ch, hidden, kernel_size=1, device=device)] if expand_ratio != 1 else []
        layers += [Conv2dNormActivation(hidden, hidden, stride=stride, groups=hidden, device=device),
                   _conv(hidden, out_ch, 1, 1, device), nn.BatchNorm2d(out_ch, device=device)]
        self.conv = nn.Sequential(*layers)
        self.out_channels = out_ch

    def forward(self, x):
        y = self.conv(x)
        return x + y if self.use_res_connect else y


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (see the module's docstring for the layout)."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, in_channels: int = 3,
                 dropout: float = 0.2, device=None):
        super().__init__()
        _check_positive({"num_classes": num_classes, "in_channels": in_channels}, "MobileNetV2")
        if not isinstance(width_mult, numbers.Real) or isinstance(width_mult, bool) or not width_mult > 0:
            raise ShapeError(f"MobileNetV2 width_mult must be a positive number, got {width_mult!r}")
        channels = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(1280 * max(1.0, width_mult))
        features = [Conv2dNormActivation(in_channels, channels, stride=2, device=device)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            out_ch = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(channels, out_ch, s if i == 0 else 1, t, device))
                channels = out_ch
        features.append(Conv2dNormActivation(channels, self.last_channel, kernel_size=1, device=device))
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten()
        classifier = nn.Linear(self.last_channel, num_classes, device=device)
        classifier.weight = Tensor.from_host(init.normal(classifier.weight.shape, 0.01), device, requires_grad=True)
        classifier.bias = Tensor.from_host(np.zeros(num_classes, np.float32), device, requires_grad=True)
        self.classifier = nn.Sequential(nn.Dropout(dropout), classifier)
        self.width_mult = float(width_mult)

    def forward(self, x):
        return self.classifier(self.flatten(self.avgpool(self.features(x))))

    def extra_repr(self):
        return f"width_mult={self.width_mult}"


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0, in_channels: int = 3, seed: int | None = None,
                 device=None) -> MobileNetV2:
    """MobileNetV2 (torchvision.models.mobilenet_v2): 3.5M parameters at 1000 classes and width 1.0; its
    state_dict keys are torchvision's, so weights move both ways as NumPy arrays. ``width_mult`` scales every
    layer's channels (rounded to multiples of 8); the last layer keeps at least 1280."""
    if seed is not None:
        _random.manual_seed(seed)
    return MobileNetV2(num_classes, width_mult, in_channels, device=device)
