"""Shared pytest fixtures: one real local[2] SparkSession for the whole run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A real ``local[2]`` SparkSession (UI off, 2 shuffle partitions, dirs under tmp)."""
    from sparktrain.session import get_or_create_session

    base = tmp_path_factory.mktemp("spark")
    session = get_or_create_session(
        master="local[2]",
        app_name="sparktrain-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.local.dir": str(base / "local"),
            "spark.sql.warehouse.dir": str(base / "warehouse"),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={base / 'derby'}",
            "spark.driver.memory": "2g",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def flights_df(spark):
    """The embedded flights table (lazy; 327,346 rows after dropping cancelled)."""
    from sparktrain.datasets import flights

    return flights(spark)


@pytest.fixture(scope="session")
def flights_sample(spark, flights_df, tmp_path_factory):
    """A ~5% sample of flights written once to Parquet, for fast stage tests."""
    path = tmp_path_factory.mktemp("flights_sample") / "raw.parquet"
    flights_df.where("abs(hash(flight_id)) % 20 = 0").coalesce(1).write.parquet(str(path))
    return spark.read.parquet(str(path))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 (free port, sqlite backend, artifacts under tmp); yields its URL."""
    from sparktrain.track.server import MlflowServer

    base = tmp_path_factory.mktemp("mlflow_server")
    server = MlflowServer(backend_store_uri=f"sqlite:///{base / 'mlflow.db'}",
                          artifacts_destination=str(base / "artifacts"), log_path=str(base / "server.log"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def restore_mlflow_uri():
    """A test that points MLflow's process-wide URIs somewhere (``mlflow.set_tracking_uri`` also sets
    ``MLFLOW_TRACKING_URI`` in ``os.environ``, which every later subprocess, a Connect server included, inherits):
    both are put back as they were."""
    import mlflow

    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    env = {k: os.environ.get(k) for k in keys}
    uris = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    yield
    mlflow.set_tracking_uri(uris[0])
    mlflow.set_registry_uri(uris[1])
    for key, value in env.items():  # after the set_* calls, which write the environment
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def tracking_uri(tmp_path):
    """A fresh sqlite tracking store under tmp (``sqlite:////abs/path/mlflow.db``)."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port) with one bucket, for the whole run (:mod:`tests._s3`)."""
    pytest.importorskip("moto.server", reason="moto[server] is a test dependency: pip install 'moto[server]'")
    from tests._s3 import MotoS3

    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server with ``AWS_ENDPOINT_URL`` and throwaway credentials set for this test only."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server
