"""Keras (MWMS) against torch (DDP) on flights, same network, batch and workers, in one run.

Usage (from the repo root, after ``sparktrain preprocess conf/flights.yaml``)::

    PYTHONPATH=python .venv/bin/python bench/keras_speed.py [--dataset work/flights/dataset] [--repeats 3]

Rows: torch 2 workers, Keras 2 workers, Keras 1 worker (no collectives: what
the step costs without TF's all-reduce).  Each is the samples/s of the second
epoch of a 2-epoch fit, median of ``--repeats`` interleaved runs with min-max;
the goal is Keras 2 workers >= 0.5x torch 2 workers.  Results go to
``work/bench/keras_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default=str(REPO / "work" / "flights" / "dataset"))
    ap.add_argument("--label", default="late")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from sparktrain.session import get_or_create_session
    from sparktrain.train.estimator import KerasEstimator, TorchEstimator

    get_or_create_session("local[2]").sparkContext.setLogLevel("ERROR")
    rows = {"torch x2": (TorchEstimator, 2), "keras x2": (KerasEstimator, 2), "keras x1": (KerasEstimator, 1)}
    runs: Dict[str, List[float]] = {k: [] for k in rows}
    for _ in range(args.repeats):
        for name, (cls, workers) in rows.items():
            est = cls(numWorkers=workers, epochs=2, batchSize=512, labelCol=args.label, learningRate=0.002,
                      store=str(REPO / "work" / "bench" / "keras-store"))
            est.show_progress = False
            runs[name].append(est.fit(args.dataset).history[-1]["samples_per_s"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{'run':<10} {'samples/s (median)':>20} {'min-max':>22}")
    for k, v in runs.items():
        print(f"{k:<10} {med[k]:>20,.0f} {min(v):>10,.0f}-{max(v):<10,.0f}")
    ratio = med["keras x2"] / med["torch x2"]
    print(f"keras / torch (2 workers): {ratio:.2f} (goal >= 0.5: {'met' if ratio >= 0.5 else 'not met'}); "
          f"keras 2 workers / 1 worker: {med['keras x2'] / med['keras x1']:.2f}")
    out = REPO / "work" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "keras_speed.json").write_text(json.dumps({"runs": runs, "median": med, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
