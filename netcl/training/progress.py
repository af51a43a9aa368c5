"""What `netcl train` shows: a tqdm progress bar on stderr, and curves.png when matplotlib is installed."""
from __future__ import annotations

import sys
from pathlib import Path


def progress_bar(total: int, desc: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a bare install should still train
        return None
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=not enabled, leave=True,
                dynamic_ncols=True)


def plot_curves(history: list, path: Path) -> str | None:
    """Loss and test accuracy per epoch as a PNG; None (and no file) without matplotlib."""
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
