"""Train ResNet-20 on MNIST padded to 32x32 with netcl's plain API: a Dataset, DataLoader with augmentation,
SGD with Nesterov momentum and weight decay, a OneCycleLR schedule stepped every batch, and a checkpoint.

    python examples/train_resnet20.py ../shared/data/mnist [epochs]   # or set NETCL_DATA
"""
import sys

import numpy as np

import netcl as nc
from netcl.data import DataLoader, Dataset
from netcl.data import transforms as T
from netcl.data.mnist import MEAN, STD, load_mnist

data_dir = sys.argv[1] if len(sys.argv) > 1 else None
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
nc.manual_seed(0)


class MNIST(Dataset):
    """A map-style dataset, as one writes for PyTorch: sample i is (image (1, 28, 28) uint8, label)."""

    def __init__(self, split, transform):
        self.images, self.labels = load_mnist(split, data_dir)
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i][None]), self.labels[i]

    def get_batch(self, indices, rng):
        # optional: the whole batch through the transforms at once (each image still gets its own crop)
        return self.transform(self.images[indices][:, None], rng), self.labels[indices]


train_set = MNIST("train", T.Compose([T.Pad(2), T.RandomCrop(32, padding=2), T.Normalize(MEAN, STD, scale=1 / 255)]))
test_set = MNIST("test", T.Compose([T.Pad(2), T.Normalize(MEAN, STD, scale=1 / 255)]))
train_batches = DataLoader(train_set, batch_size=64, shuffle=True)
test_batches = DataLoader(test_set, batch_size=500)

model = nc.models.resnet20(num_classes=10, in_channels=1)
loss_fn = nc.nn.CrossEntropyLoss()
optimizer = nc.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
scheduler = nc.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=epochs,
                                             steps_per_epoch=len(train_batches), pct_start=0.25)

for epoch in range(epochs):
    model.train()
    losses = []
    for step, (x, y) in enumerate(train_batches):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
        if step % 50 == 0:
            print(f"epoch {epoch + 1} step {step}/{len(train_batches)}: loss {loss.item():.4f}, "
                  f"lr {scheduler.get_last_lr()[0]:.4f}")

    model.eval()  # BatchNorm uses its running statistics
    correct = 0
    with nc.no_grad():
        for x, y in test_batches:
            correct += int((model(x).argmax(axis=1).to_host() == y.to_host()).sum())
    mean_loss = float(np.mean([l.item() for l in losses]))
    print(f"epoch {epoch + 1}: train loss {mean_loss:.4f}, test accuracy {100 * correct / len(test_set):.2f}%")
    nc.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "epoch": epoch + 1}, "resnet20.ncl")

print("saved resnet20.ncl")
