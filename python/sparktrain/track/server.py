"""A real ``mlflow server`` (UI + REST API + artifact proxy) bound to 127.0.0.1.

:class:`MlflowServer` starts one in the background (tests, notebooks) and stops
its whole process group; :func:`serve_forever` runs one in the foreground for
``sparktrain mlflow-server`` and ``make mlflow-server``.  The server never
binds anything but 127.0.0.1.  Its GenAI job runner is switched off
(``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): it starts four extra worker
processes that training runs do not use.

Examples
--------
>>> with MlflowServer(backend_store_uri="sqlite:////tmp/m.db", artifacts_destination="/tmp/art") as srv:
...     print(srv.url)                                           # doctest: +SKIP
http://127.0.0.1:41789
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional

from sparktrain._internal.secrets import mask_value
from sparktrain.errors import TrackingError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def health_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET {url}/health`` answers 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _prepare_stores(backend_store_uri: str, artifacts_destination: str) -> None:
    if backend_store_uri.startswith("sqlite:///"):
        db = backend_store_uri[len("sqlite:///"):]
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    if "://" not in artifacts_destination:
        Path(artifacts_destination).mkdir(parents=True, exist_ok=True)


def server_command(port: int, backend_store_uri: str, artifacts_destination: str, workers: int = 1) -> List[str]:
    """The ``mlflow server`` command line (always ``--host 127.0.0.1``)."""
    artifacts = artifacts_destination if "://" in artifacts_destination else os.path.abspath(artifacts_destination)
    return [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
            "--backend-store-uri", backend_store_uri, "--artifacts-destination", artifacts,
            "--workers", str(workers)]


def _server_env() -> dict:
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


class MlflowServer:
    """A background ``mlflow server`` on 127.0.0.1; a context manager.

    Parameters
    ----------
    backend_store_uri : str
        Where runs and the registry live, e.g. ``sqlite:////abs/path/mlflow.db``.
    artifacts_destination : str
        Directory (or URI) the server stores artifacts in; clients upload through it.
    port : int, optional
        A free port is picked when not given.
    log_path : str, optional
        File for the server's stdout/stderr (default: ``<artifacts_destination>/../mlflow-server.log``).
    """

    def __init__(self, backend_store_uri: str, artifacts_destination: str, port: Optional[int] = None,
                 log_path: Optional[str] = None, workers: int = 1) -> None:
        self.backend_store_uri = backend_store_uri
        self.artifacts_destination = artifacts_destination
        self.port = port or free_port()
        self.workers = workers
        self.log_path = log_path or os.path.join(os.path.dirname(os.path.abspath(artifacts_destination)),
                                                 f"mlflow-server-{self.port}.log")
        self._proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 240.0) -> "MlflowServer":
        """Start the server and wait until ``/health`` answers; raise :class:`TrackingError` otherwise."""
        if port_in_use(self.port):
            raise TrackingError(f"port {self.port} on {HOST} is already in use; pick another port")
        _prepare_stores(self.backend_store_uri, self.artifacts_destination)
        cmd = server_command(self.port, self.backend_store_uri, self.artifacts_destination, self.workers)
        log.info("starting %s", " ".join(cmd))
        with open(self.log_path, "ab") as out:
            # its own session: stop() signals the whole group (uvicorn workers included)
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_server_env(),
                                          start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TrackingError(f"mlflow server exited with code {self._proc.returncode} before it "
                                    f"was ready:\n{self.log_tail()}")
            if health_ok(self.url):
                log.info("MLflow server ready at %s", self.url)
                return self
            time.sleep(0.5)
        self.stop()
        raise TrackingError(f"mlflow server at {self.url} was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(port: int = 5000, backend_store_uri: str = "sqlite:///work/mlflow.db",
                  artifacts_destination: str = "work/mlartifacts") -> int:
    """Run ``mlflow server`` on 127.0.0.1 in the foreground until Ctrl-C; returns its exit code.

    Parameters
    ----------
    port : int
        Port on 127.0.0.1.
    backend_store_uri : str
        Runs and registry store; the default is the one ``sparktrain run`` writes to.
    artifacts_destination : str
        Where the server keeps artifacts it receives.
    """
    if port_in_use(port):
        raise TrackingError(f"port {port} on {HOST} is already in use (another mlflow server?); "
                            f"open http://{HOST}:{port} or pass --port")
    _prepare_stores(backend_store_uri, artifacts_destination)
    cmd = server_command(port, backend_store_uri, artifacts_destination)
    print(f"MLflow UI and tracking server: http://{HOST}:{port}  (store {mask_value(backend_store_uri)}, "
          f"artifacts {artifacts_destination}); Ctrl-C stops it", flush=True)
    # its own session, so that a SIGTERM or SIGHUP to this process (a supervisor, `kill`, a closed terminal)
    # is passed on to the server and its workers; they outlived it before, still listening on the port
    proc = subprocess.Popen(cmd, env=_server_env(), start_new_session=True)

    def stop_server(signum: int = signal.SIGTERM, frame: object = None) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, stop_server) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reaches only this process now: stop the server ourselves
            stop_server()
            return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
