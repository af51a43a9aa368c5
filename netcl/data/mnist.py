"""MNIST from the four standard IDX files, gzipped or not.

Where the files are looked for, in order:
  1. ``data_dir`` (the argument, e.g. ``--data-dir``), then
  2. the directory in ``NETCL_DATA`` (or its ``mnist/`` sub-directory), then
  3. netcl's cache directory (``<cache>/datasets/mnist``), where missing files are downloaded from the
     usual mirrors and checked against the official MD5 sums.
A directory the user names (1 or 2) is taken as is — it may hold a subset, like ../shared/data/mnist —
and is never held to the official checksums. With no files anywhere and no network, one nc.DataError
lists every place it looked and how to point netcl at a directory.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import urllib.request
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import DataError
from ..runtime.cache import atomic_write_bytes, cache_root

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# MD5 of the official gzipped files (the checksums torchvision and the original site publish).
OFFICIAL_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
# Normalization constants of the full official training set (the usual MNIST mean and std).
MEAN, STD = 0.1307, 0.3081


def cache_dir() -> Path:
    return cache_root() / "datasets" / "mnist"


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    return None


def _read_idx(path: Path, expected_magic: int, what: str) -> np.ndarray:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read MNIST {what} file {path}: {exc}") from None
    if len(raw) < 8:
        raise DataError(f"MNIST {what} file {path} is too short ({len(raw)} bytes) to be an IDX file")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        raise DataError(f"{path} is not an IDX {what} file (magic {magic:#010x}, expected {expected_magic:#010x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - start < count:
        raise DataError(f"MNIST {what} file {path} is truncated: header says {dims}, "
                        f"{len(raw) - start} bytes of data for {count}")
    return np.frombuffer(raw, dtype=np.uint8, count=count, offset=start).reshape(dims)


def _download(directory: Path, stem: str, errors: list) -> Path | None:
    name = stem + ".gz"
    for mirror in MIRRORS:
        url = mirror + name
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                data = response.read()
        except OSError as exc:
            errors.append(f"{url}: {exc}")
            continue
        digest = hashlib.md5(data).hexdigest()
        if digest != OFFICIAL_MD5[name]:
            errors.append(f"{url}: checksum {digest} is not the official {OFFICIAL_MD5[name]}")
            continue
        target = directory / name
        atomic_write_bytes(target, data)
        return target
    return None


def _verified(path: Path) -> bool:
    expected = OFFICIAL_MD5.get(path.name)
    return expected is None or hashlib.md5(path.read_bytes()).hexdigest() == expected


def locate(split: str, data_dir=None, download: bool = True) -> tuple[Path, Path]:
    """Paths of the (images, labels) files of ``split``, downloading into the cache when needed."""
    if split not in FILES:
        raise DataError(f"MNIST split must be 'train' or 'test', got {split!r}")
    stems = FILES[split]
    looked = []
    user_dirs = []
    if data_dir is not None:
        user_dirs.append(("data_dir / --data-dir", Path(os.fspath(data_dir)).expanduser()))
    elif settings.DATA.is_set():
        base = settings.DATA.get()
        user_dirs += [(settings.DATA.name, base), (settings.DATA.name, base / "mnist")]
    for label, directory in user_dirs:
        found = [_find(directory, s) for s in stems]
        if all(found):
            return found[0], found[1]
        missing = [s for s, f in zip(stems, found) if f is None]
        looked.append(f"{directory} ({label}): missing {', '.join(m + '[.gz]' for m in missing)}")
    if data_dir is not None:
        raise DataError(_message(split, looked, []))
    cached = cache_dir()
    found = [_find(cached, s) for s in stems]
    found = [f if f is not None and _verified(f) else None for f in found]
    errors: list[str] = []
    if download and not all(found):
        cached.mkdir(parents=True, exist_ok=True)
        for k, stem in enumerate(stems):
            if found[k] is None:
                found[k] = _download(cached, stem, errors)
                if found[k] is None:
                    break  # every mirror failed: the other file would fail the same way
    if all(found):
        return found[0], found[1]
    looked.append(f"{cached} (netcl cache{'; download failed' if errors else ''})")
    raise DataError(_message(split, looked, errors))


def _message(split: str, looked: list, errors: list) -> str:
    lines = [f"MNIST {split} files not found. Looked in: " + "; ".join(looked) + "."]
    if errors:
        lines.append(f"Downloading failed ({errors[0]}" + (f"; and {len(errors) - 1} more" if len(errors) > 1 else "")
                     + ").")
    lines.append("Point netcl at a directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                 "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (gzipped or not) with "
                 "--data-dir DIR, load_mnist(data_dir=DIR) or NETCL_DATA=DIR.")
    return " ".join(lines)


def load_mnist(split: str = "train", data_dir=None, download: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 28, 28], labels int64 [N]) of the "train" or "test" split."""
    images_path, labels_path = locate(split, data_dir, download)
    images = _read_idx(images_path, 0x00000803, "images")
    labels = _read_idx(labels_path, 0x00000801, "labels")
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise DataError(f"MNIST {split}: {images_path} holds {images.shape} images but {labels_path} holds "
                        f"{labels.shape} labels")
    if labels.size and labels.max() > 9:
        raise DataError(f"MNIST {split}: labels in {labels_path} go up to {labels.max()}, expected 0-9")
    return images, labels.astype(np.int64)
