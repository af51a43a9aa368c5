"""`netcl train lenet|resnet8|resnet20|resnet32` and `netcl eval CHECKPOINT`.

A run directory (--out, default runs/<model>) holds:
  checkpoint.ncl   the latest state (model, optimizer, scheduler, epoch, dropout counters, host RNG state,
                   history), rewritten atomically after every epoch, so a crash mid-write leaves the previous
                   one intact
  metrics.json     one entry per epoch: train_loss, test_accuracy, images_per_second, lr, seconds
  curves.png       loss and accuracy per epoch, only when matplotlib is installed
`--resume` continues from checkpoint.ncl: same batches and augmentation (functions of seed and epoch), same
dropout masks, momentum and schedule position, so the result equals the uninterrupted run (with
deterministic kernels, nc.use_deterministic(True)). With --distributed (under mpiexec) see
netcl.training.distributed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import serialization
from ..data import DataLoader, TensorDataset
from ..data.mnist import MEAN, STD, load_mnist
from ..errors import CheckpointError, ShapeError
from ..runtime.binaries import save_binaries
from ..runtime.cache import atomic_write_json
from . import distributed as dist_tools
from . import loop, recipes
from .progress import plot_curves, progress_bar

CHECKPOINT = "checkpoint.ncl"
METRICS = "metrics.json"
FORMAT = "netcl-train-2"
EVAL_BATCH = 500


def _host_rng_state():
    from ..random import host_generator
    return host_generator().bit_generator.state


def _set_host_rng_state(state) -> None:
    from ..random import host_generator
    if state:
        host_generator().bit_generator.state = state


def _load_checkpoint(path: Path, model_name: str) -> dict:
    if not path.exists():
        raise CheckpointError(f"--resume: no checkpoint at {path}; run without --resume first")
    state = serialization.load(path)
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("model") != model_name:
        raise CheckpointError(f"{path} is not a `netcl train {model_name}` checkpoint of this netcl version")
    return state


def train(model_name: str = "lenet", epochs: int = 3, batch_size: int | None = None, lr: float | None = None,
          data_dir=None, out=None, seed: int = 0, resume: bool = False, limit_steps: int | None = None,
          stop_after: int | None = None, eval_limit: int | None = None, train_limit: int | None = None,
          distributed: bool = False, progress: bool = True, log=print, replay: bool = True) -> dict:
    """Train, evaluating on the test set after each epoch; returns the summary of `netcl train --json`.

    ``limit_steps`` caps the batches per epoch, ``stop_after`` ends this invocation after that many epochs
    (as an interruption would), ``eval_limit`` / ``train_limit`` use only the first test / training images
    (for tests and quick looks). ``batch_size`` None: the recipe's. ``replay`` False runs every step as
    written instead of replaying a recorded one (netcl.training.replay)."""
    if batch_size is None:
        batch_size = recipes.recipe(model_name)["batch_size"]
    if epochs < 1 or batch_size < 1:
        raise ShapeError(f"--epochs and --batch-size must be positive, got {epochs} and {batch_size}")
    ranks = dist_tools.Ranks.start(distributed)
    local_batch = dist_tools.local_batch_size(batch_size, ranks)
    out = Path(out if out is not None else f"runs/{model_name}")
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
    train_x, train_y = load_mnist("train", data_dir)
    test_x, test_y = load_mnist("test", data_dir)
    train_x, train_y = train_x[:train_limit], train_y[:train_limit]
    test_x, test_y = test_x[:eval_limit], test_y[:eval_limit]
    train_set = TensorDataset(train_x, train_y, recipes.transforms(model_name, train=True))
    test_set = TensorDataset(test_x, test_y, recipes.transforms(model_name, train=False))
    sampler = dist_tools.train_sampler(train_set, ranks, seed)
    loader = DataLoader(train_set, local_batch, shuffle=sampler is None, sampler=sampler, seed=seed)
    eval_loader = DataLoader(test_set, EVAL_BATCH, sampler=dist_tools.eval_shard(len(test_set), ranks))
    steps_per_epoch = len(loader) if limit_steps is None else min(len(loader), limit_steps)
    if steps_per_epoch == 0:
        raise ShapeError(f"no training batches: {len(train_set)} images for a batch of {batch_size}")

    model = recipes.build_model(model_name, seed)
    optimizer, scheduler = recipes.optimizer_and_schedule(model_name, model.parameters(), lr,
                                                          steps_per_epoch * epochs)
    start_epoch, history = 0, []
    checkpoint_path = out / CHECKPOINT
    if resume:
        state = _load_checkpoint(checkpoint_path, model_name)
        saved_steps = state["scheduler"].get("total_steps")
        if saved_steps != scheduler.total_steps:
            raise CheckpointError(
                f"{checkpoint_path} was made for a schedule of {saved_steps} steps ({state.get('epochs')} epochs, "
                f"batch size {state.get('batch_size')}); this run's spans {scheduler.total_steps} ({epochs} epochs, "
                f"batch size {batch_size}): resume with the same --epochs, --batch-size and --limit-steps")
        model.load_state_dict(state["model_state"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        loop.set_dropout_state(model, state["dropout"])
        _set_host_rng_state(state.get("host_rng"))
        start_epoch, history = int(state["epoch"]), list(state["history"])
        if state.get("seed") != seed and ranks.is_main:
            log(f"note: resuming a run made with seed {state.get('seed')} (now {seed})", file=sys.stderr)
        if ranks.is_main:
            log(f"resuming {checkpoint_path} after epoch {start_epoch}", file=sys.stderr)
    trained = dist_tools.wrap(model, ranks)
    loss_fn = recipes.loss_function(model_name)

    last = history[-1] if history else None
    end_epoch = epochs if stop_after is None else min(epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, end_epoch):
        loader.set_epoch(epoch)
        bar = progress_bar(steps_per_epoch, f"epoch {epoch + 1}/{epochs}", progress and ranks.is_main)
        stats = loop.train_epoch(trained, loader, optimizer, scheduler, bar, max_steps=steps_per_epoch,
                                 loss_fn=loss_fn, replay=replay)
        if bar is not None:
            bar.close()
        counts = loop.predict_counts(trained, eval_loader)  # a wrapper shares rank 0's BatchNorm statistics
        correct, images, loss_sum, steps = dist_tools.sum_over_ranks(
            [counts["correct"], counts["images"], stats["loss_sum"], stats["steps"]], ranks)
        speed = dist_tools.throughput(stats["images_per_second"], ranks)
        last = {"epoch": epoch + 1, "train_loss": loss_sum / steps, "test_accuracy": correct / max(images, 1),
                "seconds": stats["seconds"], "lr": optimizer.param_groups[0]["lr"], **speed}
        history.append(last)
        if not ranks.is_main:
            continue
        log(f"epoch {epoch + 1}/{epochs}: train loss {last['train_loss']:.4f}, test accuracy "
            f"{100 * last['test_accuracy']:.2f}% ({int(correct)}/{int(images)}), "
            f"{last['images_per_second']:.0f} images/s", file=sys.stderr)
        serialization.save({"format": FORMAT, "model": model_name, "model_state": model.state_dict(),
                            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                            "epoch": epoch + 1, "dropout": loop.dropout_state(model), "host_rng": _host_rng_state(),
                            "history": history, "seed": seed, "batch_size": batch_size, "epochs": epochs,
                            "lr": optimizer.param_groups[0].get("max_lr", lr),
                            "normalization": {"mean": MEAN, "std": STD}}, checkpoint_path)
        atomic_write_json(out / METRICS, {"model": model_name, "epochs": history, "batch_size": batch_size,
                                          "seed": seed, "world_size": ranks.world_size,
                                          "recipe": recipes.recipe(model_name)})
        save_binaries()  # the kernels built so far reach the disk cache even if a later epoch is killed
    if last is None:
        raise CheckpointError(f"nothing to report: no epoch was trained and {checkpoint_path} has no history")
    summary = {"model": model_name, "test_accuracy": last["test_accuracy"], "train_loss": last["train_loss"],
               "epochs": last["epoch"], "images_per_second": last["images_per_second"],
               "checkpoint": str(checkpoint_path), "metrics": str(out / METRICS), "history": history}
    for key in ("world_size", "images_per_second_per_rank"):
        if key in last:
            summary[key] = last[key]
    plot = plot_curves(history, out / "curves.png") if ranks.is_main and history else None
    if plot:
        summary["curves"] = plot
    return summary


def _select_device(args) -> None:
    if getattr(args, "device", None) is not None:
        from ..runtime.device import set_default_device
        set_default_device(args.device)


def train_command(args) -> dict | None:
    if args.distributed:  # before any OpenCL call: the ranks on a node split its cores at start-up
        dist_tools.Ranks.start(True)
    _select_device(args)
    started = time.perf_counter()
    summary = train(args.model, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                    data_dir=args.data_dir, out=args.out, seed=args.seed, resume=args.resume,
                    limit_steps=args.limit_steps, stop_after=args.stop_after, distributed=args.distributed,
                    log=_log, replay=getattr(args, "replay", True))
    summary["seconds"] = time.perf_counter() - started
    if summary.get("world_size") and _rank() != 0:
        return None  # rank 0 alone reports
    if not args.json:
        print(f"test accuracy {100 * summary['test_accuracy']:.2f}% after {summary['epochs']} epochs; "
              f"checkpoint {summary['checkpoint']}")
    return summary


def _rank() -> int:
    from .. import distributed
    return distributed.get_rank()


def evaluate_checkpoint(path, data_dir=None, batch_size: int = EVAL_BATCH, limit: int | None = None) -> dict:
    """Score a checkpoint of `netcl train` (or a bare LeNet state_dict) on the (first ``limit``) test images."""
    state = serialization.load(path)
    if not isinstance(state, dict) or "model_state" not in state:
        # a bare state_dict saved with nc.save(model.state_dict(), path) is accepted for LeNet
        model_name, model_state = "lenet", state
    else:
        model_name, model_state = state.get("model", "lenet"), state["model_state"]
    model = recipes.build_model(model_name)
    model.load_state_dict(model_state)
    test_x, test_y = load_mnist("test", data_dir)
    test_set = TensorDataset(test_x[:limit], test_y[:limit], recipes.transforms(model_name, train=False))
    score = loop.evaluate(model, DataLoader(test_set, batch_size))
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
