"""End to end with the store and the dataset in S3 (moto's real S3 server, tests/_s3.py).

Each scenario runs a real Spark driver in a subprocess whose environment
points ``s3://`` at the server (``AWS_ENDPOINT_URL``), so its Python workers
see it too:

* a fit reading its dataset from S3 and checkpointing to a store in S3 is
  killed with SIGKILL (the whole process group: driver, JVM, workers) mid-epoch,
  then the same fit resumes from the S3 checkpoints: every row once per epoch;
* a job trains into a store in S3 with tracking off, then ``register
  --from-store`` logs and registers the model from S3, and the model is served
  from the registry.

Spark's own S3A connector (hadoop-aws) is not installable here: the datasets
are written locally by Spark and uploaded with ``pyarrow.fs.copy_files``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.test_resume import TRAIN_ROWS, committed_rows

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3

_FIT = r"""
import json, os, sys
sys.path.insert(0, {python!r})
from sparktrain.session import get_or_create_session
from sparktrain.train.estimator import TorchEstimator

spark = get_or_create_session("local[2]")
os.environ["SPARKTRAIN_TRACE_ROWS"] = "row_id:" + os.path.join({traces!r}, {run_id!r})
est = TorchEstimator(numWorkers=2, epochs={epochs}, batchSize=64, learningRate=0.01, labelCol="label",
                     store={store!r}, runId={run_id!r}, logEverySteps=5, checkpointEverySteps=5,
                     excludeCols=["row_id"], shuffleBuffer=256, seed=3, stallTimeout=900.0)
est.show_progress = False
m = est.fit({dataset!r})
print("RESULT " + json.dumps({{"history": m.history, "attempts": est.last_launch.attempts}}))
"""


@pytest.fixture(scope="module")
def s3_rows(spark, s3_server, tmp_path_factory):
    """test_resume's rows dataset, materialized locally and uploaded to S3; its ``s3://`` URI."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("s3rows") / "ds"
    df = spark.range(TRAIN_ROWS + 800).select(
        F.col("id").cast("int").alias("row_id"), (F.rand(7) * 2 - 1).cast("float").alias("x1"),
        (F.rand(8) * 2 - 1).cast("float").alias("x2"))
    df = df.withColumn("label", (F.col("x1") + F.col("x2") * 0.5 > 0).cast("float"))
    write_parquet(df.where(f"row_id < {TRAIN_ROWS}").coalesce(1), str(root / "train"), row_group_rows=1024)
    write_parquet(df.where(f"row_id >= {TRAIN_ROWS}").coalesce(1), str(root / "validation"))
    uri = s3_server.prefix("rows")
    s3_server.upload(str(root), uri)
    return uri


def _env(s3) -> dict:
    return dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **s3.env())


def _lease(store: str, run_id: str) -> dict:
    """The run's lease object in S3 (``<store>/.<run_id>.lease``, sparktrain.data.lease)."""
    from sparktrain.data.lease import claim

    return claim(f"{store}/{run_id}", "runId").read() or {}


def _result(proc_out: str, proc_err: str) -> dict:
    line = [x for x in proc_out.splitlines() if x.startswith("RESULT ")]
    assert line, proc_out[-3000:] + proc_err[-6000:]
    return json.loads(line[0][len("RESULT "):])


@pytest.mark.torch
@pytest.mark.slow
def test_kill_9_with_the_store_in_s3_resumes_with_no_row_skipped_or_repeated(s3, s3_rows, tmp_path):
    from sparktrain.data.run_store import RunStore
    from sparktrain.train._executor.checkpoint import Checkpointer

    store, traces, run_id = s3.prefix("store"), tmp_path / "traces", "s3kill"
    script = _FIT.format(python=str(REPO / "python"), traces=str(traces), run_id=run_id, epochs=EPOCHS,
                         store=store, dataset=s3_rows)
    env = _env(s3)
    # rank 1 blocks for good at epoch 1, step 12: the checkpoint of step 10 is in S3 when the job is killed
    first = subprocess.Popen([sys.executable, "-c", script], env=dict(env, SPARKTRAIN_FAULT_INJECT="1:1:12:hang"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = RunStore(store, run_id)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and first.poll() is None:
            events = run.read_events() if run.exists() else []
            if any(e["event"] == "checkpoint" and (e["epoch"], e["step"]) == (1, 10) for e in events):
                break
            time.sleep(0.5)
        assert first.poll() is None, first.communicate()[1][-6000:]
        assert time.monotonic() < deadline, "no checkpoint at epoch 1, step 10 within 600 s"
        lease = _lease(store, run_id)
        assert lease["holder"]["pid"] == first.pid  # the driver holds the run's lease object in S3
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # driver, JVM and Python workers: no cleanup runs
        first.communicate()

    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    out = _result(second.stdout, second.stderr)
    assert [h["epoch"] for h in out["history"]] == list(range(EPOCHS))

    kept, redone, starts = committed_rows(store, traces, run_id)
    assert starts == [(2, 0, 0), (2, 1, 10)]  # resumed from the S3 checkpoint after step 10 of epoch 1
    for epoch in range(EPOCHS):  # 0 rows skipped, 0 repeated
        assert sum(kept[epoch].values()) == TRAIN_ROWS and set(kept[epoch]) == set(range(TRAIN_ROWS)), epoch
    assert redone <= 2  # step 11 (and the hung step 12 on rank 0) were trained again
    model_bytes, spec = Checkpointer(store, run_id).read_model()
    assert model_bytes and spec["history"] == out["history"]
    keys = s3.keys(f"{store}/{run_id}")
    assert "run.json" in keys and "model/network.ckpt" in keys
    assert not [k for k in keys if k.rsplit("/", 1)[-1].startswith(".tmp-")]
    # the killed driver's lease (its pid gone from this host) was taken over at once, and released after the fit
    assert f".{run_id}.lease" not in s3.keys(store)


_JOB = r"""
import json, os, sys
sys.path.insert(0, {python!r})
import mlflow
from sparktrain.config import parse_config
from sparktrain.job import run_job
from sparktrain.session import get_or_create_session
from sparktrain.track.bundle import register_from_store

spark = get_or_create_session("local[2]")
cfg = parse_config({cfg})
result = run_job(cfg, stages=("preprocess", "train"), spark=spark)
run_dir = {store!r} + "/" + result.train.model.getRunId()
registered = register_from_store(spark, run_dir, tracking_uri={tracking!r})
mlflow.set_tracking_uri({tracking!r}); mlflow.set_registry_uri({tracking!r})
model = mlflow.pyfunc.load_model("models:/s3-model@champion")
rows = spark.read.parquet({raw!r}).limit(50).toPandas()
pred = model.predict(rows.drop(columns=["label"]))
acc = float(((pred["prediction"].astype(float) > 0.5) == rows["label"].astype(bool)).mean())
print("RESULT " + json.dumps({{"run_dir": run_dir, "version": registered.version, "name": registered.name,
                               "rows": len(pred), "accuracy": acc}}))
"""


@pytest.mark.torch
@pytest.mark.slow
def test_register_from_a_store_in_s3_and_serve_from_the_registry(spark, s3, tmp_path):
    from pyspark.sql import functions as F

    from sparktrain.track.bundle import read_bundle

    raw = tmp_path / "raw"
    spark.range(4000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b")) \
        .withColumn("label", F.col("a") + F.col("b") > 0).coalesce(1).write.parquet(str(raw))
    store, tracking = s3.prefix("store"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = {"name": "s3job", "data": {"source": str(raw), "label": "label"},
           "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}],
           "output": {"path": str(tmp_path / "dataset")},
           "train": {"num_workers": 2, "epochs": 3, "batch_size": 64, "store": store, "compare_baseline": False},
           "tracking": {"enabled": False, "uri": tracking, "experiment": "s3", "model_name": "s3-model"}}
    script = _JOB.format(python=str(REPO / "python"), cfg=repr(cfg), store=store, tracking=tracking, raw=str(raw))
    proc = subprocess.run([sys.executable, "-c", script], env=_env(s3), capture_output=True, text=True,
                          timeout=900, cwd=str(tmp_path))
    out = _result(proc.stdout, proc.stderr)
    assert out["name"] == "s3-model" and out["version"] == 1 and out["rows"] == 50
    assert out["accuracy"] > 0.8  # served from the registry, trained from the store in S3
    run_id = out["run_dir"].rsplit("/", 1)[1]
    keys = s3.keys(f"{store}/{run_id}")
    for part in ("model/bundle.json", "model/model.json", "model/network/model.bin", "model/features/features.json",
                 "model/network.ckpt", "run.json"):
        assert part in keys, part
    bundle = read_bundle(out["run_dir"])
    assert set(bundle["files"]) >= {"model.json", "network/model.bin"}


_FROZEN = r"""
import json, sys
sys.path.insert(0, {python!r})
from sparktrain.session import get_or_create_session
from sparktrain.train.estimator import TorchEstimator

spark = get_or_create_session("local[2]")
est = TorchEstimator(numWorkers=2, epochs=200, batchSize=64, labelCol="label", store={store!r}, runId="frozen",
                     checkpointEverySteps=5, logEverySteps=5, stallTimeout=6.0)
est.show_progress = False
try:
    est.fit({dataset!r})
    print("RESULT " + json.dumps({{"error": None}}))
except Exception as e:
    print("RESULT " + json.dumps({{"error": type(e).__name__, "message": str(e), "info": getattr(e, "info", None)}}))
"""


class _MotoProcess:
    """moto's S3 server in a process of its own on 127.0.0.1 (a free port), so a test can freeze it (SIGSTOP)."""

    def __init__(self, log: Path) -> None:
        import socket
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
                                      str(self.port)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).read()
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "frozen-key",
                "AWS_SECRET_ACCESS_KEY": "frozen-secret", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def filesystem(self):
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(access_key="frozen-key", secret_key="frozen-secret", endpoint_override=self.endpoint,
                                 scheme="http", region="us-east-1", allow_bucket_creation=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.mark.torch
@pytest.mark.slow
def test_a_store_that_freezes_mid_fit_is_named_and_the_fit_stops(spark, tmp_path):
    """The store's S3 server stops answering mid-fit (SIGSTOP: connections are accepted, nothing comes back).
    Rank 0 blocks in a checkpoint or event write while rank 1 waits for it in a collective: the stall is blamed on
    rank 0 and names the write and the store (before, it read 'stuck in collective'), and the driver raises within
    a bounded time (each S3 request gives up after the standard 3 attempts; before, ~100 s per request held the
    failed fit's cleanup for minutes)."""
    from pyarrow import fs as pafs
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    dataset = str(tmp_path / "ds")
    df = spark.range(6400).select((F.rand(1) * 2 - 1).cast("float").alias("x"))
    write_parquet(df.withColumn("label", (F.col("x") > 0).cast("float")).coalesce(1), f"{dataset}/train")
    moto = _MotoProcess(tmp_path / "moto.log")
    try:
        fs = moto.filesystem()
        fs.create_dir("frozen-store")
        store = "s3://frozen-store/runs"
        script = _FROZEN.format(python=str(REPO / "python"), store=store, dataset=dataset)
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **moto.env())
        driver = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            selector = pafs.FileSelector("frozen-store/runs/frozen/checkpoints", allow_not_found=True)
            while driver.poll() is None and time.monotonic() < deadline:
                if [i for i in fs.get_file_info(selector) if i.path.endswith(".ckpt")]:
                    break
                time.sleep(0.5)
            assert driver.poll() is None, driver.communicate()[1][-6000:]
            assert time.monotonic() < deadline, "no checkpoint in the store within 300 s"
            time.sleep(1.0)  # a few steps and writes more
            os.kill(moto.proc.pid, signal.SIGSTOP)
            out, err = driver.communicate(timeout=420)  # a hang fails here, not the suite
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.communicate()
    finally:
        moto.stop()
    result = _result(out, err)
    assert result["error"] == "TrainingStalledError", result
    info, message = result["info"], result["message"]
    assert info["rank"] == 0 and info["phase"].startswith("a write of ")
    assert info["phase"].endswith(f"to the store {store}")
    assert f"was stuck in {info['phase']}" in message and "the store or data source it waits on" in message
    assert "fit again with runId='frozen'" in message
