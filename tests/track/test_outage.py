"""A tracking server killed mid-training: the job ends promptly, the model is in the store, and
``sparktrain register --from-store`` finishes the tracking once a server is back (real MLflow)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sparktrain.errors import TrackingError

EPOCHS = 6


def _wait_for_epoch(store: Path, epoch: int, stop: threading.Event) -> bool:
    """True once some run in ``store`` logged ``epoch_finished`` for ``epoch``."""
    from sparktrain.data.run_store import RunStore

    while not stop.is_set():
        for run in store.glob("*/checkpoints/events"):
            for e in RunStore(str(store), run.parent.parent.name).read_events():
                if e.get("event") == "epoch_finished" and e.get("epoch") == epoch:
                    return True
        time.sleep(0.1)
    return False


@pytest.mark.torch
@pytest.mark.slow
def test_server_killed_mid_training_then_register_from_store(spark, tmp_path, restore_mlflow_uri):
    from mlflow import MlflowClient
    from pyspark.sql import functions as F

    from sparktrain.config import parse_config
    from sparktrain.job import run_job
    from sparktrain.track.bundle import read_bundle, register_from_store
    from sparktrain.track.server import MlflowServer

    raw = tmp_path / "raw"
    df = spark.range(20000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b"),
                                   (F.col("id") % 5).cast("string").alias("kind"))
    df.withColumn("label", (F.col("a") + F.col("b") > 0)).write.parquet(str(raw))
    backend, artifacts = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts")
    server = MlflowServer(backend, artifacts, log_path=str(tmp_path / "server.log")).start()
    store = tmp_path / "store"
    cfg = parse_config({
        "name": "outage", "data": {"source": str(raw), "label": "label"},
        "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"},
                     {"name": "kind", "type": "categorical"}],
        "output": {"path": str(tmp_path / "dataset")},
        "train": {"num_workers": 2, "epochs": EPOCHS, "batch_size": 64, "store": str(store),
                  "compare_baseline": False},
        "tracking": {"uri": server.url, "experiment": "outage", "model_name": "outage-model"}})
    stop = threading.Event()

    def killer() -> None:
        if _wait_for_epoch(store, 1, stop):  # the server dies at epoch 2 of 6
            server.stop(timeout=5)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        with pytest.raises(TrackingError) as info:
            run_job(cfg, stages=("preprocess", "train"), spark=spark)
    finally:
        stop.set()
        server.stop()
    message = str(info.value)
    assert "stopped answering after training" in message and "Nothing is lost" in message
    run_dir = message.split("--from-store ")[1].split()[0]
    bundle = read_bundle(run_dir)
    assert len(bundle["history"]) == EPOCHS and bundle["mlflow_run_id"]
    for part in ("network/model.bin", "features/features.json", "model.json", "pipeline_model"):
        assert (Path(bundle["_dir"]) / part).exists(), part

    # probe O: meanwhile another preprocess of the same output.path replaced the generation the model was trained
    # on; registering read features.json from there and failed, although the bundle holds its own copies
    import shutil

    assert "_gen-" in bundle["dataset"]
    shutil.rmtree(bundle["dataset"])
    # the server is back (same stores, another port): one command finishes the tracking
    with MlflowServer(backend, artifacts, log_path=str(tmp_path / "server2.log")) as again:
        registered = register_from_store(spark, run_dir, tracking_uri=again.url)
        client = MlflowClient(again.url, again.url)
        assert registered.name == "outage-model" and registered.version == 1
        assert client.get_model_version_by_alias("outage-model", "champion").version == "1"
        run = client.get_run(bundle["mlflow_run_id"])
        assert run.info.status == "FINISHED" and "test_auc" in run.data.metrics
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert sorted(steps) == list(range(EPOCHS))  # every epoch once: the ones logged live are not repeated
        assert client.get_run(bundle["mlflow_parent_run_id"]).info.status == "FINISHED"
        import mlflow
        import pandas as pd

        mlflow.set_tracking_uri(again.url)
        mlflow.set_registry_uri(again.url)
        scored = mlflow.pyfunc.load_model("models:/outage-model/1").predict(
            pd.DataFrame({"a": [0.9, -0.9], "b": [0.8, -0.8], "kind": ["1", "3"]}))
        assert scored["probability"][0] > 0.8 and scored["probability"][1] < 0.2  # the bundle's own features


def test_an_mlflow_failure_while_the_server_answers_names_the_recovery_command(tmp_path):
    """Probe O: a locked sqlite store (or a broken artifact store) after training gave 29 raw tracebacks and no
    hint, while `register --from-store` recovered the run; the server answered /health, so the outage path was
    not taken.  Such a failure now ends with the same error: where the model is and the command."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    from sparktrain.errors import TrackingDownError
    from sparktrain.track.bundle import tracking_down_error, tracking_failure

    db = tmp_path / "locked.db"
    holder, waiter = sqlite3.connect(db, timeout=0.1), sqlite3.connect(db, timeout=0.1)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the store: a real lock, a real error
    try:
        waiter.execute("SELECT * FROM t")
        raise AssertionError("the lock did not hold")
    except sqlite3.OperationalError as locked:
        try:
            raise MlflowException("(sqlite3.OperationalError) database is locked") from locked
        except MlflowException as exc:
            failure = exc
    finally:
        holder.rollback()
    assert tracking_failure(failure) and tracking_failure(NotADirectoryError("/mnt/artifacts/x"))
    assert not tracking_failure(ValueError("the job's own bug"))

    class Tracker:  # the part of JobTracker the error reads
        uri, down = "sqlite:////data/mlflow.db", None

        def mark_down(self, reason):
            self.down = reason

    err = tracking_down_error(Tracker(), failure, "/store/run7/model", "after training", answering=True)
    assert isinstance(err, TrackingDownError)
    text = str(err)
    assert text.startswith("MLflow at sqlite:////data/mlflow.db failed after training ((sqlite3.OperationalError) "
                           "database is locked; it answers, but its store or artifact store does not work"), text
    assert "Nothing is lost: the trained model is in the store at /store/run7/model" in text
    assert "sparktrain register --from-store /store/run7 --tracking-uri sqlite:////data/mlflow.db" in text


@pytest.mark.torch
@pytest.mark.slow  # ~40 s: a job of its own
def test_register_from_store_registers_a_job_run_with_register_off_once(spark, tmp_path, restore_mlflow_uri):
    """Probe O: after a job with tracking.register: false, `register --from-store` logged the model on the run a
    second time, created no version and printed "registered models:/m-...".  It registers the logged model now,
    with the champion rule, and a second call finds that version."""
    from mlflow import MlflowClient
    from pyspark.sql import functions as F

    from sparktrain.config import parse_config
    from sparktrain.job import run_job
    from sparktrain.track.bundle import register_from_store

    raw = tmp_path / "raw"
    df = spark.range(4000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b"))
    df.withColumn("label", F.col("a") + F.col("b") > 0).write.parquet(str(raw))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = parse_config({
        "name": "noreg", "data": {"source": str(raw), "label": "label"},
        "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}],
        "output": {"path": str(tmp_path / "dataset")},
        "train": {"num_workers": 1, "epochs": 2, "batch_size": 128, "store": str(tmp_path / "store"),
                  "compare_baseline": False},
        "tracking": {"uri": uri, "experiment": "noreg", "model_name": "noreg-model", "register": False,
                     "artifact_location": str(tmp_path / "artifacts")}})
    result = run_job(cfg, stages=("preprocess", "train"), spark=spark)
    client = MlflowClient(uri, uri)
    run_id = result.tracking.model.run_id
    assert client.search_registered_models() == []
    folder = str(tmp_path / "store" / result.train.model.getRunId())
    registered = register_from_store(spark, folder, tracking_uri=uri)
    assert (registered.name, registered.version, registered.champion) == ("noreg-model", 1, True)
    assert client.get_model_version("noreg-model", "1").run_id == run_id
    assert len(client.search_logged_models(experiment_ids=[client.get_run(run_id).info.experiment_id])) == 1
    again = register_from_store(spark, folder, tracking_uri=uri)
    assert again.version == 1 and [str(v.version) for v in client.search_model_versions("name='noreg-model'")] == ["1"]
