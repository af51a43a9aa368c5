"""Training and evaluation loops over DataLoaders, usable from Python and behind `netcl train` / `netcl eval`.

``train_epoch`` is the loop a PyTorch user writes — zero_grad, forward, loss, backward, optimizer.step(),
then scheduler.step() for a per-batch schedule (replayed from a recording after the first steps:
netcl.training.replay) — with the loss summed on the device and read back only when the progress bar
refreshes, so the host never waits for the device inside a step.
"""
from __future__ import annotations

import time

import numpy as np

from .. import autograd
from ..nn import CrossEntropyLoss, Dropout
from .replay import CapturedStep


def dropout_state(model) -> dict:
    return {name: m.calls for name, m in model.named_modules() if isinstance(m, Dropout)}


def set_dropout_state(model, state: dict) -> None:
    for name, m in model.named_modules():
        if isinstance(m, Dropout) and name in state:
            m.calls = int(state[name])


def predict_counts(model, loader) -> dict:
    """Correct predictions and images over ``loader``'s (images, labels) batches, in eval mode."""
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    correct = images = 0
    with autograd.no_grad():
        pending = []
        for x, y in loader:
            pending.append(((model(x).argmax(axis=1)), y))
        for predicted, y in pending:  # read back after every batch is queued: no wait per batch
            correct += int((predicted.to_host() == y.to_host()).sum())
            images += y.shape[0]
    model.train(was_training)
    return {"correct": correct, "images": images, "seconds": time.perf_counter() - start}


def evaluate(model, loader) -> dict:
    """Accuracy of ``model`` on a DataLoader of (images, labels): {"accuracy", "correct", "images",
    "images_per_second"}."""
    counts = predict_counts(model, loader)
    n, seconds = counts["images"], counts["seconds"]
    return {"accuracy": counts["correct"] / max(n, 1), "correct": counts["correct"], "images": n,
            "images_per_second": n / seconds if seconds > 0 else 0.0}


def train_epoch(model, loader, optimizer, scheduler=None, progress=None, loss_fn=None,
                max_steps: int | None = None, replay: bool = True) -> dict:
    """One pass over ``loader`` (at most ``max_steps`` batches); ``scheduler.step()`` after every
    optimizer step. With ``replay`` the steps after the first few replay a recorded one
    (netcl.training.replay.CapturedStep: the same arithmetic for a fraction of the host's work). Returns
    {"train_loss" (mean over steps), "images", "seconds", "images_per_second", "steps", "loss_sum",
    "replay" (what CapturedStep did)}."""
    model.train()
    step = CapturedStep(model, optimizer, loss_fn or CrossEntropyLoss(), enabled=replay)
    steps = len(loader) if max_steps is None else min(len(loader), max_steps)
    running = None
    images = shown = done = 0
    start = time.perf_counter()
    for k, (x, y) in enumerate(loader):
        if k == steps:
            break
        value = step(x, y)
        if scheduler is not None:
            scheduler.step()
        running = value if running is None else running + value
        images += x.shape[0]
        done = k + 1
        if progress is not None and (done == steps or done % 20 == 0):
            elapsed = time.perf_counter() - start
            progress.update(done - shown)
            shown = done
            progress.set_postfix(loss=f"{running.item() / done:.4f}", img_s=f"{images / elapsed:.0f}",
                                 lr=f"{optimizer.param_groups[0]['lr']:.4f}")
    loss_sum = running.item() if running is not None else float("nan")
    seconds = time.perf_counter() - start
    return {"train_loss": loss_sum / done if done else float("nan"), "loss_sum": loss_sum, "images": images,
            "seconds": seconds, "images_per_second": images / seconds if seconds > 0 else 0.0, "steps": done,
            "replay": step.status}


__all__ = ["train_epoch", "evaluate", "predict_counts", "dropout_state", "set_dropout_state"]
