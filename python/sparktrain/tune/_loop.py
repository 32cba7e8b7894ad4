"""The driver's ask/tell loop: an engine suggests, driver threads run trials as Spark jobs.

Hyperopt's own ``fmin`` either evaluates serially or polls a ``Trials``
subclass, and Optuna's ``optimize`` runs the objective in the calling
process.  Here the loop is explicit, so that the engine
(:mod:`sparktrain.tune._engines`: Hyperopt or an Optuna study) sees each
result the moment it arrives and the driver controls concurrency, timeouts,
pruning and early stopping::

    while trials remain and not stopped:
        fill free slots: ask the engine for a point -> launch it in a thread, in its own job group
        wait for the first result, the nearest deadline or (pruning) the next poll
        pruning: report each running trial's new epochs (its rank 0's verdict requests on the progress
                 channel, or its event log in the store) to the engine, and answer each with the verdict
                 (a stop ends the trial after that epoch)
        tell the engine each result; cancel the job group of every trial past its deadline

The epochs and the verdicts go through the search's progress channel
(:mod:`sparktrain.tune._channel`); where there is none (Spark Connect), through
the trial's run folder in the store.  A trial the engine pruned ends cleanly
after that epoch and is recorded ``PRUNED``.

A trial past ``timeout_s`` has its job group cancelled (again every second
until its thread returns, in case a job started after the first cancel) and is
recorded ``KILLED``.  A trial whose runner raises, or returns an error, is
recorded ``FAILED`` and the search goes on.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from sparktrain._internal import spark_compat
from sparktrain._internal.secrets import mask_value
from sparktrain.errors import SearchStoppedError
from sparktrain.tune._channel import Watch
from sparktrain.tune._engines import INTERRUPTED, Engine, HyperoptEngine
from sparktrain.tune.result import FAILED, FINISHED, KILLED, PRUNED, TrialRecord
from sparktrain.tune.space import CompiledSpace

log = logging.getLogger(__name__)

_RECANCEL_S = 1.0
#: seconds an interrupted search waits for each running trial's cancelled tasks to end
_INTERRUPT_WAIT_S = 30.0
#: seconds between two reads of the running trials' event logs when pruning
POLL_S = 0.1


@dataclass
class TrialOutcome:
    """What a runner returns for one trial (an ``error`` means the objective failed)."""

    metrics: Dict[str, Optional[float]] = field(default_factory=dict)
    history: List[Dict[str, Any]] = field(default_factory=list)
    model: Any = None
    objective_seconds: Optional[float] = None
    error: Optional[str] = None
    traceback: Optional[str] = None
    gpus: Tuple[str, ...] = ()  # the GPU addresses Spark gave the trial's task


#: ``runner(number, params)`` runs one trial; it is called in a pool thread already inside the trial's job group.
#: A runner that trains may also have ``watch(number, params) -> Watch`` (what pruning reads and writes),
#: ``cancel(number, why)`` (stop a timed-out or interrupted trial whose work is not in its job group: a reused
#: gang) and ``close()``.
Runner = Callable[[int, Dict[str, Any]], TrialOutcome]


@dataclass
class _Running:
    number: int
    handle: Any
    params: Dict[str, Any]
    group: str
    started: float
    deadline: Optional[float]
    cancelled_at: Optional[float] = None
    watch: Optional[Watch] = None
    reported: Dict[int, float] = field(default_factory=dict)
    pruned_at: Optional[int] = None


class Listener:
    """Hooks the loop calls on its own thread (the MLflow tracker implements them)."""

    def on_start(self, number: int, params: Dict[str, Any], group: str, start_time: float) -> None:
        """A trial was launched (``start_time`` is ``time.time()``)."""

    def on_finish(self, record: TrialRecord) -> None:
        """A trial ended (any status)."""


class SearchLoop:
    """Run ``max_trials`` trials of ``runner`` over ``space``, ``concurrency`` at a time.

    Parameters
    ----------
    spark : SparkSession
        Classic or Connect; used for job groups and cancellation only.
    space : CompiledSpace
        The search space.
    runner : callable
        ``runner(number, params) -> TrialOutcome`` (with ``watch``, see :data:`Runner`, its trials can be pruned).
    metric, goal : str
        The metric read from each outcome and ``"min"``/``"max"``.
    max_trials, concurrency : int
        Trials to run, and at once.
    algo : {"tpe", "random"}
        Hyperopt's suggestion algorithm (without ``engine``).
    seed : int
        Seeds the algorithm (same seed, same sequence of suggestions for serial runs).
    engine : Engine, optional
        Asked for points and told results (default: Hyperopt with ``algo``); one that
        ``prunes`` gets each running trial's per-epoch ``metric``.
    early_stop_trials : int, optional
        Stop launching after this many finished trials in a row without improvement.
    time_budget_s : float, optional
        Stop launching once this many seconds have passed since the search started.
    stop_at : float, optional
        Stop launching once a finished trial's metric is at or beyond this value
        (``<=`` when ``goal`` is ``"min"``, ``>=`` when ``"max"``).
    timeout_s : float, optional
        Per-trial wall-clock limit; the trial's Spark jobs are cancelled past it.
    listener : Listener, optional
        Told about every start and finish.
    prefix : str, optional
        Job groups are ``<prefix>-trial-NNN``.
    """

    def __init__(self, spark, space: CompiledSpace, runner: Runner, *, metric: str, goal: str, max_trials: int,
                 concurrency: int, algo: str = "tpe", seed: int = 0, early_stop_trials: Optional[int] = None,
                 timeout_s: Optional[float] = None, listener: Optional[Listener] = None,
                 prefix: Optional[str] = None, engine: Optional[Engine] = None,
                 time_budget_s: Optional[float] = None, stop_at: Optional[float] = None) -> None:
        self.spark = spark
        self.space = space
        self.runner = runner
        self.metric, self.goal = metric, goal
        self.max_trials, self.concurrency = max_trials, max(1, concurrency)
        self.engine = engine or HyperoptEngine(space, goal, algo=algo, seed=seed)
        self.pruning = self.engine.prunes and hasattr(runner, "watch")
        self.early_stop_trials, self.timeout_s = early_stop_trials, timeout_s
        self.time_budget_s, self.stop_at = time_budget_s, stop_at
        self.listener = listener or Listener()
        self.prefix = prefix or f"tune-{uuid.uuid4().hex[:8]}"
        self.records: List[TrialRecord] = []
        self.best: Optional[Tuple[TrialRecord, Optional[TrialOutcome]]] = None
        self.stop_reason: Optional[str] = None  # early_stop_trials | time_budget_s | stop_at
        self._since_best = 0
        self.started = time.time()

    @property
    def stopped_early(self) -> bool:
        """Whether a stop criterion (not ``max_trials``) ended the launches."""
        return self.stop_reason is not None

    def _stop(self, reason: str, message: str, running: int) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.info("%s", message)  # no new trials from here; the running ones finish
            if running:
                log.debug("%d running trial(s) finish", running)

    # ---- the loop ------------------------------------------------------------------------------------------
    def run(self) -> List[TrialRecord]:
        """Run the search; returns every trial's record in launch order."""
        from sparktrain._internal.spark_compat import inheritable_target

        running: Dict[Future, _Running] = {}
        launched = 0
        self.started = time.time()
        # a lost Connect server: each trial's calls give up in about a minute, and the search stops (_finish)
        with spark_compat.bounded_connect_retries(self.spark), \
                ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sparktrain-trial") as pool:
            try:
                while True:
                    spent = time.time() - self.started
                    if self.time_budget_s is not None and spent >= self.time_budget_s and launched:
                        self._stop("time_budget_s", f"time budget spent: {spent:.1f} s (tune.time_budget_s = "
                                                    f"{self.time_budget_s:g}), no new trials", len(running))
                    while (not self.stopped_early and launched < self.max_trials
                           and len(running) < self.concurrency):
                        asked = self.engine.ask()
                        if asked is None:  # the algo has nothing left to suggest
                            self.max_trials = launched
                            break
                        launched += 1
                        number, handle, params = asked
                        trial = _Running(number, handle, params, f"{self.prefix}-trial-{number:03d}", time.time(),
                                         None if self.timeout_s is None else time.monotonic() + self.timeout_s,
                                         watch=self.runner.watch(number, params)  # type: ignore[attr-defined]
                                         if self.pruning else None)
                        target = inheritable_target(self.spark)(self._run_one)
                        running[pool.submit(target, trial)] = trial
                        log.info("trial %d started: %s", number, _short(params))
                        self.listener.on_start(trial.number, params, trial.group, trial.started)
                    if not running:
                        break
                    done, _ = wait(list(running), timeout=self._wait_s(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        self._finish(running.pop(fut), fut, len(running))
                    self._enforce_deadlines(running)
                    if self.pruning:
                        for trial in running.values():
                            self._poll_epochs(trial)
            except BaseException as exc:  # Ctrl-C, a lost server or a bug here: leave no trial running
                cancel = getattr(self.runner, "cancel", None)
                for trial in running.values():
                    try:
                        spark_compat.cancel_group(self.spark, trial.group)
                        if cancel is not None:  # a reused gang's stage is in a job group of its own
                            cancel(trial.number, "was interrupted")
                    except Exception as cancel_exc:  # noqa: BLE001 - the first error is the one to see
                        log.warning("trial %d: could not cancel its Spark job: %s", trial.number,
                                    spark_compat.error_summary(cancel_exc, 1000, typed=True))
                for trial in running.values():  # their tasks end before the caller sees the interrupt
                    try:
                        ended = spark_compat.wait_group_ended(self.spark, trial.group, _INTERRUPT_WAIT_S)
                    except Exception:  # noqa: BLE001 - a stopping context: the first error is the one to see
                        ended = True
                    if not ended:
                        log.warning("trial %d: its Spark tasks still ran %.0f s after the cancel (job group %s)",
                                    trial.number, _INTERRUPT_WAIT_S, trial.group)
                self._record_interrupted(running.values(), exc.why if isinstance(exc, SearchStoppedError)
                                         else "the search was stopped (Ctrl-C)")
                raise
        self.records.sort(key=lambda r: r.number)
        return self.records

    def _record_interrupted(self, trials: Any, why: str) -> None:
        """Trials the interrupt stopped: KILLED to the engine (a study keeps no RUNNING trial; an interrupted
        trial does not count against ``max_trials`` when the search continues) and the tracker."""
        for trial in trials:
            record = TrialRecord(number=trial.number, params=trial.params, status=KILLED, metric=None, metrics={},
                                 error=f"{INTERRUPTED} {why}",
                                 seconds=time.time() - trial.started, objective_seconds=None, job_group=trial.group,
                                 history=(), traceback=None, epochs=0, end_s=time.time() - self.started)
            try:
                self.engine.tell(trial.handle, KILLED, None, record.error)
                self.listener.on_finish(record)
            except Exception as exc:  # noqa: BLE001 - the interrupt is what the caller must see
                log.warning("trial %d: could not record it as interrupted: %s", trial.number, exc)

    def _run_one(self, trial: _Running) -> TrialOutcome:
        with spark_compat.job_group(self.spark, trial.group, f"sparktrain tune: trial {trial.number}"):
            return self.runner(trial.number, dict(trial.params))

    def _wait_s(self, running: Dict[Future, _Running]) -> Optional[float]:
        now = time.monotonic()
        waits = [(t.cancelled_at + _RECANCEL_S if t.cancelled_at else t.deadline) - now
                 for t in running.values() if t.deadline is not None]
        if self.pruning:
            waits.append(POLL_S)
        return max(0.01, min(waits)) if waits else None

    # ---- pruning ---------------------------------------------------------------------------------------------
    def _poll_epochs(self, trial: _Running, final: bool = False,
                     history: Optional[List[Dict[str, Any]]] = None) -> None:
        """Report the trial's newly finished epochs to the engine; give its verdict on each.

        ``final``: the trial ended (``history``: its epochs as the outcome holds them); its last
        epochs still go to the engine (a pruner ranks trials by what each reported), but no verdict
        is given.
        """
        watch = trial.watch
        if watch is None or (trial.pruned_at is not None and not final):
            return
        epochs = watch.finished_epochs()
        for row in history or ():
            if isinstance(row, dict) and "epoch" in row:
                epochs.setdefault(int(row["epoch"]), row)
        for epoch in sorted(set(epochs) - set(trial.reported)):
            value = epochs[epoch].get(self.metric)
            if not isinstance(value, (int, float)):
                continue
            trial.reported[epoch] = float(value)
            stop = self.engine.report(trial.handle, epoch, float(value))
            if final or trial.pruned_at is not None or epoch >= watch.epochs - 1:
                continue
            reason = (f"{self.engine.name} pruner: {self.metric} = {value:.5g} after epoch {epoch + 1}"
                      if stop else "")
            try:
                watch.verdict(epoch, stop, reason)
            except OSError as exc:  # the rank trains on after its bounded wait
                log.warning("trial %d: could not write the verdict after epoch %d: %s", trial.number, epoch, exc)
                continue
            if stop:
                trial.pruned_at = epoch
                log.info("trial %d pruned after epoch %d of %d: %s = %.5g", trial.number, epoch + 1,
                         watch.epochs, self.metric, value)

    def _enforce_deadlines(self, running: Dict[Future, _Running]) -> None:
        now = time.monotonic()
        for trial in running.values():
            if trial.deadline is None or now < trial.deadline:
                continue
            if trial.cancelled_at is None or now - trial.cancelled_at >= _RECANCEL_S:
                if trial.cancelled_at is None:
                    log.warning("trial %d exceeded tune.trial_timeout_s = %gs: cancelling Spark job group %s",
                                trial.number, self.timeout_s, trial.group)
                spark_compat.cancel_group(self.spark, trial.group)
                cancel = getattr(self.runner, "cancel", None)
                if cancel is not None:
                    cancel(trial.number, "timed out")
                trial.cancelled_at = now

    def _finish(self, trial: _Running, fut: Future, still_running: int = 0) -> None:
        seconds = time.time() - trial.started
        outcome: Optional[TrialOutcome] = None
        status, metric, error, tb = FINISHED, None, None, None
        stop: Optional[SearchStoppedError] = None
        try:
            outcome = fut.result()
        except Exception as exc:  # noqa: BLE001 - a failed trial is data, the search goes on
            import traceback as _tb

            error, tb = spark_compat.error_summary(exc, 1000, typed=True), "".join(_tb.format_exception(exc))
            status = FAILED
            stop = _stops_the_search(self.spark, exc, trial.number)
        if self.pruning:
            self._poll_epochs(trial, final=True, history=list(outcome.history) if outcome else None)
            release = getattr(self.runner, "release", None)
            if release is not None:
                release(trial.number)
        if stop is not None:  # not the trial's fault: it runs again when the search continues
            status, error = KILLED, f"{INTERRUPTED} {stop.why}"
        elif trial.cancelled_at is not None and (outcome is None or outcome.error is not None):
            status, tb = KILLED, None  # the cancel's own trace (py4j, SPARK_JOB_CANCELLED) says nothing more
            error = (f"timed out after {self.timeout_s:g} s (tune.trial_timeout_s); Spark job group "
                     f"{trial.group} cancelled" + (f": {error}" if error else ""))
        elif outcome is not None and outcome.error is not None:
            status, error, tb = FAILED, outcome.error, outcome.traceback
        elif outcome is not None:
            metric, error = self._metric_of(outcome)
            status = FINISHED if error is None else FAILED
            if status == FINISHED and trial.pruned_at is not None:
                status = PRUNED
        history = tuple(outcome.history) if outcome else ()
        error, tb = (mask_value(error) if error else error), (mask_value(tb) if tb else tb)  # recorded from here on
        record = TrialRecord(
            number=trial.number, params=trial.params, status=status, metric=metric,
            metrics={k: v for k, v in (outcome.metrics if outcome else {}).items() if v is not None},
            error=error, seconds=seconds, objective_seconds=outcome.objective_seconds if outcome else None,
            job_group=trial.group, history=history, traceback=tb, epochs=len(history),
            end_s=time.time() - self.started, gpus=tuple(outcome.gpus) if outcome else ())
        self.records.append(record)
        if not self.pruning and history:  # the study keeps every trial's curve, for a later search that prunes
            self.engine.record_curve(trial.handle, {int(row["epoch"]): float(row[self.metric]) for row in history
                                                    if isinstance(row, dict) and "epoch" in row
                                                    and isinstance(row.get(self.metric), (int, float))})
        self.engine.tell(trial.handle, status, metric, error)
        self._update_best(record, outcome, still_running)
        if status == FINISHED:
            log.info("trial %d finished in %.1f s: %s = %.5g", trial.number, seconds, self.metric, metric)
        elif status == PRUNED:
            log.info("trial %d pruned: %d of %d epochs in %.1f s, %s = %.5g", trial.number, len(history),
                     trial.watch.epochs if trial.watch else len(history), seconds, self.metric, metric)
        else:
            log.warning("trial %d %s after %.1f s: %s", trial.number, status.lower(), seconds, error)
        self.listener.on_finish(record)
        if stop is not None:  # every other trial would meet the same cause: the search stops here
            raise stop

    def _metric_of(self, outcome: TrialOutcome) -> Tuple[Optional[float], Optional[str]]:
        if self.metric in outcome.metrics:
            value = outcome.metrics[self.metric]
            if value is None or not math.isfinite(value):
                shown = "NaN or infinite" if value is None else value
                return None, (f"{self.metric} is not a finite number ({shown}); the model diverged (a learning rate "
                              f"too high for it: narrow tune.space's learning_rate)")
            return float(value), None
        return None, (f"the trial reported no '{self.metric}' (tune.metric); it reported: "
                      f"{', '.join(sorted(outcome.metrics)) or 'nothing'}")

    def _update_best(self, record: TrialRecord, outcome: Optional[TrialOutcome], still_running: int = 0) -> None:
        value, best = record.metric, (self.best[0].metric if self.best else None)
        better = record.status == FINISHED and value is not None and (
            best is None or (value < best if self.goal == "min" else value > best))
        if better:
            self.best = (record, outcome)  # only the best outcome (and its model) is kept
            self._since_best = 0
        else:
            self._since_best += 1
            if outcome is not None:
                outcome.model = None
        if better and self.stop_at is not None and (
                value <= self.stop_at if self.goal == "min" else value >= self.stop_at):  # type: ignore[operator]
            self._stop("stop_at", f"target reached: trial {record.number} has {self.metric} = {value:.5g} "
                                  f"(tune.stop_at = {self.stop_at:g}), no new trials", still_running)
        if self.early_stop_trials is not None and self._since_best >= self.early_stop_trials:
            self._stop("early_stop_trials", f"early stop: no improvement of {self.metric} in the last "
                                            f"{self._since_best} trials", still_running)


def _stops_the_search(spark, exc: BaseException, number: int) -> Optional[SearchStoppedError]:
    """The error that stops the search, when a trial's failure is not the trial's own: a lost Spark Connect
    server, or a cluster without the task slots a trial needs (the runner's :class:`SearchStoppedError`)."""
    if isinstance(exc, SearchStoppedError):
        return exc
    lost = spark_compat.connect_loss(spark, exc)
    if lost is None:
        return None
    stop = SearchStoppedError(f"lost the Spark Connect server during trial {number}: it did not answer for "
                              f"{spark_compat.CONNECT_RETRY_S} s ({spark_compat.error_summary(lost, 200)})")
    stop.__cause__ = lost
    return stop


def _short(params: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))
