"""Train LeNet on MNIST with netcl's plain API: Dataset/DataLoader, transforms, SGD and a OneCycleLR schedule.

    python examples/train_lenet.py ../shared/data/mnist   # or set NETCL_DATA, or let netcl download MNIST
"""
import sys

import netcl as nc
from netcl.data import DataLoader, TensorDataset
from netcl.data import transforms as T
from netcl.data.mnist import MEAN, STD, load_mnist

data_dir = sys.argv[1] if len(sys.argv) > 1 else None
epochs = 3
nc.manual_seed(0)

to_input = T.Normalize(MEAN, STD, scale=1 / 255)  # uint8 pixels -> normalized float32, stated explicitly
train_set = TensorDataset(*load_mnist("train", data_dir), transform=to_input)
test_set = TensorDataset(*load_mnist("test", data_dir), transform=to_input)
train_batches = DataLoader(train_set, batch_size=64, shuffle=True)
test_batches = DataLoader(test_set, batch_size=500)

model = nc.models.lenet()
loss_fn = nc.nn.CrossEntropyLoss()
optimizer = nc.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=5e-4, nesterov=True)
scheduler = nc.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.03, epochs=epochs,
                                             steps_per_epoch=len(train_batches), cycle_momentum=False)

for epoch in range(epochs):
    model.train()
    for step, (x, y) in enumerate(train_batches):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 100 == 0:
            print(f"epoch {epoch + 1} step {step}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.4f}")

    model.eval()
    correct = 0
    with nc.no_grad():
        for x, y in test_batches:
            correct += int((model(x).argmax(axis=1).to_host() == y.to_host()).sum())
    print(f"epoch {epoch + 1}: test accuracy {100 * correct / len(test_set):.2f}%")

nc.save(model.state_dict(), "lenet.ncl")
print("saved lenet.ncl; score it with: netcl eval lenet.ncl")
