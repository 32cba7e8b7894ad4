"""Executor -> driver progress channel: JSON lines over one TCP connection (protocol: :mod:`.channel`).

The driver's :class:`sparktrain.train.progress.ProgressServer` listens on the
driver host; each worker process holds one :class:`Reporter`.  Sending never
blocks and never raises: events go to a bounded buffer that a sender thread
writes out.  Every event carries a sequence number ``n``; the driver
acknowledges what it has processed, and the reporter keeps each event until
then.  When the connection breaks (or the driver refuses it), the thread
reconnects with backoff (0.05 s doubling to :data:`MAX_BACKOFF_S`, for as long
as the worker lives), says hello, learns from the driver's answer what it
already has, and sends the rest again, in order; unanswered requests are
asked again.  Meanwhile events wait in the buffer (at most
:data:`BUFFER_EVENTS`; over that, the oldest step events go first; only the
newest heartbeat waits).
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
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from sparktrain.train._executor.channel import PING_S, READ_TIMEOUT_S, VERSION

log = logging.getLogger(__name__)

#: events kept while the driver cannot be reached (or has not acknowledged them)
BUFFER_EVENTS = 10_000
#: the longest wait between two reconnection attempts
MAX_BACKOFF_S = 2.0
#: seconds close() waits for the driver to acknowledge what is buffered: once reached, and never reached
CLOSE_FLUSH_S, CLOSE_FLUSH_OFFLINE_S = 10.0, 1.0

_STEP = b'{"type": "step"'


class ChannelClosed(RuntimeError):
    """The reporter was closed (or has no driver) while a request waited for its reply."""


class _Request:
    def __init__(self, body: Dict[str, Any]) -> None:
        self.body = body
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
    buffer : int
        Events kept unacknowledged at most.
    """

    def __init__(self, address: Optional[str], rank: int, host: str, token: str = "",
                 run: Optional[str] = None, buffer: int = BUFFER_EVENTS) -> None:
        self.rank, self.host, self.token, self.run = rank, host, token, run
        self.address = address
        self.client = uuid.uuid4().hex[:12]
        self.dropped = 0
        self.reconnects = 0
        self._buffer = int(buffer)
        self._seq = itertools.count(1)
        self._queue: Deque[Tuple[int, bytes]] = deque()  # not yet written
        self._unacked: Deque[Tuple[int, bytes]] = deque()  # written, not yet acknowledged
        self._beat: Optional[bytes] = None  # only the newest heartbeat waits
        self._pending: Dict[int, _Request] = {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._closed = False
        self._sock: Optional[socket.socket] = None
        self._hello_ok = threading.Event()
        self._reached = False  # the driver took a hello once: a cut at close() is waited out, not given up on
        self._attempt = 0
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
        with self._cond:
            if self._closed:
                return
            if event_type == "heartbeat":
                self._beat = self._line(event_type, payload, None)
            else:
                if len(self._queue) + len(self._unacked) >= self._buffer:
                    self._drop_one()
                n = next(self._seq)
                self._queue.append((n, self._line(event_type, payload, n)))
            self._cond.notify_all()

    def request(self, op: str, timeout: Optional[float] = None, **payload: Any) -> Any:
        """Ask the driver (``op``) and wait for its reply; asked again after every reconnect until answered.

        Raises ``TimeoutError`` after ``timeout`` seconds and :class:`ChannelClosed` when there is no
        driver or the reporter closes.
        """
        if self._thread is None:
            raise ChannelClosed(f"rank {self.rank}: no progress channel to ask the driver ({op!r})")
        rid = next(self._ids)
        req = _Request({"id": rid, "op": op, **payload})
        with self._cond:
            if self._closed:
                raise ChannelClosed(f"rank {self.rank}: the progress channel is closed ({op!r})")
            self._pending[rid] = req
            self._enqueue_request(req)
            self._cond.notify_all()
        try:
            if not req.done.wait(timeout):
                raise TimeoutError(f"rank {self.rank}: no reply from the driver to {op!r} within {timeout} s")
            if req.value is None and self._closed:
                raise ChannelClosed(f"rank {self.rank}: the progress channel closed while waiting for {op!r}")
            return req.value
        finally:
            with self._cond:
                self._pending.pop(rid, None)

    def flush(self, timeout: float) -> bool:
        """Wait until the driver acknowledged every queued event (at most ``timeout`` s); whether it did."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._want_ack = True
            self._cond.notify_all()
            while self._queue or self._unacked or self._beat is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Deliver what is buffered (bounded wait), then close the connection and stop the sender thread."""
        if self._thread is None:
            return
        # A driver that was reached once is alive (a cut heals, the reconnect loop keeps trying): wait for it.
        self.flush(CLOSE_FLUSH_S if self._reached else CLOSE_FLUSH_OFFLINE_S)
        with self._cond:
            self._closed = True
            lost = len(self._queue) + len(self._unacked)
            for req in self._pending.values():
                req.done.set()
            self._cond.notify_all()
        if lost:
            log.warning("rank %d: %d progress event(s) not acknowledged by the driver", self.rank, lost)
        self._thread.join(timeout=2)
        self._thread = None
        _close(self._sock)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- lines ----------------------------------------------------------------------------------------------------

    _want_ack = False

    def _line(self, event_type: str, payload: Dict[str, Any], n: Optional[int]) -> bytes:
        event: Dict[str, Any] = {"type": event_type, "rank": self.rank, "host": self.host, "time": time.time(),
                                 **({"run": self.run} if self.run else {}), **payload}
        if n is not None:
            event["n"] = n
        return (json.dumps(event, default=float) + "\n").encode()

    def _enqueue_request(self, req: _Request) -> None:
        """Queue ``req`` as a new line (a new sequence number each time it is asked); under the lock."""
        n = next(self._seq)
        self._queue.append((n, self._line("request", req.body, n)))

    def _drop_one(self) -> None:
        for buf in (self._unacked, self._queue):
            for i, (_, line) in enumerate(buf):
                if line.startswith(_STEP):
                    del buf[i]
                    break
            else:
                continue
            break
        else:
            (self._unacked or self._queue).popleft()
        self.dropped += 1
        if self.dropped == 1:
            log.warning("rank %d: the progress buffer is full (%d events): dropping the oldest step events",
                        self.rank, self._buffer)

    def _acked(self, upto: int) -> None:
        """The driver has every numbered line up to ``upto``; under the lock."""
        while self._unacked and self._unacked[0][0] <= upto:
            self._unacked.popleft()
        while self._queue and self._queue[0][0] <= upto:
            self._queue.popleft()
        self._cond.notify_all()

    # -- the sender thread --------------------------------------------------------------------------------------

    def _connect(self) -> Optional[socket.socket]:
        host, _, port = str(self.address).rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            sock.settimeout(10)
            self._attempt += 1  # the driver keeps the newest of a client's connections (by this number)
            hello = {"hello": VERSION, "token": self.token, "client": self.client, "attempt": self._attempt,
                     "rank": self.rank, "host": self.host}
            self._hello_ok.clear()
            sock.sendall((json.dumps(hello) + "\n").encode())
        except OSError as exc:
            log.debug("rank %d: cannot reach the driver's progress server at %s: %s", self.rank, self.address, exc)
            return None
        self._sock = sock
        threading.Thread(target=self._read, args=(sock,), name=f"sparktrain-replies-{self.rank}",
                         daemon=True).start()
        # The driver answers the hello or closes the connection; a busy one may take long to get to it, and
        # giving up early only queues another hello behind this one.
        deadline = time.monotonic() + READ_TIMEOUT_S
        with self._cond:  # the driver takes us (and says what it already has), or closes the connection
            while not self._hello_ok.is_set() and self._sock is sock and time.monotonic() < deadline:
                self._cond.wait(0.05)
            if self._hello_ok.is_set() and self._sock is sock:
                return sock
            if self._sock is sock:
                self._drop_connection()
        return None

    def _run(self) -> None:
        backoff, outage_since, attempts = 0.05, None, 0
        last_sent = time.monotonic()
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
                    with self._cond:  # new events do not cut the backoff short
                        _wait_until(self._cond, time.monotonic() + backoff * (0.5 + random.random()),
                                    lambda: self._closed)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                with self._cond:  # what the driver has not acknowledged goes again, in order; then the questions
                    self._queue.extendleft(reversed(self._unacked))
                    self._unacked.clear()
                    for req in self._pending.values():  # its reply may have been lost in the cut
                        self._enqueue_request(req)
                if outage_since is not None:
                    self.reconnects += 1
                    log.warning("rank %d: progress channel back after %.1f s (%d attempt(s))", self.rank,
                                time.monotonic() - outage_since, attempts)
                backoff, outage_since, attempts = 0.05, None, 0
            with self._cond:
                # Idle: a ping PING_S after the last send.  (Waking on any notify and pinging made a ping-pong with
                # the driver's acknowledgements: dozens of pings a second per rank.)
                _wait_until(self._cond, last_sent + PING_S,
                            lambda: bool(self._queue or self._beat is not None or self._closed or self._want_ack
                                         or self._sock is None))
                if self._sock is None and not self._closed:  # the driver closed it: reconnect first
                    continue
                lines = list(self._queue)
                batch = ([self._beat] if self._beat is not None else []) + [line for _, line in lines]
                asked_ack = self._want_ack
                if not batch or asked_ack:  # a ping: keeps the connection alive, asks for an acknowledgement
                    batch.append((json.dumps({"type": "ping", "rank": self.rank, "host": self.host,
                                              **({"run": self.run} if self.run else {})}) + "\n").encode())
                    self._want_ack = False
                sent_beat = self._beat
            sock = self._sock
            if sock is None:
                with self._cond:
                    self._want_ack = self._want_ack or asked_ack
                continue
            try:
                last_sent = time.monotonic()
                sock.sendall(b"".join(batch))
            except OSError as exc:
                log.debug("rank %d: progress channel broke: %s", self.rank, exc)
                with self._cond:
                    self._want_ack = self._want_ack or asked_ack  # flush() still waits for it: ask again
                    if self._sock is sock:
                        self._drop_connection()
                continue
            with self._cond:
                if self._beat is sent_beat:
                    self._beat = None
                for item in lines:
                    if self._queue and self._queue[0] is item:
                        self._queue.popleft()
                        self._unacked.append(item)
                self._cond.notify_all()

    def _drop_connection(self) -> None:
        self._hello_ok.clear()
        _close(self._sock)
        self._sock = None

    def _read(self, sock: socket.socket) -> None:
        """The driver's lines: the hello's answer, acknowledgements, replies to requests."""
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
                self._on_line(line)
        with self._cond:  # the driver closed it: the sender reconnects
            if self._sock is sock:
                self._drop_connection()
            self._cond.notify_all()

    def _on_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        with self._cond:
            if isinstance(msg.get("ack"), int):
                self._acked(msg["ack"])
            if msg.get("hello") == "ok":
                self._hello_ok.set()
                self._reached = True
            if "reply" in msg:
                req = self._pending.get(msg["reply"]) if isinstance(msg["reply"], int) else None
                if req is not None and not req.done.is_set():
                    req.value = msg.get("value")
                    req.done.set()


def _wait_until(cond: threading.Condition, deadline: float, done: Callable[[], bool]) -> None:
    """Wait on ``cond`` (held) until ``done()`` or ``deadline`` (``time.monotonic()``), whichever comes first."""
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        cond.wait(left)


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
