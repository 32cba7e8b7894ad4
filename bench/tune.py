"""Hyperparameter search throughput: our single-task mode against hyperopt's Trials and SparkTrials.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/tune.py [--trials 20] [--parallelism 2] [--sleep 0.5] \
        [--repeats 3] [--b-trials 4] [--no-mode-b]

Part 1 runs the same objective (``time.sleep(--sleep)`` plus a tiny numpy
computation) and the same number of trials, with TPE over the same space,
through:

* **hyperopt Trials**: sequential ``fmin`` on the driver (no Spark);
* **hyperopt SparkTrials**: ``SparkTrials(parallelism=p)`` with its defaults,
  one Spark job per trial;
* **sparktrain single**: :func:`sparktrain.tune.search.run_search` with an
  ``objective`` (``tune.mode: single``), ``p`` trials at a time, tracking off.

All share one ``local[p]`` session, warmed up first (untimed).  Each row is the
median of ``--repeats`` runs: wall time, trials per minute, and the per-trial
overhead ``wall * p / trials - objective`` (for Trials, ``p = 1``), with the
ratios of SparkTrials to ours.

Part 2 (``--no-mode-b`` skips it) trains a tiny torch MLP on 20,000 synthetic
rows (cached under ``work/bench/tune/``) for one epoch per trial, in
``tune.mode: distributed`` (2 workers per trial, on a reused gang) and, for
reference, in ``single`` mode, after one untimed warm-up search each; overhead
there is ``wall * at_once / trials`` minus the epochs' own time
(``epoch_time_s``, reported by the workers).

Part 2 ends with the reused gang (:func:`part_gang`): ``--gang-trials`` distributed trials on one
reused barrier stage against a barrier stage per trial, the same search; goal: < 0.5 s overhead per
trial on the gang.

Part 3 (``--time-to-target``; ``--only-time-to-target`` runs it alone) measures
what a user wants, the time to a good model, on flights (``conf/flights.yaml``
preprocessed once into ``work/bench/tune/flights/``), single-task trials,
``--parallelism`` at a time, the same space (:data:`TTT_SPACE`) and
``--ttt-epochs`` epochs per trial for both engines, tracking off.  In each of
``--ttt-repeats`` repeats (seed = repeat):

* **Hyperopt TPE**, ``--ttt-trials`` trials, no pruning: its best final
  ``val_loss`` is the repeat's **target**;
* then **Optuna TPE + ASHA** (``reduction_factor`` 3, rungs after 1, 3, 9...
  epochs; ``--ttt-min-epochs m`` puts them at m, 3m...; ``--ttt-pruner
  hyperband|median`` swaps the pruner, the goal is ASHA's), the same seed and
  epochs per trial, searching until it has the target: ``tune.stop_at`` = the
  target, ``tune.time_budget_s`` = Hyperopt's whole search wall (it may not take longer than the search that set the
  target) and at most ``--ttt-optuna-trials`` trials.  Pruning makes a trial
  cheaper, so in the same time Optuna may try more points than Hyperopt did:
  that is what a user gains from it, and what the measure asks.

Time to target, the same check on both sides (:func:`time_to`): when the
search first had a model at ``val_loss <= target``, epoch by epoch (any
trial, finished or pruned; an epoch's end is placed from the worker's
``epoch_time_s`` before its trial's result reached the driver).  A repeat
where Optuna never gets there is reported as not reached (its ratio counts
as 0).  The table also shows the coarser measure (the first *finished* trial
at the target).  ``--ttt-epochs`` defaults to 9, so ASHA's rungs at 1 and 3
epochs stop trials that full training would run 9 epochs.

With ``--ray`` (and ``bench/peers/.venv-ray``, from ``bench/peers/setup-ray.sh``), each repeat
also runs the same search on **Ray Tune** (:func:`ray_ttt`): the same space (:data:`TTT_SPACE`),
epochs, target and time budget, ASHA with the same rungs (``--ttt-min-epochs``), Optuna's TPE as its
searcher, the same MLP built by sparktrain's executor code on the same Parquet; Ray's start and its
dataset materialization are not timed.

Hyperopt runs first in every repeat (its result sets Optuna's stop).  Goal: median of the per-repeat
ratios (Hyperopt's time to target / Optuna's) >= 2.  Results go to
``work/bench/tune_ttt.json``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
WORK = REPO / "work" / "bench" / "tune"

from benchlib import Results, met_at_least, met_at_most, ratios  # noqa: E402

log = logging.getLogger("bench.tune")

SPACE = {"learning_rate": {"loguniform": [1.0e-4, 1.0e-1]}, "batch_size": {"choice": [256, 512, 1024]}}
#: part 3's space on flights: a wide learning-rate range, so a good share of trials is clearly bad early
TTT_SPACE = {"learning_rate": {"loguniform": [1.0e-5, 1.0e-1]}, "hidden_units": {"choice": [[32], [64, 64], [128, 64]]},
             "batch_size": {"choice": [512, 1024, 2048]}, "dropout": {"uniform": [0.0, 0.3]}}
#: part 3's Optuna pruners (--ttt-pruner), as the tables name them
PRUNER_LABELS = {"asha": "ASHA", "hyperband": "Hyperband", "median": "median"}


def make_objective(sleep_s: float) -> Callable[[Dict[str, Any]], float]:
    """``sleep_s`` of "work" plus a tiny computation; a closure, so it pickles by value."""

    def objective(params: Dict[str, Any]) -> float:
        import time as _time

        import numpy as _np

        _time.sleep(sleep_s)
        x = _np.linspace(-1.0, 1.0, 10_000) * params["learning_rate"] * 100
        return float(((x - 0.3) ** 2).mean() + params["batch_size"] * 1e-6)

    return objective


def session(parallelism: int):
    from sparktrain.session import get_or_create_session

    return get_or_create_session(f"local[{parallelism}]", "bench-tune", conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": str(parallelism),
        "spark.local.dir": str(WORK / "spark-local")})


def warm_up(spark, parallelism: int) -> None:
    """Start the Python workers both Spark paths use (RDD and mapInArrow), untimed."""
    import pyarrow as pa

    def noop(batches):
        for b in batches:
            yield pa.RecordBatch.from_pylist([{"n": b.num_rows}])

    for _ in range(2):
        spark.range(0, parallelism, 1, parallelism).mapInArrow(noop, "n long").collect()
        spark.sparkContext.parallelize(range(parallelism), parallelism).map(lambda x: x).collect()


def run_trials(space, objective, trials: int, seed: int) -> float:
    from hyperopt import Trials, fmin, tpe
    import numpy as np

    t0 = time.perf_counter()
    fmin(objective, space, algo=tpe.suggest, max_evals=trials, trials=Trials(),
         rstate=np.random.default_rng(seed), show_progressbar=False)
    return time.perf_counter() - t0


def run_sparktrials(spark, space, objective, trials: int, parallelism: int, seed: int) -> float:
    from hyperopt import SparkTrials, fmin, tpe
    import numpy as np

    t0 = time.perf_counter()
    fmin(objective, space, algo=tpe.suggest, max_evals=trials,
         trials=SparkTrials(parallelism=parallelism, spark_session=spark),
         rstate=np.random.default_rng(seed), show_progressbar=False)
    return time.perf_counter() - t0


def run_ours(spark, objective, trials: int, parallelism: int, seed: int) -> float:
    from sparktrain.config import parse_config
    from sparktrain.tune.search import run_search

    cfg = parse_config({"train": {"seed": seed}, "tracking": {"enabled": False},
                        "tune": {"mode": "single", "max_trials": trials, "parallelism": parallelism,
                                 "metric": "loss", "space": SPACE}})
    t0 = time.perf_counter()
    result = run_search(spark, cfg, None, objective=objective)
    wall = time.perf_counter() - t0
    assert len(result.trials) == trials and all(t.status == "FINISHED" for t in result.trials)
    return wall


def part_one(spark, args) -> List[Dict[str, Any]]:
    from sparktrain.tune.space import compile_space

    space = compile_space(SPACE).hyperopt
    objective = make_objective(args.sleep)
    runs: Dict[str, List[float]] = {"hyperopt Trials (sequential)": [], "hyperopt SparkTrials": [],
                                    "sparktrain single": []}
    for r in range(args.repeats):
        runs["hyperopt Trials (sequential)"].append(run_trials(space, objective, args.trials, r))
        runs["hyperopt SparkTrials"].append(run_sparktrials(spark, space, objective, args.trials,
                                                            args.parallelism, r))
        runs["sparktrain single"].append(run_ours(spark, objective, args.trials, args.parallelism, r))
        log.info("repeat %d: %s", r + 1, {k: round(v[-1], 2) for k, v in runs.items()})
    rows = []
    for name, walls in runs.items():
        p = 1 if "sequential" in name else args.parallelism
        wall = statistics.median(walls)
        rows.append({"name": name, "p": p, "wall": wall, "walls": walls, "per_min": args.trials / wall * 60,
                     "overhead": wall * p / args.trials - args.sleep})
    return rows


def synthetic_dataset(spark) -> str:
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = WORK / "ds"
    if (root / "validation" / "_manifest.json").exists():
        return str(root)
    df = spark.range(20_000).select(
        "id", (F.rand(3) * 2 - 1).cast("float").alias("x1"), (F.rand(4) * 2 - 1).cast("float").alias("x2"),
        (F.col("id") % 5).cast("int").alias("c1"))
    df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2") + (F.col("c1") == 2).cast("float") * 0.8) > 0.1)
    write_parquet(df.where("id % 5 != 0").drop("id").coalesce(1), str(root / "train"), mode="overwrite")
    write_parquet(df.where("id % 5 = 0").drop("id").coalesce(1), str(root / "validation"), mode="overwrite")
    return str(root)


def part_two(spark, args) -> List[Dict[str, Any]]:
    from sparktrain.config import parse_config
    from sparktrain.tune.search import run_search

    dataset = synthetic_dataset(spark)
    rows = []
    for mode, workers, parallelism in (("single", 1, args.parallelism), ("distributed", 2, args.parallelism)):
        cfg = parse_config({
            "data": {"label": "label"}, "tracking": {"enabled": False},
            "train": {"epochs": 1, "batch_size": 512, "num_workers": workers, "store": str(WORK / "store")},
            "tune": {"mode": mode, "max_trials": args.b_trials, "parallelism": parallelism, "algo": "random",
                     "space": {"learning_rate": {"loguniform": [1.0e-3, 3.0e-2]}}}})
        run_search(spark, cfg, dataset)  # warm-up: workers import torch once
        walls, overheads, computes, trial_s = [], [], [], []
        for _ in range(args.b_repeats):
            t0 = time.perf_counter()
            result = run_search(spark, cfg, dataset)
            wall = time.perf_counter() - t0
            compute = statistics.mean(sum(e["epoch_time_s"] for e in t.history) for t in result.trials)
            walls.append(wall)
            computes.append(compute)
            trial_s.append(statistics.mean(t.seconds for t in result.trials))
            overheads.append(wall * result.concurrency / len(result.trials) - compute)
        wall = statistics.median(walls)
        rows.append({"name": f"sparktrain {mode}", "workers": workers, "at_once": result.concurrency,
                     "trials": len(result.trials), "wall": wall, "walls": walls,
                     "per_min": len(result.trials) / wall * 60, "trial_s": statistics.median(trial_s),
                     "compute": statistics.median(computes), "overhead": statistics.median(overheads),
                     "overheads": overheads})
    return rows


def part_gang(spark, args, res) -> List[Dict[str, Any]]:
    """Distributed trials on a reused gang against a barrier stage per trial (the baseline), same search.

    ``--gang-trials`` trials of 1 epoch, 2 workers each, one at a time, after an untimed warm-up of each
    way.  Per trial: ``overhead`` = wall / trials - the epochs' own time (the gang's launch and close
    amortized over the search), and ``marginal`` = the median of (trial seconds - its epoch time) over
    the trials after the first (what one more trial costs once the gang runs).
    """
    from sparktrain.config import parse_config
    from sparktrain.tune import _training
    from sparktrain.tune.search import run_search

    dataset = synthetic_dataset(spark)
    cfg = parse_config({
        "data": {"label": "label"}, "tracking": {"enabled": False},
        "train": {"epochs": 1, "batch_size": 512, "num_workers": 2, "store": str(WORK / "store")},
        "tune": {"mode": "distributed", "max_trials": args.gang_trials, "parallelism": 1, "algo": "random",
                 "space": {"learning_rate": {"loguniform": [1.0e-3, 3.0e-2]}}}})
    rows = []
    try:
        for name, reuse in (("barrier stage per trial", False), ("reused gang", True)):
            _training.REUSE_GANGS = reuse
            run_search(spark, cfg, dataset)  # warm-up: Python workers import torch
            overheads, marginals, walls = [], [], []
            for _ in range(args.b_repeats):
                t0 = time.perf_counter()
                result = run_search(spark, cfg, dataset)
                wall = time.perf_counter() - t0
                own = [sum(e["epoch_time_s"] for e in t.history) for t in result.trials]
                walls.append(wall)
                overheads.append(wall / len(result.trials) - statistics.mean(own))
                marginals.append(statistics.median(t.seconds - o for t, o in zip(result.trials[1:], own[1:])))
            rows.append({"name": name, "trials": len(result.trials), "wall": statistics.median(walls),
                         "overhead": statistics.median(overheads), "marginal": statistics.median(marginals),
                         "overheads": overheads, "marginals": marginals})
    finally:
        _training.REUSE_GANGS = True
    print(f"\ndistributed trials (2 workers, 1 epoch, one at a time, {args.gang_trials} trials, median of "
          f"{args.b_repeats}; local[{args.parallelism}])")
    print(f"| {'way':<24} | {'wall s':>7} | {'overhead s/trial':>16} | {'marginal s/trial':>16} |")
    print(f"|{'-' * 26}|{'-' * 9}|{'-' * 18}|{'-' * 18}|")
    for r in rows:
        print(f"| {r['name']:<24} | {r['wall']:>7.1f} | {r['overhead']:>16.3f} | {r['marginal']:>16.3f} |")
    base, gang = rows
    print(f"reused gang: {base['overhead'] / max(gang['overhead'], 1e-3):.1f}x less overhead per trial "
          f"({gang['overhead']:.3f} s vs {base['overhead']:.3f} s; goal < 0.5 s)")
    res.add("distributed trials, barrier stage per trial: overhead per trial", base["overheads"], "s", digits=3)
    res.add("distributed trials, reused gang: marginal overhead per trial", gang["marginals"], "s", digits=3,
            note="trial seconds - epoch time, trials after the first (the gang running)")
    res.goal("distributed trials, reused gang: overhead per trial (s)", gang["overheads"], "< 0.5 s",
             met_at_most(gang["overheads"], 0.5), digits=3,
             note=f"{args.gang_trials} trials; wall / trials - epoch time (the gang's launch and close included)")
    less = ratios(base["overheads"], gang["overheads"])
    res.goal("distributed trial overhead, per-trial stage / reused gang", less, ">= 1 (less)",
             met_at_least(less, 1.0), digits=1)
    return rows


def flights_dataset(spark) -> str:
    """conf/flights.yaml preprocessed once into work/bench/tune/flights (reused while its features.json is there)."""
    from sparktrain.config import load_config
    from sparktrain.job import run_preprocess

    out = WORK / "flights"
    from sparktrain.train.inputs import read_features_json

    if read_features_json(str(out)) is None:  # no committed dataset there yet
        cfg = load_config(REPO / "conf" / "flights.yaml", overrides=["tracking.enabled=false", f"output.path={out}"])
        t0 = time.perf_counter()
        run_preprocess(spark, cfg)
        log.info("flights preprocessed into %s in %.0f s", out, time.perf_counter() - t0)
    return str(out)


def ttt_config(engine: str, args, seed: int, study_dir: Path, target: Optional[float] = None,
               budget_s: Optional[float] = None):
    from sparktrain.config import load_config

    tune: Dict[str, Any] = {"mode": "single", "max_trials": args.ttt_trials, "parallelism": args.parallelism,
                            "metric": "val_loss", "space": TTT_SPACE, "engine": engine, "sampler": "tpe"}
    if engine == "optuna":
        name = f"ttt-{seed}-{time.time_ns()}"  # a new study each time: nothing continues
        tune.update(pruner=args.ttt_pruner, reduction_factor=3, pruner_min_epochs=args.ttt_min_epochs, study=name,
                    storage=str(study_dir / f"{name}.journal"), max_trials=args.ttt_optuna_trials,
                    stop_at=target, time_budget_s=budget_s)
    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        "tracking.enabled=false", f"output.path={WORK / 'flights'}", f"train.store={WORK / 'store-ttt'}",
        f"train.epochs={args.ttt_epochs}", f"train.seed={seed}", "train.num_workers=1"])
    from dataclasses import replace

    from sparktrain.config import TuneConfig

    return replace(cfg, tune=TuneConfig(**tune))


def epoch_times(trial) -> List[tuple]:
    """``(seconds since the search started, val_loss)`` at the end of each epoch ``trial`` trained.

    The driver sees a trial when its result arrives (``end_s``); its epoch ``k`` ended the later epochs'
    own time (``epoch_time_s``, measured by the worker) before that.  What a trial does after its last
    epoch (model export, the result's way back) is not subtracted: the same small bias on both engines.
    """
    rows = [h for h in trial.history if isinstance(h.get("val_loss"), (int, float))]
    out, later = [], 0.0
    for h in reversed(rows):
        out.append((trial.end_s - later, float(h["val_loss"])))
        later += float(h.get("epoch_time_s") or 0.0)
    return sorted(out)


def time_to(result, target: float, per_epoch: bool = True) -> Optional[float]:
    """When the search first had a model at ``val_loss <= target`` (None: never).

    ``per_epoch`` (the goal's measure, alike for both engines): the first epoch of any trial, finished or
    pruned, that reached it.  Otherwise: the first *finished* trial whose final val_loss reached it.
    """
    bound = target * (1 + 1e-9)
    if per_epoch:
        hits = [t_s for t in result.trials if t.status in ("FINISHED", "PRUNED")
                for t_s, loss in epoch_times(t) if loss <= bound]
    else:
        hits = [t.end_s for t in result.trials if t.status == "FINISHED" and t.metric is not None
                and t.metric <= bound]
    return min(hits) if hits else None


def rank_agreement(result, epoch: int) -> Optional[float]:
    """Spearman's rank correlation, over the unpruned search's trials, of val_loss after ``epoch`` epochs with
    the final val_loss: how well an early rung (ASHA's after 1 and 3 epochs) predicts the final ranking."""
    import numpy as np

    pairs = []
    for t in result.trials:
        losses = [float(h["val_loss"]) for h in t.history if isinstance(h.get("val_loss"), (int, float))]
        if t.status == "FINISHED" and len(losses) > epoch:
            pairs.append((losses[epoch - 1], losses[-1]))
    if len(pairs) < 3:
        return None
    early, final = (np.argsort(np.argsort(np.array(col))) for col in zip(*pairs, strict=True))
    return float(np.corrcoef(early, final)[0, 1])


def ray_ttt(dataset: str, model, target: float, budget_s: float, seed: int, args) -> Dict[str, Any]:
    """Ray Tune's ASHA on the same search (bench/peers/ray_bench.py, part ``ttt``, in Ray's own venv)."""
    import json
    import os
    import shutil
    import subprocess
    import tempfile

    from sparktrain.data.commit import resolve

    ray_py = REPO / "bench" / "peers" / ".venv-ray" / "bin" / "python"
    if not ray_py.exists():
        return {"error": f"no Ray venv at {ray_py.relative_to(REPO)}: run `bash bench/peers/setup-ray.sh`"}
    gen = resolve(dataset)
    scratch = Path(tempfile.mkdtemp(prefix="ray-", dir=str(WORK)))
    inputs = scratch / "inputs.json"
    inputs.write_text(json.dumps(model.inputs.to_dict()))
    cmd = [str(ray_py), str(REPO / "bench" / "peers" / "ray_bench.py"), "--train", os.path.join(gen, "train"),
           "--validation", os.path.join(gen, "validation"), "--test", os.path.join(gen, "test"),
           "--inputs", str(inputs), "--parts", "ttt", "--tune-epochs", str(args.ttt_epochs),
           "--trials", str(args.ttt_optuna_trials), "--parallelism", str(args.parallelism),
           "--ttt-target", repr(target), "--ttt-budget-s", repr(budget_s), "--seed", str(seed),
           "--ttt-space", json.dumps(TTT_SPACE), "--ttt-grace", str(args.ttt_min_epochs), "--scratch", str(scratch)]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON")}
    env.update(PYTHONPATH=str(REPO / "python"), RAY_TMPDIR=str(scratch))
    limit = budget_s * 3 + 600  # Ray's start, its datasets and the search (time_budget_s), with a margin
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"bench/peers/ray_bench.py --parts ttt did not end within {limit:.0f} s; killed"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # this call's own mkdtemp: Ray's session files, inputs.json
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT ") and '"kind": "ttt"' in line:
            return json.loads(line[len("RESULT "):])
    return {"error": f"exit {proc.returncode}: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])}


def part_three(spark, args) -> List[Dict[str, Any]]:
    from sparktrain.tune.search import format_trials, run_search

    dataset = flights_dataset(spark)
    study_dir = WORK / "studies"
    study_dir.mkdir(parents=True, exist_ok=True)
    warm = ttt_config("hyperopt", args, 99, study_dir)
    from dataclasses import replace

    run_search(spark, replace(warm, tune=replace(warm.tune, max_trials=args.parallelism),
                              train=replace(warm.train, epochs=1)), dataset)  # untimed: workers import torch
    rows = []
    for r in range(args.ttt_repeats):
        t0 = time.perf_counter()
        hyper = run_search(spark, ttt_config("hyperopt", args, r, study_dir), dataset)
        hyper_wall = time.perf_counter() - t0
        log.info("repeat %d, hyperopt:\n%s", r + 1, format_trials(hyper))
        target = hyper.best_metric
        t0 = time.perf_counter()
        opt = run_search(spark, ttt_config("optuna", args, r, study_dir, target=target, budget_s=hyper_wall), dataset)
        opt_wall = time.perf_counter() - t0
        log.info("repeat %d, optuna:\n%s", r + 1, format_trials(opt))
        hyper_ttt = time_to(hyper, target)
        opt_ttt = time_to(opt, target)
        row = {"repeat": r + 1, "target": target, "hyperopt_ttt": hyper_ttt, "hyperopt_wall": hyper_wall,
               "hyperopt_trial_ttt": time_to(hyper, target, per_epoch=False),
               "optuna_trial_ttt": time_to(opt, target, per_epoch=False),
               "optuna_ttt": opt_ttt, "optuna_wall": opt_wall, "optuna_best": opt.best_metric,
               "pruned": sum(t.status == "PRUNED" for t in opt.trials), "optuna_trials": len(opt.trials),
               "optuna_stop": opt.stop_reason,
               "rank_corr_epoch1": rank_agreement(hyper, 1), "rank_corr_epoch3": rank_agreement(hyper, 3),
               "hyperopt_epochs": sum(t.epochs for t in hyper.trials),
               "optuna_epochs": sum(t.epochs for t in opt.trials),
               "ratio": (hyper_ttt / opt_ttt) if (hyper_ttt is not None and opt_ttt) else 0.0}
        if args.ray:
            ray = ray_ttt(dataset, hyper.best_model, target, hyper_wall, r, args)
            ray_s = ray.get("ttt_s")
            row.update(ray=ray, ray_ratio=(hyper_ttt / ray_s) if (hyper_ttt is not None and ray_s) else 0.0)
        log.info("repeat %d: %s", r + 1, {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()})
        rows.append(row)
    return rows


def print_part_three(rows: List[Dict[str, Any]], args) -> None:
    label = PRUNER_LABELS[args.ttt_pruner]

    def fmt(v: Optional[float]) -> str:
        return "not reached" if v is None else f"{v:.1f}"

    print(f"\ntime to a good model on flights: up to {args.ttt_epochs} epochs a trial, single mode, "
          f"{args.parallelism} at a time; target = best val_loss of a {args.ttt_trials}-trial Hyperopt TPE search "
          f"(no pruning); Optuna TPE + {label} (first rung {args.ttt_min_epochs} epoch(s)) searches until it has the "
          f"target (at most {args.ttt_optuna_trials} "
          "trials, within Hyperopt's wall); time to target: the first epoch at or below it (first finished trial: "
          "in brackets)")
    print(f"| {'repeat':>6} | {'target':>8} | {'hyperopt to target s':>22} | {'hyperopt wall s':>15} | "
          f"{'optuna+pruner to target s':>26} | {'optuna wall s':>13} | {'optuna best':>11} | {'pruned':>10} | "
          f"{'epochs hyperopt/optuna':>22} | {'ratio':>5} |")
    print("|" + "|".join("-" * (w + 2) for w in (6, 8, 22, 15, 26, 13, 11, 10, 22, 5)) + "|")
    for x in rows:
        hyper = f"{fmt(x['hyperopt_ttt'])} ({fmt(x.get('hyperopt_trial_ttt'))})"
        opt = f"{fmt(x['optuna_ttt'])} ({fmt(x.get('optuna_trial_ttt'))})"
        print(f"| {x['repeat']:>6} | {x['target']:>8.5f} | {hyper:>22} | {x['hyperopt_wall']:>15.1f} | "
              f"{opt:>26} | {x['optuna_wall']:>13.1f} | {x['optuna_best']:>11.5f} | "
              f"{str(x['pruned']) + ' of ' + str(x.get('optuna_trials', '?')):>10} | "
              f"{str(x['hyperopt_epochs']) + ' / ' + str(x['optuna_epochs']):>22} | {x['ratio']:>5.2f} |")
    for x in rows:
        print(f"repeat {x['repeat']}: rank correlation of val_loss after 1 / 3 epochs with the final val_loss "
              f"(Hyperopt's unpruned trials): {x.get('rank_corr_epoch1') or float('nan'):.2f} / "
              f"{x.get('rank_corr_epoch3') or float('nan'):.2f}; Optuna stopped by {x.get('optuna_stop')}")
    for x in rows:
        if "ray" in x:
            ray = x["ray"]
            print(f"repeat {x['repeat']}: Ray Tune ASHA ({ray.get('searcher', '?')}): "
                  + (f"error {ray['error']}" if "error" in ray else
                     f"to target {fmt(ray.get('ttt_s'))} s, wall {ray['wall_s']:.1f} s, {ray['trials']} trials "
                     f"({ray['stopped_early']} stopped early), {ray['epochs']} epochs, best "
                     + ("none (no epoch finished)" if ray.get("best_val_loss") is None else
                        f"{ray['best_val_loss']:.5f}") + f"; ratio Hyperopt / Ray {x['ray_ratio']:.2f}"))
    ratios_ = [x["ratio"] for x in rows]
    walls = [x["hyperopt_wall"] / x["optuna_wall"] for x in rows]
    print(f"median ratio (Hyperopt's time to target / Optuna+{label}'s): {statistics.median(ratios_):.2f} (goal >= 2); "
          f"search wall, Hyperopt / Optuna+{label}: {statistics.median(walls):.2f} "
          f"({min(walls):.2f}-{max(walls):.2f})")


def record_part_three(rows: List[Dict[str, Any]], args) -> None:
    label = PRUNER_LABELS[args.ttt_pruner]
    res = Results("tune_ttt", {"trials": args.ttt_trials, "epochs": args.ttt_epochs, "parallelism": args.parallelism,
                               "repeats": args.ttt_repeats, "space": TTT_SPACE,
                               "optuna_max_trials": args.ttt_optuna_trials, "pruner": args.ttt_pruner,
                               "pruner_min_epochs": args.ttt_min_epochs,
                               "optuna_stop": "tune.stop_at = target, tune.time_budget_s = Hyperopt's wall"},
                  title=f"time to a good model on flights, {args.ttt_trials} trials of {args.ttt_epochs} epochs")
    res.add("Hyperopt TPE: time to its best val_loss (the target), first epoch there",
            [x["hyperopt_ttt"] for x in rows], "s", digits=1)
    res.add("Hyperopt TPE: search wall", [x["hyperopt_wall"] for x in rows], "s", digits=1)
    reached = [x["optuna_ttt"] for x in rows if x["optuna_ttt"] is not None]
    res.add(f"Optuna TPE + {label}: time to the target, first epoch there (repeats that reached it)", reached, "s",
            digits=1,
            note=f"reached in {len(reached)} of {len(rows)} repeats")
    res.add(f"Optuna TPE + {label}: search wall", [x["optuna_wall"] for x in rows], "s", digits=1)
    res.add(f"Optuna TPE + {label}: trials run", [x.get("optuna_trials", 0) for x in rows], "trials", digits=0)
    res.add(f"Optuna TPE + {label}: trials pruned", [x["pruned"] for x in rows], "trials", digits=0)
    res.add("rank correlation, val_loss after 1 epoch vs final (Hyperopt's trials)",
            [x["rank_corr_epoch1"] for x in rows if x.get("rank_corr_epoch1") is not None], "rho", digits=2)
    res.add("rank correlation, val_loss after 3 epochs vs final (Hyperopt's trials)",
            [x["rank_corr_epoch3"] for x in rows if x.get("rank_corr_epoch3") is not None], "rho", digits=2)
    res.add("epochs trained: Hyperopt", [x["hyperopt_epochs"] for x in rows], "epochs", digits=0)
    res.add(f"epochs trained: Optuna + {label}", [x["optuna_epochs"] for x in rows], "epochs", digits=0)
    if any("ray" in x for x in rows):
        how = "; ".join(str(x["ray"].get("searcher") or x["ray"].get("error")) for x in rows if "ray" in x)
        res.add("Ray Tune ASHA: time to target / Hyperopt's (ratio Hyperopt / Ray; 0 = not reached)",
                [x.get("ray_ratio", 0.0) for x in rows], "x", digits=2, note=how[:300])
    ratio = [x["ratio"] for x in rows]
    res.goal(f"time to target, Hyperopt TPE / Optuna TPE + {label}", ratio, ">= 2", met_at_least(ratio, 2.0), digits=2,
             basis="median of per-repeat ratios; a repeat where Optuna never reached the target counts as 0")
    res.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.5, help="seconds of 'work' in the objective")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--b-trials", type=int, default=4, help="trials per run in part 2")
    ap.add_argument("--b-repeats", type=int, default=3, help="timed runs per mode in part 2")
    ap.add_argument("--no-mode-b", action="store_true", help="skip part 2 (training trials)")
    ap.add_argument("--gang-trials", type=int, default=12, help="trials per run of part 2's reused-gang rows")
    ap.add_argument("--time-to-target", action="store_true", help="also run part 3 (time to a good model, flights)")
    ap.add_argument("--only-time-to-target", action="store_true", help="run part 3 alone")
    ap.add_argument("--ttt-trials", type=int, default=16, help="trials per search in part 3")
    ap.add_argument("--ttt-epochs", type=int, default=9, help="epochs per (unpruned) trial in part 3")
    ap.add_argument("--ttt-repeats", type=int, default=3)
    ap.add_argument("--ttt-min-epochs", type=int, default=1,
                    help="part 3: ASHA's first rung (tune.pruner_min_epochs), in epochs; rungs at m, 3m, 9m...")
    ap.add_argument("--ttt-pruner", choices=sorted(PRUNER_LABELS), default="asha",
                    help="part 3: Optuna's pruner (the goal is ASHA's; the others test docs/tuning.md's advice)")
    ap.add_argument("--ray", action="store_true", help="part 3 also runs Ray Tune's ASHA (bench/peers/.venv-ray)")
    ap.add_argument("--ttt-optuna-trials", type=int, default=64,
                    help="at most this many Optuna trials in part 3 (it stops at the target or Hyperopt's wall)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "hyperopt", "sparktrain"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    WORK.mkdir(parents=True, exist_ok=True)
    spark = session(args.parallelism)
    warm_up(spark, args.parallelism)
    if args.only_time_to_target:
        rows_c = part_three(spark, args)
        print_part_three(rows_c, args)
        record_part_three(rows_c, args)
        spark.stop()
        return

    rows = part_one(spark, args)
    ideal = args.trials * args.sleep / args.parallelism
    print(f"\n{args.trials} trials of a {args.sleep:g} s objective, TPE, parallelism {args.parallelism} "
          f"(ideal wall {ideal:.1f} s), median of {args.repeats}")
    print(f"| {'runner':<30} | {'p':>2} | {'wall s':>7} | {'trials/min':>10} | {'overhead s/trial':>16} |")
    print(f"|{'-' * 32}|{'-' * 4}|{'-' * 9}|{'-' * 12}|{'-' * 18}|")
    for r in rows:
        print(f"| {r['name']:<30} | {r['p']:>2} | {r['wall']:>7.1f} | {r['per_min']:>10.1f} | "
              f"{r['overhead']:>16.3f} |")
    spark_trials, ours = rows[1], rows[2]
    print(f"\nsparktrain single vs SparkTrials: {ours['per_min'] / spark_trials['per_min']:.1f}x trials/min, "
          f"overhead {spark_trials['overhead'] / max(ours['overhead'], 1e-3):.1f}x lower "
          f"({ours['overhead']:.3f} s vs {spark_trials['overhead']:.3f} s per trial; goal < 0.2 s)")
    print("all walls (s): " + "; ".join(f"{r['name']}: {', '.join(f'{w:.1f}' for w in r['walls'])}" for r in rows))
    res = Results("tune", {"trials": args.trials, "parallelism": args.parallelism, "sleep_s": args.sleep,
                           "repeats": args.repeats, "b_trials": args.b_trials, "b_repeats": args.b_repeats},
                  title=f"{args.trials} trials of a {args.sleep:g} s objective, TPE, parallelism {args.parallelism}")
    for r in rows:
        res.add(f"{r['name']}: trials/min", [args.trials / w * 60 for w in r["walls"]], "trials/min", digits=1)
        res.add(f"{r['name']}: overhead per trial", [w * r["p"] / args.trials - args.sleep for w in r["walls"]],
                "s", digits=3)
    spark_walls, our_walls = rows[1]["walls"], rows[2]["walls"]
    res.goal("sparktrain single: overhead per trial (s)",
             [w * args.parallelism / args.trials - args.sleep for w in our_walls], "< 0.2 s",
             met_at_most([w * args.parallelism / args.trials - args.sleep for w in our_walls], 0.2), digits=3)
    res.goal("trials/min, sparktrain single / SparkTrials", ratios(spark_walls, our_walls), ">= 1 (faster)",
             met_at_least(ratios(spark_walls, our_walls), 1.0), digits=1)

    if not args.no_mode_b:
        rows_b = part_two(spark, args)
        print(f"\ntraining trials: tiny torch MLP, 16k train / 4k validation rows, 1 epoch, local[{args.parallelism}]")
        print(f"| {'mode':<24} | {'workers/trial':>13} | {'at once':>7} | {'trials':>6} | {'wall s':>7} | "
              f"{'trials/min':>10} | {'s/trial':>7} | {'epoch s':>7} | {'overhead s/trial':>16} |")
        print(f"|{'-' * 26}|{'-' * 15}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 12}|{'-' * 9}|{'-' * 9}|{'-' * 18}|")
        for r in rows_b:
            print(f"| {r['name']:<24} | {r['workers']:>13} | {r['at_once']:>7} | {r['trials']:>6} | "
                  f"{r['wall']:>7.1f} | {r['per_min']:>10.1f} | {r['trial_s']:>7.2f} | {r['compute']:>7.2f} | "
                  f"{r['overhead']:>16.2f} |")
        print("s/trial: launch to result on the driver; epoch s: the epochs' own time (epoch_time_s, from the "
              "workers); overhead: wall x at-once / trials - epoch s (Spark job or barrier stage, process group, "
              "reader setup, checkpoints)")
        for r in rows_b:
            res.add(f"training trials, {r['name']} ({r['workers']} worker(s)/trial): overhead per trial",
                    r["overheads"], "s", digits=2,
                    note=f"{r['trials']} trials, {r['at_once']} at once; wall x at-once / trials - epoch time")
            res.add(f"training trials, {r['name']}: wall", r["walls"], "s", digits=1)
        part_gang(spark, args, res)
    res.note("Overhead per trial = wall x parallelism / trials - the objective's own time.")
    res.write()
    if args.time_to_target:
        rows_c = part_three(spark, args)
        print_part_three(rows_c, args)
        record_part_three(rows_c, args)
    spark.stop()


if __name__ == "__main__":
    main()
