"""A real Spark Connect server for the tests: one JVM on 127.0.0.1, a free port, killed at teardown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator

import pyspark

REPO = Path(__file__).resolve().parents[1]
SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"


def connect_env() -> Dict[str, str]:
    """The environment of a driver or server process: this venv's Python, loopback, no inherited gateway."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO / "python"))
    for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS", "SPARK_CONNECT_MODE",
                "SPARK_REMOTE"):
        env.pop(key, None)
    return env


@contextmanager
def connect_server(base: Path, name: str) -> Iterator[str]:
    """Start ``SparkConnectServer`` (local[2]) with its dirs under ``base``; yields its ``sc://`` URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = base / "server.log"
    cmd = [str(SPARK_SUBMIT), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
           "--master", "local[2]", "--name", name,
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC",
           "--conf", f"spark.local.dir={base / 'local'}", "--conf", "spark.sql.shuffle.partitions=2",
           "spark-internal"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=base, env=connect_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.time() + 180
        while "Spark Connect server started" not in log_path.read_text():
            assert proc.poll() is None, f"the Spark Connect server exited:\n{log_path.read_text()[-3000:]}"
            assert time.time() < deadline, f"no Spark Connect server after 180 s:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        (base / "server.pid").write_text(str(proc.pid))  # its process group: a test may kill the server
        yield f"sc://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:  # a test killed it already
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
