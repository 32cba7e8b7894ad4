"""The driver's progress channel: a bar only on a TTY, log lines elsewhere, and caps on what clients send."""

from __future__ import annotations

import io
import json
import logging
import re
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparktrain.train.progress import ProgressServer

LOGGER = "sparktrain.train.progress"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _connect(server: ProgressServer, hello: bool = True, token: str | None = None) -> socket.socket:
    """A plain client; with ``hello`` it sends the protocol's first line (the server's token unless ``token``)."""
    host, _, port = server.address.rpartition(":")
    conn = socket.create_connection((host, int(port)), timeout=5)
    if hello:
        line = {"hello": 2, "token": server.token if token is None else token, "client": f"c{id(conn)}",
                "rank": 0, "host": "h"}
        conn.sendall((json.dumps(line) + "\n").encode())
    return conn


def _send(conn: socket.socket, server: ProgressServer, **event) -> None:
    conn.sendall((json.dumps({"rank": 0, "host": "h", **event}) + "\n").encode())


def _wait(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether the server closes ``conn`` within 5 s (what it wrote before, a hello's answer, is skipped)."""
    conn.settimeout(5)
    try:
        while conn.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _all_open(conns: list) -> bool:
    """Whether the server kept every one of ``conns`` open (none readable for 0.2 s: no end of stream, no reset;
    connections the server sent nothing on)."""
    readable, _, _ = select.select(conns, [], [], 0.2)
    return readable == []


def _trickle(conn: socket.socket, for_s: float = 15.0) -> str:
    """Send a space every 50 ms, never a newline, until the server closes ``conn`` (or ``for_s`` passed)."""
    conn.settimeout(0.05)
    give_up = time.monotonic() + for_s
    try:
        while time.monotonic() < give_up:
            conn.sendall(b" ")
            try:
                if conn.recv(1) == b"":
                    return "closed by the server"
            except TimeoutError:
                pass
    except OSError:
        return "closed by the server"
    return "still open"


def _acks(conn: socket.socket, upto: int) -> list:
    """The server's lines on ``conn`` until it acknowledged line ``upto``."""
    conn.settimeout(5)
    got, buf = [], b""
    while not any(msg.get("ack", 0) >= upto for msg in got):
        chunk = conn.recv(4096)
        assert chunk, f"closed before acknowledging line {upto}: {got}"
        buf += chunk
        *done, buf = buf.split(b"\n")
        got += [json.loads(line) for line in done]
    return got


class _Steps:
    def __init__(self) -> None:
        self.steps: list = []
        self.epochs: list = []

    def on_step(self, epoch, step, metrics):
        self.steps.append(step)

    def on_epoch(self, epoch, metrics):
        self.epochs.append(epoch)


def _step(step: int, sps: float = 1234.0, loss: float = 0.5) -> dict:
    return {"type": "step", "epoch": 0, "step": step, "steps": 100,
            "metrics": {"loss": loss, "samples_per_s": sps}}


def test_no_tty_logs_a_line_per_epoch_and_every_log_every_s(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock, seen, stream = _Clock(), _Steps(), io.StringIO()
    with ProgressServer("127.0.0.1", [seen], epochs=2, log_every_s=30, stream=stream, clock=clock) as server:
        assert not server.draws_bar
        with _connect(server) as conn:
            for step, dt in ((10, 10), (20, 21), (30, 5), (40, 26)):  # t = 10, 31, 36, 62 s after start
                clock.t += dt
                _send(conn, server, **_step(step, sps=1000.0 + step))
                _wait(lambda n=step // 10: len(seen.steps) == n)
            _send(conn, server, type="epoch", epoch=0, epochs=2, metrics={"train_loss": 0.25, "samples_per_s": 9.0})
            _wait(lambda: seen.epochs == [0])
    assert stream.getvalue() == ""  # no bar, no carriage returns
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == ["epoch 1/2  step 20/100  1020 samples/s  loss=0.5",
                     "epoch 1/2  step 40/100  1040 samples/s  loss=0.5",
                     "epoch 1/2  train_loss=0.25  samples_per_s=9"]


def test_show_bar_false_logs_only_epochs(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], show_bar=False, log_every_s=0, stream=_Tty()) as server:
        assert not server.draws_bar
        with _connect(server) as conn:
            _send(conn, server, **_step(10))
            _send(conn, server, type="epoch", epoch=0, metrics={"val_auc": 0.75})
            _wait(lambda: seen.epochs == [0])
    assert seen.steps == [10]  # callbacks still get every step
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == ["epoch 1/1  val_auc=0.75"]


def test_tty_bar_first_update_has_no_made_up_rate():
    stream, seen = _Tty(), _Steps()
    with ProgressServer("127.0.0.1", [seen], epochs=1, stream=stream) as server:
        assert server.draws_bar
        with _connect(server) as conn:
            _send(conn, server, **_step(50))
            _wait(lambda: seen.steps == [50])
            first = stream.getvalue()
            bar = server.view.bar
            assert bar.n == 50 and bar.format_dict["rate"] is None
            time.sleep(0.2)
            _send(conn, server, **_step(60))
            _wait(lambda: seen.steps == [50, 60])
            # 10 steps in >= 0.2 s: tqdm's own rate is at most 50 step/s, never 50 steps / microseconds.
            assert bar.n == 60 and bar.format_dict["n"] - bar.format_dict["initial"] == 10
    assert "50/100" in first and "?step/s" in first
    rates = [float(r) for r in re.findall(r"([\d.]+)step/s", stream.getvalue())]
    assert rates and max(rates) <= 60


def test_over_long_line_drops_the_connection(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), max_line_bytes=1024) as server:
        with _connect(server) as bad:
            bad.sendall(b'{"type": "' + b"x" * 4096)
            assert _closed_by_peer(bad)
        with _connect(server) as good:  # the server still serves others
            _send(good, server, **_step(5))
            _wait(lambda: seen.steps == [5])
    assert any("a line over 1024 bytes" in r.getMessage() for r in caplog.records)


def test_line_at_the_cap_is_accepted():
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), max_line_bytes=512) as server:
        event = json.dumps({**_step(7), "pad": ""})
        line = json.dumps({**_step(7), "pad": "p" * (511 - len(event))}) + "\n"
        assert len(line) == 512
        with _connect(server) as conn:
            conn.sendall(line.encode())
            _wait(lambda: seen.steps == [7])


def test_too_many_connections_are_dropped(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), max_connections=2) as server:
        a, b = _connect(server), _connect(server)
        _send(a, server, **_step(1))
        _send(b, server, **_step(2))
        _wait(lambda: sorted(seen.steps) == [1, 2])
        with _connect(server) as c:
            assert _closed_by_peer(c)
        assert server.dropped_connections == 1
        a.close()
        _wait(lambda: len(server._conns) == 1)
        with _connect(server) as d:  # a slot is free again
            _send(d, server, **_step(3))
            _wait(lambda: sorted(seen.steps) == [1, 2, 3])
        b.close()
    assert any("already 2 open" in r.getMessage() for r in caplog.records)


def test_garbage_after_the_hello_is_skipped_with_one_warning_per_connection(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        with _connect(server) as conn:
            conn.sendall(b"not json\n[1, 2]\n\xff\xfe\n" + b"[" * 3000 + b"\n")
            _send(conn, server, **_step(2))
            _wait(lambda: seen.steps == [2])
            port = conn.getsockname()[1]
    warned = [r.getMessage() for r in caplog.records if "not a JSON object" in r.getMessage()]
    assert len(warned) == 1 and "rank 0 (h, " in warned[0] and f":{port})" in warned[0] and "not json" in warned[0]


@pytest.mark.parametrize("kwargs", [{"log_every_s": -1}, {"max_line_bytes": 0}, {"max_connections": 0}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError, match="must be >= "):
        ProgressServer("127.0.0.1", **kwargs)


# ---- the channel holds: token, timeouts, cap, reconnects -------------------------------------------------------

def test_the_token_must_come_first_and_right_within_hello_s(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), hello_s=0.5) as server:
        with _connect(server, token="0" * len(server.token)) as wrong:  # same length, wrong: dropped
            _send(wrong, server, **_step(1))
            assert _closed_by_peer(wrong)
        with _connect(server, hello=False) as eventer:  # an event where the hello belongs: dropped
            _send(eventer, server, **_step(2))
            assert _closed_by_peer(eventer)
        t0 = time.monotonic()
        with _connect(server, hello=False) as silent:  # nothing at all: dropped after hello_s
            assert _closed_by_peer(silent) and 0.4 < time.monotonic() - t0 < 3.0
        with _connect(server) as good:
            _send(good, server, **_step(3))
            _wait(lambda: seen.steps == [3])
        assert server.rejected_connections == 3 and server.accepted_connections == 1
    assert "no valid token" in caplog.text and "no hello line within" in caplog.text


def test_a_silent_connection_is_closed_after_the_read_timeout(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with ProgressServer("127.0.0.1", stream=io.StringIO(), read_timeout_s=0.5) as server:
        with _connect(server) as conn:
            assert _closed_by_peer(conn)
        assert server.idle_closed == 1
    assert "silent for 0 s" in caplog.text or "silent for 1 s" in caplog.text


def test_the_cap_follows_the_ranks_and_idle_sockets_cannot_lock_workers_out():
    """Silent sockets take every slot for connections without a hello (as many as the cap): a worker's connection
    takes the oldest one's and is served at once, while the others still wait (their hello_s is 30 s)."""
    from sparktrain.train._executor.reporter import Reporter
    from sparktrain.train.progress import connection_cap

    assert connection_cap(300) == 616 and connection_cap(300, per_rank=2) == 1216
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), ranks=2, hello_s=30) as server:
        assert server._max_conns == server._max_pending == connection_cap(2) == 20
        squatters = [_connect(server, hello=False) for _ in range(20)]  # every slot, no token
        _wait(lambda: server.open_connections == 20)
        reporter = Reporter(server.address, 0, "h", server.token, run="r")
        try:
            reporter.send("step", epoch=0, step=7, steps=10, metrics={"loss": 0.5})
            assert reporter.flush(10) and seen.steps == [7]  # acknowledged within 10 s: the squatters have 30
            assert server.accepted_connections == 1 and server.dropped_connections == 1
            assert _closed_by_peer(squatters[0])  # the oldest gave its slot to the worker
            assert _all_open(squatters[1:]) and server.rejected_connections == 0
            server.close()
            assert all(_closed_by_peer(s) for s in squatters[1:])  # close() drops those still without a hello
        finally:
            reporter.close()
            for s in squatters:
                s.close()


def test_a_hello_trickled_a_byte_at_a_time_is_cut_at_hello_s(caplog):
    """hello_s bounds the whole first line: peers sending a space every 50 ms, never a newline (a timeout per
    recv() would keep them forever), are dropped like silent ones, and a worker is served meanwhile."""
    from sparktrain.train._executor.reporter import Reporter

    caplog.set_level(logging.WARNING, logger=LOGGER)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), ranks=1, hello_s=1.0) as server:
        peers = [_connect(server, hello=False) for _ in range(server._max_pending)]  # every slot for a hello
        with ThreadPoolExecutor(len(peers)) as pool:
            ends = pool.map(_trickle, peers)
            reporter = Reporter(server.address, 0, "h", server.token, run="r")
            try:
                reporter.send("epoch", epoch=0, epochs=1, metrics={"loss": 1.0})
                assert reporter.flush(10) and seen.epochs == [0]
            finally:
                reporter.close()
            assert set(ends) == {"closed by the server"}
        for p in peers:
            p.close()
        assert server.accepted_connections == 1
        assert server.rejected_connections + server.dropped_connections == len(peers)  # (one gave its slot)
    assert caplog.text.count("no hello line within 1 s") == server.rejected_connections


@pytest.mark.parametrize("first, closes, why", [
    (b"\x00\xffgarbage\n", False, "its first line is not a JSON hello"),
    (b"[" * 3000 + b"\n", False, "its first line is not a JSON hello"),  # deeper than the recursion limit
    (b'{"hello": 2, "tok', True, "it closed the connection in the middle of its hello line"),
    (b"", True, "it closed the connection without a hello line"),
    (b" " * 5000, False, "its first line is over 4096 bytes"),
])
def test_a_bad_first_line_is_dropped_at_once_with_its_reason(caplog, first, closes, why):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with ProgressServer("127.0.0.1", stream=io.StringIO(), hello_s=30) as server:
        with _connect(server, hello=False) as conn:
            port = conn.getsockname()[1]
            conn.sendall(first)
            if closes:
                conn.shutdown(socket.SHUT_WR)
            assert _closed_by_peer(conn)  # within 5 s, its hello_s is 30
        _wait(lambda: server.rejected_connections == 1)
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert line == f"progress server: dropping a connection from 127.0.0.1:{port}: {why}"


def test_a_reconnect_takes_the_slot_of_its_dead_connection():
    """The cap counts connections that said hello; a worker's reconnect replaces its older connection, so a full
    server takes it (its dead connection would otherwise hold the slot until the read timeout)."""
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), max_connections=1) as server:
        host, _, port = server.address.rpartition(":")
        conns = []
        for attempt in (1, 2):
            conn = socket.create_connection((host, int(port)), timeout=5)
            hello = {"hello": 2, "token": server.token, "client": "w", "attempt": attempt, "rank": 0, "host": "h"}
            conn.sendall((json.dumps(hello) + "\n").encode())
            assert _acks(conn, 0)[0] == {"hello": "ok", "ack": 0}
            conns.append(conn)
        assert _closed_by_peer(conns[0]) and server.dropped_connections == 0
        _send(conns[1], server, n=1, **_step(3))
        _wait(lambda: seen.steps == [3])
        for conn in conns:
            conn.close()


def test_a_malformed_event_is_one_warning_and_the_connection_goes_on(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    died: list = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        with _connect(server) as conn:
            port = conn.getsockname()[1]
            _send(conn, server, type="epoch", n=1, metrics={})  # no "epoch"
            _send(conn, server, type="device", n=2, rank="zero")
            assert _acks(conn, 2)  # both acknowledged: the worker need not send them again
            _send(conn, server, n=3, **_step(4))
            _wait(lambda: seen.steps == [4])  # the same connection, still served
    assert died == [] and seen.epochs == [] and server.devices == {}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"progress server: ignoring a 'epoch' event from rank 0 (h, 127.0.0.1:{port}): KeyError: 'epoch'",
                      f"progress server: ignoring a 'device' event from rank 0 (h, 127.0.0.1:{port}): ValueError: "
                      "invalid literal for int() with base 10: 'zero'"]


def test_close_stops_the_accept_thread_and_the_port_and_drains_workers():
    """close() ends the accept thread and refuses new connections; a worker that said hello is read to its end
    (its last events may still be on the way), one still without a hello is dropped; closing again is a no-op."""
    seen = _Steps()
    server = ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), hello_s=30)
    host, _, port = server.address.rpartition(":")
    with _connect(server) as worker, _connect(server, hello=False) as waiting:
        _wait(lambda: server.accepted_connections == 1 and server.open_connections == 2)
        server.close()
        assert not server._thread.is_alive()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5)
        assert _closed_by_peer(waiting)
        _send(worker, server, type="epoch", epoch=0, n=1, metrics={"val_loss": 0.5})
        _wait(lambda: seen.epochs == [0])
        server.close()
    threads = []
    for _ in range(20):  # one server per fit, or per trial: none leaves its thread behind
        with ProgressServer("127.0.0.1", stream=io.StringIO()) as other:
            threads.append(other._thread)
    assert not any(t.is_alive() for t in threads)


def test_a_worker_reconnects_after_a_cut_and_loses_nothing():
    from sparktrain.train._executor.reporter import Reporter

    seen = _Steps()
    asked = []
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        pending = []
        server.on_request("verdict", lambda req, reply: (asked.append(req["epoch"]), pending.append(reply)))
        reporter = Reporter(server.address, 0, "h", server.token, run="r")
        try:
            reporter.send("step", epoch=0, step=1, steps=10, metrics={"loss": 0.5})
            _wait(lambda: seen.steps == [1])
            server.drop_connections(refuse_s=1.0)  # a one-second network cut
            for step in range(2, 6):  # buffered meanwhile
                reporter.send("step", epoch=0, step=step, steps=10, metrics={"loss": 0.5})
            import threading

            answer = {}
            t = threading.Thread(target=lambda: answer.update(v=reporter.request("verdict", timeout=15, epoch=0)))
            t.start()
            _wait(lambda: len(asked) >= 1, timeout=15)  # the request arrives once the cut is over
            pending[-1]({"stop": True, "epoch": 0})
            t.join(15)
            assert answer["v"] == {"stop": True, "epoch": 0}
            _wait(lambda: seen.steps == [1, 2, 3, 4, 5])  # all of them, in order
            assert reporter.reconnects >= 1 and reporter.dropped == 0
        finally:
            reporter.close()


def test_a_full_buffer_drops_the_oldest_steps_first():
    from sparktrain.train._executor.reporter import Reporter

    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        server.drop_connections(refuse_s=1.5)
        reporter = Reporter(server.address, 0, "h", server.token, buffer=5)
        try:
            reporter.send("epoch", epoch=0, epochs=2, metrics={"val_loss": 0.4})
            for step in range(1, 9):
                reporter.send("step", epoch=1, step=step, steps=10, metrics={"loss": 0.5})
            _wait(lambda: seen.epochs == [0] and seen.steps[-1:] == [8], timeout=15)
            assert seen.steps == [5, 6, 7, 8] and reporter.dropped == 4  # the epoch event was kept
        finally:
            reporter.close()


def test_a_worker_pings_only_when_idle_and_new_events_do_not_cut_its_backoff_short(caplog):
    """A ping is an idle worker's keepalive (one per PING_S), not the answer to an acknowledgement: the driver's acks
    woke the sender, which pinged, which the driver acked, dozens of times a second per rank.  And during a cut, a
    busy rank's events must not turn its exponential backoff into a reconnect per event."""
    from sparktrain.train._executor.channel import PING_S
    from sparktrain.train._executor.reporter import Reporter

    seen, pings = _Steps(), []
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        server.listeners.append(lambda e: pings.append(e) if e.get("type") == "ping" else None)
        reporter = Reporter(server.address, 0, "h", server.token, run="r")
        try:
            for epoch in range(5):  # each one acknowledged by the driver
                reporter.send("epoch", epoch=epoch, epochs=5, metrics={"val_loss": 0.5})
            _wait(lambda: seen.epochs == [0, 1, 2, 3, 4])
            del pings[:]
            time.sleep(3.0)  # idle: a keepalive every PING_S, no more (the ping-pong sent thousands)
            assert PING_S == 1.0 and 1 <= len(pings) <= 4, f"{len(pings)} pings from one idle worker in 3 s"

            server.drop_connections(refuse_s=2.5)
            caplog.set_level(logging.WARNING, logger="sparktrain.train._executor.reporter")
            for step in range(1, 51):  # an event every 50 ms through the cut
                reporter.send("step", epoch=5, step=step, steps=50, metrics={"loss": 0.5})
                time.sleep(0.05)
            _wait(lambda: seen.steps[-1:] == [50], timeout=15)
            back = [r.getMessage() for r in caplog.records if "progress channel back after" in r.getMessage()]
            attempts = int(re.search(r"\((\d+) attempt", back[0]).group(1))
            # backoff 0.05 s doubling to 2 s, x0.5-1.5: at most 7 failed tries in a 2.5 s cut (one per event: ~50)
            assert 1 <= attempts <= 8, back
        finally:
            reporter.close()


@pytest.mark.parametrize("ranks", [320])
def test_hundreds_of_ranks_with_a_cut_raise_no_false_stall(ranks):
    """320 simulated ranks (the real Reporter and heartbeat, in 4 processes) against one server and watchdog;
    every connection is cut for longer than the stall timeout: all come back, nothing is lost, nobody is blamed."""
    from sparktrain.train.watchdog import StallWatchdog
    from tests.train._ranks import start as start_ranks

    stalls, epochs = [], []
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO(), ranks=ranks) as server:
        server.listeners.append(lambda e: epochs.append(e["rank"]) if e.get("type") == "epoch" else None)
        # a silent rank whose task Spark reports running is excused up to 2 x timeout: the cut (13 s) leaves 11 s
        # for a rank's last heartbeat before it (1 s), its reconnect backoff (up to 3 s) and a loaded machine
        # (with timeout 8 and a 9 s cut, a full test run's load made a late-starting rank miss it now and then; and
        # until the ping-pong fix, 320 ranks pinging the driver on every acknowledgement kept it so busy that ranks
        # waited up to 12 s for their hello's answer after the cut: now the backoff, at most 3 s)
        watchdog = StallWatchdog(ranks, timeout=12.0, on_stall=stalls.append, poll=0.2,
                                 task_state=lambda rank: "RUNNING")  # what Spark says: every task runs
        blind = StallWatchdog(ranks, timeout=12.0, on_stall=lambda info: None, poll=0.2)  # without Spark's word
        server.listeners += [watchdog, blind]
        procs = start_ranks(server.address, server.token, ranks, seconds=30.0)
        try:
            _wait(lambda: len(watchdog.ranks) == ranks, timeout=60)
            server.drop_connections(refuse_s=13.0)  # silent for longer than SILENT_S and the stall timeout
            over = time.time() + 13.0
            _wait(lambda: all(s.get("seen", 0) > over for s in list(watchdog.ranks.values())), timeout=60)
            assert watchdog.check() is None  # every rank is back
            done = [json.loads(line) for p in procs for line in p.communicate(timeout=60)[0].splitlines()]
        finally:
            for p in procs:
                p.kill()
            watchdog.close()
            blind.close()
        assert stalls == [] and watchdog.stalled is None
        assert blind.stalled is not None and blind.stalled["silent"]  # the cut alone would have stopped a fit
        assert set(watchdog.asked.values()) == {"RUNNING"}  # the silent ranks were checked with "Spark"
        by_rank = {d["rank"]: d for d in done}
        assert sorted(by_rank) == list(range(ranks)) and all(d["reconnects"] >= 1 for d in done)
        assert all(d["dropped"] == 0 for d in done)
        assert sorted(epochs) == sorted(r for r, d in by_rank.items() for _ in range(d["epochs"]))  # none lost/twice
        assert seen.steps == list(range(1, by_rank[0]["steps"] + 1))  # rank 0's steps: all, once, in order


def test_a_silent_rank_is_blamed_only_after_asking_spark():
    from sparktrain.train.watchdog import SILENT_S, StallWatchdog

    states = {0: "RUNNING", 1: "SUCCESS", 2: "FAILED", 3: None}
    dog = StallWatchdog(4, timeout=10.0, on_stall=lambda info: None, poll=3600, task_state=states.get)
    try:
        t0 = dog.started
        for rank in range(4):  # each made a step, then went silent
            dog({"type": "step", "rank": rank, "host": f"h{rank}", "epoch": 0, "step": 5})
            dog.ranks[rank].update(seen=t0, progress=t0)
        info = dog.check(now=t0 + 11)  # past the timeout: rank 3, whose task Spark cannot account for
        assert info["rank"] == 3 and info["silent"] and info["spark_task"] == "unknown"
        del states[3]
        dog.ranks[3].update(seen=t0 + 11, progress=t0 + 11)  # rank 3 is back
        assert dog.check(now=t0 + 11 + SILENT_S / 2) is None
        assert dog.check(now=t0 + 19) is None  # rank 0 runs (a cut channel?): up to twice the timeout
        info = dog.check(now=t0 + 21)
        assert info["rank"] == 0 and info["spark_task"] == "RUNNING"  # finished (1) and failed (2): never blamed
        from sparktrain.errors import TrainingStalledError

        assert "Spark reports its task still running" in str(TrainingStalledError(info, 10.0))
        assert "fit again with runId='r1' to resume run r1" in str(TrainingStalledError({**info, "run": "r1"}, 10.0))
        trial = str(TrainingStalledError({**info, "run": "tune-0a1b2c3d-t004"}, 10.0))  # no fit to run again
        assert trial.endswith("this is a trial of a search (tune-0a1b2c3d-t004): the search records it FAILED and "
                              "goes on with its next trial; its last checkpoint stays in the store")
    finally:
        dog.close()


def test_hundreds_of_silent_ranks_are_one_log_line_per_state_not_one_per_rank(caplog):
    """A cut silences every rank at once: what Spark says of them, and their overdue warnings, are one line per
    state (with the ranks as ranges), not 320 lines each; three or fewer keep a line each."""
    from sparktrain.train.watchdog import StallWatchdog, rank_list

    assert rank_list([5, 0, 1, 2, 7, 8, 8]) == "0-2, 5, 7-8"
    assert rank_list(list(range(0, 40, 2)), runs=3) == "0, 2, 4, ..."
    states = {r: "RUNNING" for r in range(320)}
    states.update({300: "FAILED", 301: "FAILED"})
    dog = StallWatchdog(320, timeout=12.0, on_stall=lambda info: None, poll=3600, task_state=states.get)
    caplog.set_level(logging.WARNING, logger="sparktrain.train.watchdog")
    try:
        t0 = dog.started
        for rank in range(320):
            dog({"type": "step", "rank": rank, "host": f"h{rank % 7}", "epoch": 0, "step": 3})
            dog.ranks[rank].update(seen=t0 + rank / 1000, progress=t0 + rank / 1000)
        assert dog.check(now=t0 + 13) is None  # all silent, 318 running (a second timeout), 2 failed (Spark's)
        assert dog.check(now=t0 + 14) is None  # asked again: nothing new to say
        lines = [r.getMessage() for r in caplog.records if r.name == "sparktrain.train.watchdog"]
        running = [m for m in lines if "have sent nothing" in m]
        assert running == ["318 ranks (0-299, 302-319) have sent nothing for up to 13 s, but Spark reports their "
                           "tasks running: their progress channels may be cut (they reconnect); stopping the fit at "
                           "24 s if they stay silent"], lines
        assert [m for m in lines if "FAILED" in m] == [f"rank {r} is silent, and Spark reports its task FAILED: Spark "
                                                       "retries or fails the stage" for r in (300, 301)]
        overdue = [m for m in lines if "no step for" in m]
        assert len(overdue) == 3, overdue  # one for the 318 that Spark excused; the 2 others, a line each
        assert overdue[0].startswith("318 ranks (0-299, 302-319): no step for 13 s (the longest: rank 0 (h0), "
                                     "epoch 0, step 3, starting); the fit stops at 24 s (2 x stallTimeout: Spark "
                                     "reports their tasks running)"), overdue
        assert overdue[1:] == [f"rank {r} (h{r % 7}): no step for 13 s (epoch 0, step 3, starting); Spark reports its "
                               "task failed: Spark's to retry" for r in (300, 301)]  # no stop time: not a stall
        assert len(lines) == 6, lines
    finally:
        dog.close()


def test_a_silent_ranks_first_warning_asks_spark_and_names_the_real_stop_time(caplog):
    """stallTimeout 60: the first warning comes at 15 s, long before the rank is overdue; it asks Spark then, so it
    says 120 s (a running task gets a second timeout), not 60."""
    from sparktrain.train.watchdog import StallWatchdog

    dog = StallWatchdog(2, timeout=60.0, on_stall=lambda info: None, poll=3600, task_state={0: "RUNNING"}.get)
    caplog.set_level(logging.WARNING, logger="sparktrain.train.watchdog")
    try:
        t0 = dog.started
        for rank in range(2):
            dog({"type": "step", "rank": rank, "host": f"h{rank}", "epoch": 1, "step": 7})
            dog.ranks[rank].update(seen=t0, progress=t0)
        dog.ranks[1].update(seen=t0 + 16, progress=t0 + 16)  # rank 1 steps on
        assert dog.check(now=t0 + 16) is None
        lines = [r.getMessage() for r in caplog.records if r.name == "sparktrain.train.watchdog"]
        assert lines == ["rank 0 has sent nothing for 16 s, but Spark reports its task running: its progress channel "
                         "may be cut (it reconnects); stopping the fit at 120 s if it stays silent",
                         "rank 0 (h0): no step for 16 s (epoch 1, step 7, starting); the fit stops at 120 s "
                         "(2 x stallTimeout: Spark reports its task running)"], lines
        dog.ranks[1].update(seen=t0 + 61, progress=t0 + 61)
        assert dog.check(now=t0 + 61) is None  # rank 0: overdue, excused up to 120 s
        later = [r.getMessage() for r in caplog.records if r.name == "sparktrain.train.watchdog"][2:]
        assert later == ["rank 0 (h0): no step for 61 s (epoch 1, step 7, starting); the fit stops at 120 s "
                         "(2 x stallTimeout: Spark reports its task running)"], later  # Spark's answer: said once
    finally:
        dog.close()


def test_task_states_reads_a_stages_task_list_once_for_every_rank(spark):
    """What the watchdog asks Spark about silent ranks, against a real barrier stage: one read for all ranks."""
    from sparktrain._internal import spark_compat

    sc = spark.sparkContext
    done = threading.Event()

    def hold(_):
        import time as _t

        _t.sleep(6)
        return [1]

    def run():
        sc.setJobGroup("task-states-test", "two tasks that sleep", interruptOnCancel=True)
        try:
            sc.parallelize(range(2), 2).barrier().mapPartitions(hold).collect()
        except Exception:  # noqa: BLE001 - cancelled at the end of the test
            pass
        finally:
            done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        states = spark_compat.TaskStates(spark, "task-states-test", 2, max_age_s=60)
        _wait(lambda: states._read() and states._read()[0][0].keys() == {0, 1}, timeout=30)
        assert [states(0), states(1), states(7)] == ["RUNNING", "RUNNING", None] and states.snapshots == 1
        assert spark_compat.TaskStates(spark, "task-states-test", 3)(0) is None  # another stage's size
        assert spark_compat.TaskStates(spark, "no-such-group", 2)(0) is None
    finally:
        sc.cancelJobGroup("task-states-test")
        done.wait(30)


def test_a_rank_waiting_in_a_collective_on_a_silent_running_peer_waits_with_it():
    """Rank 0's channel is cut (silent, Spark says running); rank 1 is connected but stuck in the collective that
    waits for rank 0: it is not the culprit while rank 0 is excused, and both are blamed at twice the timeout."""
    from sparktrain.train.watchdog import StallWatchdog

    dog = StallWatchdog(2, timeout=5.0, on_stall=lambda info: None, poll=3600, task_state=lambda rank: "RUNNING")
    try:
        t0 = dog.started
        for rank in range(2):
            dog({"type": "step", "rank": rank, "host": f"h{rank}", "epoch": 3, "step": 338})
            dog.ranks[rank].update(seen=t0, progress=t0)
        dog.ranks[1].update(seen=t0 + 8, phase="collective")  # rank 1 is heard from, waiting in allreduce
        assert dog.check(now=t0 + 8) is None
        info = dog.check(now=t0 + 10.5)
        assert info is not None and info["rank"] == 0 and info["spark_task"] == "RUNNING"  # rank 0 outside it
    finally:
        dog.close()
    lone = StallWatchdog(2, timeout=5.0, on_stall=lambda info: None, poll=3600, task_state=lambda rank: "RUNNING")
    try:
        t0 = lone.started
        for rank in range(2):
            lone({"type": "step", "rank": rank, "host": f"h{rank}", "epoch": 3, "step": 338})
            lone.ranks[rank].update(seen=t0 + 6, progress=t0)  # both heard from: nobody silent, nobody excused
        lone.ranks[1].update(phase="collective")
        info = lone.check(now=t0 + 6)
        assert info is not None and info["rank"] == 0  # the one outside the collective, at the timeout
    finally:
        lone.close()


def test_a_reused_gang_judges_a_missing_rank_alive_only_from_the_trials_own_events():
    """A rank died, its peer reported the failure: the retried stage's new task for that rank pings before it is
    handed the trial (no run in its events), which must not read as the dead rank stuck in a collective (the
    gang would be cancelled and the trial failed instead of resumed); heartbeats naming the trial's run do."""
    from sparktrain.train.gang import ALIVE_S, peers_alive
    from sparktrain.train.watchdog import StallWatchdog

    dog = StallWatchdog(2, timeout=60.0, on_stall=lambda info: None, poll=3600, run="trial-7")
    try:
        failed = {0: {"ok": False}}  # rank 0 reported the lost connection; rank 1 has no result
        dog({"type": "heartbeat", "rank": 1, "host": "h1", "run": "trial-7", "epoch": 2, "step": 3})
        assert peers_alive(2, failed, dog)  # rank 1 beats for this trial: stuck in a collective
        dog.ranks[1]["seen_run"] -= ALIVE_S + 1  # ... then nothing from it for this trial
        dog({"type": "ping", "rank": 1, "host": "h1"})  # the retried stage's new task, not yet given the trial
        dog({"type": "heartbeat", "rank": 1, "host": "h1", "run": "trial-6", "epoch": 1, "step": 9})  # an old one's
        assert dog.ranks[1]["seen"] > dog.ranks[1]["seen_run"] + ALIVE_S  # heard from, not for this trial
        assert not peers_alive(2, failed, dog)
        assert not peers_alive(2, {0: {"ok": False}, 1: {"ok": True}}, dog)  # nobody missing: nothing to wait for
    finally:
        dog.close()
