"""Tracking pieces on a real sqlite MLflow store: masking, run hierarchy, callbacks, lineage, registry, plots."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from sparktrain.errors import ModelNotFoundError, TrackingError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key, secret", [
    ("spark.conf.spark.hadoop.fs.s3a.secret.key", True),
    ("spark.conf.spark.hadoop.fs.s3a.access.key", True),
    ("tracking.api_token", True),
    ("tracking.apiToken", True),
    ("spark.conf.spark.ssl.keyStorePassword", True),
    ("tracking.password", True),
    ("features.dep_delay.api_key", True),
    ("data.key", False),                      # the split column's name (see sparktrain.track.params)
    ("features.monkey_key.type", False),      # a feature (column) name is not a setting name
    ("train.hidden_units", False),
    ("data.label", False),
    ("spark.conf.spark.sql.shuffle.partitions", False),
])
def test_secret_rule(key, secret):
    from sparktrain.track.params import is_secret_key

    assert is_secret_key(key) is secret


def test_job_params_mask_secrets_and_url_passwords():
    from sparktrain.config import load_config
    from sparktrain.track.params import MASK, job_params

    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        "spark.conf.spark.hadoop.fs.s3a.secret.key=hunter2", "tracking.uri=http://bob:hunter2@127.0.0.1:5000"])
    params = job_params(cfg)
    assert params["spark.conf.spark.hadoop.fs.s3a.secret.key"] == MASK
    assert params["tracking.uri"] == f"http://bob:{MASK}@127.0.0.1:5000"
    assert params["data.key"] == "flight_id"
    assert params["train.hidden_units"] == "[64, 64]"
    assert params["features.dest.min_frequency"] == "50"
    assert not any("hunter2" in v for v in params.values())
    assert len(params) > 150


def _cfg(tmp_path, uri, source, *extra):
    from sparktrain.config import load_config

    return load_config(REPO / "conf" / "flights.yaml", overrides=[
        f"tracking.uri={uri}", f"data.source={source}", f"output.path={tmp_path / 'ds'}",
        f"tracking.artifact_location={tmp_path / 'artifacts'}", *extra])


def test_unreachable_server_fails_before_any_spark_work(tmp_path):
    from sparktrain.job import run_job
    from sparktrain.track.server import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    cfg = _cfg(tmp_path, uri, "flights")
    t0 = time.perf_counter()
    # A session that is not one: any Spark call would raise AttributeError, not TrackingError.
    with pytest.raises(TrackingError, match=f"{uri} is unreachable") as err:
        run_job(cfg, spark=object())
    assert time.perf_counter() - t0 < 10
    assert "make mlflow-server" in str(err.value)
    assert not (tmp_path / "ds").exists()


def test_unwritable_sqlite_folder_fails_naming_the_uri(tmp_path):
    from sparktrain.track.store import preflight

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    uri = f"sqlite:///{blocker}/sub/mlflow.db"
    with pytest.raises(TrackingError, match="cannot create folder") as err:
        preflight(uri)
    assert uri in str(err.value)


def test_a_sqlite_store_that_is_not_a_database_is_named_before_any_work(tmp_path):
    """Not a raw SQLAlchemy traceback from inside MLflow: the URI, what is wrong with the file, the fix."""
    from mlflow import MlflowClient

    from sparktrain.track.store import preflight

    (tmp_path / "bad.db").write_text("not a database")
    (tmp_path / "folder.db").mkdir()
    for name, words in (("bad.db", "is not a SQLite database (it starts with b'not a da')"),
                        ("folder.db", "is a folder, not a sqlite file")):
        uri = f"sqlite:///{tmp_path / name}"
        with pytest.raises(TrackingError) as err:
            preflight(uri)
        assert str(err.value).startswith(f"MLflow tracking store {uri}: {tmp_path / name} {words}. Fix: point "
                                         f"tracking.uri (--tracking-uri, MLFLOW_TRACKING_URI) at"), str(err.value)
    assert (tmp_path / "bad.db").read_text() == "not a database"  # left as it was
    good = f"sqlite:///{tmp_path / 'good.db'}"
    MlflowClient(good).search_experiments()  # a real MLflow store passes, and an empty file is a new database
    (tmp_path / "empty.db").write_bytes(b"")
    assert preflight(good) == good and preflight(f"sqlite:///{tmp_path / 'empty.db'}")


def test_profile_job_on_sqlite(spark, flights_sample, tracking_uri, tmp_path):
    """The default backend: a parent run with params, tags and the config; a profile child run."""
    from mlflow import MlflowClient

    from sparktrain.job import run_job
    from sparktrain.track.params import job_params

    source = os.path.dirname(flights_sample.inputFiles()[0].replace("file://", ""))
    cfg = _cfg(tmp_path, tracking_uri, source, "spark.conf.spark.hadoop.fs.s3a.secret.key=hunter2")
    result = run_job(cfg, stages=("profile",), spark=spark)
    client = MlflowClient(tracking_uri)
    parent = client.get_run(result.tracking.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params == job_params(cfg)
    assert parent.data.tags["sparktrain.spark.master"] == "local[2]"
    assert parent.data.tags["sparktrain.kind"] == "job"
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.name == "sparktrain-flights"
    assert exp.artifact_location == (tmp_path / "artifacts").resolve().as_uri()
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert [c.info.run_name for c in children] == ["profile"]
    prof = children[0]
    assert prof.data.metrics["rows"] == flights_sample.count() == result.profile.rows
    assert prof.data.metrics["label_rate"] == pytest.approx(result.profile.label_rate)
    assert prof.data.params["data.label"] == "late"
    assert parent.data.metrics["profile_seconds"] == pytest.approx(prof.data.metrics["seconds"])
    text = (Path(client.download_artifacts(parent.info.run_id, "config/job.yaml", str(tmp_path)))).read_text()
    saved = yaml.safe_load(text)
    assert "hunter2" not in text and saved["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == "***"
    assert saved["features"][0] == {**cfg.to_dict()["features"][0]}
    assert client.download_artifacts(prof.info.run_id, "profile.txt", str(tmp_path))


def _tracker(tmp_path, uri):
    from sparktrain.config import load_config
    from sparktrain.track.tracker import JobTracker

    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        f"tracking.uri={uri}", f"tracking.artifact_location={tmp_path / 'art'}", "tracking.experiment=unit"])
    return JobTracker(cfg)


def test_failed_trial_is_recorded_not_dropped(tmp_path, tracking_uri):
    tracker = _tracker(tmp_path, tracking_uri)
    with tracker.job() as job:
        with pytest.raises(RuntimeError, match="boom"):
            with tracker.child_run("trial-1", params={"train.learning_rate": 0.1}) as trial:
                raise RuntimeError("boom")
        with tracker.child_run("trial-2", params={"train.learning_rate": 0.01}) as ok:
            ok.log_metrics({"val_loss": 0.4})
    client = tracker.client
    failed, good = client.get_run(trial.run_id), client.get_run(ok.run_id)
    assert failed.info.status == "FAILED"
    assert "RuntimeError: boom" in failed.data.tags["sparktrain.error"]
    assert failed.data.params == {"train.learning_rate": "0.1"}
    assert failed.data.tags["mlflow.parentRunId"] == job.run_id == good.data.tags["mlflow.parentRunId"]
    assert good.info.status == "FINISHED" and good.data.metrics["val_loss"] == 0.4
    assert client.get_run(job.run_id).info.status == "FINISHED"


def test_callback_logs_by_run_id_from_another_thread(tmp_path, tracking_uri):
    tracker = _tracker(tmp_path, tracking_uri)
    with tracker.job():
        with tracker.stage("train") as run:
            cb = run.callback()
            history = [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_loss": 1.5 / (e + 1)} for e in range(3)]

            def feed():  # the progress server calls callbacks from its own thread
                for row in history[:2]:
                    cb.on_step(row["epoch"], 10, {"loss": row["train_loss"]})
                    cb.on_epoch(row["epoch"], row)

            t = threading.Thread(target=feed)
            t.start()
            t.join()
            assert cb.log_missing(history) == 1  # epoch 2 arrived only in the final history
    for key in ("train_loss", "val_loss"):
        got = sorted(tracker.client.get_metric_history(run.run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in got] == [(e, h[key]) for e, h in enumerate(history)]
    assert "epoch" not in tracker.client.get_run(run.run_id).data.metrics


def test_dataset_inputs_from_manifests(tmp_path, tracking_uri):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparktrain.data.manifest import build_manifest, write_manifest
    from sparktrain.track.lineage import log_dataset_inputs

    root = tmp_path / "ds"
    sizes = {"train": 50, "validation": 7, "test": 9}
    for split, n in sizes.items():
        (root / split).mkdir(parents=True)
        pq.write_table(pa.table({"x": np.arange(n, dtype=np.float32), "c": np.arange(n, dtype=np.int32),
                                 "late": np.arange(n) % 2 == 0}), root / split / "part-0.parquet")
        write_manifest(str(root / split), build_manifest(str(root / split)))
    tracker = _tracker(tmp_path, tracking_uri)
    with tracker.job() as job:
        logged = log_dataset_inputs(tracker.client, [job.run_id], str(root), name="unit")
    run = tracker.client.get_run(job.run_id)
    by_name = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(by_name) == {"unit-train", "unit-validation", "unit-test"}
    for split, n in sizes.items():
        d = by_name[f"unit-{split}"]
        manifest = json.loads((root / split / "_manifest.json").read_text())
        assert d.dataset.digest == manifest["digest"][:32] == logged[split].digest
        assert json.loads(d.dataset.profile)["num_rows"] == n
        schema = json.loads(d.dataset.schema)["mlflow_colspec"]
        assert [(c["name"], c["type"]) for c in schema] == [("x", "float"), ("c", "integer"), ("late", "boolean")]
        context = {t.key: t.value for t in d.tags}["mlflow.data.context"]
        assert context == {"train": "training", "validation": "validation", "test": "testing"}[split]


def test_dataset_and_source_inputs_from_a_uri(tmp_path, tracking_uri):
    """A dataset addressed by URI (pyarrow.fs): splits and the sources in features.json are logged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparktrain.data.manifest import build_manifest, write_manifest
    from sparktrain.track.lineage import log_dataset_inputs

    root = tmp_path / "ds"
    for split in ("train", "validation", "test"):
        (root / split).mkdir(parents=True)
        pq.write_table(pa.table({"x": np.arange(4, dtype=np.float32)}), root / split / "part-0.parquet")
        write_manifest(str(root / split), build_manifest(str(root / split)))
    source = {"kind": "files", "format": "csv", "paths": ["file:/data/raw.csv"], "files": 1, "size_bytes": 123,
              "digest": "ab" * 32}
    (root / "features.json").write_text(json.dumps({"dataset": {"sources": [source]}}))
    tracker = _tracker(tmp_path, tracking_uri)
    with tracker.job() as job:
        log_dataset_inputs(tracker.client, [job.run_id], f"file://{root}", name="uri")
    inputs = {d.dataset.name: d for d in tracker.client.get_run(job.run_id).inputs.dataset_inputs}
    assert set(inputs) == {"uri-train", "uri-validation", "uri-test", "raw.csv"}
    assert json.loads(inputs["uri-train"].dataset.source)["path"] == f"file://{root}/train"
    src = inputs["raw.csv"]
    assert {t.key: t.value for t in src.tags}["mlflow.data.context"] == "source"
    assert json.loads(src.dataset.source)["path"] == "/data/raw.csv" and src.dataset.digest == "ab" * 16
    assert json.loads(src.dataset.profile) == {"format": "csv", "paths": ["file:/data/raw.csv"], "files": 1,
                                               "size_bytes": 123, "listing_sha256": "ab" * 32}


def test_champion_moves_only_to_a_better_version(tracking_uri):
    from mlflow import MlflowClient

    from sparktrain.track.registry import check_model_uri, pin_model_uri, set_champion_if_better, version_summary

    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("unit-model")
    exp = client.create_experiment("reg")
    runs = [client.create_run(exp) for _ in range(4)]
    versions = [int(client.create_model_version("unit-model", f"file:///tmp/m{i}", r.info.run_id).version)
                for i, r in enumerate(runs)]
    assert set_champion_if_better(client, "unit-model", versions[0], "test_auc", 0.70) is True
    assert set_champion_if_better(client, "unit-model", versions[1], "test_auc", 0.65) is False
    assert version_summary(client, "unit-model") == {"versions": versions, "champion": versions[0]}
    assert set_champion_if_better(client, "unit-model", versions[2], "test_auc", 0.71) is True
    # lower is better for a loss; the champion has no val_loss (tag or run metric): replaced
    assert set_champion_if_better(client, "unit-model", versions[3], "val_loss", 0.5, higher_is_better=False)
    assert int(client.get_model_version_by_alias("unit-model", "champion").version) == versions[3]
    tags = client.get_model_version("unit-model", str(versions[2])).tags
    assert tags["sparktrain.score_metric"] == "test_auc" and float(tags["sparktrain.score"]) == 0.71

    check_model_uri(client, "models:/unit-model@champion")
    # a job reads one version, whatever moves the alias meanwhile
    assert pin_model_uri(client, "models:/unit-model@champion") == f"models:/unit-model/{versions[3]}"
    assert pin_model_uri(client, "models:/unit-model") == f"models:/unit-model/{max(versions)}"
    assert pin_model_uri(client, "models:/unit-model/latest") == f"models:/unit-model/{max(versions)}"
    assert pin_model_uri(client, f"models:/unit-model/{versions[1]}") == f"models:/unit-model/{versions[1]}"
    assert pin_model_uri(client, "runs:/abc/model") == "runs:/abc/model"
    check_model_uri(client, f"models:/unit-model/{versions[1]}")
    with pytest.raises(ModelNotFoundError, match=r"'unit-modle'.*Registered models: unit-model"):
        check_model_uri(client, "models:/unit-modle@champion")
    with pytest.raises(ModelNotFoundError, match="no alias 'prod'.*aliases: champion"):
        check_model_uri(client, "models:/unit-model@prod")
    with pytest.raises(ModelNotFoundError, match="no version 9"):
        check_model_uri(client, "models:/unit-model/9")


def test_a_deleted_champion_version_gives_the_alias_to_the_best_remaining_not_to_any_newcomer(tracking_uri, caplog):
    """Probe O: deleting the champion's version drops the alias; the next registration, however bad, took it as
    "no current champion" while a better version remained."""
    import logging

    from mlflow import MlflowClient

    from sparktrain.track.registry import set_champion_if_better

    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("kept")
    exp = client.create_experiment("kept")
    versions = [int(client.create_model_version("kept", f"file:///tmp/k{i}", client.create_run(exp).info.run_id)
                    .version) for i in range(5)]
    assert set_champion_if_better(client, "kept", versions[0], "test_auc", 0.64) is True
    assert set_champion_if_better(client, "kept", versions[1], "test_auc", 0.87) is True
    assert set_champion_if_better(client, "kept", versions[2], "test_auc", 0.80) is False
    client.delete_model_version("kept", str(versions[1]))  # a colleague deletes the champion: MLflow drops the alias
    with caplog.at_level(logging.WARNING, logger="sparktrain.track.registry"):
        assert set_champion_if_better(client, "kept", versions[3], "test_auc", 0.64) is False
    assert int(client.get_model_version_by_alias("kept", "champion").version) == versions[2]
    assert f"v{versions[2]}, the best remaining version (test_auc 0.80000), holds it again" in caplog.text
    assert set_champion_if_better(client, "kept", versions[4], "test_auc", 0.90) is True  # a better one still wins
    assert int(client.get_model_version_by_alias("kept", "champion").version) == versions[4]


def test_a_champion_that_predicts_another_target_is_replaced_not_compared(tracking_uri, caplog):
    """A rerun with a redefined label (other classes, or another label column) under the same model name."""
    from mlflow import MlflowClient

    from sparktrain.train._executor.spec import InputSpec
    from sparktrain.track.registry import score_basis, set_champion_if_better

    def basis(label, classes):
        return score_basis(InputSpec(numeric=("x",), categorical=(), label=label, task="multiclass",
                                     num_classes=len(classes), classes=tuple(classes)))

    grapes, colours = basis("wine", ["barbera", "barolo", "grignolino"]), basis("wine", ["deep", "medium", "pale"])
    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("relabelled")
    exp = client.create_experiment("relabel")
    v = [int(client.create_model_version("relabelled", f"file:///tmp/r{i}", client.create_run(exp).info.run_id
                                         ).version) for i in range(4)]
    assert set_champion_if_better(client, "relabelled", v[0], "test_accuracy", 0.99, basis=grapes) is True
    assert set_champion_if_better(client, "relabelled", v[1], "test_accuracy", 0.95, basis=grapes) is False
    with caplog.at_level("WARNING", logger="sparktrain.track.registry"):
        assert set_champion_if_better(client, "relabelled", v[2], "test_accuracy", 0.83, basis=colours) is True
    assert int(client.get_model_version_by_alias("relabelled", "champion").version) == v[2]
    assert any("predicts another target" in r.getMessage() and "barolo" in r.getMessage() for r in caplog.records)
    assert client.get_model_version("relabelled", str(v[2])).tags["sparktrain.score_basis"] == colours
    # the same target again, even with a rare class missing from this run's sample: compared as before
    assert set_champion_if_better(client, "relabelled", v[3], "test_accuracy", 0.80,
                                  basis=basis("wine", ["deep", "pale"])) is False
    assert int(client.get_model_version_by_alias("relabelled", "champion").version) == v[2]


def test_same_target_compares_label_task_and_overlapping_classes():
    from sparktrain.track.registry import _same_target

    def b(label="y", task="binary", classes=()):
        return json.dumps({"label": label, "task": task, "classes": list(classes)})

    assert _same_target(b(classes=["0", "1"]), b(classes=["0.0", "1.0"]))  # an int label read as double
    assert _same_target(b(task="multiclass", classes=["a", "b", "c"]), b(task="multiclass", classes=["a", "b"]))
    assert not _same_target(b(classes=["no", "yes"]), b(classes=["low", "high"]))
    assert not _same_target(b(label="y"), b(label="z")) and not _same_target(b(), b(task="regression"))
    assert _same_target(b(task="regression"), b(task="regression"))


def test_score_of_prefers_test_metrics():
    from sparktrain.track.registry import score_of

    assert score_of("binary", {"test_auc": 0.8, "val_loss": 0.3}) == ("test_auc", 0.8, True)
    assert score_of("regression", {"test_rmse": 2.0}) == ("test_rmse", 2.0, False)
    assert score_of("binary", {}, [{"val_loss": 0.9}, {"val_loss": 0.5}]) == ("val_loss", 0.5, False)
    assert score_of("binary", {"test_auc": float("nan")}) == (None, None, True)


def test_histogram_roc_matches_exact_auc():
    from sparktrain.track.plots import BINS, histogram_auc, roc_points

    rng = np.random.default_rng(0)
    y = rng.random(20_000) < 0.3
    p = np.clip(rng.normal(0.35 + 0.25 * y, 0.2), 0, 1)
    idx = np.clip((p * BINS).astype(int), 0, BINS - 1)
    pos, neg = np.bincount(idx[y], minlength=BINS), np.bincount(idx[~y], minlength=BINS)
    order = np.argsort(p)
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    exact = (ranks[y].sum() - y.sum() * (y.sum() + 1) / 2) / (y.sum() * (~y).sum())
    assert histogram_auc(pos, neg) == pytest.approx(exact, abs=1e-3)
    fpr, tpr = roc_points(pos, neg)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_plots_have_titles_labels_and_auc_legend():
    from sparktrain.track.plots import ScoreSummary, confusion_figure, learning_curve_figure, roc_figure

    history = [{"epoch": e, "train_loss": 0.7 - 0.1 * e, "val_loss": 0.72 - 0.08 * e, "train_auc": 0.6 + 0.05 * e,
                "val_auc": 0.58 + 0.05 * e} for e in range(4)]
    fig = learning_curve_figure(history, "Learning curve")
    loss_ax, auc_ax = fig.axes
    assert (loss_ax.get_xlabel(), loss_ax.get_ylabel(), auc_ax.get_ylabel()) == ("epoch", "loss", "ROC AUC")
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()][:2] == ["train", "validation"]
    assert list(loss_ax.lines[0].get_ydata()) == pytest.approx([h["train_loss"] for h in history])
    pos, neg = np.zeros(1000), np.zeros(1000)
    pos[900], neg[100], pos[100] = 30, 60, 10
    summary = ScoreSummary("binary", ["0", "1"], np.array([[60, 0], [10, 30]]), pos, neg)
    roc = roc_figure(summary)
    legend = [t.get_text() for t in roc.axes[0].get_legend().get_texts()]
    assert legend[0] == "model (AUC = 0.875)" and roc.axes[0].get_xlabel().startswith("false positive rate")
    cm = confusion_figure(summary, label_name="late")
    assert cm.axes[0].get_xlabel() == "predicted" and "accuracy 0.900 on 100 rows" in cm.axes[0].get_title()
    for f in (fig, roc, cm):
        assert _png(f)[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_forever_refuses_a_busy_port(tmp_path):
    from sparktrain.track.server import serve_forever

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(TrackingError, match=f"port {port} on 127.0.0.1 is already in use"):
            serve_forever(port, f"sqlite:///{tmp_path}/db.sqlite", str(tmp_path / "art"))


def test_normalize_uri_makes_local_stores_absolute(tmp_path, monkeypatch):
    from sparktrain.track.store import normalize_uri

    monkeypatch.chdir(tmp_path)
    assert normalize_uri("sqlite:///work/mlflow.db") == f"sqlite:///{tmp_path}/work/mlflow.db"
    assert normalize_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert normalize_uri("mlruns") == (tmp_path / "mlruns").as_uri()
    assert normalize_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_a_deleted_experiment_is_refused_not_restored_with_its_runs(tmp_path, tracking_uri, restore_mlflow_uri):
    """Probe O: a job silently restored a colleague's deleted experiment, and its 8 deleted runs with it (an INFO
    line); MLflow's own set_experiment refuses a deleted experiment."""
    from mlflow import MlflowClient

    from sparktrain.errors import ConfigError

    first = _tracker(tmp_path, tracking_uri)
    client = MlflowClient(tracking_uri)
    run = client.create_run(first.experiment_id).info.run_id
    client.delete_experiment(first.experiment_id)
    with pytest.raises(ConfigError) as info:
        _tracker(tmp_path, tracking_uri)
    assert info.value.path == "tracking.experiment" and info.value.value == "unit"
    assert "is deleted, and this job will not undo that" in str(info.value) and "restore_experiment" in str(info.value)
    assert client.get_experiment(first.experiment_id).lifecycle_stage == "deleted"
    assert client.get_run(run).info.lifecycle_stage == "deleted"


def test_a_store_of_another_mlflow_schema_is_one_error_with_both_revisions(tmp_path, tracking_uri, restore_mlflow_uri):
    """Probe O: a tracking database whose schema is another MLflow's gave a 14-frame traceback, and for a store a
    newer MLflow wrote, advice (`mlflow db upgrade`) that cannot work."""
    import sqlite3

    import os
    import subprocess
    import sys

    from mlflow import MlflowClient

    MlflowClient(tracking_uri).search_experiments()  # the store exists, at this MLflow's schema
    db = sqlite3.connect(tracking_uri[len("sqlite:///"):])
    db.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    db.commit()
    db.close()
    script = ("import sys\nfrom sparktrain.config import parse_config\nfrom sparktrain.errors import TrackingError\n"
              "from sparktrain.track.tracker import JobTracker\n"
              f"cfg = parse_config({{'tracking': {{'uri': {tracking_uri!r}, 'experiment': 'unit'}}}})\n"
              "try:\n    JobTracker(cfg)\nexcept TrackingError as exc:\n    print('ERROR', exc)\n")
    # a fresh process: MLflow checks the schema once per store and process
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    text = proc.stdout.partition("ERROR ")[2].strip()
    assert text.startswith(f"MLflow cannot open the tracking store {tracking_uri}"), proc.stdout + proc.stderr
    assert "its schema is revision ffffffffffff" in text and "mlflow db upgrade" in text
    assert "if a newer MLflow wrote it" in text


def test_an_experiment_whose_artifact_location_cannot_be_written_fails_before_any_work(tmp_path, tracking_uri,
                                                                                      restore_mlflow_uri):
    """Probe O: a raw NotADirectoryError traceback, and a job run left RUNNING for good."""
    from mlflow import MlflowClient

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    client = MlflowClient(tracking_uri)
    client.create_experiment("unit", artifact_location=(blocker / "arts").as_uri())
    tracker = _tracker(tmp_path, tracking_uri)
    with pytest.raises(TrackingError) as info:
        with tracker.job():
            raise AssertionError("the job body must not run")
    text = str(info.value)
    assert "cannot store artifacts for experiment 'unit'" in text and str(blocker / "arts") in text, text
    assert "NotADirectoryError" in text and "Nothing ran" in text
    runs = client.search_runs([tracker.experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_an_alias_that_names_a_deleted_version_is_said_so(tracking_uri):
    """Probe O: "model 'm' has no alias 'champion' (aliases: champion; ...)" for an alias row that outlived its
    version (a delete racing an alias move), which contradicts itself."""
    import sqlite3

    from mlflow import MlflowClient

    from sparktrain.track.lookup import check_model_uri

    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("dangling")
    run = client.create_run(client.create_experiment("dangling")).info.run_id
    client.create_model_version("dangling", "file:///tmp/d0", run)
    client.set_registered_model_alias("dangling", "champion", "1")
    db = sqlite3.connect(tracking_uri[len("sqlite:///"):])
    db.execute("UPDATE registered_model_aliases SET version = 7 WHERE name = 'dangling'")
    db.commit()
    db.close()
    with pytest.raises(ModelNotFoundError) as info:
        check_model_uri(client, "models:/dangling@champion")
    assert "alias 'champion' of model 'dangling' names version 7, which no longer exists" in str(info.value)
    assert "versions: 1" in str(info.value)


def test_a_champion_scored_on_other_rows_is_compared_with_a_warning(tracking_uri, tmp_path, caplog):
    """Probe O: a run with another split seed ranked its test_auc against the champion's, measured on other test
    rows, with no word.  The rows' identity is a tag of each version; other rows still compare, with a warning."""
    import json
    import logging

    from mlflow import MlflowClient

    from sparktrain.track.registry import score_split, set_champion_if_better

    def dataset(name: str, seed: int, test_rows: int) -> str:
        root = tmp_path / name
        root.mkdir()
        (root / "features.json").write_text(json.dumps({"dataset": {
            "split": {"seed": seed, "fractions": [0.8, 0.1, 0.1]},
            "splits": {"validation": {"rows": 100}, "test": {"rows": test_rows}},
            "sources": [{"paths": ["/data/t.parquet"], "digest": "abc"}]}}))
        return str(root)

    seed42, again, seed7 = dataset("a", 42, 97), dataset("b", 42, 97), dataset("c", 7, 103)
    assert score_split(seed42, "test_auc") == score_split(again, "test_auc")  # the same preprocess run again
    assert score_split(seed42, "test_auc") != score_split(seed7, "test_auc")
    assert score_split(seed42, "test_auc") != score_split(seed42, "val_loss")  # val_loss: the validation rows
    assert score_split(str(tmp_path / "none"), "test_auc") is None and score_split(seed42, None) is None

    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("resplit")
    run = client.create_run(client.create_experiment("resplit")).info.run_id
    v = [int(client.create_model_version("resplit", f"file:///tmp/r{i}", run).version) for i in range(3)]
    assert set_champion_if_better(client, "resplit", v[0], "test_auc", 0.71, split=score_split(seed42, "test_auc"))
    assert client.get_model_version("resplit", str(v[0])).tags["sparktrain.score_split"].startswith("split-v1:")
    with caplog.at_level(logging.WARNING, logger="sparktrain.track.registry"):
        assert set_champion_if_better(client, "resplit", v[1], "test_auc", 0.68,
                                      split=score_split(seed7, "test_auc")) is False  # still compared
    assert f"v{v[0]}'s test_auc was measured on other rows than v{v[1]}'s" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparktrain.track.registry"):
        assert set_champion_if_better(client, "resplit", v[2], "test_auc", 0.75,
                                      split=score_split(again, "test_auc")) is True
    assert "other rows" not in caplog.text  # the same rows: no warning


def test_a_new_model_name_that_differs_from_one_only_by_case_is_warned(tracking_uri, caplog):
    """Probe O: `tracking.model_name=Probe-Model` beside `probe-model` made a second model with no word (the same
    name on MySQL or SQL Server).  Quotes and LIKE wildcards in a name are matched literally."""
    import logging

    from mlflow import MlflowClient

    from sparktrain.track.registry import _warn_case_twins

    client = MlflowClient(tracking_uri, tracking_uri)
    for name in ("probe-model", "Probe-Model", "o'brien", "probe_model", "a%b"):
        client.create_registered_model(name)
    with caplog.at_level(logging.WARNING, logger="sparktrain.track.registry"):
        _warn_case_twins(client, "Probe-Model")
        _warn_case_twins(client, "O'Brien")
    said = " ".join(r.getMessage() for r in caplog.records)  # not caplog.text: a JSON log format escapes quotes
    assert "registered a new model 'Probe-Model' next to 'probe-model', whose name differs only by case" in said
    assert "next to \"o'brien\"" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparktrain.track.registry"):
        _warn_case_twins(client, "probe_model")  # '_' is not a wildcard here: probe-model is no twin
        _warn_case_twins(client, "a%b")
        _warn_case_twins(client, "unique")
    assert not caplog.records


def test_an_artifact_store_that_fails_while_a_stage_logs_is_a_tracking_error(tracking_uri, monkeypatch):
    """Probe R: an S3 artifact location that stopped answering during the preprocess stage's logging ended the
    job with a raw botocore traceback and no `error:` line; it is a TrackingError saying what is kept."""
    import socket

    from mlflow import MlflowClient

    from sparktrain.errors import TrackingError
    from sparktrain.job import _logged

    with socket.socket() as sock:  # a port nothing listens on: the store refuses at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:"
                       f"{port}", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                       "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(tracking_uri, tracking_uri)
    exp = client.create_experiment("s3-arts", artifact_location="s3://gone-bucket/arts")
    run = client.create_run(exp).info.run_id
    with pytest.raises(TrackingError) as info:
        _logged("preprocess", lambda: client.log_text(run, "{}", "features/features.json"),
                "the dataset is committed at /data/ds")
    text = str(info.value)
    assert text.startswith("MLflow failed while logging the preprocess stage (") and "127.0.0.1" in text
    assert "the dataset is committed at /data/ds. Check the tracking server and its artifact location" in text
    with pytest.raises(ZeroDivisionError):  # the job's own errors are not MLflow's
        _logged("profile", lambda: 1 / 0, "nothing was written")


def test_a_version_whose_s3_artifacts_are_gone_or_unreachable_is_named_before_scoring(tracking_uri, s3,
                                                                                       monkeypatch,
                                                                                       restore_mlflow_uri):
    """Probe R: `score` of a version whose artifacts were lost from S3 gave a 40-line MlflowException traceback;
    gone files are a ModelNotFoundError naming the version and where its files were, an artifact store that
    does not answer a TrackingError saying nothing ran."""
    import socket

    from mlflow import MlflowClient

    from sparktrain.errors import TrackingError
    from sparktrain.track.lookup import resolve_model

    import mlflow

    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3.endpoint)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("s3-lost")
    run = client.create_run(client.create_experiment("s3-lost")).info.run_id
    source = f"{s3.prefix('arts')}/model"
    client.create_model_version("s3-lost", source, run)
    with pytest.raises(ModelNotFoundError) as gone:
        resolve_model("models:/s3-lost/1", tracking_uri)
    assert f"models:/s3-lost/1 is models:/s3-lost/1, whose files are gone (run {run}; its files are at s3://" \
        in str(gone.value) and source.rsplit("/", 2)[-2] in str(gone.value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key in ("MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(key, f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(TrackingError) as down:
        resolve_model("models:/s3-lost/1", tracking_uri)
    assert not isinstance(down.value, ModelNotFoundError)
    assert "whose files could not be read" in str(down.value) and "nothing ran" in str(down.value)


def test_register_from_store_given_a_file_or_an_empty_folder_says_no_saved_model(tmp_path):
    """Review: a file (bundle.json itself) or a folder named bundle.json read as "the store did not answer"."""
    from sparktrain.track.bundle import read_bundle

    (tmp_path / "bundle.json").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x.txt").write_text("x")
    for given in (tmp_path, tmp_path / "run" / "x.txt"):
        with pytest.raises(ModelNotFoundError, match="no saved model at"):
            read_bundle(str(given))
