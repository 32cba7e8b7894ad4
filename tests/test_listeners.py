"""During a local training run, nothing listens beyond the executor's address (127.0.0.1).

The test polls the listening TCP sockets of this process tree (driver, JVM,
Python workers, the Keras child processes) while training runs.
"""

from __future__ import annotations

import threading
import time

import psutil
import pytest

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


class _Listeners:
    def __init__(self) -> None:
        self.seen = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
                for c in psutil.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.pid in pids:
                        self.seen[(c.laddr.ip, c.laddr.port)] = c.pid
            except psutil.Error:
                pass
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def small_dataset(spark, tmp_path_factory):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("listen") / "ds"
    df = spark.range(6000).select((F.rand(3) * 2 - 1).cast("float").alias("x"),
                                  (F.col("id") % 5).cast("int").alias("c"))
    write_parquet(df.withColumn("label", F.col("x") > 0), str(root / "train"))
    return str(root)


@pytest.mark.torch
def test_torch_ddp_listeners_stay_on_loopback(spark, small_dataset, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    est = TorchEstimator(numWorkers=2, epochs=2, batchSize=128, labelCol="label", store=str(tmp_path))
    est.show_progress = False
    with _Listeners() as listeners:
        est.fit(small_dataset)
    ips = {ip for ip, _ in listeners.seen}
    python_ports = [port for (ip, port), pid in listeners.seen.items() if psutil.pid_exists(pid)]
    assert listeners.seen, "no listening socket observed"
    assert ips <= LOOPBACK, f"listeners beyond loopback: {sorted(listeners.seen)}"
    assert python_ports  # the TCPStore and gloo pairs were observed, all on loopback


@pytest.mark.tensorflow
def test_keras_listeners_documented(spark, small_dataset, tmp_path):
    """TF's gRPC server binds every interface ('::'): measured, and documented in docs/training.md."""
    from sparktrain.train.estimator import KerasEstimator

    est = KerasEstimator(numWorkers=2, epochs=1, batchSize=128, labelCol="label", store=str(tmp_path))
    est.show_progress = False
    with _Listeners() as listeners:
        est.fit(small_dataset)
    wide = sorted((ip, port) for ip, port in listeners.seen if ip not in LOOPBACK)
    # Only the TensorFlow collective servers (one per worker) are not confined.
    assert len(wide) <= 2, wide
    assert all(ip in ("::", "0.0.0.0") for ip, _ in wide)
