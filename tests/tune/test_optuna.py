"""The Optuna engine: config checks, the space on Optuna, a persistent study, pruning on real Spark + torch + MLflow."""

from __future__ import annotations

import json
import logging
import math
import os
import time

import pytest

from sparktrain.config import TuneConfig, parse_config
from sparktrain.errors import ConfigError
from sparktrain.tune.result import FINISHED, PRUNED
from sparktrain.tune.search import format_trials, run_search
from sparktrain.tune.space import compile_space


@pytest.fixture(scope="module")
def dataset(spark, tmp_path_factory):
    """12,000 rows: 2 float columns, 1 int categorical, a boolean label; train/validation splits."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("optuna_ds") / "ds"
    df = spark.range(12_000).select(
        "id", (F.rand(3) * 2 - 1).cast("float").alias("x1"), (F.rand(4) * 2 - 1).cast("float").alias("x2"),
        (F.col("id") % 5).cast("int").alias("c1"))
    df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2") + (F.col("c1") == 2).cast("float") * 0.8
                                 + (F.rand(5) - 0.5) * 0.4) > 0.1).cache()
    write_parquet(df.where("id % 5 > 0").drop("id").coalesce(1), str(root / "train"))
    write_parquet(df.where("id % 5 = 0").drop("id").coalesce(1), str(root / "validation"))
    df.unpersist()
    return str(root)


def _cfg(tmp_path, tune: dict, train: dict | None = None, tracking: bool = False, experiment: str = "optuna"):
    return parse_config({
        "name": "optuna-test",
        "data": {"label": "label"},
        "train": {"epochs": 3, "batch_size": 512, "num_workers": 1, "store": str(tmp_path / "store"), "seed": 7,
                  **(train or {})},
        "tune": {"engine": "optuna", **tune},
        "tracking": {"enabled": tracking, "experiment": experiment, "model_name": f"{experiment}-model",
                     "artifact_location": str(tmp_path / "artifacts")},
    })


# ---- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, names", [
    ("engine", "ray", "'hyperopt', 'optuna'"),
    ("sampler", "bayes", "'tpe', 'random', 'cmaes'"),
    ("pruner", "early", "'none', 'median', 'asha', 'hyperband'"),
])
def test_unknown_engine_sampler_or_pruner_is_refused_with_the_valid_names(tmp_path, key, value, names):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, {key: value, "space": {"dropout": {"uniform": [0.0, 0.3]}}})
    assert info.value.path == f"tune.{key}" and info.value.value == value
    assert names in info.value.fix
    with pytest.raises(ConfigError) as api:  # the Python API refuses it too, naming the valid values
        TuneConfig(**{key: value}, space={"dropout": {"uniform": [0.0, 0.3]}})
    assert api.value.path == f"tune.{key}" and all(n.strip("'") in api.value.fix for n in names.split(", "))


@pytest.mark.parametrize("tune, path, words", [
    ({"engine": "hyperopt", "pruner": "asha"}, "tune.pruner", "set tune.engine: optuna"),
    ({"engine": "hyperopt", "sampler": "cmaes"}, "tune.sampler", "Hyperopt has no CMA-ES"),
    ({"algo": "random", "sampler": "tpe"}, "tune.sampler", "tune.algo = 'random' says otherwise"),
    ({"reduction_factor": 1}, "tune.reduction_factor", "must be >= 2"),
    ({"pruner_min_epochs": 0}, "tune.pruner_min_epochs", "must be >= 1"),
    ({"time_budget_s": 0}, "tune.time_budget_s", "must be > 0 seconds"),
    ({"stop_at": float("nan")}, "tune.stop_at", "must be a finite number"),
    ({"stop_at": True}, "tune.stop_at", "expected a number"),
    ({"stop_at": 1.5, "metric": "val_accuracy"}, "tune.stop_at", "val_accuracy never reaches it (a share, in [0, 1])"),
    ({"stop_at": -0.1, "metric": "val_loss"}, "tune.stop_at", "val_loss never reaches it (never below 0)"),
])
def test_engine_settings_that_cannot_work_are_refused(tmp_path, tune, path, words):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, {"space": {"dropout": {"uniform": [0.0, 0.3]}}, **tune})
    assert info.value.path == path and words in info.value.fix


@pytest.mark.parametrize("tune, train, path, words", [
    ({"pruner": "asha", "max_trials": 2}, {}, "tune.max_trials", "tune.pruner: asha needs at least 3 trials"),
    ({"pruner": "asha", "max_trials": 3, "reduction_factor": 4}, {}, "tune.max_trials", "needs at least 4 trials"),
    ({"pruner": "median", "max_trials": 3, "pruner_startup_trials": 3}, {}, "tune.max_trials",
     "needs at least 4 trials"),
    ({"pruner": "hyperband", "max_trials": 4}, {"epochs": 3}, "tune.max_trials", "needs at least 5 trials"),
    ({"pruner": "hyperband", "max_trials": 12}, {"epochs": 9}, "tune.max_trials", "needs at least 17 trials"),
    ({"pruner": "asha", "max_trials": 8}, {"epochs": 1}, "tune.pruner", "no trial could be stopped early"),
    ({"pruner": "median", "max_trials": 8, "pruner_min_epochs": 3}, {"epochs": 3}, "tune.pruner",
     "no trial could be stopped early"),
    ({"pruner": "asha", "max_trials": 8}, {"framework": "keras", "backend": "mwms"}, "tune.pruner",
     "use train.backend: gloo"),
])
def test_a_pruner_that_could_never_stop_a_trial_is_refused_before_any_trial(spark, dataset, tmp_path, tune, train,
                                                                           path, words):
    cfg = _cfg(tmp_path, {"space": {"learning_rate": {"loguniform": [1e-3, 1e-1]}}, **tune}, train=train)
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None).size()
    with pytest.raises(ConfigError) as info:
        run_search(spark, cfg, dataset)
    assert info.value.path == path and words in info.value.fix, info.value
    assert store.jobsList(None).size() == jobs  # refused before any Spark job (counted, not timed)
    assert not os.path.exists(tmp_path / "store")


def test_the_pruner_limits_follow_the_space_epochs(spark, dataset, tmp_path):
    from sparktrain.tune._engines import max_epochs, min_trials

    cfg = _cfg(tmp_path, {"pruner": "hyperband", "max_trials": 20,
                          "space": {"epochs": {"int": [1, 9]}, "dropout": {"uniform": [0.0, 0.2]}}},
               train={"epochs": 2})
    space = compile_space(cfg.tune.space)
    assert max_epochs(cfg.tune, cfg, space) == 9  # the space's largest epochs, not train.epochs
    assert min_trials(cfg.tune, 9) == 17  # 3 brackets of eta = 3: 9 + 5 + 3
    with pytest.raises(ConfigError) as info:  # a custom objective has no epochs to prune on
        run_search(spark, cfg, None, objective=lambda params: 0.0)
    assert info.value.path == "tune.pruner" and "custom objective" in info.value.fix


def test_cmaes_needs_two_numeric_keys_and_logs_what_falls_back(spark, tmp_path, caplog):
    with pytest.raises(ConfigError) as info:
        run_search(spark, _cfg(tmp_path, {"sampler": "cmaes", "space": {
            "learning_rate": {"loguniform": [1e-3, 1e-1]}, "hidden_units": {"choice": [[8], [16]]}}}),
            None, objective=lambda params: 0.0)
    assert info.value.path == "tune.sampler" and "has 1 (learning_rate)" in info.value.fix
    assert "use tune.sampler: tpe" in info.value.fix

    def objective(params):
        return (math.log10(params["learning_rate"]) + 2) ** 2 + (params["dropout"] - 0.2) ** 2 \
            + (0.1 if params["hidden_units"] == (8,) else 0.0)

    cfg = _cfg(tmp_path, {"sampler": "cmaes", "max_trials": 6, "parallelism": 2, "metric": "loss", "space": {
        "learning_rate": {"loguniform": [1e-4, 1e-1]}, "dropout": {"uniform": [0.0, 0.5]},
        "hidden_units": {"choice": [[8], [16]]}}})
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune._engines"):
        result = run_search(spark, cfg, None, objective=objective)
    assert "CMA-ES cannot use hidden_units" in caplog.text and "models dropout, learning_rate" in caplog.text
    assert [t.status for t in result.trials] == [FINISHED] * 6
    for t in result.trials:
        assert t.metric == pytest.approx(objective(t.params))
        assert 1e-4 <= t.params["learning_rate"] <= 1e-1 and t.params["hidden_units"] in {(8,), (16,)}
    assert result.engine == "optuna" and result.best_metric == min(t.metric for t in result.trials)


# ---- the space on Optuna -----------------------------------------------------------------------------------------

def test_the_same_space_maps_to_optuna_with_its_bounds_types_and_conditional_keys():
    import optuna

    space = compile_space({
        "learning_rate": {"loguniform": [1e-4, 1e-1]},
        "batch_size": {"quniform": [128, 1024, 128]},
        "epochs": {"int": [1, 4]},
        "dropout": {"quniform": [0.0, 0.5, 0.1]},
        "embedding_dim": {"qloguniform": [4, 64, 4]},
        "seed": 3,
        "arch": {"choice": [
            {"hidden_units": [16]},
            {"hidden_units": {"choice": [[64, 64], [128, 64]]},
             "shuffle_buffer": {"choice": [1024, {"quniform": [2048, 8192, 2048]}]}}]},
    })
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = []
    for _ in range(300):
        trial = study.ask()
        params = space.suggest(trial)
        draws.append((params, dict(trial.params)))
        study.tell(trial, 0.0)
    rates = [p["learning_rate"] for p, _ in draws]
    assert 1e-4 <= min(rates) and max(rates) <= 1e-1 and 0.2 < sum(r < 1e-3 for r in rates) / len(rates) < 0.45
    assert {p["batch_size"] for p, _ in draws} == set(range(128, 1025, 128))
    assert {p["epochs"] for p, _ in draws} == {1, 2, 3, 4}  # int: both ends included
    assert all(isinstance(p["epochs"], int) and isinstance(p["batch_size"], int) for p, _ in draws)
    assert {round(p["dropout"], 6) for p, _ in draws} == {0.0, 0.1, 0.2, 0.3, 0.4, 0.5}
    assert all(p["embedding_dim"] % 4 == 0 and 4 <= p["embedding_dim"] <= 64 for p, _ in draws)
    assert all(p["seed"] == 3 for p, _ in draws)
    small = [(p, o) for p, o in draws if p["hidden_units"] == (16,)]
    big = [(p, o) for p, o in draws if p["hidden_units"] != (16,)]
    assert small and big
    # a conditional key is sampled only in its branch: Optuna sees it only there
    assert all("arch.1.hidden_units" not in o and "shuffle_buffer" not in p for p, o in small)
    assert all(o["arch"] == 1 and p["hidden_units"] in {(64, 64), (128, 64)} for p, o in big)
    assert {o["arch.1.hidden_units"] for _, o in big} == {"[64, 64]", "[128, 64]"}  # lists as JSON categories
    buffers = {p["shuffle_buffer"] for p, _ in big}
    assert 1024 in buffers and buffers <= {1024, 2048, 4096, 6144, 8192} and len(buffers) >= 4
    # the Hyperopt space is the same tree: the same labels
    assert set(space.hyperopt) == {"learning_rate", "batch_size", "epochs", "dropout", "embedding_dim", "seed",
                                   "arch"}
    assert space.numeric_labels() == ["batch_size", "dropout", "embedding_dim", "epochs", "learning_rate"]
    assert "arch" in space.categorical_labels() and "arch.1.shuffle_buffer.1" in space.categorical_labels()


def test_int_distribution_is_for_integer_keys():
    with pytest.raises(ConfigError) as info:
        compile_space({"dropout": {"int": [0, 1]}})
    assert info.value.path == "tune.space.dropout.int" and "use uniform or loguniform" in info.value.fix
    with pytest.raises(ConfigError) as info:
        compile_space({"epochs": {"int": [0, 3]}})
    assert "out of range for train.epochs" in info.value.fix


# ---- the study persists ------------------------------------------------------------------------------------------

def test_the_study_persists_in_the_store_and_a_rerun_continues_it(spark, tmp_path, caplog):
    import optuna

    def objective(params):
        return (math.log10(params["learning_rate"]) + 2.5) ** 2

    space = {"learning_rate": {"loguniform": [1e-4, 1e-1]}}
    cfg = _cfg(tmp_path, {"max_trials": 4, "parallelism": 2, "metric": "loss", "space": space})
    first = run_search(spark, cfg, None, objective=objective)
    assert [t.number for t in first.trials] == [1, 2, 3, 4] and first.previous_trials == 0
    journal = tmp_path / "store" / "_studies" / f"{first.study}.journal"
    assert journal.is_file() and first.study.startswith("optuna-test-")

    # a trial left RUNNING by a search that died: the next search records it as failed, and runs it again (it was
    # cut off, not tried: it does not count against max_trials)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    optuna.load_study(study_name=first.study, storage=storage).ask()

    more = _cfg(tmp_path, {"max_trials": 7, "parallelism": 2, "metric": "loss", "space": space})
    with caplog.at_level(logging.INFO, logger="sparktrain.tune._engines"):
        second = run_search(spark, more, None, objective=objective)
    assert "trial 5 was left running by an earlier search" in caplog.text
    assert f"continuing Optuna study '{first.study}'" in caplog.text
    assert "4 trials so far (4 complete, best loss = " in caplog.text and "; 1 cut off, run again); 3 more" \
        in caplog.text
    assert second.study == first.study and second.previous_trials == 4
    assert [t.number for t in second.trials] == [6, 7, 8]  # numbering continues
    study = optuna.load_study(study_name=first.study, storage=storage)
    states = [t.state.name for t in study.get_trials()]
    assert states == ["COMPLETE"] * 4 + ["FAIL"] + ["COMPLETE"] * 3
    values = sorted(t.value for t in study.get_trials() if t.value is not None)
    assert values == sorted([t.metric for t in first.trials] + [t.metric for t in second.trials])
    assert json.loads(study.trials[5].user_attrs["train_params"]) == {
        "learning_rate": second.trials[0].params["learning_rate"]}
    assert "study " + first.study + " (continued: 4 earlier trials)" in format_trials(second)

    with pytest.raises(ConfigError) as info:  # nothing left to run: say so
        run_search(spark, more, None, objective=objective)
    assert info.value.path == "tune.max_trials" and "already holds 1 cut off by an interrupt or a killed search, " \
        "which do not count, and 7 finished, pruned or failed trials; raise tune.max_trials" in info.value.fix
    # another search (another space) is another study
    other = _cfg(tmp_path, {"max_trials": 2, "metric": "loss", "space": {"learning_rate": {"uniform": [1e-3, 1e-2]}}})
    assert run_search(spark, other, None, objective=objective).study != first.study


def test_storage_may_be_a_database_but_not_the_tracking_one(spark, tmp_path):
    import optuna

    db = f"sqlite:///{tmp_path / 'optuna.db'}"
    cfg = _cfg(tmp_path, {"max_trials": 2, "metric": "loss", "storage": db, "study": "mine",
                          "space": {"dropout": {"uniform": [0.0, 0.5]}}})
    result = run_search(spark, cfg, None, objective=lambda params: params["dropout"])
    assert result.study == "mine"
    assert len(optuna.load_study(study_name="mine", storage=db).trials) == 2
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ConfigError) as info:
        run_search(spark, _cfg(tmp_path, {"max_trials": 2, "metric": "loss", "storage": tracking,
                                          "space": {"dropout": {"uniform": [0.0, 0.5]}}}),
                   None, objective=lambda params: 0.0, tracking_uri=tracking)
    assert info.value.path == "tune.storage" and "alembic_version" in info.value.fix


# ---- the executor's hook -----------------------------------------------------------------------------------------

def test_the_rank_hook_waits_for_the_verdict_and_stops_on_a_prune(tmp_path):
    from dataclasses import replace

    from sparktrain.data.run_store import RunStore
    from sparktrain.train._executor.checkpoint import Checkpointer
    from sparktrain.train._executor.context import WorkerContext
    from sparktrain.train._executor.control import PruneHook, hooks_for
    from sparktrain.train._executor.reporter import Reporter
    from sparktrain.train._executor.spec import InputSpec, OptimSpec, WorkerSpec

    spec = WorkerSpec(framework="torch", inputs=InputSpec(("x",), (), "y", "binary"), train_path="t",
                      val_path=None, store=str(tmp_path), run_id="r1", optim=OptimSpec(epochs=4), prune_wait_s=0.5)
    ctx = WorkerContext(rank=0, world_size=1, host="127.0.0.1", master_host="127.0.0.1", master_port=0, aux_port=0,
                        attempt=0, checkpointer=Checkpointer(str(tmp_path), "r1"), reporter=Reporter(None, 0, "h"))
    assert hooks_for(replace(spec, prune_wait_s=None), ctx) == []
    (hook,) = hooks_for(spec, ctx)
    assert isinstance(hook, PruneHook)
    run = RunStore(str(tmp_path), "r1")
    run.write_verdict(0, False)
    t0 = time.perf_counter()
    assert hook.on_epoch(0, {}) is False and time.perf_counter() - t0 < 0.3  # a go verdict: on at once
    t0 = time.perf_counter()
    assert hook.on_epoch(1, {}) is False  # no verdict: a bounded wait, then on
    assert 0.45 < time.perf_counter() - t0 < 2.0
    run.write_verdict(1, True, "worse than the rung")
    assert hook.on_epoch(2, {}) is True  # a late stop is seen at the next epoch
    assert hook.on_epoch(3, {}) is False  # the last epoch: nothing to wait for
    pruned = [e for e in run.read_events() if e["event"] == "pruned"]
    assert pruned[0]["epoch"] == 2 and pruned[0]["verdict_epoch"] == 1 and pruned[0]["reason"] == "worse than the rung"


def test_the_rank_hook_asks_the_search_over_the_channel(tmp_path):
    import threading

    from sparktrain.data.run_store import RunStore
    from sparktrain.train._executor.checkpoint import Checkpointer
    from sparktrain.train._executor.context import WorkerContext
    from sparktrain.train._executor.control import PruneHook
    from sparktrain.train._executor.reporter import Reporter
    from sparktrain.train._executor.spec import InputSpec, OptimSpec, WorkerSpec
    from sparktrain.tune._channel import SearchChannel

    channel = SearchChannel("127.0.0.1", ranks=1)
    watch = channel.watch("r1", epochs=4)
    spec = WorkerSpec(framework="torch", inputs=InputSpec(("x",), (), "y", "binary"), train_path="t",
                      val_path=None, store=str(tmp_path), run_id="r1", optim=OptimSpec(epochs=4), prune_wait_s=5.0,
                      progress_address=channel.address, token=channel.token)
    reporter = Reporter(channel.address, 0, "h", channel.token, run="r1")
    ctx = WorkerContext(rank=0, world_size=1, host="127.0.0.1", master_host="127.0.0.1", master_port=0, aux_port=0,
                        attempt=0, checkpointer=Checkpointer(str(tmp_path), "r1"), reporter=reporter)
    hook = PruneHook(spec, ctx)
    answers = []

    def epoch(n: int) -> threading.Thread:
        t = threading.Thread(target=lambda: answers.append(hook.on_epoch(n, {"val_loss": 0.5 + n})))
        t.start()
        return t

    try:
        t = epoch(0)
        _wait_for(lambda: watch.finished_epochs() == {0: {"val_loss": 0.5}})  # the request fed the metrics
        watch.verdict(0, False, "")
        t.join(5)
        assert answers == [False]
        t = epoch(1)
        _wait_for(lambda: 1 in watch.finished_epochs())
        channel.server.drop_connections(refuse_s=0.5)  # a cut while rank 0 waits: it asks again
        time.sleep(1.0)
        watch.verdict(1, True, "worse than the rung")
        t.join(10)
        assert answers == [False, True]
        t = epoch(2)  # a stop is the answer to any later question
        t.join(5)
        assert answers == [False, True, True]
        pruned = [e for e in RunStore(str(tmp_path), "r1").read_events() if e["event"] == "pruned"]
        assert [(e["epoch"], e["verdict_epoch"], e["reason"]) for e in pruned][0] == (1, 1, "worse than the rung")
    finally:
        reporter.close()
        channel.close()


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ---- pruning, end to end -----------------------------------------------------------------------------------------

def _assert_pruned_trials(result, store, epochs):
    from sparktrain.data.run_store import RunStore

    statuses = [t.status for t in result.trials]
    assert PRUNED in statuses and FINISHED in statuses, format_trials(result)
    for t in result.trials:
        assert t.epochs == len(t.history)
        run = RunStore(store, f"{t.job_group.rsplit('-trial-', 1)[0]}-t{t.number:03d}")
        assert run.stop_requested() is None  # the verdicts went over the progress channel, not the store
        pruned = [e for e in run.read_events() if e["event"] == "pruned"]
        if t.status == PRUNED:
            assert t.epochs < epochs and len(pruned) == 1
            assert t.epochs == pruned[0]["epoch"] + 1 == pruned[0]["verdict_epoch"] + 1  # stopped right after it
            assert "pruner" in pruned[0]["reason"]
            assert t.metric == pytest.approx(t.history[-1]["val_loss"])
        else:
            assert t.status == FINISHED and t.epochs == epochs and not pruned
    best = next(t for t in result.trials if t.number == result.best_number)
    assert best.status == FINISHED and result.best_metric == min(t.metric for t in result.trials
                                                                 if t.status == FINISHED)


@pytest.mark.torch
def test_asha_prunes_bad_trials_in_single_mode_and_records_them(spark, dataset, tmp_path):
    from mlflow import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(tmp_path, tracking=True, experiment="asha", tune={
        "sampler": "random", "pruner": "asha", "max_trials": 6, "parallelism": 2,
        "space": {"learning_rate": {"choice": [3.0e-2, 1.0e-6]}, "hidden_units": {"choice": [[16], [8]]}}})
    result = run_search(spark, cfg, dataset, tracking_uri=tracking)
    _assert_pruned_trials(result, str(tmp_path / "store"), 3)
    assert all(t.params["learning_rate"] == 1e-6 for t in result.trials if t.status == PRUNED) or \
        min(t.metric for t in result.trials if t.status == PRUNED) > result.best_metric
    table = format_trials(result)
    assert "PRUNED" in table and "pruned)" in table and table.splitlines()[0].split()[4] == "epochs"

    client = MlflowClient(tracking)
    exp = client.get_run(result.parent_run_id).info.experiment_id
    children = {r.data.tags["sparktrain.trial"]: r for r in client.search_runs(
        [exp], f"tags.mlflow.parentRunId = '{result.parent_run_id}'")}
    for t in result.trials:
        run = children[str(t.number)]
        assert run.data.tags["sparktrain.status"] == t.status and run.data.metrics["epochs_ran"] == t.epochs
        assert run.info.status == ("KILLED" if t.status == PRUNED else "FINISHED")
        if t.status == PRUNED:
            assert run.data.tags["sparktrain.pruned_after_epoch"] == str(t.epochs)
    parent = client.get_run(result.parent_run_id)
    assert parent.data.metrics["tune_pruned"] == sum(t.status == PRUNED for t in result.trials)
    assert parent.data.params["tune.engine"] == "optuna" and parent.data.params["tune.pruner"] == "asha"


@pytest.mark.torch
def test_median_pruner_in_distributed_mode(spark, dataset, tmp_path):
    # seed 10: the random sampler draws good, bad, good, bad learning rates
    cfg = _cfg(tmp_path, train={"num_workers": 2, "seed": 10}, tune={
        "mode": "distributed", "sampler": "random", "pruner": "median", "pruner_startup_trials": 1,
        "max_trials": 4, "parallelism": 1,
        "space": {"learning_rate": {"choice": [3.0e-2, 1.0e-6]}}})
    result = run_search(spark, cfg, dataset)
    assert result.mode == "distributed" and result.concurrency == 1
    assert [t.params["learning_rate"] for t in result.trials] == [3e-2, 1e-6, 3e-2, 1e-6]
    _assert_pruned_trials(result, str(tmp_path / "store"), 3)
    # one at a time: a bad trial is worse than the median of the finished ones after its first epoch
    assert [(t.status, t.epochs) for t in result.trials] == [(FINISHED, 3), (PRUNED, 1), (FINISHED, 3), (PRUNED, 1)]


def test_a_study_that_cannot_be_kept_is_refused_before_the_job_runs_any_stage(tmp_path):
    """An Optuna search with train.store in S3 and no tune.storage: refused by check_search (which run_job calls
    before profile, preprocess and train), not after the job's train stage has trained and registered a model."""
    from sparktrain.config import parse_config
    from sparktrain.tune.search import check_search

    raw = {"name": "t", "data": {"source": str(tmp_path / "raw"), "label": "y"},
           "train": {"store": "s3://bucket/store"}, "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
           "tune": {"engine": "optuna", "max_trials": 2, "space": {"dropout": {"uniform": [0.0, 0.5]}}}}
    with pytest.raises(ConfigError) as info:
        check_search(parse_config(raw))
    assert (info.value.path, info.value.value) == ("tune.storage", None)
    assert "train.store is 's3://bucket/store'" in info.value.fix and "database URL" in info.value.fix
    same_db = dict(raw, tune=dict(raw["tune"], storage=raw["tracking"]["uri"]))
    with pytest.raises(ConfigError) as info:
        check_search(parse_config(same_db))
    assert info.value.path == "tune.storage" and "alembic_version" in info.value.fix
    hyperopt = dict(raw, tune=dict(raw["tune"], engine="hyperopt"))  # keeps no study: nothing to refuse
    assert check_search(parse_config(hyperopt))[1] == "min"
    # probe I: a folder, a CSV or a CSV behind sqlite:/// failed after Spark started with JSONDecodeError,
    # IsADirectoryError or sqlalchemy's "file is not a database"; refused now, and the user's file is untouched
    local = dict(raw, train={"store": str(tmp_path / "store")})
    mine = tmp_path / "mine.csv"
    mine.write_text("a,b\n1,2\n")
    journal = tmp_path / "ok.journal"
    journal.write_text('{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n')
    for storage, words in ((str(tmp_path), "is a folder, not a file"),
                           (str(mine), "is not an Optuna journal"),
                           (f"sqlite:///{mine}", "is not an SQLite database")):
        with pytest.raises(ConfigError) as info:
            check_search(parse_config(dict(local, tune=dict(raw["tune"], storage=storage))))
        assert info.value.path == "tune.storage" and words in info.value.fix, info.value
        assert "name a new file" in info.value.fix
    assert mine.read_text() == "a,b\n1,2\n"
    for storage in (str(journal), str(tmp_path / "new.journal"), f"sqlite:///{tmp_path / 'new.db'}"):
        check_search(parse_config(dict(local, tune=dict(raw["tune"], storage=storage))))  # a journal, or new


def test_a_spent_study_is_refused_before_spark_and_before_any_mlflow_run(tmp_path):
    """``sparktrain tune`` on a study that already ran its max_trials: refused in run_job's preflight, naming the
    study and the fix; no MLflow store or run is made, and the study is unchanged (no lease, no new trial)."""
    import optuna

    from sparktrain.job import run_job
    from sparktrain.tune._engines import check_budget

    def cfg(max_trials):
        return parse_config({
            "name": "optuna-test", "data": {"label": "label"}, "output": {"path": str(tmp_path / "ds")},
            "train": {"epochs": 2, "store": str(tmp_path / "store")},
            "tune": {"engine": "optuna", "study": "mine", "max_trials": max_trials, "metric": "loss",
                     "space": {"dropout": {"uniform": [0.0, 0.5]}}},
            "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "artifact_location": str(tmp_path / "art")},
        })

    check_budget(cfg(2), str(tmp_path / "ds"))  # no study yet: nothing to refuse, and nothing is made
    assert not (tmp_path / "store").exists()

    journal = tmp_path / "store" / "_studies" / "mine.journal"
    journal.parent.mkdir(parents=True)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.create_study(study_name="mine", storage=storage)
    for value in (0.3, 0.2):
        study.tell(study.ask(), value)
    study.ask()  # left RUNNING by a killed search: the search runs it again, so it does not count
    check_budget(cfg(3), str(tmp_path / "ds"))  # 2 of 3 spent: one left
    size = journal.stat().st_size

    with pytest.raises(ConfigError) as info:
        run_job(cfg(2), stages=("tune",))
    assert info.value.path == "tune.max_trials" and info.value.value == 2
    assert f"study 'mine' ({journal}) already holds 1 cut off by an interrupt or a killed search, which do not " \
           "count, and 2 finished, pruned or failed trials; raise tune.max_trials" in info.value.fix
    assert not (tmp_path / "mlflow.db").exists()  # the tracker was never made: no empty FAILED runs
    assert journal.stat().st_size == size  # the study is untouched (no lease, the running trial left as it was)
