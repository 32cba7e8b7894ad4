"""One object that holds JSON metadata and a payload, sealed with its length and SHA-256.

Checkpoints (``checkpoints/ckpt-*.ckpt``) and the trained network of a run
(``model/network.ckpt``) are written as one such object each, so a reader
gets the metadata and the bytes it describes from one write (one PUT on an
object store), never a mix of two writers' files, and a truncated or foreign
file is recognized before anything is loaded from it.

Layout (all integers unsigned 64-bit big-endian)::

    MAGIC (16 bytes) | len(meta) | len(payload) | meta (UTF-8 JSON) | payload | SHA-256 of all before (32 bytes)

Only JSON is parsed here: nothing in a sealed object is unpickled.  What
the payload holds is its writer's business (torch state dicts loaded with
``weights_only=True``, NumPy ``.npz`` without pickles, a ``.keras`` file).
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Dict, Tuple

from sparktrain.errors import CorruptObjectError

MAGIC = b"SPARKTRAIN-SEAL\x01"
_HEAD = struct.Struct(">QQ")
_DIGEST = 32


def seal(meta: Dict[str, Any], payload: bytes) -> bytes:
    """``meta`` (JSON-serializable) and ``payload`` as one sealed object.

    Examples
    --------
    >>> unseal(seal({"epoch": 3}, b"weights"))
    ({'epoch': 3}, b'weights')
    """
    body = json.dumps(meta, separators=(",", ":"), allow_nan=True, default=_plain).encode()
    head = MAGIC + _HEAD.pack(len(body), len(payload))
    h = hashlib.sha256(head)
    h.update(body)
    h.update(payload)
    return b"".join([head, body, payload, h.digest()])


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays as Python numbers and lists (anything else is refused by ``json``)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def unseal(blob: bytes, where: str = "the object") -> Tuple[Dict[str, Any], bytes]:
    """``(meta, payload)`` of a sealed object; :class:`CorruptObjectError` naming ``where`` when it is not one.

    Raises
    ------
    CorruptObjectError
        The object is truncated, altered or not in this format (e.g. written by an older sparktrain).
    """
    view = memoryview(blob)
    start = len(MAGIC) + _HEAD.size
    if len(blob) < start + _DIGEST or bytes(view[:len(MAGIC)]) != MAGIC:
        raise CorruptObjectError(f"'{where}' is not a sealed sparktrain object ({len(blob)} bytes, no "
                                 f"{MAGIC[:-1].decode()} header): truncated, or written by something else. Fix: "
                                 f"remove it, or use a new runId")
    n_meta, n_payload = _HEAD.unpack(view[len(MAGIC):start])
    expected = start + n_meta + n_payload + _DIGEST
    if len(blob) != expected:
        raise CorruptObjectError(f"'{where}' is truncated or padded: {len(blob)} bytes, its header says "
                                 f"{expected}. Fix: remove it (an older checkpoint is used), or use a new runId")
    if hashlib.sha256(view[:-_DIGEST]).digest() != bytes(view[-_DIGEST:]):
        raise CorruptObjectError(f"'{where}' fails its SHA-256 check (altered after it was written). Fix: remove "
                                 f"it (an older checkpoint is used), or use a new runId")
    meta = json.loads(bytes(view[start:start + n_meta]))
    return meta, bytes(view[start + n_meta:expected - _DIGEST])


__all__ = ["MAGIC", "seal", "unseal"]
