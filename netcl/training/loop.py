"""Training and evaluation loops, usable from Python and behind `netcl train` / `netcl eval`.

The default recipe (RECIPE) is plain SGD with momentum on normalized inputs and a cosine learning-rate
decay over the whole run; every step is a function of (seed, epoch, step), so a run resumed from a
checkpoint continues exactly as the uninterrupted run would (with deterministic kernels).
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import autograd
from ..data import BatchLoader
from ..data.mnist import MEAN, STD
from ..nn import CrossEntropyLoss, Dropout

RECIPE = {"lr": 0.03, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True, "schedule": "cosine",
          "warmup_steps": 50}


def learning_rate(base_lr: float, step: int, total_steps: int, schedule: str = "cosine", warmup_steps: int = 0):
    """The rate for optimizer step ``step`` (0-based) of ``total_steps``: a linear warm-up, then cosine to 0."""
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return base_lr
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def dropout_state(model) -> dict:
    return {name: m.calls for name, m in model.named_modules() if isinstance(m, Dropout)}


def set_dropout_state(model, state: dict) -> None:
    for name, m in model.named_modules():
        if isinstance(m, Dropout) and name in state:
            m.calls = int(state[name])


def evaluate(model, images: np.ndarray, labels: np.ndarray, batch_size: int = 500, device=None) -> dict:
    """Accuracy of ``model`` on uint8 images (normalized like training) and their labels."""
    was_training = model.training
    model.eval()
    loader = BatchLoader(images, labels, batch_size, shuffle=False, mean=MEAN, std=STD, device=device)
    start = time.perf_counter()
    with autograd.no_grad():
        predictions = []
        for x, _ in loader:
            predictions.append(model(x).argmax(axis=1))
        predicted = np.concatenate([p.to_host() for p in predictions]) if predictions else np.zeros(0, np.int64)
    seconds = time.perf_counter() - start
    correct = int((predicted == labels[:len(predicted)]).sum())
    model.train(was_training)
    n = len(predicted)
    return {"accuracy": correct / max(n, 1), "correct": correct, "images": n,
            "images_per_second": n / seconds if seconds > 0 else float("nan")}


def train_epoch(model, loader: BatchLoader, optimizer, epoch: int, total_steps: int, base_lr: float,
                schedule: str = "cosine", warmup_steps: int = 0, progress=None, start_step: int = 0) -> dict:
    """One pass over ``loader`` (its order set from ``epoch``); returns the mean loss and images/s.

    The loss is accumulated on the device and read back only when the progress bar refreshes, so the
    host never waits for the device inside a step."""
    model.train()
    loss_fn = CrossEntropyLoss()
    loader.set_epoch(epoch)
    running = None
    images = 0
    steps = len(loader)
    shown_steps = 0
    start = time.perf_counter()
    for k, (x, y) in enumerate(loader):
        lr = learning_rate(base_lr, start_step + k, total_steps, schedule, warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        value = loss.detach()
        running = value if running is None else running + value
        images += x.shape[0]
        if progress is not None and (k + 1 == steps or (k + 1) % 20 == 0):
            mean_loss = running.item() / (k + 1)
            elapsed = time.perf_counter() - start
            progress.update(k + 1 - shown_steps)
            shown_steps = k + 1
            progress.set_postfix(loss=f"{mean_loss:.4f}", img_s=f"{images / elapsed:.0f}", lr=f"{lr:.4f}")
    mean_loss = running.item() / steps if steps else float("nan")
    seconds = time.perf_counter() - start
    return {"train_loss": mean_loss, "images": images, "seconds": seconds,
            "images_per_second": images / seconds if seconds > 0 else float("nan"), "steps": steps}
