"""GPU benchmark: fp32 against bf16 on one GPU, and one GPU against the CPU, on flights at scale 10.

Runs only where CUDA is present (it prints why and exits 0 elsewhere).  One
``local[2]`` session whose tasks each get one GPU through Spark's resources
(``spark.driver.resource.gpu.*`` with a discovery script written here and
``spark.task.resource.gpu.amount=1``), so the rank takes its device from its
task, as on a cluster.  Per run: samples/s of the training loop, fit -> first
step, and the share of the epoch the rank spent waiting for its input
(``input_wait_share``).  Interleaved repeats; medians with min-max.

Usage::

    PYTHONPATH=python .venv/bin/python bench/gpu.py [--repeats 3] [--scale 10] [--batch 4096]

Results: ``work/bench/gpu.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchlib import Results, fmt_spread, ratios  # noqa: E402


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _discovery_script(work: Path, count: int) -> str:
    path = work / "gpus.sh"
    addresses = ", ".join(f'\\"{i}\\"' for i in range(count))
    path.write_text(f'#!/bin/bash\necho "{{\\"name\\": \\"gpu\\", \\"addresses\\": [{addresses}]}}"\n')
    path.chmod(0o755)
    return str(path)


def run(path: str, store: str, gpus: int, precision: str, batch: int, epochs: int) -> dict:
    from sparktrain.train.estimator import TorchEstimator

    est = TorchEstimator(numWorkers=1, gpusPerWorker=gpus, precision=precision, batchSize=batch, epochs=epochs,
                         labelCol="label", store=store, shuffleBuffer=65536)
    est.show_progress = False
    model = est.fit(path)
    launch = est.last_launch
    last = model.history[-1]
    return {"samples_per_s": last["samples_per_s"], "first_step_s": launch.fit_to_first_step_s,
            "input_wait_share": last.get("input_wait_share"), "device": launch.devices.get(0, {}).get("device")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    count = _cuda_devices()
    if not count:
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False): skipped")
        return 0

    from sparktrain.config import load_config
    from sparktrain.job import run_preprocess
    from sparktrain.session import get_or_create_session

    work = REPO / "work" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    spark = get_or_create_session("local[2]", conf={
        "spark.driver.resource.gpu.amount": str(count),
        "spark.driver.resource.gpu.discoveryScript": _discovery_script(work, count),
        "spark.task.resource.gpu.amount": "1"})
    cfg = load_config(REPO / "conf" / "flights.yaml",
                      overrides=[f"data.scale={args.scale}", "tracking.enabled=false",
                                 f"output.path={work / f'flights-x{args.scale}'}"])
    from sparktrain.train.inputs import read_features_json

    if read_features_json(cfg.output.path) is None:  # no committed dataset there yet
        run_preprocess(spark, cfg)
    store = str(work / "gpu-store")
    names = {"cpu": ("CPU, fp32", 0, "fp32"), "gpu": ("1 GPU, fp32", 1, "fp32"), "bf16": ("1 GPU, bf16", 1, "bf16")}
    runs: dict = {k: [] for k in names}
    run(cfg.output.path, store, 1, "fp32", args.batch, 1)  # warm-up: CUDA context, Python workers
    for rep in range(args.repeats):
        for key, (_, gpus, precision) in names.items():
            runs[key].append(run(cfg.output.path, store, gpus, precision, args.batch, args.epochs))
        print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]['samples_per_s']:,.0f}/s on {v[-1]['device']}"
                                                 for k, v in runs.items()), flush=True)

    res = Results("gpu", {"scale": args.scale, "batch": args.batch, "epochs": args.epochs, "repeats": args.repeats},
                  title=f"flights x{args.scale}, 1 worker, batch {args.batch}, {args.epochs} epochs")

    def col(key: str, field: str) -> list:
        return [r[field] for r in runs[key] if r.get(field) is not None]

    for key, (name, _, _) in names.items():
        sps = res.add(f"{name}: samples/s (training loop)", col(key, "samples_per_s"), "samples/s", digits=0)
        fs = res.add(f"{name}: fit -> first step", col(key, "first_step_s"), "s", digits=1)
        wait = res.add(f"{name}: share of the epoch waiting for input", col(key, "input_wait_share"), "share")
        print(f"{name:<16} {fmt_spread(sps, 0):>28} samples/s  first step {fmt_spread(fs, 1)} s  "
              f"input wait {fmt_spread(wait)}")
    res.add("bf16 / fp32 on the GPU (samples/s)", ratios(col("bf16", "samples_per_s"), col("gpu", "samples_per_s")),
            "ratio")
    res.add("GPU / CPU, fp32 (samples/s)", ratios(col("gpu", "samples_per_s"), col("cpu", "samples_per_s")), "ratio")
    res.write()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
