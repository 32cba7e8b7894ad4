"""Hyperopt search on real Spark (local[2]), real torch, real MLflow (sqlite under tmp)."""

from __future__ import annotations

import math
import os
import time

import pytest

from sparktrain.config import parse_config
from sparktrain.errors import TuneError
from sparktrain.tune.result import FAILED, FINISHED, KILLED
from sparktrain.tune.search import format_trials, run_search


@pytest.fixture(scope="module")
def dataset(spark, tmp_path_factory):
    """20,000 rows: 2 float columns, 1 int categorical, a boolean label; train/validation/test splits."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("tune_ds") / "ds"
    df = spark.range(20_000).select(
        "id",
        (F.rand(3) * 2 - 1).cast("float").alias("x1"),
        (F.rand(4) * 2 - 1).cast("float").alias("x2"),
        (F.col("id") % 5).cast("int").alias("c1"))
    df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2") + (F.col("c1") == 2).cast("float") * 0.8
                                 + (F.rand(5) - 0.5) * 0.4) > 0.1).cache()
    write_parquet(df.where("id % 5 > 1").drop("id").coalesce(1), str(root / "train"))
    write_parquet(df.where("id % 5 = 0").drop("id").coalesce(1), str(root / "validation"))
    write_parquet(df.where("id % 5 = 1").drop("id").coalesce(1), str(root / "test"))
    df.unpersist()
    return str(root)


@pytest.fixture(scope="module")
def tune_tracking_uri(tmp_path_factory):
    """One sqlite store for the module (its schema migration costs seconds)."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def _cfg(tmp_path, tune: dict, train: dict | None = None, experiment: str = "tune-tests", tracking: bool = False):
    return parse_config({
        "name": "tune-test",
        "data": {"label": "label", "key": "id"},
        "train": {"epochs": 1, "batch_size": 512, "num_workers": 1, "store": str(tmp_path / "store"), "seed": 7,
                  **(train or {})},
        "tune": tune,
        "tracking": {"enabled": tracking, "experiment": experiment, "model_name": f"{experiment}-model",
                     "artifact_location": str(tmp_path / "artifacts")},
    })


def _child_runs(client, parent_run_id):
    exp = client.get_run(parent_run_id).info.experiment_id
    return client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=100)


def _network_spec(model):
    """The ModelSpec a trained torch network was built with (hidden_units, dropout, ...)."""
    import io

    import torch

    return torch.load(io.BytesIO(model.model_bytes), weights_only=False)["model"]


def _group_jobs(spark, group):
    tracker = spark.sparkContext.statusTracker()
    return [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]


@pytest.mark.torch
def test_single_mode_parallel_trials_register_best_and_log_run_tree(spark, dataset, tmp_path, tune_tracking_uri):
    from mlflow import MlflowClient

    from sparktrain.train.model import TorchModel

    cfg = _cfg(tmp_path, experiment="single-mode", tracking=True, tune={
        "mode": "single", "max_trials": 4, "parallelism": 2, "algo": "tpe",
        "space": {"learning_rate": {"loguniform": [3.0e-3, 3.0e-2]},
                  "hidden_units": {"choice": [[16], [32, 16]]},
                  "batch_size": {"choice": [256, 512]}}})
    result = run_search(spark, cfg, dataset, tracking_uri=tune_tracking_uri)

    assert [t.number for t in result.trials] == [1, 2, 3, 4]
    assert all(t.status == FINISHED for t in result.trials), format_trials(result)
    assert result.mode == "single" and result.concurrency == 2
    for t in result.trials:
        assert 3e-3 <= t.params["learning_rate"] <= 3e-2
        assert t.params["hidden_units"] in {(16,), (32, 16)} and t.params["batch_size"] in {256, 512}
        assert t.metric == t.metrics["val_loss"] == t.history[-1]["val_loss"] and len(t.history) == 1
        assert 0 < t.metric < math.log(2)  # better than a constant guess on a learnable label
        assert 0.5 < t.metrics["val_auc"] <= 1.0
        assert t.objective_seconds is not None and t.objective_seconds < t.seconds
        assert any(j.status == "SUCCEEDED" for j in _group_jobs(spark, t.job_group))
    best = min(result.trials, key=lambda t: t.metric)
    assert (result.best_number, result.best_metric, result.best_params) == (best.number, best.metric, best.params)

    model = result.best_model
    assert isinstance(model, TorchModel)
    assert model.run_id.endswith(f"-t{best.number:03d}")
    from sparktrain.errors import TRIAL_RUN_ID
    assert TRIAL_RUN_ID.fullmatch(model.run_id)  # how a stall's advice tells a trial from a fit
    assert _network_spec(model)["hidden_units"] == list(best.params["hidden_units"])
    assert model.history[-1]["val_loss"] == pytest.approx(best.metric)
    scored = model.transform(spark.read.parquet(os.path.join(dataset, "validation")))
    accuracy = scored.selectExpr("avg(cast((prediction = 1.0) = label as double))").first()[0]
    assert accuracy > 0.7

    client = MlflowClient(tune_tracking_uri)
    children = {r.data.tags["sparktrain.trial"]: r for r in _child_runs(client, result.parent_run_id)}
    assert sorted(children) == ["1", "2", "3", "4"]
    for t in result.trials:
        run = children[str(t.number)]
        assert run.info.run_id == t.run_id and run.info.status == "FINISHED"
        assert run.data.params["learning_rate"] == str(t.params["learning_rate"])
        assert run.data.metrics["val_loss"] == pytest.approx(t.metric)
    # trials really overlapped: 2 at a time
    spans = sorted((r.info.start_time, r.info.end_time) for r in children.values())
    assert any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_val_loss"] == pytest.approx(result.best_metric)
    assert parent.data.metrics["tune_trials"] == 4
    assert "tune/loss_vs_trial.png" in [f.path for f in client.list_artifacts(result.parent_run_id, "tune")]
    assert 0.9 < result.test_metrics["test_auc"] <= 1.0  # the best model, scored on the test split
    assert client.get_run(best.run_id).data.metrics["test_auc"] == pytest.approx(result.test_metrics["test_auc"])
    assert client.get_run(best.run_id).data.tags["sparktrain.best"] == "true"
    champion = client.get_model_version_by_alias("single-mode-model", "champion")
    assert champion.run_id == best.run_id and str(champion.version) == result.model_version
    assert result.model_champion  # the first registered version becomes the champion
    assert champion.tags["sparktrain.score_metric"] == "test_auc"
    inputs = {d.dataset.name for d in parent.inputs.dataset_inputs}  # lineage: the splits' manifests
    assert inputs == {"tune-test-train", "tune-test-validation", "tune-test-test"}
    assert "model" in [f.path for f in client.list_artifacts(best.run_id)]  # TorchModel.load-able (no features.json)
    table = format_trials(result)
    assert table.splitlines()[0].split()[:4] == ["trial", "status", "val_loss", "seconds"]
    assert f"*  {best.number}" in table


@pytest.mark.torch
def test_distributed_trials_run_on_one_reused_gang(spark, dataset, tmp_path, monkeypatch, caplog, tune_tracking_uri):
    """One barrier stage runs every trial; a trial that fails on every rank ends that trial, not the gang; each
    trial leaves what a barrier stage of its own did (run folder, model, MLflow child run, the registered best)."""
    from mlflow import MlflowClient

    from sparktrain.data.run_store import RunStore
    from sparktrain.train.model import TorchModel

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "*:1:0:raise")  # every rank raises in a 2-epoch trial's 2nd epoch
    cfg = _cfg(tmp_path, experiment="gang", tracking=True, train={"num_workers": 2, "seed": 2}, tune={
        "mode": "distributed", "max_trials": 4, "parallelism": 2, "algo": "random",  # seed 2: epochs 1, 2, 1, 1
        "space": {"learning_rate": {"loguniform": [3.0e-3, 3.0e-2]}, "dropout": {"uniform": [0.0, 0.3]},
                  "epochs": {"choice": [1, 2]}}})
    with caplog.at_level("INFO", logger="sparktrain.train.gang"):
        result = run_search(spark, cfg, dataset, tracking_uri=tune_tracking_uri)
    assert len(result.trials) == 4
    assert result.concurrency == 1  # local[2] has 2 slots: one 2-worker trial at a time
    assert [t.params["epochs"] for t in result.trials] == [1, 2, 1, 1], format_trials(result)
    for t in result.trials:
        if t.params["epochs"] == 2:
            assert t.status == FAILED and "injected failure on rank" in t.error, format_trials(result)
        else:
            assert t.status == FINISHED and math.isfinite(t.metric) and t.epochs == 1, format_trials(result)
    gangs = [r.getMessage() for r in caplog.records if "a barrier stage of 2 task(s)" in r.getMessage()]
    assert len(gangs) == 1, gangs  # the failures did not cost a new stage
    gang = gangs[0].split()[1].rstrip(":")
    jobs = _group_jobs(spark, f"sparktrain-gang-{gang}")
    assert jobs and all(j.status == "SUCCEEDED" for j in jobs)  # the gang's stage ran all the trials, ended cleanly
    prefix = next(iter(result.trials)).job_group.rsplit("-trial-", 1)[0]
    for t in result.trials:  # each trial's run is what a fit leaves: its own folder, its model, its log
        run = RunStore(str(tmp_path / "store"), f"{prefix}-t{t.number:03d}")
        events = [e["event"] for e in run.read_events()]
        assert events[0] == "started" and events.count("started") == 1
        if t.status == FINISHED:
            assert run.read_network()[1]["history"][-1]["val_loss"] == pytest.approx(t.metric)
    assert isinstance(result.best_model, TorchModel)
    assert _network_spec(result.best_model)["dropout"] == pytest.approx(result.best_params["dropout"])
    assert result.best_model.history[-1]["val_loss"] == pytest.approx(result.best_metric)
    client = MlflowClient(tune_tracking_uri)
    children = {r.data.tags["sparktrain.trial"]: r for r in _child_runs(client, result.parent_run_id)}
    assert sorted(children) == ["1", "2", "3", "4"]
    for t in result.trials:
        run = children[str(t.number)]
        assert run.info.run_id == t.run_id and run.data.tags["sparktrain.status"] == t.status
        assert run.info.status == ("FINISHED" if t.status == FINISHED else "FAILED")
        if t.status == FINISHED:
            assert run.data.metrics["val_loss"] == pytest.approx(t.metric)
    best = next(t for t in result.trials if t.number == result.best_number)
    champion = client.get_model_version_by_alias("gang-model", "champion")
    assert champion.run_id == best.run_id and "model" in [f.path for f in client.list_artifacts(best.run_id)]


def test_failed_trials_are_recorded_and_the_search_goes_on(spark, tmp_path, tune_tracking_uri):
    from mlflow import MlflowClient

    def objective(params):
        if params["batch_size"] == 512:
            raise ValueError(f"bad batch size {params['batch_size']}")
        return params["learning_rate"]

    cfg = _cfg(tmp_path, experiment="failures", tracking=True, tune={
        "max_trials": 6, "parallelism": 2, "algo": "random",
        "space": {"batch_size": {"choice": [256, 512]}, "learning_rate": {"uniform": [0.1, 0.9]}}})
    result = run_search(spark, cfg, None, tracking_uri=tune_tracking_uri, objective=objective)
    failed = [t for t in result.trials if t.status == FAILED]
    ok = [t for t in result.trials if t.status == FINISHED]
    assert len(result.trials) == 6 and failed and ok, format_trials(result)
    assert all(t.params["batch_size"] == 512 for t in failed) and all(t.params["batch_size"] == 256 for t in ok)
    for t in failed:
        assert t.error == "ValueError: bad batch size 512" and t.metric is None
        assert "raise ValueError" in t.traceback
    assert max(t.number for t in ok) > min(t.number for t in failed)  # trials ran after a failure
    assert result.best_metric == min(t.params["learning_rate"] for t in ok)
    assert result.best_model is None and result.model_version is None  # a bare objective has no model

    client = MlflowClient(tune_tracking_uri)
    runs = {r.info.run_id: r for r in _child_runs(client, result.parent_run_id)}
    for t in result.trials:
        run = runs[t.run_id]
        assert run.info.status == t.status
        if t.status == FAILED:
            assert run.data.tags["sparktrain.error"] == t.error
            assert "error.txt" in [f.path for f in client.list_artifacts(t.run_id)]
        else:
            assert run.data.metrics["val_loss"] == pytest.approx(t.metric)


def test_every_trial_failing_raises_with_the_first_failure(spark, tmp_path):
    def objective(params):
        raise RuntimeError(f"cannot train with batch {params['batch_size']}")

    cfg = _cfg(tmp_path, tune={"max_trials": 3, "parallelism": 2, "space": {"batch_size": {"choice": [256]}}})
    with pytest.raises(TuneError) as info:
        run_search(spark, cfg, None, objective=objective)
    text = str(info.value)
    assert "every trial failed (3 trials; failed: 3)" in text
    assert "First failure (trial 1, FAILED): RuntimeError: cannot train with batch 256" in text


def test_trial_timeout_cancels_its_spark_job_and_the_search_goes_on(spark, tmp_path, tune_tracking_uri):
    from mlflow import MlflowClient

    beats = tmp_path / "beats"
    beats.mkdir()

    def objective(params):
        import time as _time

        if params["batch_size"] == 1024:  # the slow kind: a heartbeat file grows until the task is killed
            path = os.path.join(str(beats), f"{params['learning_rate']:.6f}")
            for _ in range(200):
                with open(path, "a") as fh:
                    fh.write(".")
                _time.sleep(0.1)
        return params["learning_rate"]

    warm = _cfg(tmp_path, tune={"max_trials": 2, "parallelism": 2, "algo": "random",
                                "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    run_search(spark, warm, None, objective=lambda p: p["learning_rate"])  # run alone, a cold worker took > 4 s
    cfg = _cfg(tmp_path, experiment="timeouts", tracking=True, tune={
        "max_trials": 5, "parallelism": 2, "algo": "random", "trial_timeout_s": 4,
        "space": {"batch_size": {"choice": [256, 1024]}, "learning_rate": {"uniform": [0.1, 0.9]}}})
    t0 = time.monotonic()
    result = run_search(spark, cfg, None, tracking_uri=tune_tracking_uri, objective=objective)
    killed = [t for t in result.trials if t.status == KILLED]
    ok = [t for t in result.trials if t.status == FINISHED]
    assert killed and ok, format_trials(result)
    assert all(t.params["batch_size"] == 1024 for t in killed) and all(t.params["batch_size"] == 256 for t in ok), \
        format_trials(result)
    assert max(t.number for t in ok) > min(t.number for t in killed)  # the search went on
    assert time.monotonic() - t0 < 20 * len(killed)  # nobody waited for the 20 s objective
    for t in killed:
        assert "timed out after 4 s" in t.error and "cancelled" in t.error
        assert 4 <= t.seconds < 12
        jobs = _group_jobs(spark, t.job_group)
        assert jobs and all(j.status == "FAILED" for j in jobs)  # a cancelled job ends FAILED
        assert not {j.jobId for j in jobs} & set(spark.sparkContext.statusTracker().getActiveJobsIds())
    # the Python task itself stopped (Spark kills a cancelled task's worker within
    # spark.python.task.killTimeout = 2 s): no heartbeat grows any more
    time.sleep(3.0)
    sizes = {p: os.path.getsize(beats / p) for p in os.listdir(beats)}
    assert len(sizes) == len(killed) and all(0 < n < 200 for n in sizes.values())
    time.sleep(1.0)
    assert {p: os.path.getsize(beats / p) for p in os.listdir(beats)} == sizes
    children = _child_runs(MlflowClient(tune_tracking_uri), result.parent_run_id)
    statuses = {r.info.run_id: r.info.status for r in children}
    assert all(statuses[t.run_id] == t.status for t in result.trials)


def _sleeps(params):
    import time as _time

    _time.sleep(30)
    return params["learning_rate"]


def test_a_search_whose_every_trial_timed_out_says_how_to_fix_it_without_the_cancel_trace(spark, tmp_path):
    """Probe I: ~100 lines of py4j SPARK_JOB_CANCELLED trace, twice, and no fix, for an expected outcome."""
    from sparktrain.errors import TuneError

    cfg = _cfg(tmp_path, tune={"max_trials": 2, "parallelism": 2, "algo": "random", "trial_timeout_s": 2,
                               "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    with pytest.raises(TuneError) as info:
        run_search(spark, cfg, None, objective=_sleeps)
    text = str(info.value)
    assert "every trial failed (2 trials; killed: 2)" in text and "timed out after 2 s" in text, text
    assert "Fix: raise tune.trial_timeout_s" in text
    assert "traceback" not in text and len(text.splitlines()) == 1, text  # the cancel's one line, not its trace


def test_an_interrupted_search_stops_its_running_trials_before_it_raises(spark, tmp_path):
    """Ctrl-C (SIGINT) during a search: every running trial's job is cancelled and its tasks have ended when the
    KeyboardInterrupt reaches the caller; no trial's Python task goes on working."""
    import signal
    import threading

    beats = tmp_path / "beats"
    beats.mkdir()

    def objective(params):
        import time as _time

        path = os.path.join(str(beats), f"{params['learning_rate']:.6f}")
        for _ in range(600):  # a minute of "work", a heartbeat file growing all along
            with open(path, "a") as fh:
                fh.write(".")
            _time.sleep(0.1)
        return params["learning_rate"]

    def interrupt_once_both_run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(os.listdir(beats)) < 2:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(tmp_path, tune={"max_trials": 4, "parallelism": 2, "engine": "optuna", "sampler": "random",
                               "study": "interrupted", "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_search(spark, cfg, None, objective=objective, tracking_uri=uri)
        time.sleep(60)  # the interrupt lands here if the search ended first: the checks below fail
    assert len(os.listdir(beats)) == 2
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    sizes = {p: os.path.getsize(beats / p) for p in os.listdir(beats)}
    time.sleep(1.5)
    assert {p: os.path.getsize(beats / p) for p in os.listdir(beats)} == sizes  # their tasks have ended
    assert all(n < 600 for n in sizes.values())
    # recorded as interrupted: before, the study's trials and their MLflow runs stayed RUNNING
    import optuna
    from mlflow import MlflowClient
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = JournalStorage(JournalFileBackend(str(tmp_path / "store" / "_studies" / "interrupted.journal")))
    trials = optuna.load_study(study_name="interrupted", storage=journal).trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
    assert all("interrupted" in t.user_attrs["error"] for t in trials)
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.sparktrain.trial != ''")
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]
    # the same command again continues the study and runs the whole budget: the interrupted trials were cut
    # off, not tried (before, they counted against max_trials, and the rerun ran 2 trials, or none)
    again = run_search(spark, cfg, None, objective=lambda params: params["learning_rate"], tracking_uri=uri)
    assert again.previous_trials == 0 and [t.number for t in again.trials] == [3, 4, 5, 6]
    assert [t.state.name for t in optuna.load_study(study_name="interrupted", storage=journal).trials] == \
        ["FAIL", "FAIL"] + ["COMPLETE"] * 4


def test_early_stopping_after_k_trials_without_improvement(spark, tmp_path):
    def objective(params):
        return 1.0  # never improves on the first result

    cfg = _cfg(tmp_path, tune={"max_trials": 20, "parallelism": 2, "early_stop_trials": 2,
                               "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    result = run_search(spark, cfg, None, objective=objective)
    assert result.stopped_early
    # the first result is the best; 2 more finish without improving; at most one more was already running
    assert 3 <= len(result.trials) <= 4
    assert all(t.status == FINISHED for t in result.trials)
    assert "stopped early" in format_trials(result)
    assert result.stop_reason == "early_stop_trials"


@pytest.mark.parametrize("metric, stop_at, reached", [
    ("val_loss", 0.2, lambda v: v <= 0.2),   # minimized: stops at or below
    ("val_auc", 0.7, lambda v: v >= 0.7),    # maximized: stops at or above
])
def test_stop_at_ends_the_search_at_the_first_trial_that_reaches_it(spark, tmp_path, metric, stop_at, reached):
    def objective(params):
        return params["dropout"]  # a point's metric is its own coordinate

    cfg = _cfg(tmp_path, tune={"max_trials": 200, "parallelism": 1, "algo": "random", "metric": metric,
                               "stop_at": stop_at, "space": {"dropout": {"uniform": [0.0, 0.9]}}})
    result = run_search(spark, cfg, None, objective=objective)
    values = [t.metric for t in sorted(result.trials, key=lambda t: t.end_s)]
    assert result.stop_reason == "stop_at" and result.stopped_early
    assert reached(values[-1]) and not any(reached(v) for v in values[:-1]), values  # one at a time: none after
    assert result.best_metric == values[-1] and len(values) < 200
    assert f"{metric} reached tune.stop_at" in format_trials(result)


def test_time_budget_stops_launching_and_lets_running_trials_finish(spark, tmp_path):
    def objective(params):
        time.sleep(0.4)
        return params["learning_rate"]

    cfg = _cfg(tmp_path, tune={"max_trials": 500, "parallelism": 2, "algo": "random", "time_budget_s": 3,
                               "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    result = run_search(spark, cfg, None, objective=objective)
    assert result.stop_reason == "time_budget_s" and 1 <= len(result.trials) < 500
    assert all(t.status == FINISHED for t in result.trials)  # none was cut off
    starts = [t.end_s - t.seconds for t in result.trials]  # seconds after the search started
    assert max(starts) < 3 + 0.5, starts  # launched only while the budget lasted
    assert "tune.time_budget_s spent" in format_trials(result)


def test_bad_setups_fail_before_any_trial(spark, dataset, tmp_path):
    from sparktrain.errors import ConfigError, PreflightError

    space = {"learning_rate": {"loguniform": [1.0e-3, 1.0e-2]}}
    with pytest.raises(ConfigError) as info:  # val_loss needs a validation split
        run_search(spark, _cfg(tmp_path, tune={"space": space}), os.path.join(dataset, "train"))
    assert info.value.path == "tune.metric" and "no validation split" in str(info.value)
    with pytest.raises(PreflightError) as info:  # 3 workers per trial cannot fit local[2]
        run_search(spark, _cfg(tmp_path, train={"num_workers": 3}, tune={"mode": "distributed", "space": space}),
                   dataset)
    assert "numWorkers = 3" in str(info.value) and "only 2 task(s)" in str(info.value)


def test_a_metric_no_trial_reports_is_refused_before_any_trial(spark, tmp_path):
    """Probe I: a typo (val_los) or val_auc on a multiclass label passed every check; each trial then trained in
    full and failed ("the trial reported no 'val_auc'"), and a named study's budget was spent on them."""
    import json

    from sparktrain.errors import ConfigError
    from sparktrain.tune.search import check_search

    space = {"learning_rate": {"loguniform": [1.0e-3, 1.0e-2]}}
    with pytest.raises(ConfigError) as info:
        check_search(_cfg(tmp_path, tune={"space": space, "metric": "val_los"}))
    assert info.value.path == "tune.metric" and "did you mean 'val_loss'?" in str(info.value)
    check_search(_cfg(tmp_path, tune={"space": space, "metric": "val_f1"}), objective=True)  # the objective's own
    ds = tmp_path / "multi"  # a dataset whose features.json says its label is multiclass: no trial is started
    (ds / "train").mkdir(parents=True)
    (ds / "features.json").write_text(json.dumps({"label": {"column": "species", "task": "multiclass"}}))
    with pytest.raises(ConfigError) as info:
        run_search(spark, _cfg(tmp_path, tune={"space": space, "metric": "val_auc"}), str(ds))
    text = str(info.value)
    assert "val_auc is reported for a binary label only; this dataset's label 'species' is multiclass" in text
    assert "use one of val_loss, val_accuracy" in text
    assert not (tmp_path / "store").exists()  # no trial ran


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_single_mode_trials(spark, dataset, tmp_path):
    from sparktrain.train.model import KerasModel

    cfg = _cfg(tmp_path, train={"framework": "keras"}, tune={
        "max_trials": 2, "parallelism": 2, "space": {"learning_rate": {"loguniform": [3.0e-3, 3.0e-2]}}})
    result = run_search(spark, cfg, dataset)
    assert [t.status for t in result.trials] == [FINISHED, FINISHED], format_trials(result)
    assert all(0 < t.metric < math.log(2) for t in result.trials)
    assert isinstance(result.best_model, KerasModel)
    assert 0.9 < result.test_metrics["test_auc"] <= 1.0


def test_a_continued_study_ends_the_mlflow_runs_a_killed_search_left_running(spark, tmp_path):
    """kill -9 leaves the search's MLflow runs RUNNING; the next search of the study (which holds its lease, so no
    live search has them) ends them KILLED with why, and leaves every other run as it was."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(tmp_path, tune={"max_trials": 2, "engine": "optuna", "sampler": "random", "study": "killed",
                               "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    first = run_search(spark, cfg, None, objective=lambda p: p["learning_rate"], tracking_uri=uri)
    client = MlflowClient(uri)
    exp = client.get_run(first.parent_run_id).info.experiment_id
    # what a killed `sparktrain run` leaves: its job run, its tune run (tagged with the study) and a trial, RUNNING
    job = client.create_run(exp, run_name="killed-job", tags={"sparktrain.kind": "job"}).info.run_id
    tune = client.create_run(exp, run_name="killed-tune", tags={"mlflow.parentRunId": job, "sparktrain.kind": "stage",
                                                                "sparktrain.study": "killed"}).info.run_id
    trial = client.create_run(exp, run_name="trial-003", tags={"mlflow.parentRunId": tune, "sparktrain.kind": "trial",
                                                               "sparktrain.study": "killed"}).info.run_id
    other = client.create_run(exp, run_name="another-study", tags={"sparktrain.study": "other"}).info.run_id
    more = _cfg(tmp_path, tune={"max_trials": 4, "engine": "optuna", "sampler": "random", "study": "killed",
                                "space": {"learning_rate": {"uniform": [0.1, 0.9]}}})
    # probe I: the live job's own runs (its tune run, just tagged with the study, and the job run above it) were
    # ended KILLED too, and tagged "the process was killed", for the whole search
    live_job = client.create_run(exp, run_name="live-job", tags={"sparktrain.kind": "job"}).info.run_id
    live_tune = client.create_run(exp, run_name="live-tune", tags={"mlflow.parentRunId": live_job,
                                                                   "sparktrain.kind": "stage"}).info.run_id
    client.log_param(live_tune, "tune.storage", "")  # what a job logs from its config (no tune.storage given)
    second = run_search(spark, more, None, parent_run_id=live_tune, objective=lambda p: p["learning_rate"],
                        tracking_uri=uri)
    for run_id in (live_job, live_tune):
        run = client.get_run(run_id)
        assert run.info.status == "RUNNING" and "sparktrain.error" not in run.data.tags, run  # its job ends them
    logged = client.get_run(live_tune).data  # probe I: the resolved study's place was lost behind the '' param
    assert logged.params["tune.storage"] == "" and logged.params["tune.stop_reason"] == "max_trials"
    assert logged.tags["sparktrain.tune.storage"].endswith("_studies/killed.journal")
    for run_id in (job, tune, trial):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.info.end_time is not None
        assert "ended without closing it (the process was killed)" in run.data.tags["sparktrain.error"]
    assert client.get_run(other).info.status == "RUNNING"  # another study's run: not this search's to end
    assert client.get_run(first.parent_run_id).info.status == "FINISHED"
    finished = [client.get_run(t.run_id) for t in second.trials]
    assert [r.info.status for r in finished] == ["FINISHED", "FINISHED"]
    assert {r.data.tags["sparktrain.study"] for r in finished} == {"killed"}


@pytest.mark.torch
def test_the_python_api_on_output_path_evaluates_the_best_model_on_its_committed_test_split(spark, dataset, tmp_path):
    """run_search(spark, cfg, output.path), as docs/tuning.md shows it: the splits are in the committed
    generation (``_gen-*/test``), and the test evaluation was skipped without a word (probe I), so the best
    model was registered on val_loss and took the champion alias from versions scored on test metrics."""
    import shutil

    from sparktrain.data.commit import Generation

    out = tmp_path / "dataset"
    with Generation(str(out), "output.path") as gen:
        for split in ("train", "validation", "test"):
            shutil.copytree(os.path.join(dataset, split), os.path.join(gen.uri, split))
    assert not (out / "test").exists()
    cfg = _cfg(tmp_path, tune={"max_trials": 1, "algo": "random", "parallelism": 1,
                               "space": {"learning_rate": {"loguniform": [0.01, 0.05]}}})
    result = run_search(spark, cfg, str(out))
    assert [t.status for t in result.trials] == [FINISHED], format_trials(result)
    assert 0.8 < result.test_metrics["test_auc"] <= 1.0
