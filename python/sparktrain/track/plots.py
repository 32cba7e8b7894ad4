"""Plots logged with a training run: learning curve, ROC curve, confusion matrix.

The figures are drawn on matplotlib's Agg canvas through the object API
(``matplotlib.figure.Figure``), never ``pyplot``: no global state, safe from
any thread, and no display needed.  ROC and confusion matrix come from one
Spark aggregation over the scored test split (:func:`test_score_summary`),
a histogram of scores by label of at most 4,000 rows; the scored rows are
never collected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# the same 1,000 score bins and AUC the training workers use for val_auc (executor code never imports this one)
from sparktrain.train._executor.metrics import BINS, histogram_auc
_TRAIN, _VAL = "#1f77b4", "#d62728"


@dataclass
class ScoreSummary:
    """Histogram of test scores by label (binary) and the confusion matrix (classification)."""

    task: str
    labels: List[str]
    confusion: np.ndarray                  # [actual, predicted] counts
    pos: Optional[np.ndarray] = None       # binary: count of positives per score bin
    neg: Optional[np.ndarray] = None       # binary: count of negatives per score bin

    @property
    def rows(self) -> int:
        return int(self.confusion.sum())


def test_score_summary(model: Any, df: Any) -> Optional[ScoreSummary]:
    """Score ``df`` with ``model`` and aggregate it in Spark; ``None`` for regression.

    Binary: ``groupBy(label, prediction, score bin).count()`` (<= 4,000 rows
    reach the driver).  Multiclass: ``groupBy(label, prediction).count()``.
    """
    from pyspark.sql import functions as F

    task = model.inputs.task
    if task not in ("binary", "multiclass"):
        return None
    label, pred, prob = model.getLabelCol(), model.getPredictionCol(), model.getProbabilityCol()
    # the split holds class indices: score to indices too (transform() would give the original
    # values, e.g. 'setosa' or the integer 3, which do not cast to the index they stand for)
    scored = model._score(df, decode=False)
    names = [str(c) for c in model.inputs.classes]
    y = F.col(label).cast("double")
    if task == "binary":
        b = F.least(F.greatest(F.floor(F.col(prob) * BINS).cast("int"), F.lit(0)), F.lit(BINS - 1))
        rows = (scored.where(F.col(label).isNotNull())
                .groupBy((y > 0.5).cast("int").alias("y"), F.col(pred).cast("int").alias("p"), b.alias("b"))
                .count().collect())
        pos, neg = np.zeros(BINS), np.zeros(BINS)
        confusion = np.zeros((2, 2), dtype=np.int64)
        for r in rows:
            (pos if r["y"] == 1 else neg)[r["b"]] += r["count"]
            confusion[r["y"], r["p"]] += r["count"]
        return ScoreSummary(task, names if len(names) == 2 else ["0", "1"], confusion, pos, neg)
    k = int(model.inputs.num_classes)
    rows = (scored.where(F.col(label).isNotNull())
            .groupBy(y.cast("int").alias("y"), F.col(pred).cast("int").alias("p")).count().collect())
    confusion = np.zeros((k, k), dtype=np.int64)
    for r in rows:
        if 0 <= r["y"] < k and 0 <= r["p"] < k:
            confusion[r["y"], r["p"]] += r["count"]
    return ScoreSummary(task, names if len(names) == k else [str(i) for i in range(k)], confusion)


def roc_points(pos: np.ndarray, neg: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(fpr, tpr)`` at every bin edge, from threshold 1 down to 0 (starts at (0, 0), ends at (1, 1))."""
    tp = np.concatenate([[0.0], np.cumsum(pos[::-1])])
    fp = np.concatenate([[0.0], np.cumsum(neg[::-1])])
    return fp / max(fp[-1], 1.0), tp / max(tp[-1], 1.0)


def _figure(width: float = 6.4, height: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _quality_metric(history: Sequence[Dict[str, float]]) -> Optional[str]:
    keys = set().union(*(h.keys() for h in history)) if history else set()
    for name in ("auc", "accuracy", "rmse"):
        if f"train_{name}" in keys or f"val_{name}" in keys:
            return name
    return None


def learning_curve_figure(history: Sequence[Dict[str, float]], title: str = "Learning curve"):
    """Train and validation loss (and AUC, accuracy or RMSE) per epoch."""
    metric = _quality_metric(history)
    panels = ["loss"] + ([metric] if metric else [])
    fig = _figure(5.2 * len(panels), 4.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    epochs = [int(h.get("epoch", i)) + 1 for i, h in enumerate(history)]
    for ax, name in zip(axes, panels):
        for split, color, style in (("train", _TRAIN, "-"), ("val", _VAL, "--")):
            values = [h.get(f"{split}_{name}") for h in history]
            if all(v is None for v in values):
                continue
            ys = [np.nan if v is None else v for v in values]
            ax.plot(epochs, ys, style, color=color, marker="o", linewidth=2, markersize=5,
                    label="train" if split == "train" else "validation")
        if name == "loss" and any("val_loss" in h for h in history):
            vals = [h.get("val_loss", np.inf) for h in history]
            best = int(np.argmin(vals))
            ax.scatter([epochs[best]], [vals[best]], s=160, marker="*", color=_VAL, zorder=5,
                       label=f"best validation (epoch {epochs[best]})")
        ax.set_xlabel("epoch")
        ax.set_ylabel({"loss": "loss", "auc": "ROC AUC", "accuracy": "accuracy", "rmse": "RMSE"}[name])
        ax.set_title({"loss": "Loss", "auc": "ROC AUC", "accuracy": "Accuracy", "rmse": "RMSE"}[name])
        ax.set_xticks(epochs)
        ax.grid(True, alpha=0.3)
        ax.legend(frameon=False)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    return fig


def roc_figure(summary: ScoreSummary, title: str = "ROC curve, test split"):
    """The ROC curve of a binary summary, AUC in the legend, chance line dashed."""
    pos, neg = summary.pos, summary.neg
    if pos is None or neg is None:
        raise ValueError(f"a ROC curve needs a binary score summary, got task {summary.task!r}")
    fpr, tpr = roc_points(pos, neg)
    auc = histogram_auc(pos, neg)
    fig = _figure(5.6, 5.2)
    ax = fig.subplots()
    ax.plot(fpr, tpr, color=_TRAIN, linewidth=2.2, label=f"model (AUC = {auc:.3f})")
    ax.fill_between(fpr, tpr, alpha=0.12, color=_TRAIN)
    ax.plot([0, 1], [0, 1], "--", color="0.55", linewidth=1.2, label="chance (AUC = 0.500)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.005)
    ax.set_aspect("equal")
    ax.set_xlabel("false positive rate (1 - specificity)")
    ax.set_ylabel("true positive rate (sensitivity)")
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    ax.set_title(f"{title}\n{n_pos:,} positive, {n_neg:,} negative rows", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", frameon=True)
    return fig


def confusion_figure(summary: ScoreSummary, title: str = "Confusion matrix, test split",
                     label_name: str = "label"):
    """Counts with row percentages; darker is more rows."""
    cm = summary.confusion
    k = cm.shape[0]
    fig = _figure(max(4.8, 1.1 * k + 2.6), max(4.2, 1.0 * k + 2.2))
    ax = fig.subplots()
    image = ax.imshow(cm, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="rows")
    row_totals = np.maximum(cm.sum(axis=1, keepdims=True), 1)
    threshold = cm.max() / 2.0 if cm.size else 0
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{cm[i, j]:,}\n{100.0 * cm[i, j] / row_totals[i, 0]:.1f}%", ha="center", va="center",
                    color="white" if cm[i, j] > threshold else "black", fontsize=11 if k <= 4 else 8)
    names = [f"{label_name}={v}" for v in summary.labels]
    ax.set_xticks(range(k), names)
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    accuracy = np.trace(cm) / max(cm.sum(), 1)
    extra = ", threshold 0.5" if summary.task == "binary" else ""
    ax.set_title(f"{title}{extra}\naccuracy {accuracy:.3f} on {summary.rows:,} rows", fontsize=11)
    return fig
