"""Driver side of the progress channel: live metrics while the barrier stage runs.

:class:`ProgressServer` listens on the driver's host (``spark.driver.host``,
127.0.0.1 locally), reads JSON-line events from the workers and calls every
:class:`TrainingCallback` (the MLflow hook is one).  Callbacks run on the
server's threads: they must not rely on thread-local state (the MLflow hook
logs with an explicit run id).

What a person sees depends on where stderr goes:

- on a TTY, a tqdm bar per epoch (its rate counts only the steps seen since
  the bar opened, so the first update is not "1115506 step/s");
- anywhere else (``spark-submit`` logs, CI, a notebook's captured stderr), no
  bar, but one log line per epoch plus one at most every ``log_every_s``
  seconds with the step, samples/s and loss.

The server is reachable by anything on the driver's network, so it guards
itself (the protocol: :mod:`sparktrain.train._executor.channel`):

- a connection must send the launch's token on its first line, of at most
  :data:`MAX_HELLO_BYTES`, within ``HELLO_S`` seconds of connecting (one deadline
  for the whole line, however slowly it trickles in; the token is compared in
  constant time), or it is dropped;
- a connection that sends nothing for ``read_timeout_s`` is closed (workers
  ping when idle), and a line longer than ``max_line_bytes`` drops it;
- at most ``max_connections`` that said hello are open at once, sized from the
  number of ranks (``2 x ranks + 16``: a reconnect may briefly overlap its dead
  connection); a worker that is refused reconnects with backoff.  Connections
  still waiting for their hello have slots of their own (as many): they cannot
  take a worker's, and when they are all taken the oldest is dropped for the
  newcomer, so a flood of silent sockets cannot keep a worker's hello out.

Workers may also ask the driver (a ``request`` line); :meth:`ProgressServer.on_request`
registers what answers each operation, on the same connection.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import socket
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from sparktrain.train._executor.channel import HELLO_S, READ_TIMEOUT_S, token_ok
from sparktrain.train._progress_view import ProgressView

log = logging.getLogger(__name__)

#: Longest accepted hello line (the first line of a connection): a hello is about 150 bytes.
MAX_HELLO_BYTES = 4096
#: Seconds :meth:`ProgressServer.close` waits for its accept thread to end.
CLOSE_JOIN_S = 2.0
#: Longest accepted event line.  A rank-0 step or epoch event is a few hundred bytes;
#: an error event carries a traceback (a few KiB).
MAX_LINE_BYTES = 1 << 20
#: Spare connections over ``2 x ranks`` (a retried attempt's or a reconnect's overlap, the odd client).
SPARE_CONNECTIONS = 16
#: Seconds between two acknowledgements of step lines (other numbered lines are acknowledged at once; heartbeats
#: and pings carry no number: a heartbeat only matters while it is the newest).
ACK_EVERY_S = 0.2
#: Default seconds between two step log lines when no bar is drawn.
LOG_EVERY_S = 30.0

#: ``handler(request, reply)``: answer a worker's request now or later (``reply(value)``, once).
RequestHandler = Callable[[Dict[str, Any], Callable[[Any], None]], None]


def connection_cap(ranks: int, per_rank: int = 1) -> int:
    """Connections the server accepts for ``ranks`` worker tasks of ``per_rank`` processes each."""
    return 2 * max(1, int(ranks)) * max(1, int(per_rank)) + SPARE_CONNECTIONS


class TrainingCallback(Protocol):
    """Receives metrics as they arrive from rank 0 (already all-reduced)."""

    def on_step(self, epoch: int, step: int, metrics: Dict[str, float]) -> None:
        """Periodic metrics within an epoch (``step`` counts batches of one rank)."""

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> None:
        """Metrics at the end of an epoch (train and validation)."""


class ProgressServer:
    """A small TCP server bound to ``host``; one thread per worker connection.

    Parameters
    ----------
    host : str
        Address to listen on (the driver host Spark advertises to executors).
    callbacks : sequence of TrainingCallback
        Called with rank 0's step and epoch metrics.
    epochs : int
        Epochs of the run (for "epoch 2/5").
    show_bar : bool
        Allow a tqdm bar.  It is drawn only when ``stream`` is a TTY; otherwise
        progress goes to the log.  ``False`` also silences the step log lines
        (tuning trials); the per-epoch line is always logged.
    log_every_s : float
        Seconds between two step log lines when no bar is drawn (``0``: every
        step event).
    stream : file-like, optional
        Where the bar is drawn (default ``sys.stderr``).
    ranks : int
        Worker processes expected (sizes the connection cap).
    max_line_bytes : int
        Cap on one line.
    max_connections : int, optional
        Cap on open connections that said hello (default :func:`connection_cap` of ``ranks``).
    max_pending : int, optional
        Cap on open connections that have not said hello yet (default ``max_connections``); a new connection
        over it drops the oldest of them.
    read_timeout_s, hello_s : float
        Seconds a connection may stay silent, and has from its connect to the end of its hello line.
    clock : callable, optional
        Monotonic clock (tests).
    """

    def __init__(self, host: str, callbacks: Sequence[TrainingCallback] = (), epochs: int = 1,
                 show_bar: bool = True, log_every_s: float = LOG_EVERY_S, stream: Optional[IO[str]] = None,
                 ranks: int = 1, max_line_bytes: int = MAX_LINE_BYTES, max_connections: Optional[int] = None,
                 read_timeout_s: float = READ_TIMEOUT_S, hello_s: float = HELLO_S,
                 clock: Callable[[], float] = time.monotonic, max_pending: Optional[int] = None) -> None:
        if log_every_s < 0:
            raise ValueError(f"log_every_s == {log_every_s}, must be >= 0 (seconds between progress log lines)")
        max_connections = connection_cap(ranks) if max_connections is None else max_connections
        max_pending = max_connections if max_pending is None else max_pending
        if max_line_bytes < 1 or max_connections < 1 or max_pending < 1:
            raise ValueError(f"max_line_bytes == {max_line_bytes}, max_connections == {max_connections}, "
                             f"max_pending == {max_pending}: all must be >= 1")
        if read_timeout_s <= 0 or hello_s <= 0:
            raise ValueError(f"read_timeout_s == {read_timeout_s}, hello_s == {hello_s}: both must be >= 0.001")
        self.host = host
        self.token = secrets.token_hex(16)
        self.callbacks = list(callbacks)
        self.devices: Dict[int, Dict[str, Any]] = {}  # rank -> its "device" event (addresses, device)
        self.listeners: List[Callable[[Dict[str, Any]], None]] = []  # see every event (the stall watchdog)
        self.errors: List[Dict[str, Any]] = []
        self.epochs_seen: Dict[int, Dict[str, float]] = {}
        self.dropped_connections = 0  # over a cap (said hello, or the oldest of those waiting for theirs)
        self.rejected_connections = 0  # no, a wrong or a stale token
        self.idle_closed = 0  # silent past read_timeout_s
        self.accepted_connections = 0  # said hello with the token
        self._handlers: Dict[str, RequestHandler] = {}
        self._refuse_until = 0.0
        self._last_n: Dict[str, int] = {}  # client -> the last line number processed (acknowledged)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(max(128, min(int(max_connections), 4096)))
        self._closed = threading.Event()
        # Three locks, so that hundreds of connections' events do not queue the accept loop and the hellos behind
        # them (one lock for all made 320 reconnecting ranks wait up to 12 s for their hello's answer):
        self._conn_lock = threading.Lock()  # _pending, _conns, _clients, _refuse_until and the connection counters
        self._seq_lock = threading.Lock()  # _last_n: what each client's lines were processed up to
        self._lock = threading.Lock()  # errors, the view, callbacks: what events change
        self._conns: List[socket.socket] = []  # said hello (at most max_connections)
        self._pending: Dict[socket.socket, Any] = {}  # connection -> peer, oldest first: no hello yet
        self._clients: Dict[str, Tuple[Optional[socket.socket], int]] = {}  # client -> newest connection, attempt
        self.view = ProgressView(epochs, show_bar, log_every_s, stream if stream is not None else sys.stderr, clock)
        self._max_line = int(max_line_bytes)
        self._max_conns = int(max_connections)
        self._max_pending = int(max_pending)
        self._read_timeout = float(read_timeout_s)
        self._hello_s = float(hello_s)
        self._thread = threading.Thread(target=self._accept_loop, name="sparktrain-progress", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{host}:{port}"

    @property
    def draws_bar(self) -> bool:
        """Whether progress is drawn as a tqdm bar (a TTY) rather than logged."""
        return self.view.draws_bar

    @property
    def open_connections(self) -> int:
        """Connections open now: those that said hello and those still waiting for theirs."""
        with self._conn_lock:
            return len(self._conns) + len(self._pending)

    def on_request(self, op: str, handler: RequestHandler) -> None:
        """Answer the workers' ``op`` requests with ``handler(request, reply)`` (called on a connection's thread;
        it must not block: keep ``reply`` and call it later when the answer is not known yet)."""
        self._handlers[op] = handler

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:  # close() shut the socket down (that wakes accept())
                return
            oldest: Optional[Tuple[socket.socket, Any]] = None
            with self._conn_lock:
                closed = self._closed.is_set()
                if not closed:
                    if len(self._pending) >= self._max_pending:
                        oldest = next(iter(self._pending.items()))
                        del self._pending[oldest[0]]
                        self.dropped_connections += 1
                    self._pending[conn] = peer
            if closed:  # accepted as close() ran: nobody serves it
                _close(conn)
                return
            if oldest is not None:
                log.warning("progress server: dropping a connection from %s: no hello yet, and a newer connection "
                            "takes its slot (%d may wait for their hello at once)", _peer(oldest[1]), self._max_pending)
                _shut(oldest[0])  # its thread sees the end of its hello and closes it
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _hello(self, conn: socket.socket, lines: "_Lines", peer: Any) -> Optional[Dict[str, Any]]:
        """The first line, with the token, within ``hello_s`` of the connect; None (the connection is dropped)
        otherwise."""
        hello, why = _read_hello(lines, self._hello_s, self.token)
        replaced: Optional[socket.socket] = None
        full = False
        with self._conn_lock:
            if self._pending.pop(conn, None) is None:  # dropped meanwhile: for a newer one (logged), close(), a cut
                return None
            if self._closed.is_set() or time.monotonic() < self._refuse_until:  # over, or a simulated network cut
                return None
            if hello is None:
                self.rejected_connections += 1
            else:
                client = str(hello.get("client", ""))
                attempt = hello["attempt"] if isinstance(hello.get("attempt"), int) else 0
                older = self._clients.get(client) if client else None
                if older is not None and older[1] > attempt:  # a hello the worker gave up on, read afterwards
                    return None
                if older is not None and older[0] is not None and older[0] is not conn:
                    replaced = older[0]  # a reconnect: the old connection is dead, its slot is the new one's
                    if replaced in self._conns:
                        self._conns.remove(replaced)
                full = len(self._conns) >= self._max_conns
                if full:
                    self.dropped_connections += 1
                else:
                    self._conns.append(conn)
                    self.accepted_connections += 1
                    if client:
                        self._clients[client] = (conn, attempt)
        if hello is None:
            log.warning("progress server: dropping a connection from %s: %s", _peer(peer), why)
            return None
        if replaced is not None:
            _close(replaced)
        if full:
            log.warning("progress server: dropping a connection from %s (rank %s): already %d open (the limit); "
                        "the worker reconnects", _peer(peer), hello.get("rank"), self._max_conns)
            return None
        conn.settimeout(self._read_timeout)
        return hello

    def _seen(self, client: str, n: Any) -> bool:
        """Whether line ``n`` of ``client`` was processed already (re-sent after a reconnect); records it."""
        if not isinstance(n, int) or not client:
            return False
        with self._seq_lock:
            if n <= self._last_n.get(client, 0):
                return True
            self._last_n[client] = n
            return False

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        client = ""
        try:
            lines = _Lines(conn)
            hello = self._hello(conn, lines, peer)
            if hello is None:
                return
            client = str(hello.get("client", ""))
            who = f"rank {hello.get('rank')} ({hello.get('host')}, {_peer(peer)})"
            reply = _Replier(conn)
            with self._seq_lock:
                last = self._last_n.get(client, 0)
            reply.line({"hello": "ok", "ack": last})  # what it need not send again
            acked_at = 0.0
            skipped = False
            while True:  # drained to EOF even after close(): the last epoch event may still be queued
                try:
                    line = lines.readline(self._max_line + 1)
                except socket.timeout:
                    with self._conn_lock:
                        self.idle_closed += 1
                    log.warning("progress server: closing the connection of rank %s (%s): silent for %.0f s",
                                hello.get("rank"), hello.get("host"), self._read_timeout)
                    return
                if not line:
                    return
                if len(line) > self._max_line and not line.endswith(b"\n"):
                    log.warning("progress server: dropping the connection from %s: a line over %d bytes",
                                _peer(peer), self._max_line)
                    return
                try:
                    event = json.loads(line)
                except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                    event = None
                if not isinstance(event, dict):
                    if not skipped and line.endswith(b"\n"):  # (not a last line cut short by a dying worker)
                        skipped = True
                        log.warning("progress server: skipping a line from %s that is not a JSON object: %.60r "
                                    "(any more on this connection are skipped without a word)", who, line)
                    continue
                if self._seen(client, event.get("n")):
                    continue
                kind = event.get("type")
                try:
                    if kind == "request":
                        self._request(event, reply)
                    self._handle(event)
                except Exception as exc:  # noqa: BLE001 - a malformed event must not end the connection
                    log.warning("progress server: ignoring a %r event from %s: %s: %s", kind, who,
                                type(exc).__name__, exc)
                now = time.monotonic()
                if kind == "ping" or ("n" in event and (kind != "step" or now - acked_at >= ACK_EVERY_S)):
                    acked_at = now
                    with self._seq_lock:
                        last = self._last_n.get(client, 0)
                    reply.line({"ack": last})
        except OSError:
            return
        finally:
            with self._conn_lock:
                self._pending.pop(conn, None)
                if conn in self._conns:
                    self._conns.remove(conn)
                newest = self._clients.get(client) if client else None
                if newest is not None and newest[0] is conn:  # keep its attempt: a stale hello stays refused
                    self._clients[client] = (None, newest[1])
            _close(conn)

    def _request(self, event: Dict[str, Any], reply: "_Replier") -> None:
        handler = self._handlers.get(str(event.get("op")))
        rid = event.get("id")
        answer = functools.partial(reply.send, rid)
        if handler is None:
            answer({"error": f"unknown request {event.get('op')!r}"})
            return
        try:
            handler(event, answer)
        except Exception as exc:  # noqa: BLE001 - the worker gets the error, the server goes on
            log.exception("progress server: the %r handler failed", event.get("op"))
            answer({"error": f"{type(exc).__name__}: {exc}"})

    def _handle(self, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        for listener in list(self.listeners):
            _safe(listener, event)
        if kind in ("ping", "request", "heartbeat"):
            return
        if kind == "world_size":
            log.info("world size %s -> %s at epoch %s step %s (per-rank batch %s)", event.get("old"),
                     event.get("new"), event.get("epoch"), event.get("step"), event.get("batch_size"))
            for cb in self.callbacks:
                hook = getattr(cb, "on_world_size", None)
                if hook is not None:
                    _safe(hook, event["epoch"], event["step"], event["old"], event["new"])
            return
        if kind == "device":
            self.devices[int(event.get("rank", -1))] = event
            level = logging.DEBUG if event.get("note") == "no GPU requested" else logging.INFO
            log.log(level, "rank %s on %s: GPU addresses %s from its task's resources, training on %s%s",
                    event.get("rank"), event.get("host"), event.get("addresses") or "none", event.get("device"),
                    f" ({event['note']})" if event.get("note") else "")
            return
        with self._lock:
            if kind == "error":
                self.errors.append(event)
                return
            metrics = event.get("metrics", {})
            if kind == "step":
                self.view.step(event, metrics)
                for cb in self.callbacks:
                    _safe(cb.on_step, event["epoch"], event["step"], metrics)
            elif kind == "epoch":
                self.epochs_seen[event["epoch"]] = metrics
                self.view.epoch(event, metrics)
                for cb in self.callbacks:
                    _safe(cb.on_epoch, event["epoch"], metrics)

    def drop_connections(self, refuse_s: float = 0.0) -> int:
        """Close every open connection and refuse hellos for ``refuse_s`` seconds: a network cut of that length.

        For fault tests (``tests/``, ``bench/faults.py``); the workers reconnect with backoff.  Returns how many
        connections were closed.
        """
        with self._conn_lock:
            conns = list(self._conns) + list(self._pending)
            self._pending.clear()  # (their threads drop them without a word)
            self._refuse_until = time.monotonic() + refuse_s
        for conn in conns:
            _close(conn)
        return len(conns)

    def first_error(self) -> Optional[Dict[str, Any]]:
        with self._lock:
            return self.errors[0] if self.errors else None

    def close(self) -> None:
        """Stop accepting: the port is closed and the accept thread ends.  Connections that said hello are read to
        their end (the workers close them); those still waiting for their hello are dropped.  Idempotent."""
        self._closed.set()
        with self._conn_lock:
            pending = list(self._pending)
            self._pending.clear()  # (their threads drop them without a word)
        try:
            try:  # wakes the thread blocked in accept(); closing the socket alone does not (Linux)
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed already, or a platform that refuses it on a listening socket (macOS)
                if self._thread.is_alive():
                    _wake(self._sock)
            for conn in pending:
                _shut(conn)
            if self._thread is not threading.current_thread():
                self._thread.join(CLOSE_JOIN_S)
            self._sock.close()
        finally:
            with self._lock:
                self.view.close()

    def __enter__(self) -> "ProgressServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Replier:
    """Writes replies on one connection (several threads may answer: a lock per connection)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, rid: Any, value: Any) -> None:
        self.line({"reply": rid, "value": value})

    def line(self, body: Dict[str, Any]) -> None:
        line = (json.dumps(body, default=float) + "\n").encode()
        with self.lock:
            try:
                self.conn.sendall(line)
            except OSError:  # the worker re-sends its request after reconnecting
                pass


class _Lines:
    """Reads lines from a socket, with the socket's timeout per ``recv`` or one deadline for the whole line.

    (What ``socket.makefile("rb").readline`` does, plus the deadline: a hello trickled one byte at a time must not
    outlive ``hello_s``.)
    """

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.scanned = 0  # the first bytes of buf hold no newline

    def readline(self, limit: int, deadline: Optional[float] = None) -> bytes:
        """The next line with its newline; its first ``limit`` bytes when longer; what is left at the end of the
        stream (``b""`` when nothing).

        Raises
        ------
        socket.timeout
            After the socket's timeout without a byte or, with ``deadline`` (``time.monotonic()``), at it.
        OSError
            From ``recv``.
        """
        while True:
            end = self.buf.find(b"\n", self.scanned, limit)
            if end >= 0 or len(self.buf) >= limit:
                cut = end + 1 if end >= 0 else limit
                line = bytes(self.buf[:cut])
                del self.buf[:cut]
                self.scanned = 0
                return line
            self.scanned = len(self.buf)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("no complete line before the deadline")
                self.conn.settimeout(left)
            chunk = self.conn.recv(1 << 16)
            if not chunk:
                line = bytes(self.buf)
                self.buf.clear()
                self.scanned = 0
                return line
            self.buf += chunk


def _read_hello(lines: _Lines, hello_s: float, token: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """A connection's hello line if it comes within ``hello_s`` and carries ``token``; else None and why not."""
    try:
        line = lines.readline(MAX_HELLO_BYTES, deadline=time.monotonic() + hello_s)
    except socket.timeout:
        return None, "no hello line within %g s" % hello_s
    except OSError:
        line = b""
    if not line.endswith(b"\n"):
        return None, (f"its first line is over {MAX_HELLO_BYTES} bytes" if len(line) >= MAX_HELLO_BYTES
                      else "it closed the connection in the middle of its hello line" if line
                      else "it closed the connection without a hello line")
    try:
        hello = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: "[[[[..."
        return None, "its first line is not a JSON hello"
    if not isinstance(hello, dict):
        return None, "its first line is not a JSON hello"
    if "hello" not in hello or not token_ok(hello.get("token"), token):
        return None, "its first line has no valid token"
    return hello, ""


def _peer(peer: Any) -> str:
    try:
        return f"{peer[0]}:{peer[1]}"
    except (TypeError, IndexError):
        return str(peer)


def _wake(listening: socket.socket) -> None:
    """Connect to ``listening`` once: its accept() returns (the accept loop then sees it is closed)."""
    try:
        with socket.create_connection(listening.getsockname()[:2], timeout=0.5):
            pass
    except OSError:
        pass


def _shut(conn: socket.socket) -> None:
    """Wake whoever reads ``conn`` (it sees the end of the stream and closes it)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass


def _safe(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a broken callback must not kill training
        log.exception("training callback %r failed", fn)
