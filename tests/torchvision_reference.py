"""What the torchvision-model tests (tests/test_models_imagenet.py) and the script that wrote their fixtures
(tests/fixtures/make_torchvision_fixtures.py, run once under PyTorch) share: the model configurations, and
deterministic synthetic weights and data drawn from NumPy, so that only PyTorch's outputs are stored.
NumPy only (the fixture script imports it beside torch; netcl never does)."""
from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
KEYS_FILE = FIXTURES / "torchvision_state_dicts.json"
OUTPUTS_FILE = FIXTURES / "torchvision_outputs.npz"

# state_dict key lists and shapes, as torchvision builds the models with these arguments
KEYED_MODELS = {
    "resnet18": ("resnet18", {}),
    "resnet34": ("resnet34", {}),
    "resnet50": ("resnet50", {}),
    "mobilenet_v2": ("mobilenet_v2", {}),
    "mobilenet_v2_w0.35_c10": ("mobilenet_v2", {"width_mult": 0.35, "num_classes": 10}),
    "resnet18_c1_gray": ("resnet18", {"num_classes": 1, "in_channels": 1}),
}

# forward (eval) and a training step (loss, gradients) computed by PyTorch on synthetic weights and data
NUMERIC_MODELS = {
    "resnet18": ("resnet18", {"num_classes": 7}),
    "resnet50": ("resnet50", {"num_classes": 7}),
    "mobilenet_v2": ("mobilenet_v2", {"num_classes": 7, "dropout": 0.0}),
}
BATCH_SHAPE = (2, 3, 96, 96)  # the last stage 3×3: 18 values a channel for its BatchNorms
NUM_CLASSES = 7
DATA_SEED = 46

# gradients stored in full (the rest as L2 norms): the stem, where every path's error has gathered, and the
# head
FULL_GRADIENTS = {
    "resnet18": ("conv1.weight", "bn1.weight", "bn1.bias", "layer4.1.bn2.weight", "fc.weight", "fc.bias"),
    "resnet50": ("conv1.weight", "bn1.bias", "layer4.2.bn3.weight", "fc.bias"),
    "mobilenet_v2": ("features.0.0.weight", "features.0.1.weight", "features.1.conv.0.0.weight",
                     "features.18.1.bias", "classifier.1.weight", "classifier.1.bias"),
}


def synthetic_state(shapes, seed: int) -> dict:
    """Weights for the (key, shape) list in order: convolutions and linear layers uniform with the variance
    of He initialization over their fan-in, BatchNorm weights in [0.5, 1.5), biases and running means in
    [-0.1, 0.1), running variances in [0.5, 1.5), num_batches_tracked 0. float32 (int64 for the count)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in shapes:
        shape = tuple(shape)
        if key.endswith("num_batches_tracked"):
            state[key] = np.zeros(shape, np.int64)
            continue
        u = rng.random(shape)
        if len(shape) >= 2:  # conv (K, C/groups, kh, kw) or linear (out, in)
            fan_in = math.prod(shape[1:])
            value = (2 * u - 1) * math.sqrt(6.0 / fan_in)
        elif key.endswith("running_var") or (key.endswith(".weight")):
            value = 0.5 + u
        else:  # biases and running means
            value = 0.2 * u - 0.1
        state[key] = value.astype(np.float32)
    return state


def model_seed(name: str) -> int:
    return zlib.crc32(name.encode())


def synthetic_batch(shape=BATCH_SHAPE, num_classes: int = NUM_CLASSES):
    """(images float32 of ``shape``, integer targets) in [-1, 1) (BATCH_SHAPE for every numeric model)."""
    rng = np.random.default_rng(DATA_SEED)
    images = rng.random(shape).astype(np.float32) * 2 - 1
    targets = rng.integers(0, num_classes, size=shape[0]).astype(np.int64)
    return images, targets
