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
from sparktrain.tune._engines import check_pruning, check_sampler, make_engine, warn_random_start
from sparktrain.tune._loop import Listener, SearchLoop
from sparktrain.tune.result import (FAILED, FINISHED, KILLED, PRUNED, SearchResult, TrialRecord, check_metric,
                                   format_trials, goal_of)
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
    if not objective:
        check_metric(tune.metric)
    goal = goal_of(tune.metric)
    check_pruning(tune, cfg, space, objective=objective)
    check_sampler(tune, space)
    from sparktrain.tune._engines import check_storage

    check_storage(cfg)  # a study that cannot be kept: before the job's train stage, not after it
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
    warn_random_start(tune)
    if dataset_path is not None:  # output.path as the docs show it: its splits are in its committed generation
        from sparktrain.data.commit import resolve

        dataset_path = resolve(dataset_path)
    if objective is None:
        _check_task_metric(tune.metric, dataset_path)
        _check_test_split(spark, dataset_path)  # before the study, the runs and any trial
    prefix = f"tune-{uuid.uuid4().hex[:8]}"
    mode = "objective" if objective is not None else tune.mode
    tracker: Any = None
    t0 = time.perf_counter()
    failed = True
    runner: Any = None
    engine: Any = None
    made: Dict[str, Any] = {}

    def run_id_of(number: int) -> Optional[str]:  # a trial's run folder in the store (training trials)
        find = getattr(getattr(made.get("runner"), "plan", None), "run_id", None)
        return find(number) if find is not None else None

    try:
        # the study (and its lease) first: a search refused for a study in use leaves nothing, not even a run
        engine = make_engine(space, cfg, goal, seed=(cfg.train.seed if cfg.train else 0), dataset_path=dataset_path,
                             tracking_uri=tracking_uri, run_id_of=run_id_of)
        if tracking_uri or cfg.tracking.enabled:  # the tracking preflight, before any compute
            from sparktrain.tune._tracking import TrialTracker

            tracker = TrialTracker(cfg, tracking_uri=tracking_uri, parent_run_id=parent_run_id)
            if getattr(engine, "study_name", None):
                try:  # runs a killed search of this study left RUNNING: it holds the study's lease now
                    tracker.adopt_study(engine.study_name)
                except Exception as exc:  # noqa: BLE001 - housekeeping must not stop the search
                    log.warning("could not end the MLflow runs an earlier search left running: %s", exc)
        runner, concurrency = _make_runner(spark, cfg, dataset_path, objective, prefix)
        made["runner"] = runner
        to_run = tune.max_trials - engine.previous
        study = getattr(engine, "study_name", None)
        log.info("tuning job %s (%smodel %s) over %s: %d trials, mode %s, %d at a time, %s %s%s (%simize %s)",
                 cfg.name, f"study {study}, " if study else "", cfg.tracking.model_name or cfg.name, describe(space),
                 to_run, mode, concurrency, tune.engine, tune.effective_sampler,
                 f", pruner {tune.pruner}" if tune.pruner != "none" else "", goal, tune.metric)
        loop = SearchLoop(spark, space, runner, metric=tune.metric, goal=goal, max_trials=to_run,
                          concurrency=concurrency, early_stop_trials=tune.early_stop_trials,
                          timeout_s=tune.trial_timeout_s, listener=tracker or Listener(), prefix=prefix,
                          engine=engine, time_budget_s=tune.time_budget_s, stop_at=tune.stop_at)
        try:
            records = _with_run_ids(loop.run(), tracker)
        finally:
            _close_runner(runner)  # the gangs end, the channel closes
        from sparktrain.tune._keep import keep_model, study_best
        from sparktrain.tune._training import materialize_model

        store = cfg.train.store if cfg.train else None
        common = dict(trials=tuple(records), metric=tune.metric, goal=goal, mode=mode, concurrency=concurrency,
                      stopped_early=loop.stopped_early, stop_reason=loop.stop_reason,
                      parent_run_id=tracker.parent_run_id if tracker else None, engine=engine.name,
                      study=getattr(engine, "study_name", None), previous_trials=engine.previous)
        best_record: Optional[TrialRecord] = None
        if loop.best is None:
            # every trial of a continued study pruned: the study's best, from an earlier search, stands
            earlier = study_best(engine, records, store) if records and {r.status for r in records} == {PRUNED} \
                else None
            if earlier is None or earlier.model is None:
                raise TuneError(_all_failed_message(records, earlier, cfg.name))
            log.warning("every trial of this search (%d) was pruned: none came near the study's best, trial %d "
                        "(%s = %.5g) from an earlier search, whose model is in the store at %s; it stays the "
                        "search's result", len(records), earlier.number, tune.metric, earlier.metric,
                        earlier.run_dir)
            result = SearchResult(
                best_params=dict(earlier.params), best_metric=earlier.metric, best_number=earlier.number,
                best_model=earlier.model, seconds=time.perf_counter() - t0,
                test_metrics={k: v for k, v in dict(earlier.metrics).items() if k.startswith("test_")},
                model_dir=f"{earlier.run_dir}/model", study_best_number=earlier.number,
                study_best_metric=earlier.metric, **common)
        else:
            best_record, best_outcome = loop.best
            best_record = next(r for r in records if r.number == best_record.number)  # with its run id
            model = materialize_model(best_outcome.model if best_outcome else None)
            test = _test_metrics(spark, model, dataset_path)
            # the best model goes to its run folder in the store before any MLflow call: an outage cannot lose it
            saved = keep_model(cfg, best_record, model, test, dataset_path, best_record.run_id)
            earlier = study_best(engine, records, store)
            result = SearchResult(
                best_params=dict(best_record.params), best_metric=float(best_record.metric),  # type: ignore[arg-type]
                best_number=best_record.number, best_model=model, test_metrics=test,
                seconds=time.perf_counter() - t0, model_dir=saved,
                study_best_number=earlier.number if earlier else None,
                study_best_metric=earlier.metric if earlier else None, **common)
            if earlier is not None:
                _warn_earlier_best(cfg, result, earlier)
        if tracker is not None:
            try:
                result = _track_search(spark, tracker, cfg, result, loop, engine, best_record, earlier,
                                       dataset_path, register, embedded)
            except Exception as exc:
                down = _tracking_down(tracker, exc, result.model_dir, result)
                if down is None:
                    raise
                raise down from exc
        failed = False
        return result
    finally:
        _close_runner(runner)
        if engine is not None:
            engine.close()  # the study's lease: another search may continue it now
        if tracker is not None:
            tracker.close(failed=failed)


def _track_search(spark, tracker: Any, cfg: JobConfig, result: SearchResult, loop: SearchLoop, engine: Any,
                  best_record: Optional[TrialRecord], earlier: Any, dataset_path: Optional[str],
                  register: Optional[bool],
                  embedded: Optional[Embedded]) -> SearchResult:
    """The search's summary on its MLflow run, then the best model registered; returns ``result`` with its version.

    The model registered is the study's best: an earlier search's trial when
    its model is in the store (``earlier.model``), else this search's best
    (``best_record`` is None when every trial of this search was pruned).
    """
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    settings = {"mode": result.mode, "max_trials": tune.max_trials, "parallelism": result.concurrency,
                "algo": tune.algo, "metric": tune.metric, "early_stop_trials": tune.early_stop_trials,
                "trial_timeout_s": tune.trial_timeout_s, "time_budget_s": tune.time_budget_s,
                "stop_at": tune.stop_at, "stop_reason": loop.stop_reason or "max_trials", **engine.settings()}
    tracker.log_summary(list(result.trials), tune.metric, result.goal, settings,
                        best_run_id=best_record.run_id if best_record else None, test=result.test_metrics)
    if not (cfg.tracking.register if register is None else register) or dataset_path is None:
        return result
    from sparktrain.tune._tracking import register_best

    number, model, run_id, metrics = (result.best_number, result.best_model,
                                      best_record.run_id if best_record else earlier.mlflow_run_id,
                                      {**(best_record.metrics if best_record else {}), **result.test_metrics})
    if earlier is not None and earlier.model is not None and earlier.mlflow_run_id:
        from sparktrain.track.bundle import already_registered

        number, model, run_id, metrics = earlier.number, earlier.model, earlier.mlflow_run_id, dict(earlier.metrics)
        done = already_registered(tracker.client, tracker.experiment_id, cfg, f"{earlier.run_dir}/model", run_id)
        if done is not None and done.version is not None:  # its own search registered it: no second version
            return replace(result, model_version=str(done.version), model_champion=done.champion,
                           registered_number=number)
        log.info("registering the study's best, trial %d (%s = %.5g), from its run folder %s", number,
                 tune.metric, earlier.metric, earlier.run_dir)
    if model is None or not run_id:
        return result
    registered = register_best(spark, tracker, cfg, model, dataset_path, run_id, metrics, embedded=embedded)
    if registered is None:
        return result
    return replace(result, model_version=registered[0], model_champion=registered[1], registered_number=number)


def _warn_earlier_best(cfg: JobConfig, result: SearchResult, earlier: Any) -> None:
    """Log, loudly, that a continued study's best trial ran in an earlier search, and what becomes of its model."""
    from sparktrain.tune._keep import retrain_hint

    head = (f"study '{result.study}': its best trial is trial {earlier.number} ({result.metric} = "
            f"{earlier.metric:.5g}) from an earlier search, better than this search's best, trial "
            f"{result.best_number} ({result.metric} = {result.best_metric:.5g})")
    if earlier.model is not None and earlier.mlflow_run_id:
        log.warning("%s; its model is in the store at %s: the study's best is the one registered", head,
                    earlier.run_dir)
        return
    log.warning("%s. Trial %d's model is not in the store (%s: its search ended before keeping it), so the "
                "model registered is trial %d's, this search's best. To get the study's best model, train "
                "its params again: %s", head, earlier.number, earlier.run_dir or "no run folder recorded",
                result.best_number, retrain_hint(cfg.name, earlier.params))


def _tracking_down(tracker: Any, exc: Exception, saved: Optional[str], result: SearchResult) -> Optional[Exception]:
    """The error for a tracking server that stopped answering after the trials; None when it still answers."""
    from sparktrain.errors import TrackingDownError
    from sparktrain.track.bundle import tracking_down_error
    from sparktrain.track.params import mask_url_password

    try:
        tracker.job.check_alive(timeout=5.0)
        return None
    except Exception:  # noqa: BLE001 - the server is down: that is the error to report
        pass
    if saved is not None:
        return tracking_down_error(tracker.job, exc, saved, f"after the search (best: trial {result.best_number})",
                                   result=result)
    tracker.job.mark_down(spark_compat.error_summary(exc, 300))
    return TrackingDownError(
        f"the MLflow tracking server at {mask_url_password(tracker.uri)} stopped answering after the search "
        f"({tracker.job.down}). The trials' results are in the search's table (best: trial {result.best_number}); "
        "no model was kept in the store (a custom objective, or a dataset not written by `sparktrain preprocess`), "
        "so run the search again once the server is back", reason=tracker.job.down or "", result=result)


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


def _test_split(dataset_path: Optional[str]) -> Optional[list]:
    """The committed files of the dataset's test split (local or a URI), or None when it has none."""
    if dataset_path is None:
        return None
    from sparktrain.data.manifest import committed_files
    from sparktrain.train.inputs import exists

    test = f"{dataset_path.rstrip('/')}/test"
    return committed_files(test) if exists(test) else None


def _check_task_metric(metric: str, dataset_path: Optional[str]) -> None:
    """Refuse, before any trial, a ``tune.metric`` the dataset's task does not report (``val_auc`` on a multiclass
    label): each trial would train in full, then fail for want of it."""
    from sparktrain.train.inputs import read_features_json

    try:
        meta = read_features_json(dataset_path) if dataset_path is not None else None
    except Exception:  # noqa: BLE001 - an unreadable features.json is the trials' to report, with its fix
        return
    label = (meta or {}).get("label") or {}
    if isinstance(label, dict) and label.get("task"):
        check_metric(metric, str(label["task"]), str(label.get("column") or ""))


def _check_test_split(spark, dataset_path: Optional[str]) -> None:
    """Refuse, before any trial, a test split Spark cannot read (the best model is evaluated on it at the end)."""
    files = _test_split(dataset_path)
    if files:
        spark_compat.check_spark_reads(spark, files, "output.path", "the dataset's test split (the best model "
                                                                    "is evaluated on it with Spark; no trial ran)",
                                       value=f"{str(dataset_path).rstrip('/')}/test")


def _test_metrics(spark, model: Any, dataset_path: Optional[str]) -> Dict[str, float]:
    """The best model's metrics on the dataset's test split (as the train stage reports them), if there is one."""
    files = _test_split(dataset_path) if model is not None else None
    if not files:
        return {}
    from sparktrain.train.evaluate import evaluate_model

    return evaluate_model(model, spark.read.parquet(*files)).metrics


def _with_run_ids(records, tracker) -> list:
    if tracker is None:
        return list(records)
    ids = tracker.run_ids()
    return [replace(r, run_id=ids.get(r.number)) for r in records]


def _all_failed_message(records, earlier: Any = None, cfg_name: str = "job") -> str:
    if not records:
        return "the search ran no trials (max_trials = 0?)"
    if {r.status for r in records} == {PRUNED}:
        from sparktrain.tune._keep import retrain_hint

        stands = "" if earlier is None else (
            f"; the study's best, trial {earlier.number} ({earlier.metric:.5g}) of an earlier search, has no model "
            f"in the store ({earlier.run_dir or 'no run folder recorded'}), so there is no model to return (train "
            f"its params with `{retrain_hint(cfg_name, earlier.params)}`)")
        return (f"every trial of this search was pruned ({len(records)} trials), so none trained to the end{stands}; "
                "raise tune.max_trials, widen tune.space, or set tune.pruner: none (or a later "
                "tune.pruner_min_epochs)")
    first = min(records, key=lambda r: r.number)
    statuses = ", ".join(f"{s.lower()}: {sum(r.status == s for r in records)}"
                         for s in sorted({r.status for r in records}))
    timed_out = all(r.status == KILLED and "(tune.trial_timeout_s)" in (r.error or "") for r in records)
    fix = (". Fix: raise tune.trial_timeout_s (every trial ran longer), or make trials cheaper (fewer "
           "train.epochs, a smaller tune.space)") if timed_out else ""
    return (f"every trial failed ({len(records)} trials; {statuses}). First failure (trial {first.number}, "
            f"{first.status}): {first.error}{fix}" + (f"\n--- its traceback ---\n{first.traceback.rstrip()}"
                                                       if first.traceback else ""))


__all__ = ["run_search", "tune_stage", "format_trials", "SearchResult", "TrialRecord", "FINISHED", "PRUNED", "FAILED",
           "KILLED"]
