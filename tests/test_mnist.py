"""MNIST loading (IDX, gzipped or not; data_dir, NETCL_DATA, cache + verified download; clear errors)
and the batch loader (seeded shuffling, normalization, complete coverage)."""
from __future__ import annotations

import gzip
import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl.data import mnist

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
needs_shared = pytest.mark.skipif(not (SHARED / "t10k-labels-idx1-ubyte.gz").exists(),
                                  reason="../shared/data/mnist is not present")


def _idx(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_split(directory: Path, split: str, n: int, rng, gz: bool):
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    for stem, data in zip(mnist.FILES[split], (_idx(images, 0x803), _idx(labels, 0x801))):
        path = directory / (stem + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(data) if gz else data)
    return images, labels


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No NETCL_DATA, an empty cache, and no network."""
    monkeypatch.delenv("NETCL_DATA", raising=False)
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))

    def offline(url, timeout=None):
        raise OSError("network is unreachable")
    monkeypatch.setattr(mnist.urllib.request, "urlopen", offline)
    return tmp_path


@needs_shared
def test_shared_subset_loads_without_official_checksums():
    x, y = mnist.load_mnist("train", SHARED)
    assert x.shape == (22699, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.bincount(y).tolist() == [2258, 2581, 2215, 2369, 2222, 2010, 2235, 2356, 2163, 2290]
    tx, ty = mnist.load_mnist("test", str(SHARED))
    assert tx.shape == (10000, 28, 28) and ty[:5].tolist() == [7, 2, 1, 0, 4]


@pytest.mark.parametrize("gz", [True, False])
def test_plain_and_gzipped_files_and_netcl_data(isolated, monkeypatch, rng, gz):
    data = isolated / "data" / "mnist"
    data.mkdir(parents=True)
    images, labels = _write_split(data, "test", 5, rng, gz)
    x, y = mnist.load_mnist("test", data)
    assert np.array_equal(x, images) and np.array_equal(y, labels)
    monkeypatch.setenv("NETCL_DATA", str(isolated / "data"))  # the parent works too (its mnist/ is used)
    assert np.array_equal(nc.data.mnist.load_mnist("test")[0], images)


def test_missing_everywhere_is_one_clear_data_error(isolated, monkeypatch):
    monkeypatch.setenv("NETCL_DATA", str(isolated / "nowhere"))
    with pytest.raises(nc.DataError) as info:
        mnist.load_mnist("train")
    message = str(info.value)
    assert "nowhere" in message and "cache" in message and "network is unreachable" in message
    assert "--data-dir" in message and "NETCL_DATA" in message and "\n" not in message
    with pytest.raises(nc.DataError, match="missing t10k-images"):
        mnist.load_mnist("test", isolated / "nowhere")


def test_download_verifies_checksums(isolated, monkeypatch, rng):
    images = _idx(rng.integers(0, 256, size=(3, 28, 28)), 0x803)
    labels = _idx(rng.integers(0, 10, size=3), 0x801)
    payload = {"t10k-images-idx3-ubyte.gz": gzip.compress(images), "t10k-labels-idx1-ubyte.gz": gzip.compress(labels)}
    served = []

    def fake(url, timeout=None):
        served.append(url)
        return io.BytesIO(payload[url.rsplit("/", 1)[1]])
    monkeypatch.setattr(mnist.urllib.request, "urlopen", fake)
    with pytest.raises(nc.DataError, match="not the official"):
        mnist.load_mnist("test")  # our fake files do not match the official MD5 sums
    assert not list((isolated / "cache").rglob("*.gz")), "unverified downloads are not kept"
    for name, data in payload.items():
        monkeypatch.setitem(mnist.OFFICIAL_MD5, name, hashlib.md5(data).hexdigest())
    x, y = mnist.load_mnist("test")
    assert x.shape == (3, 28, 28) and (mnist.cache_dir() / "t10k-labels-idx1-ubyte.gz").exists()
    served.clear()
    mnist.load_mnist("test")
    assert served == [], "verified files in the cache are not downloaded again"


def test_malformed_files_raise_data_error(isolated, rng):
    d = isolated / "bad"
    d.mkdir()
    _write_split(d, "test", 4, rng, gz=False)
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx(np.zeros(3), 0x801))
    with pytest.raises(nc.DataError, match="labels"):
        mnist.load_mnist("test", d)
    (d / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x04")
    with pytest.raises(nc.DataError, match="truncated|too short"):
        mnist.load_mnist("test", d)
    with pytest.raises(nc.DataError, match="split"):
        mnist.load_mnist("validation", d)
