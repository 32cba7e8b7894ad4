"""MLflow for a search: a child run per trial, a plot on the parent, the best model registered.

Built on :mod:`sparktrain.track`: :class:`~sparktrain.track.tracker.JobTracker`
checks the tracking store before any Spark work and opens the experiment;
the best model goes through :func:`~sparktrain.track.registry.log_model_and_register`
(one pyfunc model carrying the feature pipeline and the network; ``champion``
moves only to a strictly better version).

Every MLflow call of the trials runs on one background thread, in order, so
the scheduling loop never waits on the tracking store (a sqlite write costs
tens of ms) and the store sees one writer.  Runs are addressed by id only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sparktrain.features.load import Embedded
from sparktrain.tune._loop import Listener
from sparktrain.tune.result import FAILED, FINISHED, KILLED, PRUNED, TrialRecord

log = logging.getLogger(__name__)

_MAX_TAG = 5000
#: MLflow has no PRUNED run status: a pruned trial's run ends KILLED (stopped before its last epoch, by the
#: search) and carries ``sparktrain.status = PRUNED``
MLFLOW_STATUS = {PRUNED: "KILLED"}
#: the Optuna study a search's runs belong to (its run and its trials)
STUDY_TAG = "sparktrain.study"


class TrialTracker(Listener):
    """Log each trial as an MLflow child run of ``parent_run_id``.

    Parameters
    ----------
    cfg : JobConfig
        Its ``tracking`` section (URI, experiment, artifact location, model name).
    tracking_uri : str, optional
        Overrides ``tracking.uri``.
    parent_run_id : str, optional
        The job's run (the ``tune`` stage run of :func:`sparktrain.job.run_job`);
        when None a parent run ``<name>-tune`` is created, and ended by :meth:`close`.
    """

    def __init__(self, cfg: Any, tracking_uri: Optional[str] = None, parent_run_id: Optional[str] = None) -> None:
        from sparktrain.track.tracker import KIND_TAG, STAGE_TAG, JobTracker

        self.job = JobTracker(cfg, uri=tracking_uri)  # preflight: a bad store fails here, naming the URI
        self.client = self.job.client
        self.uri = self.job.uri
        self.owns_parent = parent_run_id is None
        if parent_run_id is None:
            parent_run_id = self.job.start_run(f"{cfg.name}-tune", tags={KIND_TAG: "stage", STAGE_TAG: "tune"}).run_id
            self.experiment_id = self.job.experiment_id
        else:  # children live in their parent's experiment
            self.experiment_id = self.client.get_run(parent_run_id).info.experiment_id
        self.parent_run_id: str = parent_run_id
        self.study: Optional[str] = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparktrain-mlflow")
        self._runs: Dict[int, Future] = {}
        self._pending: List[Future] = []

    # ---- Listener --------------------------------------------------------------------------------------------
    def on_start(self, number: int, params: Dict[str, Any], group: str, start_time: float) -> None:
        self._runs[number] = self._submit(self._create_child, number, params, group, start_time)

    def on_finish(self, record: TrialRecord) -> None:
        self._pending.append(self._submit(self._finish_child, record, time.time()))

    def _submit(self, fn, *args) -> Future:
        fut = self._pool.submit(fn, *args)
        fut.add_done_callback(_log_failure)
        return fut

    def _create_child(self, number: int, params: Dict[str, Any], group: str, start_time: float) -> str:
        from mlflow.entities import Param

        from sparktrain.track.tracker import KIND_TAG, PARENT_TAG

        run = self.client.create_run(
            self.experiment_id, start_time=int(start_time * 1000), run_name=f"trial-{number:03d}",
            tags={PARENT_TAG: self.parent_run_id, KIND_TAG: "trial", "sparktrain.trial": str(number),
                  "sparktrain.job_group": group, **({STUDY_TAG: self.study} if self.study else {})})
        self.client.log_batch(run.info.run_id, params=[Param(k, _param_text(v)) for k, v in sorted(params.items())])
        return run.info.run_id

    def _finish_child(self, record: TrialRecord, end_time: float) -> None:
        from mlflow.entities import Metric, RunTag

        run_id = self._runs[record.number].result()
        now = int(end_time * 1000)
        metrics = [Metric(k, float(v), now, int(row.get("epoch", i)))
                   for i, row in enumerate(record.history) for k, v in row.items()
                   if k != "epoch" and isinstance(v, (int, float)) and v == v]
        if not record.history:
            metrics += [Metric(k, float(v), now, 0) for k, v in record.metrics.items()]
        metrics.append(Metric("trial_seconds", record.seconds, now, 0))
        if record.objective_seconds is not None:
            metrics.append(Metric("objective_seconds", record.objective_seconds, now, 0))
        if record.history:
            metrics.append(Metric("epochs_ran", float(record.epochs), now, 0))
        tags = [RunTag("sparktrain.status", record.status)]
        if record.status == PRUNED:
            tags.append(RunTag("sparktrain.pruned_after_epoch", str(record.epochs)))
        if record.error:
            tags.append(RunTag("sparktrain.error", record.error[:_MAX_TAG]))
        for start in range(0, len(metrics), 900):  # log_batch takes at most 1000 entries
            self.client.log_batch(run_id, metrics=metrics[start:start + 900], tags=tags if start == 0 else [])
        if record.traceback:
            self.client.log_text(run_id, record.traceback, "error.txt")
        self.client.set_terminated(run_id, status=MLFLOW_STATUS.get(record.status, record.status), end_time=now)

    # ---- a continued study ------------------------------------------------------------------------------------
    def adopt_study(self, study: str) -> List[str]:
        """Tag this search's runs with ``study`` and end the runs a killed search of it left RUNNING.

        Called once this search holds the study's lease, so no other live search runs it: a RUNNING run tagged
        with the study (a trial, the search's run, and that run's RUNNING parent, the killed job's) belongs to a
        search whose process is gone.  They end KILLED, tagged with why.  Returns their run ids.
        """
        from sparktrain.track.tracker import KIND_TAG, PARENT_TAG

        self.study = study
        self.client.set_tag(self.parent_run_id, STUDY_TAG, study)
        stale = self.client.search_runs([self.experiment_id], f"tags.`{STUDY_TAG}` = '{study}' and "
                                                              f"attributes.status = 'RUNNING'", max_results=1000)
        ended: List[str] = []
        why = f"its search of study '{study}' ended without closing it (the process was killed); a later search " \
              f"continued the study"
        own = {self.parent_run_id, self.client.get_run(self.parent_run_id).data.tags.get(PARENT_TAG)}
        for run in stale:
            if run.info.run_id in own:  # this search's run (just tagged) and its job's: alive
                continue
            ids = [run.info.run_id]
            parent = run.data.tags.get(PARENT_TAG)
            if parent and run.data.tags.get(KIND_TAG) != "trial":  # the killed search's own run: its job's too
                ids.append(parent)
            for run_id in ids:
                if run_id in (*own, *ended) or self.client.get_run(run_id).info.status != "RUNNING":
                    continue
                self.client.set_tag(run_id, "sparktrain.error", why)
                self.client.set_terminated(run_id, status="KILLED")
                ended.append(run_id)
        if ended:
            log.warning("study '%s': ended %d MLflow run(s) a killed search left RUNNING (KILLED): %s", study,
                        len(ended), ", ".join(ended))
        return ended

    # ---- after the search ------------------------------------------------------------------------------------
    def run_ids(self) -> Dict[int, str]:
        """Trial number -> child run id (waits for pending writes)."""
        self.flush()
        return {n: f.result() for n, f in self._runs.items() if f.exception() is None}

    def flush(self) -> None:
        for fut in [*self._runs.values(), *self._pending]:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - already logged by _log_failure
                pass

    def log_summary(self, records: Sequence[TrialRecord], metric: str, goal: str, settings: Dict[str, Any],
                    best_run_id: Optional[str] = None, test: Optional[Mapping[str, float]] = None) -> None:
        """Search settings, best metric, the trials table and a loss-versus-trial PNG on the parent run.

        The best trial's run gets tag ``sparktrain.best = true`` and its ``test`` metrics.
        """
        from mlflow.entities import Metric, Param

        self.flush()
        now = int(time.time() * 1000)
        done = [r.metric for r in records if r.status == FINISHED and r.metric is not None]
        metrics = [Metric("tune_trials", len(records), now, 0),
                   Metric("tune_failed", sum(r.status == FAILED for r in records), now, 0),
                   Metric("tune_killed", sum(r.status == KILLED for r in records), now, 0),
                   Metric("tune_pruned", sum(r.status == PRUNED for r in records), now, 0)]
        if done:
            best = min(done) if goal == "min" else max(done)
            metrics.append(Metric(f"best_{metric}", best, now, 0))
        from mlflow.entities import RunTag

        existing = self.client.get_run(self.parent_run_id).data.params
        params = [Param(f"tune.{k}", _param_text(v)) for k, v in settings.items() if f"tune.{k}" not in existing]
        # a job logged its config's value (tune.study: '' for the default name); a param cannot change: the
        # resolved value (the study's name, where it is kept) goes in a tag
        tags = [RunTag(f"sparktrain.tune.{k}", _param_text(v)) for k, v in settings.items()
                if f"tune.{k}" in existing and existing[f"tune.{k}"] != _param_text(v)]
        metrics += [Metric(k, float(v), now, 0) for k, v in (test or {}).items()]
        self.client.log_batch(self.parent_run_id, metrics=metrics, params=params, tags=tags)
        if best_run_id:
            self.client.log_batch(best_run_id, metrics=[Metric(k, float(v), now, 0) for k, v in (test or {}).items()],
                                  tags=[RunTag("sparktrain.best", "true")])
        table = [{"trial": r.number, "status": r.status, metric: r.metric, "seconds": r.seconds, "epochs": r.epochs,
                  "params": {k: list(v) if isinstance(v, tuple) else v for k, v in r.params.items()},
                  "error": r.error} for r in records]
        self.client.log_text(self.parent_run_id, json.dumps(table, indent=2, default=str), "tune/trials.json")
        with tempfile.TemporaryDirectory(prefix="sparktrain-tune-") as tmp:
            path = os.path.join(tmp, "loss_vs_trial.png")
            plot_trials(records, metric, goal, path)
            self.client.log_artifact(self.parent_run_id, path, "tune")

    def close(self, failed: bool = False) -> None:
        """Flush, and end the parent run when this tracker created it (not when the server stopped answering)."""
        self.flush()
        self._pool.shutdown(wait=True)
        if self.job.down is not None:
            log.warning("not ending MLflow run %s: the tracking server is down (%s)", self.parent_run_id,
                        self.job.down)
        elif self.owns_parent:
            self.job.end_run(self.parent_run_id, status="FAILED" if failed else "FINISHED")


def register_best(spark, tracker: TrialTracker, cfg: Any, model: Any, dataset_path: str, run_id: str,
                  metrics: Mapping[str, float], embedded: Optional[Embedded] = None) -> Optional[Tuple[str, bool]]:
    """Log the best trial's model on its child run, register it, move ``champion`` when it is better.

    With a dataset written by ``sparktrain preprocess`` (it has ``features.json``)
    this is :func:`sparktrain.track.registry.log_model_and_register`: one pyfunc
    model with the feature pipeline and the network.  Other Parquet (written by
    hand) has no feature pipeline to bundle: the network alone is logged with
    its Spark ML writer under the run's ``model`` artifact (``TorchModel.load``
    reads it back) and registered, with the same champion rule.  ``embedded``
    names the datasets ``data.source`` may give, for the model's input example.

    Returns
    -------
    (str, bool) or None
        The registered version and whether ``champion`` moved to it (None when
        ``tracking.register`` is off).
    """
    from sparktrain.track.lineage import log_dataset_inputs
    from sparktrain.track.registry import (log_model_and_register, score_basis, score_of,
                                           set_champion_if_better)

    log_dataset_inputs(tracker.client, [tracker.parent_run_id, run_id], dataset_path, name=cfg.name)
    from sparktrain.data.commit import resolve

    if os.path.isfile(os.path.join(resolve(dataset_path), "features.json")):
        from sparktrain.track.stages import raw_input_example

        example = raw_input_example(spark, cfg, dataset_path, embedded=embedded)
        registered = log_model_and_register(model, dataset_path, cfg, metrics, run_id=run_id, client=tracker.client,
                                            input_example=example)
        return None if registered.version is None else (str(registered.version), bool(registered.champion))
    log.warning("%s has no features.json (not written by `sparktrain preprocess`): logging the network alone, "
                "without a feature pipeline", dataset_path)
    client = tracker.client
    with tempfile.TemporaryDirectory(prefix="sparktrain-model-") as tmp:
        local = os.path.join(tmp, "model")
        model.write().save(local)  # a fresh folder: no overwrite (its check needs the JVM, absent under Connect)
        client.log_artifacts(run_id, local, "model")
    if not cfg.tracking.register:
        return None
    name = cfg.tracking.model_name
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/model"
    version = int(client.create_model_version(name, source=source, run_id=run_id,
                                              tags={"sparktrain.run_id": run_id}).version)
    metric, score, higher = score_of(model.inputs.task, metrics, model.history)
    moved = set_champion_if_better(client, name, version, metric, score, higher, basis=score_basis(model.inputs))
    return str(version), moved


def plot_trials(records: Sequence[TrialRecord], metric: str, goal: str, path: str) -> None:
    """PNG: each finished trial's metric by trial number, the running best, pruned trials and failures marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    done = sorted((r.number, r.metric) for r in records if r.status == FINISHED and r.metric is not None)
    if done:
        xs, ys = zip(*done, strict=True)
        ax.scatter(xs, ys, label=f"{metric} (finished)", color="tab:blue", zorder=3)
        best, running = [], None
        for y in ys:
            running = y if running is None else (min(running, y) if goal == "min" else max(running, y))
            best.append(running)
        ax.step(xs, best, where="post", color="tab:green", label="best so far")
    pruned = sorted((r.number, r.metric) for r in records if r.status == PRUNED and r.metric is not None)
    if pruned:
        px, py = zip(*pruned, strict=True)
        ax.scatter(px, py, label=f"{metric} when pruned", color="tab:orange", marker="v", zorder=3)
    bad = [r.number for r in records if r.status not in (FINISHED, PRUNED)]
    if bad:
        level = max(y for _, y in done) if done else 0.0
        ax.scatter(bad, [level] * len(bad), marker="x", color="tab:red", label="failed / killed", zorder=3)
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by trial ({goal}imize)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path)


def _param_text(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return json.dumps(list(value))
    return str(value)


def _log_failure(fut: Future) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("MLflow logging for the search failed: %s: %s", type(exc).__name__, exc)
