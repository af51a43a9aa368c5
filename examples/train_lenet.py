"""Train LeNet on MNIST with netcl's plain API (the `netcl train lenet` recipe at a constant learning rate).

    python examples/train_lenet.py ../shared/data/mnist   # or set NETCL_DATA, or let netcl download MNIST
"""
import sys

import netcl as nc
from netcl.data import BatchLoader
from netcl.data.mnist import MEAN, STD, load_mnist

data_dir = sys.argv[1] if len(sys.argv) > 1 else None
train_x, train_y = load_mnist("train", data_dir)
test_x, test_y = load_mnist("test", data_dir)

model = nc.models.lenet(seed=0)
loss_fn = nc.nn.CrossEntropyLoss()
optimizer = nc.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=5e-4, nesterov=True)
train_batches = BatchLoader(train_x, train_y, batch_size=64, shuffle=True, seed=0, mean=MEAN, std=STD)
test_batches = BatchLoader(test_x, test_y, batch_size=500, shuffle=False, mean=MEAN, std=STD)

for epoch in range(3):
    model.train()
    for step, (x, y) in enumerate(train_batches):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"epoch {epoch + 1} step {step}: loss {loss.item():.4f}")

    model.eval()
    correct = 0
    with nc.no_grad():
        for x, y in test_batches:
            correct += int((model(x).argmax(axis=1).to_host() == y.to_host()).sum())
    print(f"epoch {epoch + 1}: test accuracy {100 * correct / len(test_y):.2f}%")

nc.save(model.state_dict(), "lenet.ncl")
print("saved lenet.ncl; score it with: netcl eval lenet.ncl")
