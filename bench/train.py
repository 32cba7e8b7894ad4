"""Training benchmark: our barrier launcher against Spark's TorchDistributor, in one run.

Same model (the default embeddings + MLP), same data, same epochs:

* time from ``fit`` to the first training step, and the whole fit;
* samples/s with 2 workers x 1 thread against 1 worker x 2 threads;
* plain torch in one process streaming the same Parquet (the ceiling);
* KerasEstimator with 2 workers (gloo all-reduce): its training-loop samples/s against torch's;
* with ``--flights``: test AUC on flights against Spark MLlib LogisticRegression.

Usage::

    PYTHONPATH=python .venv/bin/python bench/train.py [--rows 1000000] [--epochs 2] [--repeats 3] [--flights]

The runs are interleaved (one of each per repeat) and the table shows medians
with min-max; ratios are medians of the per-repeat ratios.  Results:
``work/bench/train.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchlib import Results, fmt_spread, met_at_least, met_at_most, ratios  # noqa: E402

BATCH = 1024


def make_dataset(spark, root: Path, rows: int) -> str:
    """16 float32 features + 2 categorical indices + a boolean label, written once."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import atomic_dir, write_parquet

    path = root / f"synthetic-{rows}"
    if (path / "train" / "_manifest.json").is_file():
        return str(path)
    cols = [(F.rand(i) * 2 - 1).cast("float").alias(f"x{i}") for i in range(16)]
    df = spark.range(rows, numPartitions=4).select(
        *cols, (F.col("id") % 31).cast("int").alias("c0"), (F.col("id") % 7).cast("int").alias("c1"))
    df = df.withColumn("label", (F.col("x0") + F.col("x1") - F.col("x2") + (F.col("c1") == 3).cast("float")) > 0)
    with atomic_dir(str(path)) as staging:
        write_parquet(df, os.path.join(staging, "train"))
    return str(path)


def ours(spark, path: str, workers: int, epochs: int, threads: int, store: str, framework: str = "torch"):
    from sparktrain.train.estimator import KerasEstimator, TorchEstimator

    os.environ["SPARKTRAIN_TORCH_THREADS"] = str(threads)
    cls = KerasEstimator if framework == "keras" else TorchEstimator
    est = cls(numWorkers=workers, epochs=epochs, batchSize=BATCH, labelCol="label", store=store,
                         logEverySteps=20)
    est.show_progress = False
    t0 = time.perf_counter()
    model = est.fit(path)
    total = time.perf_counter() - t0
    del os.environ["SPARKTRAIN_TORCH_THREADS"]
    launch = est.last_launch
    rows = _rows(path)
    return {"first_step_s": launch.fit_to_first_step_s, "total_s": total,
            "samples_per_s": rows * epochs / total,
            "train_samples_per_s": sum(h["samples_per_s"] for h in model.history) / len(model.history)}


def _rows(path: str) -> int:
    from sparktrain.data.manifest import read_manifest
    return read_manifest(os.path.join(path, "train"))["num_rows"]


def _train_epochs(model, path: str, inputs, epochs: int, rank: int, world: int) -> float:
    """Plain Adam/BCE loop over this rank's shard; returns the wall-clock time of the first step."""
    import time as _t

    import torch

    from sparktrain.train._executor.batches import epoch_batches

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = None
    for epoch in range(epochs):
        _, batches = epoch_batches(path + "/train", inputs, BATCH, rank, world, epoch, 42)
        for x_num, x_cat, y in batches:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(torch.from_numpy(x_num), torch.from_numpy(x_cat)).reshape(-1), torch.from_numpy(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if first is None:
                first = _t.time()
    return first if first is not None else _t.time()


def _distributor_fn(path: str, epochs: int, t_launch: float):
    """Runs inside TorchDistributor's processes: DDP on the same model and reader."""

    import torch
    import torch.distributed as dist

    from sparktrain.train._executor.spec import InputSpec, ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs = InputSpec(numeric=tuple(f"x{i}" for i in range(16)), categorical=(("c0", 31), ("c1", 7)),
                       label="label", task="binary")
    model = torch.nn.parallel.DistributedDataParallel(build_default_model(inputs, ModelSpec()))
    first_step_at = _train_epochs(model, path, inputs, epochs, rank, world)
    first = first_step_at - t_launch
    dist.barrier()
    dist.destroy_process_group()
    return first


def torch_distributor(spark, path: str, epochs: int):
    from pyspark.ml.torch.distributor import TorchDistributor

    t0 = time.perf_counter()
    first = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        _distributor_fn, path, epochs, time.time())
    total = time.perf_counter() - t0
    return {"first_step_s": first, "total_s": total, "samples_per_s": _rows(path) * epochs / total}


def single_process(path: str, epochs: int):
    """Plain torch in this process, streaming the Parquet with our reader (2 threads)."""
    import torch

    from sparktrain.train._executor.spec import InputSpec, ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model

    torch.set_num_threads(2)
    inputs = InputSpec(numeric=tuple(f"x{i}" for i in range(16)), categorical=(("c0", 31), ("c1", 7)),
                       label="label", task="binary")
    model = build_default_model(inputs, ModelSpec())
    t0 = time.perf_counter()
    _train_epochs(model, path, inputs, epochs, 0, 1)
    total = time.perf_counter() - t0
    return {"total_s": total, "samples_per_s": _rows(path) * epochs / total}


def flights(spark, cfg_path: str):
    from sparktrain.config import load_config
    from sparktrain.job import run_preprocess
    from sparktrain.job import train_stage

    cfg = load_config(cfg_path, overrides=["tracking.enabled=false"])
    from sparktrain.train.inputs import read_features_json

    if read_features_json(cfg.output.path) is None:  # no committed dataset there yet
        run_preprocess(spark, cfg)
    res = train_stage(spark, cfg, cfg.output.path)
    return res.test.get("test_auc"), res.baseline.get("test_auc")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flights", action="store_true", help="also train on flights and compare with MLlib LR")
    ap.add_argument("--config", default=str(REPO / "conf" / "flights.yaml"))
    args = ap.parse_args()

    from sparktrain.session import get_or_create_session

    spark = get_or_create_session("local[2]")
    work = REPO / "work" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    path = make_dataset(spark, work, args.rows)
    store = str(work / "store")
    print(f"data: {args.rows:,} rows x (16 float + 2 categorical), batch {BATCH}, {args.epochs} epochs, local[2]")

    ours(spark, path, 2, 1, 1, store)  # warm the Python workers once, as a long-lived cluster would be
    keras_cold = ours(spark, path, 2, 1, 1, store, framework="keras")  # the workers' first TensorFlow import
    names = {"r2": "sparktrain TorchEstimator 2 workers x 1 thr", "r1": "sparktrain TorchEstimator 1 worker x 2 thr",
             "td": "TorchDistributor(local_mode=False) 2 procs", "sp": "plain torch, 1 process, 2 threads",
             "k2": "sparktrain KerasEstimator 2 workers x 1 thr"}
    runs: dict = {k: [] for k in names}
    for rep in range(args.repeats):
        # Keras right after torch: both find the Python workers the previous fit left (a TorchDistributor run
        # replaces them; a fresh worker has torch from the daemon but must import TensorFlow: see keras_cold)
        runs["r2"].append(ours(spark, path, 2, args.epochs, 1, store))
        runs["k2"].append(ours(spark, path, 2, args.epochs, 1, store, framework="keras"))
        runs["r1"].append(ours(spark, path, 1, args.epochs, 2, store))
        runs["td"].append(torch_distributor(spark, path, args.epochs))
        runs["sp"].append(single_process(path, args.epochs))
        print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]['total_s']:.1f} s" for k, v in runs.items()),
              flush=True)

    res = Results("train", {"rows": args.rows, "epochs": args.epochs, "batch": BATCH, "repeats": args.repeats,
                            "master": "local[2]"},
                  title=f"{args.rows:,} rows x (16 float + 2 categorical), batch {BATCH}, {args.epochs} epochs")

    def col(key: str, field: str) -> list:
        return [r[field] for r in runs[key] if r.get(field) is not None]

    print()
    print(f"{'run':<44}{'fit->1st step s':>22}{'total s':>22}{'samples/s':>30}")
    for key, name in names.items():
        fs = res.add(f"{name}: fit -> first step", col(key, "first_step_s"), "s", digits=1) \
            if col(key, "first_step_s") else None
        tot = res.add(f"{name}: whole fit", col(key, "total_s"), "s", digits=1)
        sps = res.add(f"{name}: samples/s (whole fit)", col(key, "samples_per_s"), "samples/s", digits=0)
        print(f"{name:<44}{(fmt_spread(fs, 1) if fs else '-'):>22}{fmt_spread(tot, 1):>22}"
              f"{fmt_spread(sps, 0):>30}")
    print()
    launch = ratios(col("r2", "first_step_s"), col("td", "first_step_s"))
    res.goal("launch: fit -> first step, ours / TorchDistributor", launch, "<= 0.33", met_at_most(launch, 0.33))
    res.goal("whole fit, ours / TorchDistributor", ratios(col("r2", "total_s"), col("td", "total_s")), "< 1",
             met_at_most(ratios(col("r2", "total_s"), col("td", "total_s")), 1.0))
    thr = ratios(col("r2", "samples_per_s"), col("r1", "samples_per_s"))
    res.goal("throughput 2x1 / 1x2 (whole fit)", thr, ">= 0.9", met_at_least(thr, 0.9),
             note="on 2 shared cores the 1 worker x 2 threads runs fight the reader's threads and other jobs "
                  "for the cores: this ratio swings with the machine's load")
    res.add("throughput 2x1 / 1x2 (training loop only)",
            ratios(col("r2", "train_samples_per_s"), col("r1", "train_samples_per_s")), "ratio")
    keras_launch = ratios(col("k2", "first_step_s"), col("r2", "first_step_s"))
    res.goal("Keras / torch, 2 workers: fit -> first step", keras_launch, "<= 3", met_at_most(keras_launch, 3.0),
             note="Keras trains in the Python worker (TensorFlow imported once per worker, as torch is)")
    res.add("Keras 2 workers, first fit in fresh workers (imports TensorFlow): fit -> first step",
            [keras_cold["first_step_s"]], "s", digits=1)
    keras = ratios(col("k2", "train_samples_per_s"), col("r2", "train_samples_per_s"))
    res.goal("Keras / torch, 2 workers (training-loop samples/s)", keras, ">= 0.5", met_at_least(keras, 0.5))
    res.add("Keras / torch, 2 workers (whole fit, with TensorFlow's start-up)",
            ratios(col("k2", "samples_per_s"), col("r2", "samples_per_s")), "ratio")
    res.add("ours whole-fit / single process", ratios(col("r2", "samples_per_s"), col("sp", "samples_per_s")),
            "ratio")
    if args.flights:
        auc, lr_auc = flights(spark, args.config)
        print(f"\nflights test AUC: sparktrain {auc:.4f}  vs  Spark MLlib LogisticRegression {lr_auc:.4f}"
              f"  (ratio {auc / lr_auc:.3f})")
        res.add("flights test AUC: sparktrain (2 workers, torch)", [auc], "AUC", digits=4)
        res.add("flights test AUC: Spark MLlib LogisticRegression", [lr_auc], "AUC", digits=4)
        res.goal("flights test AUC, ours - MLlib LR", [auc - lr_auc], "> 0", auc > lr_auc, digits=4)
    res.note("sparktrain rows are after one untimed warm-up fit (Python workers started), as on a long-lived "
             "cluster; each TorchDistributor run starts its processes.")
    res.write()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
