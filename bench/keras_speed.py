"""Keras against torch on flights, same network, batch and workers, in one run.

Usage (from the repo root, after ``sparktrain preprocess conf/flights.yaml``)::

    PYTHONPATH=python .venv/bin/python bench/keras_speed.py [--dataset work/flights/dataset] [--repeats 3]

Rows: torch 2 workers (DDP), Keras 2 workers with gloo all-reduce (the
default), Keras 2 workers under MultiWorkerMirroredStrategy (TF's own
all-reduce), Keras 1 worker (no collectives: what the step costs alone).
Each is the training loop's samples/s of the second epoch of a 2-epoch fit,
median of ``--repeats`` interleaved runs with min-max; the goal is Keras 2
workers >= 0.5x torch 2 workers, per repeat.  Results go to
``work/bench/keras_speed.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchlib import Results, met_at_least, ratios  # noqa: E402


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default=str(REPO / "work" / "flights" / "dataset"))
    ap.add_argument("--label", default="late")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from sparktrain.session import get_or_create_session
    from sparktrain.train.estimator import KerasEstimator, TorchEstimator

    if not Path(args.dataset).exists():
        print(f"no dataset at {args.dataset}: run `make demo` (or sparktrain preprocess conf/flights.yaml) first")
        return 2
    get_or_create_session("local[2]").sparkContext.setLogLevel("ERROR")
    rows = {"torch x2 (DDP)": (TorchEstimator, 2, "auto"), "keras x2 (gloo)": (KerasEstimator, 2, "auto"),
            "keras x2 (MWMS)": (KerasEstimator, 2, "mwms"), "keras x1": (KerasEstimator, 1, "auto")}
    runs: Dict[str, List[float]] = {k: [] for k in rows}
    for rep in range(args.repeats):
        for name, (cls, workers, backend) in rows.items():
            est = cls(numWorkers=workers, epochs=2, batchSize=512, labelCol=args.label, learningRate=0.002,
                      backend=backend, store=str(REPO / "work" / "bench" / "keras-store"))
            est.show_progress = False
            runs[name].append(est.fit(args.dataset).history[-1]["samples_per_s"])
        print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in runs.items()), flush=True)
    res = Results("keras_speed", {"dataset": "flights", "epochs": 2, "batch": 512, "repeats": args.repeats,
                                  "master": "local[2]"},
                  title="Keras vs torch on flights: training-loop samples/s, 2nd epoch, batch 512 per worker")
    for name, v in runs.items():
        res.add(f"{name}: samples/s", v, "samples/s", digits=0)
    gloo = ratios(runs["keras x2 (gloo)"], runs["torch x2 (DDP)"])
    res.goal("keras x2 (gloo) / torch x2", gloo, ">= 0.5", met_at_least(gloo, 0.5))
    res.add("keras x2 (MWMS) / torch x2", ratios(runs["keras x2 (MWMS)"], runs["torch x2 (DDP)"]), "ratio")
    res.add("keras x2 (gloo) / keras x1", ratios(runs["keras x2 (gloo)"], runs["keras x1"]), "ratio")
    res.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
