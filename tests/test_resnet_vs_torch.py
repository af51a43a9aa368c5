"""The issue's numeric target: ResNet-20 against PyTorch float64 with the same weights moved through
state_dict as NumPy arrays. Loss and every parameter's gradient within 2e-3 relative (L2 per tensor),
running statistics within 1e-4, in train and in eval mode. Runs only where torch is installed, with -m slow.

The weights and data come from fixed seeds. In float32 a ReLU mask flips for an activation within
rounding of zero, and one flipped element moves a BatchNorm bias gradient (a sum over a channel) by up to
~1e-2 relative: PyTorch float32 itself differs from its float64 run by 3e-3 to 6e-3 on 4 of 8 random
seeds (netcl likewise, on other seeds). The 2e-3 target holds for inputs without such a tie, which these
seeds are; otherwise netcl and PyTorch float32 are both within about 3e-6 of float64."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from util import rel_l2

torch = pytest.importorskip("torch")
tnn = torch.nn


class TorchBlock(tnn.Module):
    def __init__(self, in_ch, out_ch, stride):
        super().__init__()
        self.conv1 = tnn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(out_ch)
        self.relu = tnn.ReLU()
        self.conv2 = tnn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = tnn.Sequential(tnn.Conv2d(in_ch, out_ch, 1, stride, bias=False), tnn.BatchNorm2d(out_ch))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + shortcut)


class TorchResNet(tnn.Module):
    def __init__(self, blocks, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = tnn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(16)
        self.relu = tnn.ReLU()
        ch = 16
        for i, (width, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
            layers = [TorchBlock(ch, width, stride)] + [TorchBlock(width, width, 1) for _ in range(blocks - 1)]
            setattr(self, f"layer{i}", tnn.Sequential(*layers))
            ch = width
        self.avgpool = tnn.AdaptiveAvgPool2d(1)
        self.fc = tnn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x))))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _step(nc_model, torch_model, x_h, t_h, device):
    loss = nc.nn.CrossEntropyLoss()(nc_model(nc.tensor(x_h, device=device)), nc.tensor(t_h, device=device))
    loss.backward()
    t_loss = tnn.functional.cross_entropy(torch_model(torch.tensor(x_h, dtype=torch.float64)), torch.tensor(t_h))
    t_loss.backward()
    grads = {name: rel_l2(p.grad.to_host(), dict(torch_model.named_parameters())[name].grad.numpy())
             for name, p in nc_model.named_parameters()}
    return abs(loss.item() - t_loss.item()) / abs(t_loss.item()), grads


@pytest.mark.slow  # about 35 s on the 2-core machine
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_resnet20_matches_pytorch_float64(device, mode):
    rng = np.random.default_rng(3)
    model = nc.models.resnet20(seed=3, device=device)
    reference = TorchResNet(3).double()
    if mode == "eval":  # running statistics away from their initial 0 / 1, so eval differs from train
        for _ in range(2):
            model(nc.tensor(rng.normal(0.5, 2, size=(8, 3, 32, 32)).astype(np.float32), device=device))
    state = {k: v.to_host() for k, v in model.state_dict().items()}
    assert list(state) == list(reference.state_dict())
    reference.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    getattr(model, mode)()
    getattr(reference, mode)()
    x_h = rng.normal(size=(16, 3, 32, 32)).astype(np.float32)
    t_h = rng.integers(0, 10, size=16)
    loss_err, grads = _step(model, reference, x_h, t_h, device)
    ours, theirs = model.state_dict(), reference.state_dict()
    stats = {k: float(np.max(np.abs(ours[k].to_host() - theirs[k].numpy())))
             for k in ours if "running" in k}
    counts = {int(ours[k].to_host()) == int(theirs[k]) for k in ours if k.endswith("num_batches_tracked")}
    worst = max(grads, key=grads.get)
    print(f"\n{mode}: loss rel err {loss_err:.2e}; worst gradient {worst} {grads[worst]:.2e} "
          f"(median {np.median(list(grads.values())):.2e}); running stats max abs err {max(stats.values()):.2e}")
    assert loss_err <= 2e-3
    assert grads[worst] <= 2e-3, grads
    assert max(stats.values()) <= 1e-4, stats
    assert counts == {True}
