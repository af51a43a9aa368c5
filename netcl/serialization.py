"""nc.save / nc.load: checkpoints of nested dicts of tensors, arrays and plain values.

File layout (all integers little-endian):
  MAGIC (8 bytes) | format version (u32) | header length (u64) | SHA-256 of header + payload (32 bytes)
  | header (UTF-8 JSON describing the structure; arrays point into the payload) | payload (raw array bytes)
The digest makes any damage (truncation, flipped bytes) a nc.CheckpointError instead of silently wrong
weights, and the write is atomic (temporary file in the same directory, fsync, rename), so a crash while
saving leaves the previous checkpoint intact.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from .errors import CheckpointError
from .runtime.cache import atomic_write_bytes
from .tensor import Tensor

MAGIC = b"NETCLCK\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sIQ32s")


def _encode(obj, arrays: list):
    if isinstance(obj, (Tensor, np.ndarray)):
        host = obj.to_host() if isinstance(obj, Tensor) else obj
        host = np.ascontiguousarray(host).reshape(host.shape)  # ascontiguousarray turns a 0-d array into 1-d
        if host.dtype.kind not in "biuf" or host.dtype.byteorder == ">":
            raise CheckpointError(f"cannot save an array of dtype {host.dtype}")
        arrays.append(host)
        return {"__array__": len(arrays) - 1, "dtype": host.dtype.str, "shape": list(host.shape),
                "tensor": isinstance(obj, Tensor)}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise CheckpointError(f"checkpoint dict keys must be str or int, got {type(k).__name__}")
            items.append([k, _encode(v, arrays)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        return {"__list__" if isinstance(obj, list) else "__tuple__": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot save a value of type {type(obj).__name__} in a checkpoint")


def save(obj, path) -> None:
    """Write ``obj`` (typically a state_dict, or a dict holding several) to ``path`` atomically."""
    arrays: list[np.ndarray] = []
    structure = _encode(obj, arrays)
    offsets, position = [], 0
    for a in arrays:
        offsets.append([position, a.nbytes])
        position += a.nbytes
    header = json.dumps({"structure": structure, "arrays": offsets}, separators=(",", ":")).encode()
    digest = hashlib.sha256(header)
    for a in arrays:
        digest.update(memoryview(a).cast("B"))
    blob = b"".join([_PREFIX.pack(MAGIC, VERSION, len(header), digest.digest()), header] +
                    [a.tobytes() for a in arrays])
    path = Path(os.fspath(path))
    try:
        atomic_write_bytes(path, blob)
    except OSError as exc:
        raise CheckpointError(f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # the temporary file was private; a checkpoint is an ordinary file


def _decode(node, arrays, payload: memoryview, device):
    if isinstance(node, dict):
        if "__array__" in node:
            start, nbytes = arrays[node["__array__"]]
            dtype = np.dtype(node["dtype"])
            host = np.frombuffer(payload[start:start + nbytes], dtype=dtype).reshape(node["shape"]).copy()
            return Tensor.from_host(host, device) if node["tensor"] else host
        if "__dict__" in node:
            return {k: _decode(v, arrays, payload, device) for k, v in node["__dict__"]}
        if "__list__" in node:
            return [_decode(v, arrays, payload, device) for v in node["__list__"]]
        if "__tuple__" in node:
            return tuple(_decode(v, arrays, payload, device) for v in node["__tuple__"])
        raise ValueError(f"unknown node {sorted(node)}")
    return node


def load(path, device=None):
    """Read a file written by :func:`save`; tensors come back on ``device`` (default: the default device).
    A missing, truncated, altered or foreign file raises nc.CheckpointError."""
    path = Path(os.fspath(path))
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    if len(blob) < _PREFIX.size:
        raise CheckpointError(f"{path} is not a netcl checkpoint (only {len(blob)} bytes)")
    magic, version, header_len, digest = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise CheckpointError(f"{path} is not a netcl checkpoint (bad magic bytes)")
    if version != VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {version}; this netcl reads {VERSION}")
    body = memoryview(blob)[_PREFIX.size:]
    if header_len > len(body) or hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path} is damaged (checksum mismatch: truncated or altered); "
                              "use an earlier checkpoint")
    try:
        header = json.loads(bytes(body[:header_len]).decode())
        payload = body[header_len:]
        return _decode(header["structure"], header["arrays"], payload, device)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{path} has a malformed header: {exc}") from None
