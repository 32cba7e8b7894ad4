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
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)


__all__ = ["TrainResult"]
