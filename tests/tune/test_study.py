"""A study stays whole: one search at a time, no values of another meaning, and a continued search all pruned."""

from __future__ import annotations

import json
import logging

import pytest

from sparktrain.config import TuneConfig, parse_config
from sparktrain.errors import ConfigError, LeaseHeldError, TuneError
from sparktrain.tune.result import FINISHED
from sparktrain.tune.search import run_search
from tests.tune.test_optuna import dataset  # noqa: F401 - a fixture

SPACE = {"learning_rate": {"loguniform": [1e-4, 1e-1]}, "dropout": {"uniform": [0.0, 0.5]}}


def _cfg(tmp_path, tune: dict, train: dict | None = None):
    return parse_config({
        "name": "study-test",
        "data": {"label": "label"},
        "train": {"epochs": 3, "batch_size": 512, "num_workers": 1, "store": str(tmp_path / "store"), "seed": 5,
                  **(train or {})},
        "tune": {"engine": "optuna", "study": "kept", "space": SPACE, "parallelism": 1, "metric": "loss", **tune},
        "tracking": {"enabled": False},
    })


def _objective(params):
    loss = (params["dropout"] - 0.2) ** 2
    return {"loss": loss, "other_loss": 2 * loss + 1}


def _study(tmp_path, name: str = "kept"):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "store" / "_studies" / f"{name}.journal"
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(path)))), str(path)


def test_a_continued_study_refuses_a_metric_of_another_meaning_and_logs_other_changes(spark, tmp_path, caplog):
    first = run_search(spark, _cfg(tmp_path, {"max_trials": 3}), None, objective=_objective)
    assert [t.status for t in first.trials] == [FINISHED] * 3

    # train_loss for val_loss, loss for other_loss: both minimized, so only the recorded settings can tell
    with pytest.raises(ConfigError) as info:
        run_search(spark, _cfg(tmp_path, {"max_trials": 5, "metric": "other_loss"}), None, objective=_objective)
    assert info.value.path == "tune.metric" and info.value.value == "other_loss"
    assert "tune.metric: 'loss' -> 'other_loss'" in info.value.fix and "Name a new study" in info.value.fix
    study, _ = _study(tmp_path)
    assert len(study.trials) == 3  # refused before any trial: nothing written to the study

    with pytest.raises(ConfigError) as task:
        run_search(spark, _cfg(tmp_path, {"max_trials": 5}, {"task": "regression"}), None, objective=_objective)
    assert task.value.path == "train.task" and task.value.value == "regression"
    assert "train.task: 'auto' -> 'regression'" in task.value.fix

    # a narrower space and another starting point keep the values comparable: logged, key by key, and continued
    narrow = {**SPACE, "learning_rate": {"loguniform": [1e-3, 1e-2]}}
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune._study"):
        second = run_search(spark, _cfg(tmp_path, {"max_trials": 5, "space": narrow}, {"epochs": 4}), None,
                            objective=_objective)
    assert [t.number for t in second.trials] == [4, 5] and second.previous_trials == 3
    assert "tune.space.learning_rate: {'loguniform': [0.0001, 0.1]} -> {'loguniform': [0.001, 0.01]}" in caplog.text
    assert "train.epochs: 3 -> 4" in caplog.text and "loss values still compare" in caplog.text
    study, _ = _study(tmp_path)
    assert study.user_attrs["sparktrain_search"]["tune.space"]["learning_rate"] == {"loguniform": [0.001, 0.01]}


def test_a_continued_study_refuses_a_dataset_preprocessed_again_with_other_validation_rows(spark, tmp_path):
    """Probe I: after a new split (or other features), the study went on, claimed the values "still compare" and
    preferred an earlier trial measured on other rows as its best.  The split's identity in features.json tells:
    the same preprocess run again continues (its part files, so its file digest, are new each run), another
    split is refused."""

    def made(name: str, seed: int, file_digest: str) -> str:
        path = tmp_path / name
        (path / "train").mkdir(parents=True)
        (path / "features.json").write_text(json.dumps(
            {"label": {"column": "label", "task": "binary"},
             "dataset": {"split": {"seed": seed, "fractions": {"train": 0.8, "validation": 0.1, "test": 0.1},
                                   "expression": f"pmod(xxhash64({seed}, id), 10000)"},
                         "splits": {"validation": {"path": "validation", "rows": 9, "digest": file_digest}}}}))
        return str(path)

    run_search(spark, _cfg(tmp_path, {"max_trials": 2}), made("ds1", 42, "sha256:aaa"), objective=_objective)
    again = run_search(spark, _cfg(tmp_path, {"max_trials": 3}), made("ds2", 42, "sha256:bbb"),
                       objective=_objective)
    assert [t.number for t in again.trials] == [3]  # the same rows, new part files: the values compare
    with pytest.raises(ConfigError) as info:
        run_search(spark, _cfg(tmp_path, {"max_trials": 5}), made("ds3", 7, "sha256:ccc"), objective=_objective)
    assert (info.value.path, info.value.value) == ("tune.study", "kept")
    assert "holds trials measured on other validation rows" in info.value.fix and "ds3" in info.value.fix
    assert "loss values do not compare" in info.value.fix and "Name a new study" in info.value.fix
    study, _ = _study(tmp_path)
    assert len(study.trials) == 3  # refused before any trial


def test_a_second_search_on_a_study_in_use_is_refused_and_its_running_trial_is_left_alone(spark, tmp_path):
    from optuna.trial import TrialState

    from sparktrain.data.lease import Lease

    run_search(spark, _cfg(tmp_path, {"max_trials": 2}), None, objective=_objective)
    study, journal = _study(tmp_path)
    running = study.ask()  # the other search's trial, in flight
    other = Lease(journal, "tune.study").acquire()  # ... and that search's hold on the study
    try:
        with pytest.raises(LeaseHeldError) as info:
            run_search(spark, _cfg(tmp_path, {"max_trials": 4}), None, objective=_objective,
                       tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert info.value.what == "tune.study" and info.value.target == journal
        assert not (tmp_path / "mlflow.db").exists()  # refused before the tracking: no FAILED runs left behind
        assert "is in use by another job" in str(info.value)
        study, _ = _study(tmp_path)
        assert study.trials[running.number].state == TrialState.RUNNING  # before: recorded FAIL under its search
    finally:
        other.release()
    # that search is gone (its lease released without telling its trial): the next search closes the trial
    result = run_search(spark, _cfg(tmp_path, {"max_trials": 5}), None, objective=_objective)
    study, _ = _study(tmp_path)
    assert study.trials[running.number].state == TrialState.FAIL
    assert [t.number for t in result.trials] == [4, 5, 6]  # the closed trial was cut off: it does not count


@pytest.mark.parametrize("key, value", [("study", "kept"), ("storage", "sqlite:///optuna.db")])
def test_a_study_with_the_hyperopt_engine_is_refused(key, value):
    with pytest.raises(ConfigError) as info:
        TuneConfig(engine="hyperopt", space=SPACE, **{key: value})
    assert info.value.path == f"tune.{key}" and "set tune.engine: optuna" in info.value.fix


@pytest.mark.torch
def test_a_continued_search_whose_trials_are_all_pruned_says_so(spark, dataset, tmp_path):  # noqa: F811
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    # an earlier search's two trials, far better than any this data allows, whose models were not kept
    path = tmp_path / "store" / "_studies" / "kept.journal"
    path.parent.mkdir(parents=True)
    study = optuna.create_study(study_name="kept", storage=JournalStorage(JournalFileBackend(str(path))))
    for dropout in (0.1, 0.2):
        study.add_trial(optuna.trial.create_trial(
            params={"dropout": dropout}, distributions={"dropout": FloatDistribution(0.0, 0.3)}, value=1e-4,
            intermediate_values={1: 1e-4, 2: 1e-4, 3: 1e-4}, user_attrs={"train_params": json.dumps(
                {"dropout": dropout})}))
    cfg = _cfg(tmp_path, {"metric": "val_loss", "pruner": "median", "max_trials": 4,
                          "space": {"dropout": {"uniform": [0.0, 0.3]}}})
    with pytest.raises(TuneError) as info:
        run_search(spark, cfg, dataset)
    text = str(info.value)
    assert "every trial of this search was pruned (2 trials)" in text and "None" not in text
    assert "the study's best, trial 1 (0.0001) of an earlier search, has no model in the store" in text
    assert [t.state.name for t in _study(tmp_path)[0].trials] == ["COMPLETE", "COMPLETE", "PRUNED", "PRUNED"]


@pytest.mark.parametrize("key, spec, words", [
    ("learning_rate", {"uniform": [1e-4, 1e-1]}, "sampled learning_rate as {'loguniform': [0.0001, 0.1]}"),
    ("dropout", {"choice": [0.0, 0.5]}, "a key's distribution kind and a choice's options"),
])
def test_a_space_change_optuna_cannot_take_is_refused_before_any_trial(spark, tmp_path, key, spec, words):
    run_search(spark, _cfg(tmp_path, {"max_trials": 2}), None, objective=_objective)
    with pytest.raises(ConfigError) as info:  # before: a warning that the study goes on, then Optuna's ValueError
        run_search(spark, _cfg(tmp_path, {"max_trials": 4, "space": {**SPACE, key: spec}}), None,
                   objective=_objective)
    assert info.value.path == f"tune.space.{key}" and info.value.value == spec and words in info.value.fix
    assert len(_study(tmp_path)[0].trials) == 2  # no trial spent on it


def test_a_tie_with_an_earlier_trial_is_not_called_better(spark, tmp_path):
    def flat(params):
        return 0.5

    run_search(spark, _cfg(tmp_path, {"max_trials": 2}), None, objective=flat)
    second = run_search(spark, _cfg(tmp_path, {"max_trials": 3}), None, objective=flat)
    assert second.best_metric == 0.5 and second.best_number == 3
    assert second.study_best_number is None  # before: trial 1, "better than this search's best"


def test_a_database_study_is_leased_in_the_database_whatever_the_store(spark, tmp_path):
    """Two searches with their own stores share one database study: the lease is the study's, not a store's."""
    import optuna
    from optuna.trial import TrialState

    from sparktrain.tune._study import LEASE_ATTR, DatabaseLease

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    tune = {"max_trials": 2, "storage": url}
    run_search(spark, _cfg(tmp_path / "a", tune), None, objective=_objective)
    study = optuna.load_study(study_name="kept", storage=url)
    assert study.user_attrs[LEASE_ATTR] == {}  # released when the search ended
    running = study.ask()
    other = DatabaseLease(study, url).acquire(settle_s=0.0)  # a search on another host, with another store
    try:
        with pytest.raises(LeaseHeldError) as info:
            run_search(spark, _cfg(tmp_path / "b", {**tune, "max_trials": 4}), None, objective=_objective)
        assert info.value.what == "tune.study" and f"kept in {url}" in str(info.value)
        assert f"set the study's user attribute '{LEASE_ATTR}' to {{}}" in str(info.value)
        study = optuna.load_study(study_name="kept", storage=url)
        assert study.trials[running.number].state == TrialState.RUNNING  # before: FAIL, and that search crashed
    finally:
        other.release()
    result = run_search(spark, _cfg(tmp_path / "b", {**tune, "max_trials": 5}), None, objective=_objective)
    assert [t.number for t in result.trials] == [4, 5, 6]  # the closed trial was cut off: it does not count
    assert optuna.load_study(study_name="kept", storage=url).trials[running.number].state == TrialState.FAIL
