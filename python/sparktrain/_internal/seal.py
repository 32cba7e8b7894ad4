"""Seal a payload for a trip through a place that may be logged or shown: encrypted and authenticated.

A single-task trial's callable reaches its reused Spark job in a local
property of the job (:mod:`sparktrain.tune._stage`).  Spark writes a job's
local properties to the event log as they are (``spark.redaction.regex``
applies only to keys of the SparkConf), so the property holds the pickled
callable sealed with a per-search key that travels only inside the planned
job's function (the query plan, which is not logged).

The construction uses the standard library only: a SHAKE-256 keystream of
(key, random 16-byte nonce) XORed with the body, and an HMAC-SHA256 over
nonce and ciphertext under a separate key derived from the same secret.  A
wrong key or an altered text is refused (``ValueError``) before anything is
decrypted, let alone unpickled.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

_NONCE, _MAC = 16, 32


def new_key() -> bytes:
    """A fresh 32-byte random key."""
    return os.urandom(32)


def _keystream(key: bytes, nonce: bytes, n: int) -> bytes:
    return hashlib.shake_256(b"sparktrain-seal-enc" + key + nonce).digest(n)


def _mac_key(key: bytes) -> bytes:
    return hashlib.sha256(b"sparktrain-seal-mac" + key).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")


def seal(body: bytes, key: bytes) -> str:
    """``body`` encrypted and authenticated under ``key``, as ASCII text."""
    nonce = os.urandom(_NONCE)
    cipher = _xor(body, _keystream(key, nonce, len(body))) if body else b""
    mac = hmac.new(_mac_key(key), nonce + cipher, hashlib.sha256).digest()
    return base64.b64encode(nonce + mac + cipher).decode("ascii")


def unseal(text: str, key: bytes) -> bytes:
    """The body :func:`seal` sealed; ``ValueError`` when ``text`` was not sealed with ``key`` or was altered."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError("a sealed payload is not valid base64 text") from exc
    if len(raw) < _NONCE + _MAC:
        raise ValueError(f"a sealed payload is {len(raw)} bytes, shorter than its nonce and MAC")
    nonce, mac, cipher = raw[:_NONCE], raw[_NONCE:_NONCE + _MAC], raw[_NONCE + _MAC:]
    if not hmac.compare_digest(mac, hmac.new(_mac_key(key), nonce + cipher, hashlib.sha256).digest()):
        raise ValueError("a sealed payload failed its authentication check (another key, or altered): not opened")
    return _xor(cipher, _keystream(key, nonce, len(cipher))) if cipher else b""
