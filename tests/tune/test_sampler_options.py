"""``tune.sampler_options``: the sampler's own settings, checked by name and type, reach the sampler on real Spark."""

from __future__ import annotations

import logging
import math

import pytest

from sparktrain.config import parse_config
from sparktrain.errors import ConfigError
from sparktrain.tune.result import FINISHED
from sparktrain.tune.search import run_search

SPACE = {"learning_rate": {"loguniform": [1e-4, 1e-1]}, "dropout": {"uniform": [0.0, 0.5]}}


def _cfg(tmp_path, tune: dict, store: str | None = None):
    return parse_config({
        "name": "sampler-options",
        "data": {"label": "label"},
        "train": {"epochs": 3, "batch_size": 64, "store": store or str(tmp_path / "store"), "seed": 11},
        "tune": {"space": SPACE, "parallelism": 2, "metric": "loss", **tune},
        "tracking": {"enabled": False},
    })


def _objective(params):
    return (math.log10(params["learning_rate"]) + 2) ** 2 + (params["dropout"] - 0.2) ** 2


@pytest.mark.parametrize("tune, path, words", [
    ({"engine": "optuna", "sampler_options": {"n_startup_jobs": 3}}, "tune.sampler_options.n_startup_jobs",
     "Optuna's tpe sampler takes no option 'n_startup_jobs'; its options are: consider_endpoints"),
    ({"engine": "optuna", "sampler_options": {"seed": 3}}, "tune.sampler_options.seed", "seeds it from train.seed"),
    ({"engine": "optuna", "sampler_options": {"n_startup_trials": "5"}}, "tune.sampler_options.n_startup_trials",
     "takes int for 'n_startup_trials'"),
    ({"engine": "optuna", "sampler_options": {"multivariate": 1}}, "tune.sampler_options.multivariate",
     "takes bool for 'multivariate'"),
    ({"engine": "optuna", "sampler_options": {"n_ei_candidates": 0}}, "tune.sampler_options.n_ei_candidates",
     "must be >= 1"),
    ({"engine": "optuna", "sampler_options": {"group": True, "multivariate": False}}, "tune.sampler_options",
     "``group`` option can only be enabled when ``multivariate`` is enabled"),
    ({"engine": "optuna", "sampler": "random", "sampler_options": {"n_startup_trials": 3}},
     "tune.sampler_options.n_startup_trials", "Optuna's random sampler takes no options; remove"),
    ({"algo": "random", "sampler_options": {"n_startup_jobs": 3}}, "tune.sampler_options.n_startup_jobs",
     "Hyperopt's random sampler takes no options"),
    ({"sampler_options": {"n_startup_jobs": 3.0}}, "tune.sampler_options.n_startup_jobs",
     "Hyperopt's tpe sampler takes int for 'n_startup_jobs', e.g. {n_startup_jobs: 5}"),
    # ranges the samplers themselves check only once they model results, mid-search
    ({"sampler_options": {"gamma": 1.5}}, "tune.sampler_options.gamma", "must be in (0, 1)"),
    ({"sampler_options": {"prior_weight": -1.0}}, "tune.sampler_options.prior_weight", "must be > 0"),
    ({"engine": "optuna", "sampler_options": {"prior_weight": -1.0}}, "tune.sampler_options.prior_weight",
     "must be > 0"),
    ({"engine": "optuna", "sampler": "cmaes", "sampler_options": {"popsize": 0}}, "tune.sampler_options.popsize",
     "must be >= 1"),
    ({"engine": "optuna", "sampler": "cmaes", "sampler_options": {"sigma0": -1.0}}, "tune.sampler_options.sigma0",
     "must be > 0"),
])
def test_an_option_the_sampler_cannot_take_is_refused_before_any_trial(spark, tmp_path, tune, path, words):
    cfg = _cfg(tmp_path, {"max_trials": 6, **tune})
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None).size()
    with pytest.raises(ConfigError) as info:
        run_search(spark, cfg, None, objective=_objective)
    assert info.value.path == path and words in info.value.fix, info.value
    assert info.value.value == (tune["sampler_options"] if path == "tune.sampler_options"
                                else tune["sampler_options"][path.rsplit(".", 1)[1]])
    assert store.jobsList(None).size() == jobs  # refused before any Spark job (counted, not timed)


@pytest.mark.parametrize("value", [[3], {"a": 1}, float("inf")])
def test_a_value_no_config_can_set_is_refused_when_the_config_is_read(tmp_path, value):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, {"sampler_options": {"n_startup_jobs": value}})
    assert info.value.path == "tune.sampler_options.n_startup_jobs" and "a finite number, a boolean or a string" \
        in info.value.fix


def test_hyperopt_tpe_options_reach_it_and_a_random_start_is_named(spark, tmp_path, caplog):
    """Hyperopt's TPE draws 20 points at random by default: 8 trials are a random search, and the log says so."""
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune._engines"):
        plain = run_search(spark, _cfg(tmp_path / "a", {"max_trials": 8}), None, objective=_objective)
    assert caplog.text.count("draws its first 20 trials at random and tune.max_trials is 8") == 1
    assert "tune.sampler_options: {n_startup_jobs: 2}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparktrain.tune._engines"):
        early = run_search(spark, _cfg(tmp_path / "b", {"max_trials": 8, "sampler_options": {"n_startup_jobs": 2}}),
                           None, objective=_objective)
    assert "at random" not in caplog.text
    for result in (plain, early):
        assert [t.status for t in result.trials] == [FINISHED] * 8
        for t in result.trials:
            assert t.metric == pytest.approx(_objective(t.params))

    def by_number(result):
        return [t.params["learning_rate"] for t in sorted(result.trials, key=lambda t: t.number)]

    # the same seed draws the same random start; after 2 points the TPE that models them proposes others
    assert by_number(early)[:2] == by_number(plain)[:2]
    assert by_number(early)[2:] != by_number(plain)[2:]
    from sparktrain.tune._engines import make_engine
    from sparktrain.tune.space import compile_space

    tuned = _cfg(tmp_path, {"sampler_options": {"n_startup_jobs": 2}})
    engine = make_engine(compile_space(SPACE), tuned, "min", seed=0, dataset_path=None)
    assert engine.settings() == {"engine": "hyperopt", "sampler": "tpe", "sampler_options": {"n_startup_jobs": 2}}


def test_optuna_options_reach_the_sampler_and_name_a_study_of_their_own(tmp_path):
    from optuna.samplers import CmaEsSampler, TPESampler

    from sparktrain.tune._engines import OptunaEngine, study_name

    base = _cfg(tmp_path, {"engine": "optuna", "max_trials": 30}, store="/data/store")
    tuned = _cfg(tmp_path, {"engine": "optuna", "max_trials": 30,
                            "sampler_options": {"n_startup_trials": 4, "multivariate": False}}, store="/data/store")
    sampler = OptunaEngine._sampler(tuned.tune, 0)
    assert isinstance(sampler, TPESampler) and sampler._n_startup_trials == 4 and sampler._multivariate is False
    assert OptunaEngine._sampler(base.tune, 0)._n_startup_trials == 10  # a third of 30, at most 10
    cma = _cfg(tmp_path, {"engine": "optuna", "sampler": "cmaes", "sampler_options": {"popsize": 6}})
    assert isinstance(OptunaEngine._sampler(cma.tune, 0), CmaEsSampler)
    assert OptunaEngine._sampler(cma.tune, 0)._popsize == 6
    # options change the study; without them the name is the one earlier versions gave (a restart continues it)
    assert study_name(base, "/data/ds") == "sampler-options-2485a69f11"
    assert study_name(tuned, "/data/ds") != study_name(base, "/data/ds")


def test_a_database_storage_without_its_driver_is_named(spark, tmp_path):
    cfg = _cfg(tmp_path, {"engine": "optuna", "max_trials": 2, "storage": "postgresql+pg8000://ana:s3cret@127.0.0.1:1/db"})
    with pytest.raises(ConfigError) as info:
        run_search(spark, cfg, None, objective=_objective)
    assert info.value.path == "tune.storage" and info.value.value == "postgresql+pg8000://ana:***@127.0.0.1:1/db"
    assert "no database driver for it is installed" in info.value.fix and "s3cret" not in str(info.value)
