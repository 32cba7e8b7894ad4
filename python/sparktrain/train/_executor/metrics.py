"""Framework-neutral metric accumulators whose state all-reduces as one float vector.

Each rank accumulates sums and a fixed-size score histogram; the vectors are
summed across ranks (one all-reduce), then :func:`finalize` turns them into
loss, accuracy and ROC AUC.  The AUC comes from a 1,000-bin histogram of the
predicted probability per class, which all-reduces exactly and differs from
the sort-based AUC by well under 1e-3 on real data.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

BINS = 1000


def state_size(task: str) -> int:
    # [loss_sum, count, correct, sq_err] + positive histogram + negative histogram
    return 4 + (2 * BINS if task == "binary" else 0)


def new_state(task: str) -> np.ndarray:
    return np.zeros(state_size(task), dtype=np.float64)


def update(state: np.ndarray, task: str, loss_sum: float, y: np.ndarray, pred: np.ndarray) -> None:
    """Add one batch. ``pred`` is a probability (binary), class scores (multiclass) or value."""
    n = len(y)
    state[0] += loss_sum
    state[1] += n
    if task == "binary":
        p = pred.reshape(-1).astype(np.float64)
        yb = y.reshape(-1) > 0.5
        state[2] += float(np.sum((p > 0.5) == yb))
        idx = np.clip((p * BINS).astype(np.int64), 0, BINS - 1)
        state[4:4 + BINS] += np.bincount(idx[yb], minlength=BINS)
        state[4 + BINS:] += np.bincount(idx[~yb], minlength=BINS)
    elif task == "multiclass":
        state[2] += float(np.sum(np.argmax(pred, axis=1) == y.reshape(-1).astype(np.int64)))
    else:
        state[3] += float(np.sum((pred.reshape(-1) - y.reshape(-1)) ** 2))


def finalize(state: np.ndarray, task: str, prefix: str = "") -> Dict[str, float]:
    """Turn an all-reduced state into named metrics."""
    count = max(state[1], 1.0)
    out = {f"{prefix}loss": float(state[0] / count)}
    if task in ("binary", "multiclass"):
        out[f"{prefix}accuracy"] = float(state[2] / count)
    if task == "binary":
        out[f"{prefix}auc"] = histogram_auc(state[4:4 + BINS], state[4 + BINS:])
    if task == "regression":
        out[f"{prefix}rmse"] = float(np.sqrt(state[3] / count))
    return out


def histogram_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC from per-bin positive/negative counts (ties within a bin count half)."""
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    neg_below = np.cumsum(neg) - neg
    return float((np.sum(pos * neg_below) + 0.5 * np.sum(pos * neg)) / (n_pos * n_neg))
