"""train/_executor/metrics.py: metric sums that all-reduce as one vector, and the histogram AUC."""

from __future__ import annotations

import numpy as np
import pytest

from sparktrain.train._executor import metrics as M


def _exact_auc(y: np.ndarray, p: np.ndarray) -> float:
    pos, neg = p[y > 0.5], p[y <= 0.5]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def test_binary_metrics_summed_over_ranks_equal_one_rank_over_all_rows():
    rng = np.random.default_rng(0)
    y = (rng.random(4000) > 0.6).astype(np.float32)
    p = np.clip(0.35 * y + rng.random(4000) * 0.65, 0, 1)
    whole = M.new_state("binary")
    M.update(whole, "binary", 1234.0, y, p)
    parts = [M.new_state("binary") for _ in range(3)]
    for state, idx in zip(parts, np.array_split(np.arange(4000), 3)):
        M.update(state, "binary", 1234.0 * len(idx) / 4000, y[idx], p[idx])
    summed = M.finalize(np.sum(parts, axis=0), "binary", prefix="val_")
    assert summed == pytest.approx(M.finalize(whole, "binary", prefix="val_"))
    assert set(summed) == {"val_loss", "val_accuracy", "val_auc"}
    assert summed["val_loss"] == pytest.approx(1234.0 / 4000)
    assert summed["val_accuracy"] == pytest.approx(float(np.mean((p > 0.5) == (y > 0.5))))
    assert summed["val_auc"] == pytest.approx(_exact_auc(y, p), abs=1e-3)


def test_multiclass_and_regression():
    y = np.array([0, 1, 2, 2])
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    state = M.new_state("multiclass")
    M.update(state, "multiclass", 2.0, y, scores)
    assert M.finalize(state, "multiclass") == {"loss": 0.5, "accuracy": 0.75}
    reg = M.new_state("regression")
    M.update(reg, "regression", 8.0, np.array([1.0, 2.0]), np.array([1.0, 4.0]))
    out = M.finalize(reg, "regression")
    assert out["loss"] == 4.0 and out["rmse"] == pytest.approx(np.sqrt(2.0))


def test_histogram_auc_edge_cases():
    pos, neg = np.zeros(M.BINS), np.zeros(M.BINS)
    assert np.isnan(M.histogram_auc(pos, neg))  # no positives, no negatives: undefined, not 0
    pos[900], neg[100] = 5, 5
    assert M.histogram_auc(pos, neg) == 1.0
    assert M.histogram_auc(neg, pos) == 0.0
    assert M.histogram_auc(pos, pos) == 0.5  # ties within a bin count half
