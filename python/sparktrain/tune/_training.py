"""Driver side of a training trial: the two runners the search loop calls.

* :class:`SingleTaskRunner` (``tune.mode: single``) builds a one-worker
  :class:`~sparktrain.train.worker.WorkerSpec` for the trial and runs
  it as one tiny Spark job (:class:`~sparktrain.tune._stage.TrialStage`: planned once per search).
  The data goes by path in the spec; nothing is broadcast.
* :class:`DistributedRunner` (``tune.mode: distributed``) fits the estimator,
  a barrier stage of ``train.num_workers`` tasks (its plan, preflight and
  launch, as ``fit`` runs them, with the trial's spec).

Both run in a pool thread that is already inside the trial's Spark job group.
The search's progress channel (:mod:`sparktrain.tune._channel`, classic Spark)
carries what a trial tells the driver and back: rank 0's epoch metrics and the
pruner's verdicts (each trial's :class:`~sparktrain.train.worker.WorkerSpec`
then carries ``prune_wait_s`` and the channel's address), and the distributed
trials of a :class:`~sparktrain.train.gang.GangPool`: one barrier stage per
trial that runs at once, reused trial after trial.  Without a channel (Spark
Connect), verdicts go through the trial's run folder and each distributed
trial is a barrier stage of its own.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Optional

from sparktrain.config import JobConfig, TrainConfig
from sparktrain.errors import ConfigError, PreflightError, SearchStoppedError, TrainingError
from sparktrain.tune._channel import SearchChannel, StoreWatch, Watch
from sparktrain.tune._loop import TrialOutcome
from sparktrain.tune._stage import TrialStage
from sparktrain.tune._trial import train_single

log = logging.getLogger(__name__)

#: how long rank 0 waits for the driver's verdict after an epoch (the driver polls every 0.1 s)
PRUNE_WAIT_S = 10.0
#: distributed trials on reused gangs (False: a barrier stage per trial, as before; bench/tune.py's baseline)
REUSE_GANGS = True
#: how long a distributed search whose trial failed waits for lost task slots to come back before it stops
CAPACITY_WAIT_S = 30.0


class ObjectiveRunner:
    """Runs a user objective ``objective(params) -> float | dict`` as a single-task trial."""

    def __init__(self, spark, objective: Callable[[Dict[str, Any]], Any], metric: str) -> None:
        self.spark, self.objective, self.metric = spark, objective, metric
        self.stage = TrialStage(spark, metric)

    def __call__(self, number: int, params: Dict[str, Any]) -> TrialOutcome:
        return self.stage.run(functools.partial(self.objective, params))


class _TrainingPlan:
    """What every trial of one search shares: the job config, the dataset, one resolved plan.

    Each trial's spec comes from the estimator's public :meth:`plan` step with
    the trial's params, so trials and ``fit`` can never resolve inputs differently.
    """

    def __init__(self, spark, cfg: JobConfig, dataset_path: str, prefix: str, pruning: bool = False) -> None:
        if cfg.train is None:
            raise ConfigError("train", None, "tuning needs a train: section to start from")
        self.cfg, self.dataset_path, self.prefix = cfg, os.fspath(dataset_path), prefix
        self.pruning = pruning
        self.channel: Optional[SearchChannel] = None  # set by the search (classic Spark)
        self.label = cfg.data.label
        base = self.plan({}, f"{prefix}-plan")
        self.train_path, self.val_path, self.inputs = base.train_path, base.val_path, base.inputs
        metric = cfg.tune.metric if cfg.tune else "val_loss"
        if metric.startswith("val_") and self.val_path is None:
            raise ConfigError("tune.metric", metric, f"the dataset at '{self.dataset_path}' has no validation "
                                                     "split; materialize one (split.validation > 0) or tune on "
                                                     "a train_ metric")

    def estimator(self, params: Dict[str, Any], run_id: str, **train_changes: Any):
        from sparktrain.train.evaluate import estimator_from_config

        train = replace(self.cfg.train or TrainConfig(), **params, **train_changes)
        return estimator_from_config(train, self.label, run_id=run_id)

    def plan(self, params: Dict[str, Any], run_id: str, **train_changes: Any):
        """The trial's :class:`~sparktrain.train.plan.TrainingPlan` (its run id is new: nothing resumes)."""
        return self.estimator(params, run_id, **train_changes).plan(self.dataset_path)

    def single_plan(self, params: Dict[str, Any], run_id: str):
        """The trial's plan with ``world_size = 1`` (DDP/Horovod are pointless for one worker)."""
        plan = self.plan(params, run_id, num_workers=1, backend="auto")
        return replace(plan, spec=self.trial_spec(replace(plan.spec.with_workers(1), progress_address=None)))

    def trial_spec(self, spec: Any) -> Any:
        """``spec`` with the pruning hook switched on when the search prunes, reporting to the search's channel."""
        if not self.pruning:
            return spec
        spec = replace(spec, prune_wait_s=PRUNE_WAIT_S)
        if self.channel is not None:
            spec = replace(spec, progress_address=self.channel.address, token=self.channel.token)
        return spec

    def run_id(self, number: int) -> str:
        """Trial ``number``'s run id (its folder in the store); a search's match
        :data:`sparktrain.errors.TRIAL_RUN_ID`, by which a stall's advice tells a trial from a fit."""
        return f"{self.prefix}-t{number:03d}"

    def watch(self, number: int, params: Dict[str, Any]) -> Watch:
        """How trial ``number``'s epochs reach the search and its verdicts go back, and how many epochs it plans."""
        from sparktrain.data.run_store import RunStore

        epochs = int(params.get("epochs", self.cfg.train.epochs if self.cfg.train else 1))
        if self.channel is not None:
            return self.channel.watch(self.run_id(number), epochs)
        return StoreWatch(RunStore(self.cfg.train.store if self.cfg.train else "work/store", self.run_id(number)),
                          epochs)

    def claim(self, number: int) -> Any:
        """The lease on trial ``number``'s run (:mod:`sparktrain.data.lease`), to hold while it trains."""
        from sparktrain.data.run_store import RunStore

        return RunStore(self.cfg.train.store if self.cfg.train else "work/store", self.run_id(number)).claim()

    def release(self, number: int) -> None:
        """Trial ``number`` ended: forget its watch."""
        if self.channel is not None:
            self.channel.release(self.run_id(number))

    def single_spec(self, params: Dict[str, Any], run_id: str):
        """A ``world_size = 1`` WorkerSpec."""
        return self.single_plan(params, run_id).spec

    def model(self, params: Dict[str, Any], plan: Any, model_bytes: bytes, history) -> Any:
        """The fitted Model of a single-task trial, as ``fit`` would have returned it."""
        est = self.estimator(params, plan.run_id, num_workers=1, backend="auto")
        return est.model_from_plan(plan, model_bytes, history)

    def preflight(self, spark, num_workers: int) -> None:
        from sparktrain.train import preflight

        spec = self.single_spec({}, f"{self.prefix}-preflight")
        preflight.run_all(spark, spec.with_workers(num_workers))


class _PlanRunner:
    """What both runners share: a trial's watch (pruning), its release, and its run claimed while it trains."""

    def __init__(self, spark, plan: _TrainingPlan) -> None:
        self.spark, self.plan = spark, plan

    def watch(self, number: int, params: Dict[str, Any]) -> Watch:
        return self.plan.watch(number, params)

    def release(self, number: int) -> None:
        self.plan.release(number)

    def __call__(self, number: int, params: Dict[str, Any]) -> TrialOutcome:
        with self.plan.claim(number):  # one job per run: a second search on the same runs is refused
            return self._run(number, params)

    def _run(self, number: int, params: Dict[str, Any]) -> TrialOutcome:
        raise NotImplementedError


class SingleTaskRunner(_PlanRunner):
    """``tune.mode: single``: each trial trains one worker inside one Spark task."""

    def __init__(self, spark, plan: _TrainingPlan) -> None:
        super().__init__(spark, plan)
        # the trial's task asks for the estimator's GPUs, as a fit's barrier stage and a gang do
        self.stage = TrialStage(spark, gpus=plan.cfg.train.gpus_per_worker if plan.cfg.train else 0)

    def _run(self, number: int, params: Dict[str, Any]) -> TrialOutcome:
        from sparktrain.train.plan import record_run

        plan = self.plan.single_plan(params, self.plan.run_id(number))
        record_run(plan)  # the trial's folder in the store is a recorded run, as a fit's is
        outcome = self.stage.run(functools.partial(train_single, plan.spec))
        if outcome.error is None and outcome.model is not None:
            outcome.model = _LazyModel(self.plan, params, plan, outcome.model, outcome.history)
        return outcome


class DistributedRunner(_PlanRunner):
    """``tune.mode: distributed``: each trial is a barrier-mode fit of ``train.num_workers`` workers.

    With the search's channel the trials run on reused gangs (:class:`~sparktrain.train.gang.GangPool`,
    one per trial at once); without one (Spark Connect), or for a backend a gang cannot reuse
    (Horovod, Keras MWMS, elastic runs), each trial launches its own barrier stage as ``fit`` does.
    """

    def __init__(self, spark, plan: _TrainingPlan) -> None:
        from sparktrain.train.gang import GangPool, can_reuse

        super().__init__(spark, plan)
        self.gangs: Optional[GangPool] = None
        self._running: Dict[int, Any] = {}  # trial number -> its gang
        base = plan.plan({}, f"{plan.prefix}-gang").spec
        reusable, why = can_reuse(base)
        if plan.channel is not None and reusable and REUSE_GANGS:
            self.gangs = GangPool(spark, plan.channel.server, base.num_workers, base.scaling.gpus_per_worker)
        elif plan.channel is not None:
            log.info("distributed trials: one barrier stage per trial (%s)", why)

    def _run(self, number: int, params: Dict[str, Any]) -> TrialOutcome:
        from sparktrain.train import plan as plan_mod
        from sparktrain.train import preflight
        from sparktrain.train.launcher import launch

        est = self.plan.estimator(params, self.plan.run_id(number))
        t0 = time.perf_counter()
        plan = est.plan(self.plan.dataset_path)  # what est.fit runs, with the trial's spec
        spec = self.plan.trial_spec(plan.spec)
        try:
            if self.gangs is None:  # a gang's slots are held: the search's preflight covered them
                preflight.run_all(self.spark, spec)
            plan_mod.record_run(plan)
        except PreflightError as exc:
            plan_mod.discard(spec.store, plan.run_id)
            self._check_capacity(number, spec.num_workers, exc)
            raise
        except BaseException:
            plan_mod.discard(spec.store, plan.run_id)
            raise
        t_plan = time.perf_counter() - t0
        try:
            if self.gangs is None:
                handlers = {}
                if self.plan.channel is not None:  # this launch's own server answers the verdicts
                    handlers["verdict"] = self.plan.channel.on_verdict
                result = launch(self.spark, spec, show_bar=False, handlers=handlers)
            else:
                gang = self._running[number] = self.gangs.acquire()
                try:
                    result = gang.run(spec)
                finally:
                    self._running.pop(number, None)
                    self.gangs.release(gang)
        except TrainingError as exc:
            self._check_capacity(number, spec.num_workers, exc)
            raise
        t_run = time.perf_counter() - t0
        model = est.model_from_plan(plan, result.model_bytes, result.history)
        model.launch = result
        history = list(model.history)
        log.debug("trial %d: plan and record %.3f s, training %.3f s, model %.3f s", number, t_plan, t_run - t_plan,
                  time.perf_counter() - t0 - t_run)
        last = {k: v for k, v in (history[-1] if history else {}).items() if k != "epoch"}
        gpus = tuple(a for r in sorted(result.devices) for a in (result.devices[r].get("addresses") or []))
        return TrialOutcome(metrics=last, history=history, model=model, objective_seconds=time.perf_counter() - t0,
                            gpus=gpus)

    def _check_capacity(self, number: int, needed: int, exc: BaseException) -> None:
        """After trial ``number`` failed: raise :class:`SearchStoppedError` when the cluster cannot run a trial's
        ``needed`` tasks at once, so the search stops rather than fail every trial left at once (each one counted
        against ``max_trials``).  Lost slots get :data:`CAPACITY_WAIT_S` to come back (a Worker starts a new
        executor in seconds); a stage Spark refused for want of slots (SPARK-24819) stops the search at once."""
        from sparktrain._internal import spark_compat

        text = str(exc)
        refused = "SPARK-24819" in text or "BarrierJobSlotsNumberCheckFailed" in text
        deadline = time.monotonic() + CAPACITY_WAIT_S
        while True:
            total = spark_compat.max_concurrent_tasks(self.spark)
            if total is None or (total >= needed and not refused):
                return
            if refused or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        waited = "" if refused else f" (after waiting {CAPACITY_WAIT_S:.0f} s for lost slots to come back)"
        why = (f"Spark refused trial {number}'s barrier stage: the cluster has fewer free task slots than the "
               f"{needed} (train.num_workers) it needs at once (SPARK-24819; {total} in all, some may still be held "
               f"by a lost or frozen executor)" if refused else
               f"the cluster can run {total} task(s) at once now{waited}, fewer than the {needed} "
               f"(train.num_workers) a trial needs: an executor was lost and not replaced")
        raise SearchStoppedError(f"{why}. Trial {number} failed with: {spark_compat.error_summary(exc, 200)}. Fix: "
                                 f"add executors or free the slots other jobs hold") from exc

    def cancel(self, number: int, why: str = "timed out") -> None:
        """A timed-out or interrupted trial: cancel its gang's stage (its job group holds no job of the trial's)."""
        gang = self._running.get(number)
        if gang is not None:
            gang.kill(f"trial {number} {why}")

    def close(self) -> None:
        if self.gangs is not None:
            self.gangs.close()


class _LazyModel:
    """Model bytes of a single-task trial; turned into a Model only for the best trial."""

    def __init__(self, shared: _TrainingPlan, params: Dict[str, Any], plan: Any, model_bytes: bytes,
                 history) -> None:
        self.shared, self.params, self.plan = shared, params, plan
        self.run_id = plan.run_id
        self.model_bytes, self.history = model_bytes, history

    def build(self) -> Any:
        return self.shared.model(self.params, self.plan, self.model_bytes, self.history)


def materialize_model(model: Optional[Any]) -> Any:
    """The best trial's Model (builds it from bytes for single-task trials)."""
    return model.build() if isinstance(model, _LazyModel) else model
