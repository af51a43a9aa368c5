"""A float64 NumPy forward pass of nc.models.resnet* from its state_dict (PyTorch's names), in training
mode (batch statistics; returns the moved running statistics too) or eval mode."""
from __future__ import annotations

import numpy as np

from util import conv2d_ref


def _bn(state, prefix, x, training, momentum=0.1, eps=1e-5, moved=None):
    axes = (0, 2, 3)
    if training:
        mean, var = x.mean(axes), x.var(axes)
        m = x.size // x.shape[1]
        if moved is not None:
            moved[prefix + "running_mean"] = (1 - momentum) * state[prefix + "running_mean"] + momentum * mean
            moved[prefix + "running_var"] = ((1 - momentum) * state[prefix + "running_var"]
                                             + momentum * var * m / (m - 1))
    else:
        mean, var = state[prefix + "running_mean"], state[prefix + "running_var"]
    shape = (1, -1, 1, 1)
    return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * state[prefix + "weight"].reshape(shape)
            + state[prefix + "bias"].reshape(shape))


def _conv(state, name, x, stride):
    w = state[name]
    pad = w.shape[2] // 2
    return conv2d_ref(x, w, (stride, stride), (pad, pad))


def resnet_forward_ref(state, x, blocks, training, moved=None, relu_inputs=None):
    """logits of the CIFAR ResNet with ``blocks`` BasicBlocks per stage; ``moved`` (a dict) receives the
    running statistics training would leave, ``relu_inputs`` (a list) every ReLU's input."""
    s = {k: np.asarray(v, np.float64) for k, v in state.items()}

    def relu(v):
        if relu_inputs is not None:
            relu_inputs.append(v)
        return np.maximum(v, 0)

    h = relu(_bn(s, "bn1.", _conv(s, "conv1.weight", np.asarray(x, np.float64), 1), training, moved=moved))
    for stage in (1, 2, 3):
        for b in range(blocks):
            p = f"layer{stage}.{b}."
            stride = 2 if stage > 1 and b == 0 else 1
            out = relu(_bn(s, p + "bn1.", _conv(s, p + "conv1.weight", h, stride), training, moved=moved))
            out = _bn(s, p + "bn2.", _conv(s, p + "conv2.weight", out, 1), training, moved=moved)
            if p + "downsample.0.weight" in s:
                shortcut = _bn(s, p + "downsample.1.", _conv(s, p + "downsample.0.weight", h, stride), training,
                               moved=moved)
            else:
                shortcut = h
            h = relu(out + shortcut)
    pooled = h.mean((2, 3))
    return pooled @ s["fc.weight"].T + s["fc.bias"]


def cross_entropy_mean(logits, target):
    m = logits.max(1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(1, keepdims=True)))[:, 0]
    return float(np.mean(lse - logits[np.arange(len(target)), target]))
