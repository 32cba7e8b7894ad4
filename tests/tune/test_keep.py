"""The search's best model kept in the store: through a tracking outage, and for a continued study's best.

Real Spark, torch, MLflow (a server this test starts and kills, or sqlite) and Optuna.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from sparktrain.config import parse_config
from sparktrain.errors import TrackingDownError, TrackingError
from sparktrain.tune.search import format_trials, run_search

FEATURES = [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"},
            {"name": "kind", "type": "categorical"}]


@pytest.fixture(scope="module")
def prepared(spark, tmp_path_factory):
    """A dataset written by ``sparktrain preprocess`` (it has ``features.json``): 4,000 rows, 3 splits."""
    from pyspark.sql import functions as F

    from sparktrain.job import run_preprocess

    root = tmp_path_factory.mktemp("keep_ds")
    df = spark.range(4000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b"),
                                  (F.col("id") % 5).cast("string").alias("kind"))
    df.withColumn("label", F.col("a") + F.col("b") > 0).write.parquet(str(root / "raw"))
    cfg = parse_config({"name": "keep", "data": {"source": str(root / "raw"), "label": "label"},
                        "features": FEATURES, "output": {"path": str(root / "dataset")}})
    return run_preprocess(spark, cfg).path


def _cfg(tmp_path: Path, dataset: str, uri: str, tune: dict, train: dict | None = None):
    return parse_config({
        "name": "keep", "data": {"source": "unused", "label": "label"}, "features": FEATURES,
        "output": {"path": dataset},
        "train": {"epochs": 3, "batch_size": 256, "num_workers": 1, "store": str(tmp_path / "store"), "seed": 7,
                  "compare_baseline": False, **(train or {})},
        "tune": {"mode": "single", "parallelism": 1, **tune},
        "tracking": {"uri": uri, "experiment": "keep", "model_name": "keep-model",
                     "artifact_location": str(tmp_path / "artifacts")}})


@pytest.mark.torch
@pytest.mark.slow
def test_server_killed_mid_search_keeps_the_best_model_and_register_from_store_is_idempotent(
        spark, prepared, tmp_path, restore_mlflow_uri, caplog):
    from mlflow import MlflowClient

    from sparktrain.track.bundle import read_bundle, register_from_store
    from sparktrain.track.server import MlflowServer

    backend, artifacts = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "server-artifacts")
    server = MlflowServer(backend, artifacts, log_path=str(tmp_path / "server.log")).start()
    cfg = _cfg(tmp_path, prepared, server.url, {"max_trials": 3, "space": {
        "learning_rate": {"choice": [0.0001, 0.003, 0.03]}}})
    stop = threading.Event()

    def killer() -> None:  # the server dies when trial 2 starts (its run folder appears), not at a time
        while not stop.is_set():
            if list((tmp_path / "store").glob("tune-*-t002")):
                server.stop(timeout=5)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        with pytest.raises(TrackingDownError) as info:
            run_search(spark, cfg, prepared)
    finally:
        stop.set()
        server.stop()
    error = info.value
    assert isinstance(error, TrackingError)
    message = str(error)
    assert server.url in message and "stopped answering after the search" in message, message
    result = error.result  # the search's results survive the outage: its table prints
    assert [t.number for t in result.trials] == [1, 2, 3] and all(t.metric is not None for t in result.trials)
    best = min(result.trials, key=lambda t: t.metric)
    assert result.best_number == best.number and f"*  {best.number}" in format_trials(result)
    run_dir = message.split("--from-store ")[1].split()[0]
    assert run_dir == error.run_dir and run_dir.endswith(f"-t{best.number:03d}")
    assert f"--tracking-uri {server.url}" in message
    bundle = read_bundle(run_dir)  # the best trial's model is in its run folder
    assert bundle["_dir"] == result.model_dir
    assert bundle["history"][-1]["val_loss"] == pytest.approx(best.metric)
    assert bundle["config"]["train"]["learning_rate"] == best.params["learning_rate"]

    with MlflowServer(backend, artifacts, log_path=str(tmp_path / "server2.log")) as again:
        first = register_from_store(spark, run_dir, tracking_uri=again.url)
        client = MlflowClient(again.url, again.url)
        assert (first.name, first.version) == ("keep-model", 1)
        with caplog.at_level(logging.INFO, logger="sparktrain.track.bundle"):
            second = register_from_store(spark, run_dir, tracking_uri=again.url)  # idempotent
        assert (second.name, second.version, second.run_id) == ("keep-model", 1, first.run_id)
        assert second.champion and second.metric == first.metric
        assert "already registered as v1 of 'keep-model'" in caplog.text
        assert [v.version for v in client.search_model_versions("name = 'keep-model'")] == ["1"]
        logged = [m for m in client.search_logged_models(experiment_ids=[client.get_run(first.run_id).info
                                                                        .experiment_id])]
        assert len(logged) == 1  # the model was not logged a second time


@pytest.mark.torch
def test_a_continued_study_registers_its_best_trial_from_the_store(spark, prepared, tmp_path, caplog):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tune = {"engine": "optuna", "study": "keep-study", "space": {"dropout": {"uniform": [0.0, 0.1]}}}
    first = run_search(spark, _cfg(tmp_path, prepared, uri, {**tune, "max_trials": 2},
                                   {"learning_rate": 0.01}), prepared)
    best = min(first.trials, key=lambda t: t.metric)
    assert first.registered_number == best.number and first.model_version == "1"
    assert first.model_dir and first.model_dir.endswith(f"-t{best.number:03d}/model")

    # the same study, continued by a search whose trials cannot learn (learning rate ~0, 1 epoch): worse
    weak = {"learning_rate": 1.0e-7, "epochs": 1}
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune.search"):
        second = run_search(spark, _cfg(tmp_path, prepared, uri, {**tune, "max_trials": 3}, weak), prepared)
    assert second.previous_trials == 2 and [t.number for t in second.trials] == [3]
    assert second.trials[0].metric > best.metric  # the study's best is trial `best`, of the first search
    assert second.best_number == 3  # best_* describe this search's trials
    assert (second.study_best_number, second.study_best_metric) == (best.number, pytest.approx(best.metric))
    assert second.registered_number == best.number  # its model came from the store, not this search's
    assert f"its best trial is trial {best.number}" in caplog.text and "the one registered" in caplog.text
    client = MlflowClient(uri, uri)
    assert second.model_version == first.model_version == "1"  # its own search registered it: no second version
    assert client.get_model_version("keep-model", "1").run_id == best.run_id
    assert f"the study's best is trial {best.number} of an earlier search" in format_trials(second)
    assert f"registered from trial {best.number}" in format_trials(second)

    # when the earlier search did not keep it (a driver killed mid-search): this search's best, and a loud warning
    (Path(first.model_dir) / "bundle.json").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune.search"):
        third = run_search(spark, _cfg(tmp_path, prepared, uri, {**tune, "max_trials": 4}, weak), prepared)
    assert third.study_best_number == best.number and third.registered_number == 4 and third.model_version == "2"
    assert client.get_model_version("keep-model", third.model_version).run_id == third.trials[0].run_id
    text = caplog.text
    assert f"trial {best.number} (val_loss = {best.metric:.5g})" in text and "trial 4 (val_loss = " in text
    assert "model is not in the store" in text and "sparktrain train <keep config> --set train.dropout=" in text


@pytest.mark.torch
@pytest.mark.slow
def test_a_continued_search_whose_trials_are_all_pruned_returns_the_studys_kept_best(spark, prepared, tmp_path,
                                                                                    caplog):
    from mlflow import MlflowClient

    from sparktrain.tune.result import PRUNED

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tune = {"engine": "optuna", "study": "pruned-study", "space": {"dropout": {"uniform": [0.0, 0.1]}}}
    first = run_search(spark, _cfg(tmp_path, prepared, uri, {**tune, "max_trials": 2}, {"learning_rate": 0.01}),
                       prepared)
    best = min(first.trials, key=lambda t: t.metric)
    assert first.model_version == "1" and first.registered_number == best.number
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = JournalStorage(JournalFileBackend(str(tmp_path / "store" / "_studies" / "pruned-study.journal")))
    for trial, stored in zip(first.trials, optuna.load_study(study_name="pruned-study", storage=journal).trials):
        # an unpruned search keeps each trial's curve: what the pruning search below compares with
        assert stored.intermediate_values == pytest.approx({e + 1: h["val_loss"] for e, h in enumerate(trial.history)})

    # trials that cannot learn (learning rate ~0): the median pruner stops each after its first epoch
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune.search"):
        second = run_search(spark, _cfg(tmp_path, prepared, uri, {**tune, "max_trials": 4, "pruner": "median",
                                                                   "pruner_startup_trials": 2},
                                        {"learning_rate": 1.0e-7}), prepared)
    assert [(t.number, t.status, t.epochs) for t in second.trials] == [(3, PRUNED, 1), (4, PRUNED, 1)]
    assert (second.best_number, second.best_metric) == (best.number, pytest.approx(best.metric))
    assert second.best_params == best.params and second.model_dir == first.model_dir
    assert second.best_model is not None and second.test_metrics == pytest.approx(first.test_metrics)
    assert "every trial of this search (2) was pruned" in caplog.text and first.model_dir.rsplit("/", 1)[0] \
        in caplog.text
    assert second.model_version == "1"  # its own search registered it: no second version
    assert [str(v.version) for v in MlflowClient(uri, uri).search_model_versions("name = 'keep-model'")] == ["1"]
