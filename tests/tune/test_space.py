"""The tune.space compiler: each distribution, nesting, constants and clear errors (no Spark needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hyperopt import space_eval
from hyperopt.pyll.stochastic import sample

from sparktrain.config import parse_config
from sparktrain.errors import ConfigError, UnknownKeyError
from sparktrain.tune.space import compile_space


def _draws(space, n=200, seed=0):
    rng = np.random.default_rng(seed)
    return [space.to_train_params(sample(space.hyperopt, rng=rng)) for _ in range(n)]


def test_uniform_within_bounds():
    draws = [d["dropout"] for d in _draws(compile_space({"dropout": {"uniform": [0.1, 0.4]}}))]
    assert min(draws) >= 0.1 and max(draws) <= 0.4
    assert max(draws) - min(draws) > 0.2  # spread over the range, not a constant
    assert all(isinstance(x, float) for x in draws)


def test_loguniform_takes_real_bounds_and_spreads_in_log_space():
    space = compile_space({"learning_rate": {"loguniform": [1e-4, 1e-1]}})
    # hyperopt receives log bounds
    text = str(space.hyperopt["learning_rate"])
    assert f"Literal{{{math.log(1e-4)!r}}}" in text and f"Literal{{{math.log(1e-1)!r}}}" in text
    draws = np.array([d["learning_rate"] for d in _draws(space, 400)])
    assert draws.min() >= 1e-4 and draws.max() <= 1e-1
    # about a third of the draws per decade: log-uniform, not uniform (which would put ~90% above 1e-2)
    assert 0.2 < np.mean(draws < 1e-3) < 0.45
    assert np.mean(draws > 1e-2) < 0.5


def test_quniform_integer_key_gives_ints_on_the_grid():
    draws = [d["batch_size"] for d in _draws(compile_space({"batch_size": {"quniform": [128, 1024, 128]}}))]
    assert all(isinstance(x, int) and x % 128 == 0 and 128 <= x <= 1024 for x in draws)
    assert len(set(draws)) >= 6


def test_qloguniform_and_float_quniform():
    space = compile_space({"embedding_dim": {"qloguniform": [4, 64, 4]}, "dropout": {"quniform": [0.0, 0.5, 0.1]}})
    for d in _draws(space):
        assert isinstance(d["embedding_dim"], int) and d["embedding_dim"] % 4 == 0 and 4 <= d["embedding_dim"] <= 64
        assert round(d["dropout"] * 10) == pytest.approx(d["dropout"] * 10) and 0 <= d["dropout"] <= 0.5


def test_choice_of_lists_becomes_tuples_and_constants_pass_through():
    space = compile_space({"hidden_units": {"choice": [[32], [64, 32]]}, "epochs": 2})
    draws = _draws(space)
    assert {d["hidden_units"] for d in draws} == {(32,), (64, 32)}
    assert all(d["epochs"] == 2 for d in draws)
    assert space.keys == {"hidden_units", "epochs"}


def test_choice_between_a_constant_and_a_distribution():
    space = compile_space({"dropout": {"choice": [0.0, {"uniform": [0.2, 0.3]}]}})
    draws = [d["dropout"] for d in _draws(space)]
    assert 0.0 in draws
    assert any(0.2 <= x <= 0.3 for x in draws)
    assert all(x == 0.0 or 0.2 <= x <= 0.3 for x in draws)


def test_nested_choice_groups_are_flattened_into_train_keys():
    text = """
    learning_rate: {loguniform: [1.0e-3, 1.0e-2]}
    architecture:
      choice:
        - {hidden_units: [16], embedding_dim: 2}
        - hidden_units: {choice: [[64, 64], [128, 64]]}
          dropout: {uniform: [0.1, 0.5]}
          regularize:
            choice:
              - {}
              - {embedding_dim: {quniform: [8, 16, 8]}}
    """
    space = compile_space(yaml.safe_load(text))
    assert space.keys == {"learning_rate", "hidden_units", "embedding_dim", "dropout"}
    assert space.groups == {"architecture", "architecture.1.regularize"}
    draws = _draws(space, 300)
    small = [d for d in draws if d["hidden_units"] == (16,)]
    big = [d for d in draws if d["hidden_units"] != (16,)]
    assert small and big
    assert all(d["embedding_dim"] == 2 and "dropout" not in d for d in small)  # option 0 sets no dropout
    assert all(0.1 <= d["dropout"] <= 0.5 and d["hidden_units"] in {(64, 64), (128, 64)} for d in big)
    assert {d.get("embedding_dim") for d in big} == {None, 8, 16}  # the inner group: unset, or 8/16
    # a hyperopt point with inactive branches evaluates to the same flattened params
    point = {"learning_rate": 0.005, "architecture": 1, "architecture.1.hidden_units": 1,
             "architecture.1.dropout": 0.25, "architecture.1.regularize": 1,
             "architecture.1.regularize.1.embedding_dim": 16.0}
    assert space.to_train_params(space_eval(space.hyperopt, point)) == {
        "learning_rate": 0.005, "hidden_units": (128, 64), "dropout": 0.25, "embedding_dim": 16}


def test_space_in_a_job_config_yaml_compiles():
    cfg = parse_config(yaml.safe_load("""
    train: {epochs: 1}
    tune:
      max_trials: 4
      space:
        learning_rate: {loguniform: [1e-4, 1e-2]}   # YAML 1.1 reads 1e-4 as a string: accepted
        batch_size: {choice: [256, 512]}
    """))
    draws = _draws(compile_space(cfg.tune.space), 50)
    assert all(1e-4 <= d["learning_rate"] <= 1e-2 and d["batch_size"] in (256, 512) for d in draws)


@pytest.mark.parametrize("space, path, words", [
    ({"learning_rat": {"uniform": [0.1, 0.2]}}, "tune.space.learning_rat", "did you mean 'learning_rate'"),
    ({"num_workers": {"choice": [1, 2]}}, "tune.space.num_workers", "cannot be tuned"),
    ({"dropout": {"gaussian": [0, 1]}}, "tune.space.dropout.gaussian", "uniform"),
    ({"dropout": {"uniform": [0.3, 0.1]}}, "tune.space.dropout.uniform", "lo must be < hi"),
    ({"dropout": {"uniform": [0.1]}}, "tune.space.dropout.uniform", "[lo, hi]"),
    ({"dropout": {"uniform": [0.0, 1.5]}}, "tune.space.dropout.uniform", "out of range for train.dropout"),
    ({"learning_rate": {"loguniform": [0.0, 0.1]}}, "tune.space.learning_rate.loguniform", "must be > 0"),
    ({"learning_rate": {"uniform": ["fast", 0.1]}}, "tune.space.learning_rate.uniform", "not a number"),
    ({"batch_size": {"uniform": [64, 512]}}, "tune.space.batch_size.uniform", "is an integer; use quniform"),
    ({"batch_size": {"quniform": [64, 512, 0.5]}}, "tune.space.batch_size.quniform", "whole number"),
    ({"batch_size": {"quniform": [0, 512, 64]}}, "tune.space.batch_size.quniform", "must be >= 1"),
    ({"batch_size": {"quniform": [64, 512, -8]}}, "tune.space.batch_size.quniform", "q must be > 0"),
    ({"batch_size": {"choice": []}}, "tune.space.batch_size.choice", "non-empty list"),
    ({"batch_size": {"choice": [256, 300.5]}}, "tune.space.batch_size.choice[1]", "whole numbers"),
    ({"dropout": {"uniform": [0, 0.1], "choice": [0.2]}}, "tune.space.dropout", "exactly one distribution"),
    ({"dropout": {"choice": [{"rate": 0.1}]}}, "tune.space.dropout.choice[0]", "named group"),
    ({"arch": {"choice": [1, 2]}}, "tune.space.arch", "must be a group"),
    ({"dropout": {"uniform": [0.0, 0.2]}, "arch": {"choice": [{"dropout": 0.1}, {}]}}, "tune.space.arch",
     "set twice"),
    ({"arch": {"choice": [{"epochs": {"quniform": [0, 3, 1]}}]}}, "tune.space.arch.choice[0].epochs.quniform",
     "out of range for train.epochs"),
    ({}, "tune.space", "give a mapping"),
    # probe I: a bare list (a forgotten distribution) said "bound [0.001, 0.01] is not a finite number"
    ({"learning_rate": [0.001, 0.01]}, "tune.space.learning_rate", "e.g. {loguniform: [1.0e-4, 1.0e-2]}"),
    ({"epochs": [1, 3]}, "tune.space.epochs", "one number; for a range name its distribution, e.g. {int: [1, 8]}"),
    ({"hidden_units": {"choice": [[16], "abc"]}}, "tune.space.hidden_units.choice[1]", "a list of layer widths"),
])
def test_errors_name_the_key_the_value_and_the_fix(space, path, words):
    with pytest.raises(ConfigError) as info:
        compile_space(space)
    assert info.value.path == path
    assert words in str(info.value)


def test_unknown_distribution_is_an_unknown_key_error_with_the_valid_names():
    with pytest.raises(UnknownKeyError) as info:
        compile_space({"learning_rate": {"log_uniform": [1e-4, 1e-2]}})
    assert "did you mean 'loguniform'" in str(info.value)
