"""The modified LeNet of Hao Zhang, "A Simple and Efficient Implementation of im2col in Convolution
Neural Networks" (2017), Table 2.

  conv1 20@5×5 s1 p0 → relu1 → pool1 max 2×2/2 → conv2 50@5×5 s1 p0 → relu2 → pool2 max 2×2/2
  → fc3 500 → relu3 → drop3 → fc4 10
For 1×28×28 inputs: 20×24×24 → 20×12×12 → 50×8×8 → 50×4×4 → 800 → 500 → 10 (431,080 parameters).
The layer names are the table's, so state_dict keys read "conv1.weight", "fc3.bias", ...
"""
from __future__ import annotations

from collections import OrderedDict

from .. import nn


def lenet(num_classes: int = 10, in_channels: int = 1, dropout: float = 0.5, seed: int | None = None,
          device=None, conv_strategy: str = "auto") -> nn.Sequential:
    """A freshly initialized (PyTorch default initialization) LeNet; ``seed`` makes it reproducible."""
    if seed is not None:
        nn.init.manual_seed(seed)
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 20, 5, strategy=conv_strategy, device=device)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2, 2)),
        ("conv2", nn.Conv2d(20, 50, 5, strategy=conv_strategy, device=device)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2, 2)),
        ("flatten", nn.Flatten()),
        ("fc3", nn.Linear(50 * 4 * 4, 500, device=device)),
        ("relu3", nn.ReLU()),
        ("drop3", nn.Dropout(dropout)),
        ("fc4", nn.Linear(500, num_classes, device=device)),
    ]))
