"""The driver's progress channel: a bar only on a TTY, log lines elsewhere, and caps on what clients send."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import time

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
    conn.settimeout(5)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


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
            bar = server._bar
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


def test_garbage_after_the_hello_is_ignored():
    seen = _Steps()
    with ProgressServer("127.0.0.1", [seen], stream=io.StringIO()) as server:
        with _connect(server) as conn:
            conn.sendall(b"not json\n[1, 2]\n")
            _send(conn, server, **_step(2))
            _wait(lambda: seen.steps == [2])


@pytest.mark.parametrize("kwargs", [{"log_every_s": -1}, {"max_line_bytes": 0}, {"max_connections": 0}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError, match="must be >= "):
        ProgressServer("127.0.0.1", **kwargs)
