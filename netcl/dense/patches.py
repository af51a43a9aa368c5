"""Patch-by-patch scanning: the reference the dense model must reproduce (and the baseline it beats).

The patch around pixel (i, j) is the n_h×n_w window with top-left corner (i − ⌊n_h/2⌋, j − ⌊n_w/2⌋),
zero outside the image: the same definition netcl.dense.convert uses.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..autograd import no_grad
from ..errors import DTypeError, ShapeError
from ..ops.conv_common import pair
from ..tensor import Tensor


def _image_host(image) -> np.ndarray:
    if isinstance(image, Tensor):
        image = image.to_host()
    if not isinstance(image, np.ndarray):
        raise DTypeError(f"expected an image as a netcl Tensor or NumPy array, got {type(image).__name__}")
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if image.ndim != 3 or min(image.shape) < 1:
        raise ShapeError(f"expected one (C, H, W) or (1, C, H, W) image, got shape {image.shape}")
    return image


def all_pixels(height: int, width: int) -> np.ndarray:
    """Every (row, col) of an H×W image in row-major order, shape (H·W, 2)."""
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=1)


def _pixels(pixels, height: int, width: int) -> np.ndarray:
    if pixels is None:
        return all_pixels(height, width)
    p = np.asarray(pixels)
    if p.ndim == 1 and p.shape[0] == 2 and not isinstance(pixels, np.ndarray):
        p = p.reshape(1, 2)
    if p.ndim != 2 or p.shape[1] != 2 or p.dtype.kind not in "iu":
        raise ShapeError(f"pixels must be integer (row, col) pairs of shape (P, 2), got shape {p.shape} ({p.dtype})")
    if p.size and (p.min(axis=0) < 0).any() or p.size and (p.max(axis=0) >= (height, width)).any():
        raise ShapeError(f"pixels must lie in the {height}×{width} image; got rows {p[:, 0].min()}..{p[:, 0].max()}, "
                         f"cols {p[:, 1].min()}..{p[:, 1].max()}")
    return p.astype(np.int64)


def crop_patches(image, pixels, patch_size, device=None) -> Tensor:
    """The (P, C, n_h, n_w) batch of patches around ``pixels`` ((P, 2) row/col pairs, None = all pixels)."""
    host = _image_host(image)
    if device is None and isinstance(image, Tensor):
        device = image.device
    nh, nw = pair(patch_size, "patch_size", 1)
    _, h, w = host.shape
    p = _pixels(pixels, h, w)
    padded = np.pad(host, ((0, 0), (nh // 2, nh - 1 - nh // 2), (nw // 2, nw - 1 - nw // 2)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (nh, nw), axis=(1, 2))  # (C, H, W, nh, nw)
    batch = windows[:, p[:, 0], p[:, 1]].transpose(1, 0, 2, 3)
    return Tensor.from_host(np.ascontiguousarray(batch), device)


def scan_patches(model, image, pixels=None, batch_size: int = 64, patch_size=None) -> Tensor:
    """Scores of a patch classifier for the patch around each pixel, cropped and run ``batch_size`` at a time.

    model: the patch classifier, or a DenseModel (its original classifier and patch size are used).
    image: (C, H, W) or (1, C, H, W), a Tensor or a NumPy array. pixels: (P, 2) integer (row, col) pairs,
    None for every pixel in row-major order. Returns a (P, K) Tensor. ``patch_size`` (n or (n_h, n_w))
    defaults to the DenseModel's, else to the smallest square patch the classifier maps to one score vector
    (netcl.dense.infer_patch_size). The model should be in eval mode (Dropout would otherwise drop).
    No autograd graph is recorded.
    """
    from .convert import DenseModel, infer_patch_size
    if isinstance(model, DenseModel):
        patch_size = model.patch_size if patch_size is None else patch_size
        model = model.source
    if patch_size is None:
        patch_size = infer_patch_size(model)
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        raise ShapeError(f"batch_size must be a positive int, got {batch_size!r}")
    host = _image_host(image)
    device = image.device if isinstance(image, Tensor) else None
    p = _pixels(pixels, *host.shape[1:])
    if len(p) == 0:
        raise ShapeError("scan_patches: no pixels to scan")
    scores = []
    with no_grad():
        for start in range(0, len(p), batch_size):
            chunk = p[start:start + batch_size]
            out = model(crop_patches(host, chunk, patch_size, device))
            scores.append(out.reshape((len(chunk), -1)).to_host())
    return Tensor.from_host(np.concatenate(scores), device)
