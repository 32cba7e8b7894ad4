"""Executor -> driver progress channel: JSON lines over one TCP connection (protocol: :mod:`.channel`).

The driver's :class:`sparktrain.train.progress.ProgressServer` listens on the
driver host; each worker process holds one :class:`Reporter`.  Sending never
blocks and never raises: events go to a bounded buffer that a sender thread
writes out.  When the connection breaks, the thread reconnects with backoff
(0.05 s doubling to :data:`MAX_BACKOFF_S`, for as long as the worker lives),
says hello again and re-sends its unanswered requests; meanwhile events wait
in the buffer (at most :data:`BUFFER_EVENTS`; over that, the oldest step
events go first, and only the newest heartbeat is kept).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any, Deque, Dict, Optional

from sparktrain.train._executor.channel import PING_S, VERSION

log = logging.getLogger(__name__)

#: events kept while the driver cannot be reached
BUFFER_EVENTS = 10_000
#: the longest wait between two reconnection attempts
MAX_BACKOFF_S = 2.0
#: seconds close() waits for the buffer to drain (connected), and when the driver is out of reach
CLOSE_FLUSH_S, CLOSE_FLUSH_OFFLINE_S = 10.0, 1.0


class ChannelClosed(RuntimeError):
    """The reporter was closed (or has no driver) while a request waited for its reply."""


class _Request:
    def __init__(self, line: bytes) -> None:
        self.line = line
        self.done = threading.Event()
        self.value: Any = None


class Reporter:
    """Send progress events and requests to the driver (a no-op when ``address`` is None).

    Parameters
    ----------
    address : str or None
        ``host:port`` of the driver's progress server.
    rank : int
        This worker's rank (in every event).
    host : str
        This worker's host (in every event).
    token : str
        The launch's token (sent once, in the hello line).
    run : str, optional
        The run id put in every event (a reused gang sets it per trial).
    """

    def __init__(self, address: Optional[str], rank: int, host: str, token: str = "",
                 run: Optional[str] = None, buffer: int = BUFFER_EVENTS) -> None:
        self.rank, self.host, self.token, self.run = rank, host, token, run
        self.address = address
        self.client = uuid.uuid4().hex[:12]
        self.dropped = 0
        self.reconnects = 0
        self._buffer = int(buffer)
        self._queue: Deque[bytes] = deque()
        self._steps = 0  # step events in the queue (dropped first on overflow)
        self._beat: Optional[bytes] = None  # only the newest heartbeat waits
        self._pending: Dict[int, _Request] = {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._closed = False
        self._sock: Optional[socket.socket] = None
        self._connected = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if address:
            self._thread = threading.Thread(target=self._run, name=f"sparktrain-reporter-{rank}", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._thread is not None

    # -- what the worker calls ----------------------------------------------------------------------------------

    def send(self, event_type: str, **payload: Any) -> None:
        """Queue one event (never blocks; the oldest step events go first when the buffer is full)."""
        if self._thread is None:
            return
        event: Dict[str, Any] = {"type": event_type, "rank": self.rank, "host": self.host, "time": time.time(),
                                 **({"run": self.run} if self.run else {}), **payload}
        line = (json.dumps(event, default=float) + "\n").encode()
        with self._cond:
            if self._closed:
                return
            if event_type == "heartbeat":
                self._beat = line
            else:
                if len(self._queue) >= self._buffer:
                    self._drop_one()
                self._queue.append(line)
                self._steps += event_type == "step"
            self._cond.notify_all()

    def request(self, op: str, timeout: Optional[float] = None, **payload: Any) -> Any:
        """Ask the driver (``op``) and wait for its reply; re-sent after every reconnect until answered.

        Raises ``TimeoutError`` after ``timeout`` seconds and :class:`ChannelClosed` when there is no
        driver or the reporter closes.
        """
        if self._thread is None:
            raise ChannelClosed(f"rank {self.rank}: no progress channel to ask the driver ({op!r})")
        rid = next(self._ids)
        body = {"type": "request", "id": rid, "op": op, "rank": self.rank, "host": self.host,
                **({"run": self.run} if self.run else {}), **payload}
        req = _Request((json.dumps(body, default=float) + "\n").encode())
        with self._cond:
            if self._closed:
                raise ChannelClosed(f"rank {self.rank}: the progress channel is closed ({op!r})")
            self._pending[rid] = req
            self._queue.append(req.line)
            self._cond.notify_all()
        try:
            if not req.done.wait(timeout):
                raise TimeoutError(f"rank {self.rank}: no reply from the driver to {op!r} within {timeout} s")
            if self._closed and not req.done.is_set():
                raise ChannelClosed(f"rank {self.rank}: the progress channel closed while waiting for {op!r}")
            return req.value
        finally:
            with self._cond:
                self._pending.pop(rid, None)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event was written (at most ``timeout`` s); whether it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._beat is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Write what is queued (bounded wait), then close the connection and stop the sender thread."""
        if self._thread is None:
            return
        self.flush(CLOSE_FLUSH_S if self._connected.is_set() else CLOSE_FLUSH_OFFLINE_S)
        with self._cond:
            self._closed = True
            lost = len(self._queue)
            for req in self._pending.values():
                req.done.set()
            self._cond.notify_all()
        if lost:
            log.warning("rank %d: %d progress event(s) not delivered: the driver could not be reached", self.rank,
                        lost)
        self._thread.join(timeout=2)
        self._thread = None
        _close(self._sock)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the sender thread --------------------------------------------------------------------------------------

    def _drop_one(self) -> None:
        if self._steps:
            for i, line in enumerate(self._queue):
                if line.startswith(b'{"type": "step"'):
                    del self._queue[i]
                    self._steps -= 1
                    break
        else:
            self._queue.popleft()
        self.dropped += 1
        if self.dropped == 1:
            log.warning("rank %d: the progress buffer is full (%d events): dropping the oldest step events",
                        self.rank, self._buffer)

    def _connect(self) -> Optional[socket.socket]:
        host, _, port = str(self.address).rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            sock.settimeout(10)
            hello = {"hello": VERSION, "token": self.token, "client": self.client, "rank": self.rank,
                     "host": self.host}
            sock.sendall((json.dumps(hello) + "\n").encode())
            return sock
        except OSError as exc:
            log.debug("rank %d: cannot reach the driver's progress server at %s: %s", self.rank, self.address, exc)
            return None

    def _run(self) -> None:
        backoff, outage_since, attempts = 0.05, None, 0
        while True:
            with self._cond:
                if self._closed:
                    return
            if self._sock is None:
                sock = self._connect()
                if sock is None:
                    attempts += 1
                    if outage_since is None:
                        outage_since = time.monotonic()
                        log.warning("rank %d: the driver's progress server at %s is out of reach: retrying with "
                                    "backoff (events are buffered)", self.rank, self.address)
                    with self._cond:
                        self._cond.wait(backoff * (0.5 + random.random()))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                with self._cond:  # unanswered requests go again, first
                    for req in self._pending.values():
                        if req.line not in self._queue:
                            self._queue.appendleft(req.line)
                self._sock = sock
                self._connected.set()
                threading.Thread(target=self._read, args=(sock,), name=f"sparktrain-replies-{self.rank}",
                                 daemon=True).start()
                if outage_since is not None:
                    self.reconnects += 1
                    log.warning("rank %d: progress channel back after %.1f s (%d attempt(s))", self.rank,
                                time.monotonic() - outage_since, attempts)
                backoff, outage_since, attempts = 0.05, None, 0
            with self._cond:
                if not self._queue and self._beat is None and not self._closed:
                    self._cond.wait(PING_S)
                batch = ([self._beat] if self._beat is not None else []) + list(self._queue)
                if not batch:
                    batch = [(json.dumps({"type": "ping", "rank": self.rank, "host": self.host,
                                          **({"run": self.run} if self.run else {})}) + "\n").encode()]
                sent_beat, sent_lines = self._beat, len(self._queue)
            sock = self._sock
            if sock is None:
                continue
            try:
                sock.sendall(b"".join(batch))
            except OSError as exc:
                log.debug("rank %d: progress channel broke: %s", self.rank, exc)
                with self._cond:
                    if self._sock is sock:
                        self._drop_connection()
                continue
            with self._cond:
                if self._beat is sent_beat:
                    self._beat = None
                for _ in range(min(sent_lines, len(self._queue))):
                    line = self._queue.popleft()
                    self._steps -= line.startswith(b'{"type": "step"')
                self._cond.notify_all()

    def _drop_connection(self) -> None:
        self._connected.clear()
        _close(self._sock)
        self._sock = None

    def _read(self, sock: socket.socket) -> None:
        """Replies from the driver: resolve the waiting requests."""
        buf = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                if sock is self._sock:
                    continue
                return
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._resolve(line)
        with self._cond:  # the driver closed it: the sender reconnects
            if self._sock is sock:
                self._drop_connection()
            self._cond.notify_all()

    def _resolve(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
            rid = int(msg["reply"])
        except (ValueError, KeyError, TypeError):
            return
        with self._cond:
            req = self._pending.get(rid)
            if req is not None and not req.done.is_set():
                req.value = msg.get("value")
                req.done.set()


def _close(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
