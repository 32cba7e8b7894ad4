"""The train stage's report: metrics beside the MLlib baseline, and a hint when the network clearly trails it."""

from __future__ import annotations

import pytest

from sparktrain.train.result import TrainResult


def _result(test, baseline, epochs=3, task_model="LogisticRegression"):
    return TrainResult(model=None, test=test, baseline=baseline, seconds=1.5, baseline_model=task_model,
                       history=[{"epoch": i, "val_loss": 0.5} for i in range(epochs)])


def test_a_network_far_behind_the_baseline_gets_the_fix_in_the_report():
    """Probe C: 3 classes, 2,373 rows, the defaults: test_accuracy 0.451 against LogisticRegression's 0.974, and
    no word on why. The report now says which metric trails, by how much, and what to raise."""
    text = _result({"test_accuracy": 0.451}, {"test_accuracy": 0.974}).format()
    assert "  test_accuracy  0.4510   (Spark MLlib LogisticRegression: 0.9740)" in text
    assert "hint: the network trails Spark MLlib LogisticRegression (test_accuracy 0.4510 against 0.9740) after " \
           "3 epochs. On a small table that is often too few optimizer steps: raise train.epochs (e.g. --set " \
           "train.epochs=30) or train.learning_rate, or lower train.batch_size" in text
    assert text.index("hint:") < text.index("time: 1.5 s")


@pytest.mark.parametrize("test, baseline, trails", [
    ({"test_auc": 0.9267, "test_accuracy": 0.9044}, {"test_auc": 0.9064, "test_accuracy": 0.8892}, None),
    ({"test_auc": 0.90, "test_accuracy": 0.88}, {"test_auc": 0.94, "test_accuracy": 0.90}, None),  # within 0.05
    ({"test_auc": 0.80, "test_accuracy": 0.88}, {"test_auc": 0.90, "test_accuracy": 0.90},
     "test_auc 0.8000 against 0.9000"),
    ({"test_rmse": 1.20, "test_r2": 0.70}, {"test_rmse": 1.00, "test_r2": 0.75}, None),  # 20% worse: not yet
    ({"test_rmse": 1.30, "test_r2": 0.55}, {"test_rmse": 1.00, "test_r2": 0.70},
     "test_rmse 1.3000 against 1.0000; test_r2 0.5500 against 0.7000"),
    ({"test_accuracy": 0.40}, {}, None),  # no baseline (compare_baseline off): nothing to say
    ({"test_accuracy": float("nan")}, {"test_accuracy": 0.9}, None),
])
def test_the_hint_appears_only_when_a_metric_clearly_trails(test, baseline, trails):
    hint = _result(test, baseline, task_model="LinearRegression").underfit_hint()
    if trails is None:
        assert hint == ""
    else:
        assert f"trails Spark MLlib LinearRegression ({trails})" in hint
