"""Where a single-task trial's overhead goes: a profile, before and after the fixes, in ms per trial.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/tune_profile.py [--trials 20] [--parallelism 2] [--sleep 0.5] \
        [--repeats 3] [--cprofile]

Both variants run ``--repeats`` searches of ``--trials`` single-task trials
(:func:`sparktrain.tune.search.run_search` with an objective of ``--sleep``
seconds, TPE, tracking off: bench/tune.py's part 1), each search in its own
process (a fresh JVM and Python worker daemon) after an untimed warm-up, the
two variants alternating (which goes first, too):

* **before**: a new DataFrame planned for every trial (``_stage.PLAN_ONCE = False``)
  and no ``gc.freeze()`` in the Python workers (``SPARKTRAIN_GC_FREEZE=0``);
* **after**: one planned job per search thread, reused; the worker daemon and
  each trial task freeze what was imported.

Per trial it splits the time, from wall-clock timestamps on one host:

* *driver, until the job is submitted*: the runner's call to the job's
  submission (Spark's status store): the DataFrame, its UDF, analysis and planning;
* *submitted -> objective starts*: scheduling, task launch, a free Python
  worker (one still in its after-task ``gc.collect()`` is not free), the task's
  function and the trial's callable unpickled;
* *objective -> job completed*, *job completed -> runner returns*: the
  result row back to the driver;
* *search loop, per trial*: the rest of the trial's wall on the driver (engine
  ask and tell, records, thread hand-off);
* *worker gc.collect() after the task*: full collections in the trial's
  Python worker, measured with ``gc.callbacks`` (off the trial's own clock, but
  it holds the worker the next trial needs);
* *overhead per trial*: ``wall * parallelism / trials - sleep``, as bench/tune.py reports it;
* a *training* trial's own driver work before its job (the same code in
  both variants): its plan (estimator, inputs, worker spec) and ``record_run``
  (its ``run.json`` in the store), on bench/tune.py's synthetic dataset.
  MLflow child runs are logged on the tracker's own thread, off the trial's path.

Each cell is the median over the repeats of the per-search median (overhead:
of the per-search value), with the range over the repeats.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

ROWS = [("driver_submit", "driver, until the job is submitted"),
        ("to_objective", "submitted -> objective starts (task launch, worker)"),
        ("objective_end", "objective end -> job completed"),
        ("result", "job completed -> runner returns (result)"),
        ("loop", "search loop, per trial (ask, tell, records)"),
        ("worker_gc", "worker gc.collect() after the task"),
        ("overhead", "overhead per trial (wall x p / trials - sleep)"),
        ("train_plan", "training trial, driver: its plan (estimator, inputs, spec)"),
        ("train_record", "training trial, driver: record_run (run.json to the store)")]


def make_objective(sleep_s: float):
    """``sleep_s`` of work; reports its start and end times and its worker's full-collection time so far."""

    def objective(params: Dict[str, Any]) -> Dict[str, Any]:
        import builtins
        import gc as _gc
        import os as _os
        import time as _time

        state = getattr(builtins, "_sparktrain_bench_gc", None)
        if state is None:  # once per Python worker: time every full collection from now on
            state = builtins._sparktrain_bench_gc = {"s": 0.0, "n": 0, "t": None}

            def on_gc(phase, info):
                if phase == "start":
                    state["t"] = _time.perf_counter()
                elif state["t"] is not None and info.get("generation") == 2:
                    state["s"] += _time.perf_counter() - state["t"]
                    state["n"] += 1

            _gc.callbacks.append(on_gc)
        t0 = _time.time()
        _time.sleep(sleep_s)
        loss = (params["learning_rate"] - 0.01) ** 2 + params["batch_size"] * 1e-9
        return {"loss": loss, "t_start": t0, "t_end": _time.time(), "pid": float(_os.getpid()),
                "gc_s": state["s"], "gc_n": float(state["n"])}

    return objective


def _jobs_by_group(spark) -> Dict[str, Dict[str, float]]:
    """Submission and completion time (s since the epoch) of every finished job, by job group."""
    out: Dict[str, Dict[str, float]] = {}
    it = spark.sparkContext._jsc.sc().statusStore().jobsList(None).iterator()
    while it.hasNext():
        job = it.next()
        group = job.jobGroup()
        if not group.isDefined() or not job.submissionTime().isDefined() or not job.completionTime().isDefined():
            continue
        out[group.get()] = {"submitted": job.submissionTime().get().getTime() / 1000.0,
                            "completed": job.completionTime().get().getTime() / 1000.0}
    return out


def training_driver_costs(spark, n: int = 10) -> Dict[str, float]:
    """A training trial's own driver work before its job (``tune.mode: single``), median ms of ``n``."""
    import uuid

    import tune as bench_tune

    from sparktrain.config import parse_config
    from sparktrain.train.plan import record_run
    from sparktrain.tune._training import _TrainingPlan

    dataset = bench_tune.synthetic_dataset(spark)
    cfg = parse_config({"data": {"label": "label"}, "tracking": {"enabled": False},
                        "train": {"epochs": 1, "batch_size": 512, "num_workers": 1,
                                  "store": str(bench_tune.WORK / "store-profile")},
                        "tune": {"mode": "single", "max_trials": 1,
                                 "space": {"learning_rate": {"loguniform": [1.0e-3, 3.0e-2]}}}})
    shared = _TrainingPlan(spark, cfg, dataset, f"profile-{uuid.uuid4().hex[:8]}")
    plans, records = [], []
    for i in range(n + 1):
        t0 = time.perf_counter()
        plan = shared.single_plan({"learning_rate": 0.01}, shared.run_id(i))
        t1 = time.perf_counter()
        record_run(plan)
        if i:  # the first one warms up
            plans.append(t1 - t0)
            records.append(time.perf_counter() - t1)
    return {"train_plan": statistics.median(plans) * 1e3, "train_record": statistics.median(records) * 1e3}


def child(args) -> None:
    """One variant in this process: warm up, then ``--repeats`` timed searches; prints one JSON line."""
    import tune as bench_tune

    from sparktrain.config import parse_config
    from sparktrain.tune import _stage
    from sparktrain.tune.search import run_search

    _stage.PLAN_ONCE = args.variant == "after"
    calls: Dict[str, Dict[str, float]] = {}
    original = _stage.TrialStage.run

    def timed_run(self, call):  # the runner's call and return, by job group (the thread's local property)
        group = self.spark.sparkContext.getLocalProperty("spark.jobGroup.id")
        t0 = time.time()
        out = original(self, call)
        calls[group] = {"call": t0, "return": time.time()}
        return out

    _stage.TrialStage.run = timed_run  # type: ignore[method-assign]
    spark = bench_tune.session(args.parallelism)
    bench_tune.warm_up(spark, args.parallelism)
    objective = make_objective(args.sleep)

    def search(trials: int, seed: int):
        cfg = parse_config({"train": {"seed": seed}, "tracking": {"enabled": False},
                            "tune": {"mode": "single", "max_trials": trials, "parallelism": args.parallelism,
                                     "metric": "loss", "space": bench_tune.SPACE}})
        t0 = time.perf_counter()
        result = run_search(spark, cfg, None, objective=objective)
        return result, time.perf_counter() - t0

    search(2 * args.parallelism, 99)  # untimed: the workers import what the trials use
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
    runs: List[Dict[str, Any]] = []
    for r in range(args.repeats):
        if profiler is not None:
            profiler.enable()
        result, wall = search(args.trials, r)
        if profiler is not None:
            profiler.disable()
        jobs = _jobs_by_group(spark)
        spans: Dict[str, List[float]] = {k: [] for k, _ in ROWS if k != "overhead"}
        last_gc: Dict[float, tuple] = {}
        for t in sorted(result.trials, key=lambda t: t.metrics["t_start"]):
            m, job, call = t.metrics, jobs.get(t.job_group), calls.get(t.job_group)
            if job is None or call is None:
                continue
            spans["driver_submit"].append(job["submitted"] - call["call"])
            spans["to_objective"].append(m["t_start"] - job["submitted"])
            spans["objective_end"].append(job["completed"] - m["t_end"])
            spans["result"].append(call["return"] - job["completed"])
            spans["loop"].append(t.seconds - (call["return"] - call["call"]))
            before = last_gc.get(m["pid"])
            if before is not None and m["gc_n"] > before[1]:
                spans["worker_gc"].append((m["gc_s"] - before[0]) / (m["gc_n"] - before[1]))
            last_gc[m["pid"]] = (m["gc_s"], m["gc_n"])
        row = {k: statistics.median(v) * 1e3 for k, v in spans.items() if v}
        row["overhead"] = (wall * args.parallelism / args.trials - args.sleep) * 1e3
        row.update(training_driver_costs(spark))
        runs.append(row)
    out: Dict[str, Any] = {"variant": args.variant, "runs": runs}
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        out["cprofile"] = text.getvalue()
    print("PROFILE " + json.dumps(out), flush=True)
    spark.stop()


def run_variant(variant: str, args) -> Dict[str, Any]:
    env = dict(os.environ, SPARKTRAIN_GC_FREEZE="1" if variant == "after" else "0")
    cmd = [sys.executable, __file__, "--child", variant, "--trials", str(args.trials), "--parallelism",
           str(args.parallelism), "--sleep", str(args.sleep), "--repeats", str(args.repeats)]
    if args.cprofile:
        cmd.append("--cprofile")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("PROFILE ")]
    if not lines:
        raise SystemExit(f"variant {variant} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len("PROFILE "):])


def _cell(runs: List[Dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs if key in r]
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="also print the driver's cProfile (after)")
    ap.add_argument("--child", choices=("before", "after"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.variant = args.child
        logging.basicConfig(level=logging.WARNING)
        child(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    # one child per variant and repeat, alternating which goes first: a load that drifts hits both alike
    results: Dict[str, Dict[str, Any]] = {v: {"runs": []} for v in ("before", "after")}
    child_args = argparse.Namespace(**{**vars(args), "repeats": 1})
    for r in range(args.repeats):
        for variant in (("before", "after") if r % 2 == 0 else ("after", "before")):
            got = run_variant(variant, child_args)
            results[variant]["runs"] += got["runs"]
            if "cprofile" in got:
                results[variant]["cprofile"] = got["cprofile"]
            logging.info("repeat %d, %s: overhead %.0f ms", r + 1, variant, got["runs"][0]["overhead"])
    print(f"\nsingle-task trial profile: {args.trials} trials of a {args.sleep:g} s objective, TPE, parallelism "
          f"{args.parallelism}, local[{args.parallelism}]; ms per trial, median of {args.repeats} (range)")
    print(f"| {'where':<52} | {'before ms':>17} | {'after ms':>17} |")
    print(f"|{'-' * 54}|{'-' * 19}|{'-' * 19}|")
    for key, name in ROWS:
        print(f"| {name:<52} | {_cell(results['before']['runs'], key):>17} | "
              f"{_cell(results['after']['runs'], key):>17} |")
    before = [r["overhead"] for r in results["before"]["runs"]]
    after = [r["overhead"] for r in results["after"]["runs"]]
    ratio = statistics.median(before) / max(statistics.median(after), 1e-3)
    print(f"overhead per trial: {statistics.median(after):.0f} ms after vs {statistics.median(before):.0f} ms "
          f"before ({ratio:.1f}x less; goal < 200 ms)")
    from benchlib import Results, met_at_least, met_at_most, ratios

    res = Results("tune_profile", {"trials": args.trials, "parallelism": args.parallelism, "sleep_s": args.sleep,
                                   "repeats": args.repeats},
                  title=f"single-task trial profile, {args.trials} trials of a {args.sleep:g} s objective")
    for key, name in ROWS:
        for variant in ("before", "after"):
            runs = [r[key] for r in results[variant]["runs"] if key in r]
            if runs:
                res.add(f"{name}, {variant}", runs, "ms", digits=0)
    res.goal("single-task trial overhead after the fixes (ms)", after, "< 200 ms", met_at_most(after, 200.0),
             digits=0)
    less = ratios(before, after)
    res.goal("single-task trial overhead, before / after", less, ">= 1 (less)", met_at_least(less, 1.0), digits=1)
    res.note("before: a DataFrame planned per trial, no gc.freeze() in the Python workers; after: one planned "
             "job per search thread, the daemon's and the trials' imports frozen.")
    print(f"results: {res.write()}")
    if "cprofile" in results["after"]:
        print("\ndriver cProfile (after), cumulative:\n" + results["after"]["cprofile"])


if __name__ == "__main__":
    main()
