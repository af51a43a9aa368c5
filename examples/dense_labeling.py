"""Train a patch classifier on whole images with a masked per-pixel loss, then label every pixel at once.

Synthetic segmentation task: noisy 32×32 images holding discs striped horizontally and squares striped
vertically (both as bright as each other on average); every pixel is labelled background (0), disc (1) or
square (2), so a pixel's class depends on the texture and shape around it, not on its own value. The
patch classifier sees a 15×15 patch; netcl.dense.convert turns it into a network that scores all pixels
of an image in one pass. Each training step runs the dense model over a whole image and back-propagates
the loss of a random subset of pixels (Section 4.3 of Li, Zhao & Wang: the error map is masked,
and the cost does not depend on how many pixels are selected). The predicted label map of a test image is
printed, and saved as dense_labeling.png when matplotlib is installed.

    python examples/dense_labeling.py [--steps 150] [--size 32] [--out dense_labeling.png]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import netcl as nc
from netcl import nn

PATCH = 15
CLASSES = ("background", "disc", "square")


def synthetic_image(rng, size: int):
    """A (1, size, size) float32 image and its (size, size) int64 label map."""
    image = np.zeros((size, size), np.float32)
    labels = np.zeros((size, size), np.int64)
    rows, cols = np.mgrid[:size, :size]
    for _ in range(rng.integers(2, 5)):
        cls = int(rng.integers(1, 3))
        half = int(rng.integers(4, 7))
        ci, cj = rng.integers(half, size - half, 2)
        if cls == 1:
            inside = (rows - ci) ** 2 + (cols - cj) ** 2 <= half * half
        else:
            inside = (abs(rows - ci) <= half) & (abs(cols - cj) <= half)
        stripes = ((rows if cls == 1 else cols) // 2) % 2  # 2-pixel stripes: horizontal (disc), vertical (square)
        image[inside] = stripes[inside].astype(np.float32)
        labels[inside] = cls
    image += rng.normal(0.0, 0.25, image.shape).astype(np.float32)
    return image[None], labels


def patch_classifier():
    # 15 → conv 3 → 13 → pool 2/2 → 6 → conv 3 → 4 → pool 2/2 → 2 → Linear(16·2·2 → 3)
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.MaxPool2d(2, 2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.MaxPool2d(2, 2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * 2 * 2, 32), nn.ReLU(), nn.Linear(32, len(CLASSES)))


def balanced_mask(rng, labels, per_class: int):
    """Up to ``per_class`` random pixels of each class (positives are rare: sample them evenly)."""
    mask = np.zeros(labels.shape, bool)
    for cls in range(len(CLASSES)):
        where = np.argwhere(labels == cls)
        if len(where):
            pick = where[rng.choice(len(where), min(per_class, len(where)), replace=False)]
            mask[pick[:, 0], pick[:, 1]] = True
    return mask


def show(labels, title):
    print(title)
    glyphs = ".o#"
    for row in labels:
        print("  " + "".join(glyphs[v] for v in row))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="dense_labeling.png")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    nn.init.manual_seed(args.seed)

    model = patch_classifier()
    dense = nc.dense.convert(model, PATCH)  # shares model's parameters
    opt = nc.optim.Adam(dense.parameters(), lr=args.lr)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        image, labels = synthetic_image(rng, args.size)
        mask = balanced_mask(rng, labels, per_class=40)
        opt.zero_grad()
        loss = nc.dense.masked_cross_entropy(dense(nc.tensor(image[None])), labels[None], mask[None], "mean")
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  ({int(mask.sum())} pixels selected, "
                  f"{time.perf_counter() - start:.1f} s)")

    image, labels = synthetic_image(np.random.default_rng(args.seed + 1), args.size)
    model.eval()
    with nc.no_grad():
        scores = dense(nc.tensor(image[None])).to_host()[0]
    predicted = scores.argmax(axis=0)
    accuracy = float((predicted == labels).mean())
    # the dense map is exactly what scanning the patches would give
    pixels = np.array([[0, 0], [args.size // 2, args.size // 3], [args.size - 1, args.size - 1]])
    scanned = nc.dense.scan_patches(model, image, pixels, patch_size=PATCH).to_host()
    mismatch = np.abs(scanned - scores[:, pixels[:, 0], pixels[:, 1]].T).max() / np.abs(scanned).max()
    show(labels, "true labels (. background, o disc, # square):")
    show(predicted, f"predicted by the dense model (pixel accuracy {accuracy:.1%}):")
    print(f"dense vs patch-by-patch at {len(pixels)} pixels: max relative difference {mismatch:.1e}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written")
        return accuracy
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    for ax, data, title in zip(axes, (image[0], labels, predicted),
                               ("image", "true labels", f"dense prediction ({accuracy:.0%})")):
        ax.imshow(data, cmap="gray" if title == "image" else "viridis", vmin=None if title == "image" else 0,
                  vmax=None if title == "image" else len(CLASSES) - 1)
        ax.set_title(title)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    return accuracy


if __name__ == "__main__":
    main()
