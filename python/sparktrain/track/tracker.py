"""The run hierarchy of a job: one parent run, one child run per stage or trial.

Every call logs through :class:`mlflow.MlflowClient` with an explicit run id,
never through MLflow's thread-local active run, so it is safe from the
progress server's thread (training callbacks) and from a tuning driver.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from typing import Any, Dict, Iterator, Mapping, Optional, Set

from sparktrain._internal.secrets import mask_config, mask_value
from sparktrain._internal.spark_compat import error_summary
from sparktrain.errors import TrackingError

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
KIND_TAG = "sparktrain.kind"      # job | stage | trial | ...
STAGE_TAG = "sparktrain.stage"
_BATCH = 100                      # MLflow's log_batch limit for params
#: Config sections whose params a stage run repeats (the job run has them all).
STAGE_SECTIONS = {"profile": ("data",), "preprocess": ("data", "features", "split", "output"),
                  "train": ("train",), "tune": ("tune", "train")}


def _metric_list(metrics: Mapping[str, Any], step: int, timestamp: Optional[int] = None) -> list:
    from mlflow.entities import Metric

    ts = timestamp or int(time.time() * 1000)
    out = []
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out.append(Metric(key=str(k), value=float(v), timestamp=ts, step=int(step)))
    return out


class StageRun:
    """One MLflow run (a job, a stage or a trial) and helpers that log to it by id.

    Attributes
    ----------
    run_id : str
        The MLflow run id.
    name : str
        The run name shown in the UI.
    """

    def __init__(self, client: Any, run_id: str, name: str) -> None:
        self.client = client
        self.run_id = run_id
        self.name = name

    def __repr__(self) -> str:
        return f"StageRun(name={self.name!r}, run_id={self.run_id!r})"

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Log numeric values (others are skipped) at ``step``."""
        items = _metric_list(metrics, step)
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000], synchronous=True)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params (stringified), in batches of 100."""
        from mlflow.entities import Param

        items = [Param(str(k), "" if v is None else str(v)) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _BATCH], synchronous=True)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (stringified)."""
        from mlflow.entities import RunTag

        items = [RunTag(str(k), str(v)) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, tags=items[i:i + _BATCH], synchronous=True)

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """Upload a file or a directory's files (``log_artifacts``)."""
        import os

        if os.path.isdir(local_path):
            self.client.log_artifacts(self.run_id, local_path, artifact_path)
        else:
            self.client.log_artifact(self.run_id, local_path, artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib ``Figure`` as a PNG artifact."""
        self.client.log_figure(self.run_id, figure, artifact_file)

    def callback(self) -> "MlflowCallback":
        """A training callback logging per-epoch metrics to this run (step = epoch)."""
        return MlflowCallback(self.client, self.run_id)


class MlflowCallback:
    """A :class:`~sparktrain.train.progress.TrainingCallback` that logs epoch metrics by run id.

    ``on_epoch`` only queues the metrics: a background thread logs them with
    ``step=epoch``, so a slow or dead tracking server never blocks training
    (nor the progress channel).  After the first failed call the thread stops
    calling MLflow and keeps the epochs; :meth:`log_missing` logs them later.
    Steps within an epoch are not logged (they would make a metric's history
    longer than the number of epochs); the last one is kept in :attr:`last_step`.
    """

    def __init__(self, client: Any, run_id: str) -> None:
        import queue
        import threading

        self.client = client
        self.run_id = run_id
        self.epochs_logged: Set[int] = set()
        self.last_step: Dict[str, float] = {}
        self.failure: Optional[str] = None
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def on_step(self, epoch: int, step: int, metrics: Mapping[str, float]) -> None:
        self.last_step = {"epoch": epoch, "step": step, **metrics}

    def on_world_size(self, epoch: int, step: int, old: int, new: int) -> None:
        """An elastic change of the number of workers: recorded as a param naming where it happened."""
        self._queue.put(("param", f"world_size_e{epoch}_s{step}", f"{old}->{new}"))
        self._start()

    def on_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self._queue.put(("epoch", int(epoch), dict(metrics)))
        self._start()

    def _start(self) -> None:
        import threading

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="sparktrain-mlflow", daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None or self.failure is not None:
                    continue
                if item[0] == "param":
                    self.client.log_param(self.run_id, item[1], item[2])
                else:
                    self._log_epoch(item[1], item[2])
            except Exception as exc:  # noqa: BLE001 - an outage must not reach training
                self.failure = error_summary(exc, 300, typed=True)
                log.warning("MLflow did not take the metrics of run %s (%s); training goes on, the epochs are "
                            "in the store's history", self.run_id, self.failure)
            finally:
                self._queue.task_done()
            if item is None:
                return

    def _log_epoch(self, epoch: int, metrics: Mapping[str, Any]) -> None:
        items = _metric_list({k: v for k, v in metrics.items() if k != "epoch"}, step=epoch)
        self.client.log_batch(self.run_id, metrics=items, synchronous=True)
        self.epochs_logged.add(int(epoch))

    def flush(self, timeout: float = 15.0) -> bool:
        """Wait (at most ``timeout`` s) for queued metrics; True when all were handled."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def log_missing(self, history: list) -> int:
        """Log epochs of ``history`` not logged yet (a resumed run, an outage); returns how many."""
        self.flush()
        n = 0
        for i, row in enumerate(history):
            epoch = int(row.get("epoch", i))
            if epoch not in self.epochs_logged:
                self._log_epoch(epoch, row)
                n += 1
        return n


class JobTracker:
    """Opens the experiment of a job config and creates its runs.

    Creating one runs the tracking preflight (an unreachable server or an
    unwritable sqlite folder raises :class:`~sparktrain.errors.TrackingError`
    naming the URI) and points MLflow's process-wide URIs at the store.

    Parameters
    ----------
    cfg : JobConfig
        Its ``tracking`` section gives the URI, artifact location and experiment.
    uri : str, optional
        Overrides ``cfg.tracking.uri``.
    """

    def __init__(self, cfg: Any, uri: Optional[str] = None) -> None:
        from mlflow import MlflowClient

        from sparktrain.track import store

        self.cfg = cfg
        self.uri = store.preflight(uri or cfg.tracking.uri)
        store.configure(self.uri)
        try:
            self.client = MlflowClient(self.uri, self.uri)
        except Exception as exc:  # a store MLflow cannot open (another MLflow's schema, a corrupt file)
            raise store.unusable_store(self.uri, exc) from exc
        self.experiment_id = store.get_or_create_experiment(
            self.client, cfg.tracking.experiment, store.artifact_root(self.uri, cfg.tracking.artifact_location))
        self.parent: Optional[StageRun] = None
        self.down: Optional[str] = None  # set on an outage: later calls are skipped, not retried

    def mark_down(self, reason: str) -> None:
        """Stop calling the tracking server for the rest of the job (its runs stay RUNNING there)."""
        self.down = reason

    def check_alive(self, timeout: float = 5.0) -> None:
        """Raise :class:`TrackingError` within ``timeout`` s when the tracking store does not answer."""
        from sparktrain.track import store

        store.preflight(self.uri, timeout=timeout)

    # -- runs -------------------------------------------------------------------------------------
    def start_run(self, name: str, tags: Optional[Mapping[str, Any]] = None,
                  params: Optional[Mapping[str, Any]] = None, parent_run_id: Optional[str] = None) -> StageRun:
        """Create a run (a child of ``parent_run_id``, else of the job run when one is open).

        The caller ends it with :meth:`end_run`; prefer the context managers.
        """
        all_tags = {"mlflow.runName": name, **(tags or {})}
        parent = parent_run_id or (self.parent.run_id if self.parent else None)
        if parent:
            all_tags[PARENT_TAG] = parent
        try:
            run = self.client.create_run(self.experiment_id, tags={k: str(v) for k, v in all_tags.items()},
                                         run_name=name)
        except Exception as exc:
            raise TrackingError(f"cannot create an MLflow run in {mask_value(self.uri)}: {mask_value(str(exc))}"
                                ) from exc
        handle = StageRun(self.client, run.info.run_id, name)
        if params:
            handle.log_params(params)
        return handle

    def end_run(self, run_id: str, status: str = "FINISHED", error: Optional[BaseException] = None) -> None:
        """Mark a run ``FINISHED`` or ``FAILED``; a failure keeps its message in tag ``sparktrain.error``."""
        if error is not None:
            text = mask_value("".join(traceback.format_exception_only(type(error), error)).strip())
            self.client.set_tag(run_id, "sparktrain.error", text[:5000])
        self.client.set_terminated(run_id, status=status)

    @contextlib.contextmanager
    def child_run(self, name: str, params: Optional[Mapping[str, Any]] = None,
                  tags: Optional[Mapping[str, Any]] = None, kind: str = "trial") -> Iterator[StageRun]:
        """A child run of the job run; ``FAILED`` (with the error) when the body raises.

        Its wall time is logged as metric ``seconds``.
        """
        run = self.start_run(name, tags={KIND_TAG: kind, **(tags or {})}, params=params)
        t0 = time.perf_counter()
        try:
            yield run
        except BaseException as exc:
            self._finish(run, t0, _status(exc), exc)
            raise
        self._finish(run, t0, "FINISHED", None)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[StageRun]:
        """A child run for one job stage (``profile``, ``preprocess``, ``train``, ``tune``).

        Logs the params of the config sections it uses (:data:`STAGE_SECTIONS`),
        ``seconds`` in the stage run and ``<name>_seconds`` in the job run.
        """
        from sparktrain.track.params import job_params

        sections = STAGE_SECTIONS.get(name, ())
        params = {k: v for k, v in job_params(self.cfg).items() if k.split(".", 1)[0] in sections}
        with self.child_run(name, params=params, tags={STAGE_TAG: name}, kind="stage") as run:
            yield run

    @contextlib.contextmanager
    def job(self, spark: Any = None, master: Optional[str] = None,
            run_name: Optional[str] = None) -> Iterator[StageRun]:
        """The parent run of a job: masked config params, system tags and the config YAML."""
        import yaml

        from sparktrain.track.params import job_params, system_tags

        if self.parent is not None:
            raise TrackingError(f"a job run is already open ({self.parent.run_id}); jobs do not nest")
        run = self.start_run(run_name or self.cfg.name, tags={KIND_TAG: "job", **system_tags(spark, self.cfg, master)},
                             params=job_params(self.cfg))
        try:
            run.log_text(yaml.safe_dump(mask_config(self.cfg.to_dict()), sort_keys=False), "config/job.yaml")
        except Exception as exc:  # the first artifact: a broken artifact store shows here, before any work
            try:
                self.end_run(run.run_id, "FAILED", exc)
            except Exception:  # noqa: BLE001 - the error below is the one to see
                pass
            try:
                location = self.client.get_experiment(self.experiment_id).artifact_location
            except Exception:  # noqa: BLE001 - the server itself went away: say what is known
                location = "unknown: the server did not answer either"
            raise TrackingError(
                f"MLflow at {mask_value(self.uri)} cannot store artifacts for experiment "
                f"'{self.cfg.tracking.experiment}' (its artifact location {mask_value(str(location))}; "
                f"{mask_value(error_summary(exc, 300, typed=True))}). Nothing "
                f"ran. Fix: make that location writable (a server's --artifacts-destination), or name a new "
                f"tracking.experiment (with tracking.artifact_location)") from exc
        self.parent = run
        t0 = time.perf_counter()
        try:
            yield run
        except BaseException as exc:
            self.parent = None
            self._finish(run, t0, _status(exc), exc, job=True)
            raise
        self.parent = None
        self._finish(run, t0, "FINISHED", None, job=True)

    def _finish(self, run: StageRun, t0: float, status: str, error: Optional[BaseException],
                job: bool = False) -> None:
        if self.down is not None:
            log.warning("not marking MLflow run %s %s: the tracking server is down (%s)", run.run_id, status,
                        self.down)
            return
        seconds = time.perf_counter() - t0
        try:
            run.log_metrics({"job_seconds" if job else "seconds": seconds})
            if not job and self.parent is not None and run.name and status == "FINISHED":
                self.parent.log_metrics({f"{run.name}_seconds": seconds})
            self.end_run(run.run_id, status, error if isinstance(error, Exception) else None)
        except Exception:  # never hide the body's own error behind a tracking one
            if error is None:
                raise
            log.exception("could not mark MLflow run %s %s", run.run_id, status)

    # -- links -------------------------------------------------------------------------------------
    def run_url(self, run_id: str, base: Optional[str] = None) -> str:
        """The UI address of a run (``base`` defaults to the server, or http://127.0.0.1:5000)."""
        from sparktrain.track.store import is_remote

        base = mask_value(base or (self.uri if is_remote(self.uri) else "http://127.0.0.1:5000"))
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"


def _status(exc: BaseException) -> str:
    """``KILLED`` for Ctrl-C and interpreter exit, ``FAILED`` for errors."""
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "FAILED"

