"""Hyperparameter search on Spark: :func:`run_search` and the job's ``tune`` stage.

``tune.mode: single`` runs each trial as one Spark task training a one-worker
model from the materialized Parquet (by path), ``tune.parallelism`` trials at
a time, each its own small Spark job in its own job group.  ``tune.mode:
distributed`` runs each trial as a barrier-mode fit of ``train.num_workers``
workers on a reused gang (one barrier stage that runs trial after trial,
:mod:`sparktrain.train.gang`), as many trials at once as the slots allow, a gang each.  Both feed the engine
(``tune.engine``: Hyperopt TPE/random, or an Optuna study with TPE, random or
CMA-ES) result by result, prune trials from their per-epoch metrics
(``tune.pruner``, Optuna), stop early after ``tune.early_stop_trials``
trials without improvement, cancel a trial's Spark jobs past
``tune.trial_timeout_s``, log each trial as an MLflow child run and register
the best model with the alias ``champion``.  An Optuna study persists (a
journal file under ``train.store``, or ``tune.storage``): rerunning the same
search continues it.

Examples
--------
>>> from sparktrain.config import load_config                        # doctest: +SKIP
>>> cfg = load_config("conf/job.yaml")                              # doctest: +SKIP
>>> result = run_search(spark, cfg, cfg.output.path)                 # doctest: +SKIP
>>> print(format_trials(result))                                     # doctest: +SKIP
>>> result.best_params, result.best_model                            # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Dict, Optional, Tuple

from sparktrain._internal import spark_compat
from sparktrain.config import JobConfig, TuneConfig
from sparktrain.errors import ConfigError, TuneError
from sparktrain.features.load import Embedded
from sparktrain.tune._channel import open_channel
from sparktrain.tune._engines import check_pruning, check_sampler, make_engine
from sparktrain.tune._loop import Listener, SearchLoop
from sparktrain.tune.result import FAILED, FINISHED, KILLED, PRUNED, SearchResult, TrialRecord, format_trials, goal_of
from sparktrain.tune.space import CompiledSpace, compile_space, describe

log = logging.getLogger(__name__)

Objective = Callable[[Dict[str, Any]], Any]


def check_search(cfg: JobConfig, objective: bool = False) -> Tuple[CompiledSpace, str]:
    """``(compiled space, goal)`` of ``cfg.tune``, checked without Spark: the space, the metric, the pruner
    against ``max_trials`` and epochs, the sampler against the space.

    :func:`sparktrain.job.run_job` calls it before any stage runs, so a bad
    ``tune:`` section fails before profile, preprocess and train, not after them.

    Raises
    ------
    ConfigError
        No ``tune:`` section, or one the search would refuse (the key, the value and the fix).
    """
    if cfg.tune is None:
        raise ConfigError("tune", None, "add a tune: section with at least a space:, e.g. "
                                        "{space: {learning_rate: {loguniform: [1.0e-4, 1.0e-2]}}}")
    tune: TuneConfig = cfg.tune
    space = compile_space(tune.space)
    goal = goal_of(tune.metric)
    check_pruning(tune, cfg, space, objective=objective)
    check_sampler(tune, space)
    return space, goal


def run_search(spark, cfg: JobConfig, dataset_path: Optional[str], parent_run_id: Optional[str] = None,
               tracking_uri: Optional[str] = None, objective: Optional[Objective] = None,
               register: Optional[bool] = None, embedded: Optional[Embedded] = None) -> SearchResult:
    """Search ``cfg.tune.space`` by training on the materialized dataset at ``dataset_path``.

    Parameters
    ----------
    spark : SparkSession
        Classic or Spark Connect.
    cfg : JobConfig
        Needs ``train:`` (the starting point) and ``tune:`` sections.
    dataset_path : str
        A materialized dataset (``train/`` and ``validation/`` Parquet splits).
        Unused with ``objective``.
    parent_run_id : str, optional
        The job's MLflow run; trials become its child runs.  Without it (and
        with tracking enabled) a parent run is created in ``tracking.experiment``.
    tracking_uri : str, optional
        MLflow tracking URI; defaults to ``tracking.uri`` when ``tracking.enabled``.
        With neither, nothing is logged.
    objective : callable, optional
        Instead of training, run ``objective(params) -> float | dict`` in one
        Spark task per trial (single-task mode; ``params`` are the sampled
        ``train.*`` values).  A number is the loss; a dict must hold
        ``tune.metric`` or ``loss``.  It must be picklable and should import
        heavy modules inside the function.
    register : bool, optional
        Register the best model (default: ``tracking.register``).
    embedded : mapping, optional
        The datasets ``data.source`` may name instead of a path, for the
        registered model's input example (the job passes :data:`sparktrain.datasets.EMBEDDED`).

    Returns
    -------
    SearchResult
        Every trial (failed and killed ones too), the best params, metric and model.

    Raises
    ------
    TuneError
        When every trial failed (with the first failure's message).
    ConfigError, PreflightError
        Before any trial runs, for a bad space, metric or cluster.
    """
    space, goal = check_search(cfg, objective=objective is not None)
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]  # check_search refuses None
    prefix = f"tune-{uuid.uuid4().hex[:8]}"
    mode = "objective" if objective is not None else tune.mode
    tracker = None
    if tracking_uri or cfg.tracking.enabled:  # the tracking preflight comes first: fail before any compute
        from sparktrain.tune._tracking import TrialTracker

        tracker = TrialTracker(cfg, tracking_uri=tracking_uri, parent_run_id=parent_run_id)
    t0 = time.perf_counter()
    failed = True
    runner: Any = None
    try:
        runner, concurrency = _make_runner(spark, cfg, dataset_path, objective, prefix)
        engine = make_engine(space, cfg, goal, seed=(cfg.train.seed if cfg.train else 0), dataset_path=dataset_path,
                             tracking_uri=tracking_uri)
        to_run = tune.max_trials - engine.previous
        log.info("tuning %s over %s: %d trials, mode %s, %d at a time, %s %s%s (%simize %s)", cfg.name,
                 describe(space), to_run, mode, concurrency, tune.engine, tune.effective_sampler,
                 f", pruner {tune.pruner}" if tune.pruner != "none" else "", goal, tune.metric)
        loop = SearchLoop(spark, space, runner, metric=tune.metric, goal=goal, max_trials=to_run,
                          concurrency=concurrency, early_stop_trials=tune.early_stop_trials,
                          timeout_s=tune.trial_timeout_s, listener=tracker or Listener(), prefix=prefix,
                          engine=engine, time_budget_s=tune.time_budget_s, stop_at=tune.stop_at)
        try:
            records = _with_run_ids(loop.run(), tracker)
        finally:
            _close_runner(runner)  # the gangs end, the channel closes
        if loop.best is None:
            raise TuneError(_all_failed_message(records))
        best_record, best_outcome = loop.best
        best_record = next(r for r in records if r.number == best_record.number)  # with its run id
        from sparktrain.tune._training import materialize_model

        model = materialize_model(best_outcome.model if best_outcome else None)
        test = _test_metrics(spark, model, dataset_path)
        result = SearchResult(
            trials=tuple(records), best_params=dict(best_record.params), best_metric=float(best_record.metric),
            best_number=best_record.number, best_model=model, test_metrics=test, metric=tune.metric, goal=goal,
            mode=mode, concurrency=concurrency, stopped_early=loop.stopped_early, stop_reason=loop.stop_reason,
            seconds=time.perf_counter() - t0, parent_run_id=tracker.parent_run_id if tracker else None,
            engine=engine.name, study=getattr(engine, "study_name", None), previous_trials=engine.previous)
        if tracker is not None:
            settings = {"mode": mode, "max_trials": tune.max_trials, "parallelism": concurrency,
                        "algo": tune.algo, "metric": tune.metric, "early_stop_trials": tune.early_stop_trials,
                        "trial_timeout_s": tune.trial_timeout_s, "time_budget_s": tune.time_budget_s,
                        "stop_at": tune.stop_at, "stop_reason": loop.stop_reason, **engine.settings()}
            tracker.log_summary(records, tune.metric, goal, settings, best_run_id=best_record.run_id, test=test)
            if (model is not None and dataset_path is not None and best_record.run_id
                    and (cfg.tracking.register if register is None else register)):
                from sparktrain.tune._tracking import register_best

                registered = register_best(spark, tracker, cfg, model, dataset_path, best_record.run_id,
                                           {**best_record.metrics, **test}, embedded=embedded)
                if registered is not None:
                    result = replace(result, model_version=registered[0], model_champion=registered[1])
        failed = False
        return result
    finally:
        _close_runner(runner)
        if tracker is not None:
            tracker.close(failed=failed)


def _close_runner(runner: Any) -> None:
    close = getattr(runner, "close", None)
    if close is not None:
        close()
    channel = getattr(getattr(runner, "plan", None), "channel", None)
    if channel is not None:
        channel.close()


def tune_stage(spark, cfg: JobConfig, dataset_path: str, parent_run_id: Optional[str] = None,
               tracking_uri: Optional[str] = None, embedded: Optional[Embedded] = None) -> SearchResult:
    """The job's ``tune`` stage: :func:`run_search`, then the trials table in the log.

    ``sparktrain tune CONFIG`` (``job.run_job(cfg, stages=['tune'])``) calls this
    with the materialized dataset (``cfg.output.path`` or the preprocess
    stage's output) and the job's MLflow parent run, if any.
    """
    result = run_search(spark, cfg, dataset_path, parent_run_id=parent_run_id, tracking_uri=tracking_uri,
                        embedded=embedded)
    log.info("search finished: best %s = %.5g at trial %d", result.metric, result.best_metric, result.best_number)
    return result


def _make_runner(spark, cfg: JobConfig, dataset_path: Optional[str], objective: Optional[Objective], prefix: str):
    """``(runner, concurrency)`` for the configured mode, after the driver preflight."""
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]  # run_search checked it
    slots = max(1, spark_compat.max_concurrent_tasks(spark) or tune.parallelism)  # unknown (Connect): as asked
    _check_worker_reuse(spark)
    if objective is not None:
        from sparktrain.tune._training import ObjectiveRunner

        return ObjectiveRunner(spark, objective, tune.metric), _capped(tune.parallelism, slots, 1)
    if dataset_path is None:
        raise ConfigError("output.path", None, "tuning trains on a materialized dataset; run `sparktrain "
                                               "preprocess CONFIG` first or pass dataset_path")
    from sparktrain.tune._training import DistributedRunner, SingleTaskRunner, _TrainingPlan

    plan = _TrainingPlan(spark, cfg, dataset_path, prefix, pruning=tune.engine == "optuna" and tune.pruner != "none")
    if tune.mode == "single":
        plan.preflight(spark, 1)
        concurrency = _capped(tune.parallelism, slots, 1)
        if plan.pruning:  # rank 0 of each trial asks the search for its verdicts
            plan.channel = open_channel(spark, concurrency)
        return SingleTaskRunner(spark, plan), concurrency
    workers = cfg.train.num_workers  # type: ignore[union-attr]  # _TrainingPlan checked it
    plan.preflight(spark, workers)  # slots >= num_workers, no dynamic allocation, framework, dataset
    concurrency = _capped(tune.parallelism, slots, workers)
    plan.channel = open_channel(spark, concurrency * workers)  # the gangs' trials, the verdicts
    try:
        return DistributedRunner(spark, plan), concurrency
    except BaseException:
        plan.channel.close() if plan.channel is not None else None
        raise


def _capped(parallelism: int, slots: int, per_trial: int) -> int:
    fit = max(1, slots // per_trial)
    if parallelism > fit:
        log.warning("tune.parallelism = %d, but %d slots fit only %d trial(s) of %d task(s) at once; running %d "
                    "at a time", parallelism, slots, fit, per_trial, fit)
    return min(parallelism, fit)


def _check_worker_reuse(spark) -> None:
    value = (spark_compat.conf_get(spark, "spark.python.worker.reuse", "true") or "true").lower()
    if value != "true":
        log.warning("spark.python.worker.reuse = %s: every trial starts a fresh Python worker and re-imports "
                    "its framework (seconds per trial); set it to true", value)


def _test_metrics(spark, model: Any, dataset_path: Optional[str]) -> Dict[str, float]:
    """The best model's metrics on the dataset's test split (as the train stage reports them), if there is one."""
    import os

    from sparktrain.data.commit import resolve

    if model is None or dataset_path is None or not os.path.isdir(resolve(os.path.join(dataset_path, "test"))):
        return {}
    from sparktrain.data.manifest import committed_files
    from sparktrain.train.evaluate import evaluate_model

    return evaluate_model(model, spark.read.parquet(*committed_files(os.path.join(dataset_path, "test")))).metrics


def _with_run_ids(records, tracker) -> list:
    if tracker is None:
        return list(records)
    ids = tracker.run_ids()
    return [replace(r, run_id=ids.get(r.number)) for r in records]


def _all_failed_message(records) -> str:
    if not records:
        return "the search ran no trials (max_trials = 0?)"
    first = min(records, key=lambda r: r.number)
    statuses = ", ".join(f"{s.lower()}: {sum(r.status == s for r in records)}"
                         for s in sorted({r.status for r in records}))
    return (f"every trial failed ({len(records)} trials; {statuses}). First failure (trial {first.number}, "
            f"{first.status}): {first.error}" + (f"\n--- its traceback ---\n{first.traceback.rstrip()}"
                                                  if first.traceback else ""))


__all__ = ["run_search", "tune_stage", "format_trials", "SearchResult", "TrialRecord", "FINISHED", "PRUNED", "FAILED",
           "KILLED"]
