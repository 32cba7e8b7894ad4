"""What the job's train stage returns: the fitted model, its test metrics and the MLlib baseline.

:func:`sparktrain.job.train_stage` builds it; the tracking
(:mod:`sparktrain.track.stages`, :mod:`sparktrain.track.bundle`) reads it.
It lives here, below both, so that neither imports the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List


@dataclass
class TrainResult:
    """A fitted model with its test metrics and the MLlib baseline."""

    model: Any
    test: Dict[str, float]
    baseline: Dict[str, float]
    history: List[Dict[str, float]]
    seconds: float
    baseline_model: str = "LogisticRegression"

    def format(self) -> str:
        last = self.history[-1] if self.history else {}
        lines = [f"epochs: {len(self.history)}  last epoch: " + "  ".join(
            f"{k}={v:.4f}" for k, v in last.items() if k != "epoch")]
        lines.append("test metrics:")
        width = max((len(k) for k in (*self.test, *self.baseline)), default=8)
        for k, v in self.test.items():
            base = self.baseline.get(k)
            extra = f"   (Spark MLlib {self.baseline_model}: {base:.4f})" if base is not None else ""
            lines.append(f"  {k:<{width}}  {v:.4f}{extra}")
        hint = self.underfit_hint()
        if hint:
            lines.append(hint)
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)

    def underfit_hint(self) -> str:
        """A hint when the network clearly trails the MLlib baseline (by :data:`TRAILS`), else "".

        The usual cause on a small table is too few optimizer steps: the
        defaults (a few epochs of large batches) suit tables of many thousand
        rows.
        """
        trailing = []
        for key, model in self.test.items():
            base, metric = self.baseline.get(key), key.rsplit("_", 1)[-1]
            if base is None or metric not in TRAILS or model != model:
                continue
            higher, margin = TRAILS[metric]
            if (base - model > margin) if higher else (model > base * (1 + margin)):
                trailing.append(f"{key} {model:.4f} against {base:.4f}")
        if not trailing:
            return ""
        return (f"hint: the network trails Spark MLlib {self.baseline_model} ({'; '.join(trailing)}) after "
                f"{len(self.history)} epoch{'s' if len(self.history) != 1 else ''}. On a small table that is "
                "often too few optimizer steps: raise train.epochs (e.g. --set train.epochs=30) or "
                "train.learning_rate, or lower train.batch_size")


#: metric -> (higher is better, how far behind the baseline counts as trailing: absolute when higher is better,
#: relative when lower is)
TRAILS = {"auc": (True, 0.05), "accuracy": (True, 0.05), "r2": (True, 0.1), "rmse": (False, 0.25)}


__all__ = ["TRAILS", "TrainResult"]
