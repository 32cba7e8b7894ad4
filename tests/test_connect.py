"""The same job against a Spark Connect server (sc://): preprocess, barrier training, MLflow, scoring, from the CLI."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests._connect import connect_env, connect_server

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.connect


_env = connect_env


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """A real Spark Connect server (local[2], 127.0.0.1, free port) in its own JVM; yields its sc:// URL."""
    with connect_server(tmp_path_factory.mktemp("connect"), "sparktrain-connect-test") as url:
        yield url


def _sparktrain(cwd, *args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "sparktrain", *map(str, args)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _assert_close(a, b, path="features"):
    """Equal JSON, floats to 1e-9 relative."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (path, sorted(a), sorted(b))
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def test_preprocess_over_spark_connect_matches_the_classic_session(connect_url, spark, flights_sample, tmp_path):
    """The CLI's preprocess over Connect: the same splits, rows and fitted values as on a classic session."""
    _preprocess_over_connect(connect_url, spark, flights_sample, tmp_path)


@pytest.mark.slow  # then train, MLflow and score over Connect (~60-80 s in all); the preprocess part runs by default
def test_preprocess_and_train_over_spark_connect(connect_url, spark, flights_sample, tmp_path):
    overrides, sets, config, tracking, sample = _preprocess_over_connect(connect_url, spark, flights_sample, tmp_path)
    rc, out, err = _sparktrain(tmp_path, "train", config, "--master", connect_url, *sets)
    assert rc == 0, err[-3000:]
    assert "training torch (ddp) with 2 workers" in err
    assert "cannot tell how many tasks" not in err  # the slot check read local[2] from the server
    auc = float(re.search(r"^  test_auc\s+([0-9.]+)", out, re.MULTILINE).group(1))
    assert 0.75 < auc <= 1.0, out
    assert re.search(r"^epochs: 2 ", out, re.MULTILINE), out

    # MLflow: the run, its metric and the registered model, logged from the Connect client
    from mlflow import MlflowClient

    client = MlflowClient(tracking, tracking)
    version = client.get_model_version_by_alias("connect-model", "champion")
    assert str(version.version) == "1"
    assert client.get_run(version.run_id).data.metrics["test_auc"] == pytest.approx(auc, abs=1e-4)

    # scoring through Connect with the registered model (it carries the fitted feature pipeline)
    from sparktrain.data.manifest import committed_files

    rc, out, err = _sparktrain(tmp_path, "score", "--model", "models:/connect-model@champion", "--input", sample,
                               "--output", tmp_path / "scored", "--tracking-uri", tracking, "--master", connect_url)
    assert rc == 0, err[-3000:]
    scored = pq.read_table(committed_files(str(tmp_path / "scored")))
    assert scored.num_rows == flights_sample.count()
    probability = scored.column("probability").to_numpy()
    assert ((probability > 0) & (probability < 1)).all()
    assert set(scored.column("prediction").to_pylist()) == {0.0, 1.0}


def _preprocess_over_connect(connect_url, spark, flights_sample, tmp_path):
    """``sparktrain preprocess`` over Connect, checked against the same job on the classic session; returns the
    job's overrides, their --set arguments, the config, the tracking URI and the sample's folder."""
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize
    from sparktrain.jvm import local_path

    sample = os.path.dirname(local_path(flights_sample.inputFiles()[0]))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [f"data.source={sample}", f"output.path={tmp_path / 'dataset'}", f"train.store={tmp_path / 'store'}",
                 "train.epochs=2", "train.num_workers=2", "train.compare_baseline=false", f"tracking.uri={tracking}",
                 "tracking.model_name=connect-model"]
    sets = [x for o in overrides for x in ("--set", o)]
    config = REPO / "conf" / "flights.yaml"

    rc, out, err = _sparktrain(tmp_path, "preprocess", config, "--master", connect_url, *sets)
    assert rc == 0, err[-3000:]
    assert "SparkSession ready: master local[2]" in err  # the client reads the server's master
    from sparktrain.data.commit import resolve
    from sparktrain.data.manifest import committed_files

    remote = json.loads((Path(resolve(str(tmp_path / "dataset"))) / "features.json").read_text())

    # the same job on the classic local session: the same splits and the same fitted values
    cfg = load_config(config, overrides=overrides)
    local = materialize(spark, replace(cfg, output=replace(cfg.output, path=str(tmp_path / "local"))))
    for split, rows in local.row_counts.items():
        assert remote["dataset"]["splits"][split]["rows"] == rows
        got, want = (pq.read_table(committed_files(str(root / split))).sort_by("flight_id")
                     for root in (tmp_path / "dataset", tmp_path / "local"))
        assert got.schema == want.schema and got.equals(want), split  # the same rows, features and values
    _assert_close(remote["features"], local.features["features"])
    assert remote["columns"] == local.features["columns"]
    # no JVM on a Connect client: no lineage listener, so no sources (the splits are the lineage)
    assert "sources" not in remote["dataset"] and local.features["dataset"]["sources"]

    return overrides, sets, config, tracking, sample


_FIT_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, {python!r})
from pyspark.sql import SparkSession, functions as F
from sparktrain.train.estimator import TorchEstimator

spark = SparkSession.builder.remote({url!r}).getOrCreate()
df = spark.range(2000).select((F.rand(1) * 2 - 1).alias("x"), (F.rand(2) * 2 - 1).alias("z"))
df = df.withColumn("label", (F.col("x") + F.col("z") > 0).cast("int"))
est = TorchEstimator(numWorkers=2, epochs={epochs}, batchSize=64, labelCol="label", store={store!r})
est.show_progress = False
print("FIT", flush=True)
t0 = time.monotonic()
try:
    model = est.fit(df)
    out = {{"ok": True, "epochs": len(model.history), "rows": model.transform(df).where("prediction IS NOT NULL")
           .count()}}
except Exception as exc:
    out = {{"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000]}}
out["seconds"] = time.monotonic() - t0
print("RESULT", json.dumps(out), flush=True)
"""


def _fit_script(url, store, epochs):
    return _FIT_SCRIPT.format(python=str(REPO / "python"), url=url, store=str(store), epochs=epochs)


def test_fit_of_a_dataframe_over_spark_connect(connect_url, tmp_path):
    """Probe E: fit(DataFrame) over Connect failed before training ('errorifexists is not supported': the Connect
    writer knows only error/append/overwrite/ignore). It trains and scores now."""
    proc = subprocess.run([sys.executable, "-c", _fit_script(connect_url, tmp_path / "store", 2)], env=_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    lines = [json.loads(x.split(" ", 1)[1]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines and lines[0]["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lines[0]["epochs"] == 2 and lines[0]["rows"] == 2000


@pytest.mark.slow  # a Connect server of its own, killed mid-fit, and the client's bounded retries (~1 minute)
def test_a_connect_server_killed_mid_fit_ends_the_fit_with_an_error_not_a_hang(tmp_path):
    """Probe E: the server killed mid-fit left the client in PySpark's retry loop for 10+ minutes with no word.
    The fit's Connect calls retry for about a minute (spark_compat.CONNECT_RETRY_S); then a TrainingError names
    the lost server and the run to resume."""
    import signal
    import time

    base = tmp_path / "server"
    base.mkdir()
    with connect_server(base, "sparktrain-connect-kill") as url:
        proc = subprocess.Popen([sys.executable, "-c", _fit_script(url, tmp_path / "store", 500)], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        events = []
        while time.monotonic() < deadline and not events:  # kill it once a rank has finished an epoch
            events = [p for p in (tmp_path / "store").glob("*/checkpoints/events/*") if p.is_file()]
            time.sleep(1.0)
        time.sleep(3.0)
        os.killpg(int((base / "server.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=300)
    lines = [json.loads(x.split(" ", 1)[1]) for x in out.splitlines() if x.startswith("RESULT ")]
    assert lines, out[-3000:] + err[-3000:]
    result = lines[0]
    assert not result["ok"] and result["error"] == "TrainingError", result
    assert "lost the Spark Connect server" in result["message"] and "runId=" in result["message"], result
    assert time.monotonic() - killed < 360  # bounded: PySpark's own policy waits 10+ minutes
