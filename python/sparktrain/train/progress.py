"""Driver side of the progress channel: live metrics while the barrier stage runs.

:class:`ProgressServer` listens on the driver's host (``spark.driver.host``,
127.0.0.1 locally), reads JSON-line events from the workers, drives a tqdm
progress bar and calls every :class:`TrainingCallback` (the MLflow hook is one).
Callbacks run on the server's thread: they must not rely on thread-local state
(the MLflow hook logs with an explicit run id).
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

log = logging.getLogger(__name__)


class TrainingCallback(Protocol):
    """Receives metrics as they arrive from rank 0 (already all-reduced)."""

    def on_step(self, epoch: int, step: int, metrics: Dict[str, float]) -> None:
        """Periodic metrics within an epoch (``step`` counts batches of one rank)."""

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> None:
        """Metrics at the end of an epoch (train and validation)."""


class ProgressServer:
    """A small TCP server bound to ``host``; one thread per worker connection."""

    def __init__(self, host: str, callbacks: Sequence[TrainingCallback] = (), epochs: int = 1,
                 show_bar: bool = True) -> None:
        self.host = host
        self.token = secrets.token_hex(8)
        self.callbacks = list(callbacks)
        self.listeners: List[Callable[[Dict[str, Any]], None]] = []  # see every event (the stall watchdog)
        self.errors: List[Dict[str, Any]] = []
        self.epochs_seen: Dict[int, Dict[str, float]] = {}
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._bar: Any = None
        self._epochs = epochs
        self._show_bar = show_bar
        self._thread = threading.Thread(target=self._accept_loop, name="sparktrain-progress", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{host}:{port}"

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("token") != self.token:
                    log.warning("ignoring a progress event with a wrong token from %s", event.get("host"))
                    continue
                self._handle(event)

    def _handle(self, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        for listener in self.listeners:
            _safe(listener, event)
        if kind == "world_size":
            log.info("world size %s -> %s at epoch %s step %s (per-rank batch %s)", event.get("old"),
                     event.get("new"), event.get("epoch"), event.get("step"), event.get("batch_size"))
            for cb in self.callbacks:
                hook = getattr(cb, "on_world_size", None)
                if hook is not None:
                    _safe(hook, event["epoch"], event["step"], event["old"], event["new"])
            return
        with self._lock:
            if kind == "error":
                self.errors.append(event)
                return
            metrics = event.get("metrics", {})
            if kind == "step":
                self._update_bar(event)
                for cb in self.callbacks:
                    _safe(cb.on_step, event["epoch"], event["step"], metrics)
            elif kind == "epoch":
                self.epochs_seen[event["epoch"]] = metrics
                if self._bar is not None:
                    self._bar.set_postfix({k: round(v, 4) for k, v in metrics.items()
                                           if k in ("train_loss", "val_loss", "val_auc")})
                    self._bar.close()
                    self._bar = None
                summary = "  ".join(f"{k}={v:.4g}" for k, v in metrics.items())
                log.info("epoch %d/%d  %s", event["epoch"] + 1, event.get("epochs", self._epochs), summary)
                for cb in self.callbacks:
                    _safe(cb.on_epoch, event["epoch"], metrics)

    def _update_bar(self, event: Dict[str, Any]) -> None:
        if not self._show_bar:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover
            return
        if self._bar is None:
            self._bar = tqdm(total=event.get("steps"), desc=f"epoch {event['epoch'] + 1}/{self._epochs}",
                             unit="step", file=sys.stderr, leave=False, dynamic_ncols=True)
        self._bar.n = event["step"]
        self._bar.set_postfix(loss=round(event["metrics"].get("loss", float("nan")), 4),
                              sps=int(event["metrics"].get("samples_per_s", 0)), refresh=False)
        self._bar.refresh()

    def first_error(self) -> Optional[Dict[str, Any]]:
        with self._lock:
            return self.errors[0] if self.errors else None

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.close()
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> "ProgressServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _safe(fn, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a broken callback must not kill training
        log.exception("training callback %r failed", fn)
