"""`netcl train lenet` and `netcl eval CHECKPOINT`.

A run directory (--out, default runs/lenet) holds:
  checkpoint.ncl   the latest state (model, optimizer, epoch, dropout counters, history), rewritten atomically
                   after every epoch, so a crash mid-write leaves the previous one intact
  metrics.json     one entry per epoch: train_loss, test_accuracy, images_per_second, lr, seconds
  curves.png       loss and accuracy per epoch, only when matplotlib is installed
`--resume` continues from checkpoint.ncl: same batches, same dropout masks, same momentum, so the result
equals the uninterrupted run (with deterministic kernels, nc.use_deterministic(True)).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import serialization
from ..data.mnist import MEAN, STD, load_mnist
from ..errors import CheckpointError, ShapeError
from ..runtime.cache import atomic_write_json
from ..runtime.binaries import save_binaries
from . import loop

CHECKPOINT = "checkpoint.ncl"
METRICS = "metrics.json"
FORMAT = "netcl-train-1"


def _model(name: str, seed: int):
    from .. import models
    if name != "lenet":
        raise ShapeError(f"unknown model {name!r}; netcl trains: lenet")
    return models.lenet(seed=seed)


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a bare install should still train
        return None
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=not enabled, leave=True,
                dynamic_ncols=True)


def _plot(history: list, path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h["train_loss"] for h in history], marker="o")
    a.set_xlabel("epoch")
    a.set_ylabel("training loss")
    b.plot(epochs, [100 * h["test_accuracy"] for h in history], marker="o", color="C1")
    b.set_xlabel("epoch")
    b.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def train(model_name: str = "lenet", epochs: int = 3, batch_size: int = 64, lr: float | None = None,
          data_dir=None, out="runs/lenet", seed: int = 0, resume: bool = False, limit_steps: int | None = None,
          stop_after: int | None = None, eval_limit: int | None = None, progress: bool = True,
          log=print) -> dict:
    """Train, evaluating on the test set after each epoch; returns the summary of `netcl train --json`.

    ``stop_after`` ends this invocation after that many epochs (as an interruption would), ``eval_limit``
    scores only the first test images (both for tests and quick looks)."""
    if epochs < 1 or batch_size < 1:
        raise ShapeError(f"--epochs and --batch-size must be positive, got {epochs} and {batch_size}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_x, train_y = load_mnist("train", data_dir)
    test_x, test_y = load_mnist("test", data_dir)
    if eval_limit is not None:
        test_x, test_y = test_x[:eval_limit], test_y[:eval_limit]
    recipe = dict(loop.RECIPE)
    base_lr = recipe["lr"] if lr is None else float(lr)
    model = _model(model_name, seed)
    from ..optim import SGD
    optimizer = SGD(model.parameters(), lr=base_lr, momentum=recipe["momentum"],
                    weight_decay=recipe["weight_decay"], nesterov=recipe["nesterov"])
    loader = loop.BatchLoader(train_x, train_y, batch_size, shuffle=True, seed=seed, mean=MEAN, std=STD,
                              limit=limit_steps)
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * epochs
    start_epoch, history = 0, []
    checkpoint_path = out / CHECKPOINT
    if resume:
        if not checkpoint_path.exists():
            raise CheckpointError(f"--resume: no checkpoint at {checkpoint_path}; run without --resume first")
        state = serialization.load(checkpoint_path)
        if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("model") != model_name:
            raise CheckpointError(f"{checkpoint_path} is not a `netcl train {model_name}` checkpoint")
        model.load_state_dict(state["model_state"])
        optimizer.load_state_dict(state["optimizer"])
        loop.set_dropout_state(model, state["dropout"])
        start_epoch, history = int(state["epoch"]), list(state["history"])
        if state.get("seed") != seed or state.get("batch_size") != batch_size:
            log(f"note: resuming a run made with seed {state.get('seed')} and batch size "
                f"{state.get('batch_size')} (now {seed} and {batch_size})", file=sys.stderr)
        log(f"resuming {checkpoint_path} after epoch {start_epoch}", file=sys.stderr)

    last = history[-1] if history else None
    end_epoch = epochs if stop_after is None else min(epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, end_epoch):
        bar = _progress(steps_per_epoch, f"epoch {epoch + 1}/{epochs}", progress)
        stats = loop.train_epoch(model, loader, optimizer, epoch, total_steps, base_lr, recipe["schedule"],
                                 recipe["warmup_steps"], bar, start_step=epoch * steps_per_epoch)
        if bar is not None:
            bar.close()
        score = loop.evaluate(model, test_x, test_y)
        last = {"epoch": epoch + 1, "train_loss": stats["train_loss"], "test_accuracy": score["accuracy"],
                "images_per_second": stats["images_per_second"], "seconds": stats["seconds"],
                "lr": optimizer.param_groups[0]["lr"]}
        history.append(last)
        log(f"epoch {epoch + 1}/{epochs}: train loss {stats['train_loss']:.4f}, test accuracy "
            f"{100 * score['accuracy']:.2f}% ({score['correct']}/{score['images']}), "
            f"{stats['images_per_second']:.0f} images/s", file=sys.stderr)
        serialization.save({"format": FORMAT, "model": model_name, "model_state": model.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                            "dropout": loop.dropout_state(model), "history": history, "seed": seed,
                            "batch_size": batch_size, "epochs": epochs, "lr": base_lr,
                            "normalization": {"mean": MEAN, "std": STD}}, checkpoint_path)
        atomic_write_json(out / METRICS, {"model": model_name, "epochs": history, "batch_size": batch_size,
                                          "lr": base_lr, "seed": seed, "recipe": recipe})
        save_binaries()  # the kernels built so far reach the disk cache even if a later epoch is killed
    plot = _plot(history, out / "curves.png") if history else None
    if last is None:
        raise CheckpointError(f"nothing to report: no epoch was trained and {checkpoint_path} has no history")
    summary = {"test_accuracy": last["test_accuracy"], "train_loss": last["train_loss"],
               "epochs": last["epoch"], "images_per_second": last["images_per_second"],
               "checkpoint": str(checkpoint_path), "metrics": str(out / METRICS), "history": history}
    if plot:
        summary["curves"] = plot
    return summary


def _select_device(args) -> None:
    if getattr(args, "device", None) is not None:
        from ..runtime.device import set_default_device
        set_default_device(args.device)


def train_command(args) -> dict:
    _select_device(args)
    started = time.perf_counter()
    summary = train(args.model, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                    data_dir=args.data_dir, out=args.out, seed=args.seed, resume=args.resume,
                    limit_steps=args.limit_steps, log=_log)
    summary["seconds"] = time.perf_counter() - started
    if not args.json:
        print(f"test accuracy {100 * summary['test_accuracy']:.2f}% after {summary['epochs']} epochs; "
              f"checkpoint {summary['checkpoint']}")
    return summary


def evaluate_checkpoint(path, data_dir=None, batch_size: int = 500, limit: int | None = None) -> dict:
    """Score a checkpoint of `netcl train` (or a bare LeNet state_dict) on the (first ``limit``) test images."""
    state = serialization.load(path)
    if not isinstance(state, dict) or "model_state" not in state:
        # a bare state_dict saved with nc.save(model.state_dict(), path) is accepted for LeNet
        model_name, model_state = "lenet", state
    else:
        model_name, model_state = state.get("model", "lenet"), state["model_state"]
    model = _model(model_name, 0)
    model.load_state_dict(model_state)
    test_x, test_y = load_mnist("test", data_dir)
    if limit is not None:
        test_x, test_y = test_x[:limit], test_y[:limit]
    score = loop.evaluate(model, test_x, test_y, batch_size)
    return {"test_accuracy": score["accuracy"], "correct": score["correct"], "images": score["images"],
            "images_per_second": score["images_per_second"], "checkpoint": str(path), "model": model_name}


def eval_command(args) -> dict:
    _select_device(args)
    result = evaluate_checkpoint(args.checkpoint, args.data_dir, args.batch_size)
    if not args.json:
        print(f"{result['checkpoint']}: test accuracy {100 * result['test_accuracy']:.2f}% "
              f"({result['correct']}/{result['images']})")
    return result


def _log(message: str, file=None) -> None:
    print(message, file=file or sys.stderr)
