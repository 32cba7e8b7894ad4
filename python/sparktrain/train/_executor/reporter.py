"""Executor -> driver progress channel: JSON lines over one TCP connection.

The driver's :class:`sparktrain.train.progress.ProgressServer` listens on the
driver host; each worker opens a connection and sends events such as
``{"type": "metrics", "rank": 0, "epoch": 1, "step": 40, "metrics": {...}}``.
Sending never raises: losing a progress line must not kill training.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)


class Reporter:
    """Send progress events to the driver (no-op when ``address`` is None)."""

    def __init__(self, address: Optional[str], rank: int, host: str, token: str = "") -> None:
        self.rank = rank
        self.host = host
        self.token = token
        self._sock: Optional[socket.socket] = None
        self._lock = threading.Lock()
        if address:
            host_part, _, port = address.rpartition(":")
            try:
                self._sock = socket.create_connection((host_part, int(port)), timeout=10)
                self._sock.settimeout(10)
            except OSError as exc:
                log.warning("rank %d: cannot reach the driver's progress server at %s: %s", rank, address, exc)
                self._sock = None

    def send(self, event_type: str, **payload: Any) -> None:
        """Send one event; drops it (with a log line) if the driver is gone."""
        if self._sock is None:
            return
        event: Dict[str, Any] = {"type": event_type, "rank": self.rank, "host": self.host,
                                 "token": self.token, "time": time.time(), **payload}
        data = (json.dumps(event, default=float) + "\n").encode()
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                log.warning("rank %d: progress event dropped: %s", self.rank, exc)
                self._sock = None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                finally:
                    self._sock = None

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
