"""Run one Spark barrier stage of ``num_workers`` training tasks and collect the result.

The stage is ``spark.range(n, numPartitions=n).mapInArrow(task, schema, barrier=True)``:
DataFrame API only (no RDDs), so the same code can target Spark Connect.
Everything that differs under Connect lives in :mod:`sparktrain._internal.spark_compat`.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from sparktrain._internal import spark_compat
from sparktrain._internal.secrets import mask_value
from sparktrain.errors import SlotsUnavailableError, TrainingError, TrainingStalledError
from sparktrain.train._executor.spec import WorkerSpec
from sparktrain.train._executor.task import ERROR_MARKER, RESULT_SCHEMA, make_task
from sparktrain.train.progress import ProgressServer, RequestHandler, TrainingCallback, connection_cap
from sparktrain.train.resources import training_profile
from sparktrain.train.watchdog import StallWatchdog

log = logging.getLogger(__name__)

_MARKER_RE = re.compile(re.escape(ERROR_MARKER) + r"(.*?)" + re.escape(ERROR_MARKER), re.S)
_LOST_TASK_RE = re.compile(r"(?:Lost task|Task) (\d+)(?:\.\d+)? in stage")
#: what a rank's collective raises when a peer's process is gone: the echo of the peer's failure, not the cause
_ECHO_RE = re.compile(r"connection (?:closed|reset) by peer|broken pipe|socket closed|connection refused", re.I)
#: Spark's words for a task whose Python worker process died (no Python error of its own)
_DIED_RE = re.compile(r"exited unexpectedly|crashed|EOFError")
#: Spark's words for a task lost with its executor (a Worker, host or container gone)
_LOST_RE = re.compile(r"ExecutorLostFailure|executor \S+ (?:was )?lost|RPC client disassociated", re.I)
_LOST_HINT = (" (the executor went away with its host, Worker or container: Spark retries the stage only when "
              "the cluster has the slots again; elastic=True (train.elastic) continues on the free ones)")
_DIED_HINT = (" (the Python worker process died, e.g. killed for memory or by os._exit; "
              "raise spark.task.maxFailures, or use local[N,F] locally, to let training resume "
              "from its last checkpoint)")


@dataclass
class LaunchResult:
    """What the barrier stage returned."""

    history: List[Dict[str, float]]
    model_bytes: bytes = field(repr=False)
    param_digests: Dict[int, str]
    attempts: int
    seconds: float
    first_step_s: Optional[float] = None
    hosts: Dict[int, str] = field(default_factory=dict)
    plan_s: float = 0.0  # driver time before the launch (plan + preflight), set by fit()
    world_sizes: List[int] = field(default_factory=list)  # one per launch (elastic relaunches add one)
    devices: Dict[int, Dict[str, Any]] = field(default_factory=dict)  # rank -> GPU addresses and device used

    @property
    def fit_to_first_step_s(self) -> Optional[float]:
        """Seconds from ``fit()`` to the first training step (planning included)."""
        return None if self.first_step_s is None else self.plan_s + self.first_step_s


class _FirstStep:
    """A callback recording when the first metrics arrived (time-to-first-step)."""

    def __init__(self) -> None:
        self.t: Optional[float] = None

    def on_step(self, epoch: int, step: int, metrics: Dict[str, float]) -> None:
        if self.t is None:
            self.t = time.perf_counter()

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> None:
        if self.t is None:
            self.t = time.perf_counter()


ELASTIC_SETTLE_S = 2.0  # after a failure, before an elastic run counts the free slots


@dataclass(frozen=True)
class ElasticPolicy:
    """``train.elastic``: after a failure, continue on the free slots if there are at least ``min_workers``."""

    min_workers: int


def launch(spark, spec: WorkerSpec, callbacks: Sequence[TrainingCallback] = (), show_bar: bool = True,
           handlers: Optional[Mapping[str, RequestHandler]] = None) -> LaunchResult:
    """Train with ``spec.num_workers`` barrier tasks; raise :class:`TrainingError` on failure.

    Spark retries a failed barrier stage on the same number of workers (up to
    ``spark.task.maxFailures``); every retry resumes from the last checkpoint.
    With ``spec.failure.elastic``, a failure after which fewer slots are free
    than ``num_workers`` (an executor lost) continues on the free slots, if at
    least ``min_workers``, from the same checkpoint.  ``handlers`` answer the ranks' requests on the
    progress channel (a search's pruning verdicts: ``{"verdict": handler}``).
    """
    t0 = time.perf_counter()
    log_every_s = spec.logging.log_every_s
    elastic = ElasticPolicy(spec.failure.min_workers or spec.num_workers) if spec.failure.elastic else None
    relaunches = 0
    budget = max(1, spark_compat.task_max_failures(spark))  # elastic relaunches allowed
    sizes = [spec.num_workers]
    while True:
        can_relaunch = elastic is not None and relaunches < budget
        try:
            with spark_compat.bounded_connect_retries(spark):  # a lost Connect server: an error in ~1 minute
                result = _launch_once(spark, spec, callbacks, show_bar, t0, log_every_s,
                                      elastic if can_relaunch else None, handlers or {})
            result.world_sizes = sizes
            return result
        except (TrainingStalledError, SlotsUnavailableError):
            raise
        except TrainingError as exc:
            if elastic is None or not can_relaunch:
                raise
            free: Optional[int] = exc.free if isinstance(exc, _SlotsLost) else None
            if free is None:
                time.sleep(ELASTIC_SETTLE_S)  # let the scheduler hand the failed stage's slots out (or lose them)
                free = spark_compat.free_slots(spark)
            if free is None or free >= spec.num_workers:
                raise  # not a lost executor: the same failure would happen again
            if free < elastic.min_workers:
                raise TrainingError(f"{exc.args[0] if exc.args else exc} -- and only {free} task slot(s) are free, "
                                    f"fewer than minWorkers = {elastic.min_workers}; resume later with the same "
                                    f"runId ({spec.run_id}) when the cluster has room", rank=exc.rank,
                                    host=exc.host) from exc
            relaunches += 1
            log.warning("run %s: a rank failed (%s) and only %d slot(s) are free: continuing on %d worker(s) from "
                        "the last checkpoint", spec.run_id, spark_compat.error_summary(exc, 200), free, free)
            spec = spec.with_workers(free)
            sizes.append(free)


class _SlotsLost(TrainingError):
    """Spark's retry of the training stage waited for slots that are not free (elastic runs only)."""

    def __init__(self, message: str, free: int) -> None:
        super().__init__(message, rank=None, host=None)
        self.free = free


class _SlotMonitor:
    """Watch for a retried training stage waiting for more task slots than are free.

    Spark retries a failed barrier stage on the same number of tasks and waits,
    without a timeout, until all of them can start at once.  After a lost
    executor that may never happen.  Every ``WARN_S`` seconds of such a wait is
    logged; with an elastic policy (given only while :func:`launch` may still
    relaunch), a wait of ``ELASTIC_SETTLE_S`` with at least ``min_workers``
    free slots cancels the stage so that :func:`launch` continues on them.
    Any other wait is bounded by ``give_up_s`` (``stallTimeout``: no rank can
    make progress meanwhile): the stage is cancelled and ``gave_up`` says
    how long it waited and how many slots were free.
    """

    WARN_S = 30.0

    def __init__(self, spark, group: str, num_workers: int, run_id: str, elastic: Optional[ElasticPolicy],
                 poll: float = 0.5, give_up_s: float = 600.0) -> None:
        import threading

        self.spark, self.group, self.n, self.run_id, self.elastic = spark, group, num_workers, run_id, elastic
        self.give_up_s = give_up_s
        self.free: Optional[int] = None  # set when the monitor cancelled the stage
        self.gave_up: Optional[Dict[str, float]] = None  # {"waited_s", "free"} when the wait hit give_up_s
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparktrain-slots", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        since: Optional[float] = None
        warned = 0.0
        while not self._stop.wait(self._poll):
            try:
                waiting = spark_compat.waiting_retry(self.spark, self.group)
                free = spark_compat.free_slots(self.spark) if waiting else None
            except Exception:  # the context is stopping: nothing to watch
                return
            if not waiting or free is None or free >= self.n:
                since, warned = None, 0.0
                continue
            now = time.monotonic()
            since = since or now
            if self.elastic is not None and free >= self.elastic.min_workers and now - since >= ELASTIC_SETTLE_S:
                self.free = free
                spark_compat.cancel_group(self.spark, self.group)
                return
            if now - since >= self.give_up_s:
                self.gave_up = {"waited_s": now - since, "free": free}
                spark_compat.cancel_group(self.spark, self.group)
                return
            if now - since >= warned + self.WARN_S:
                warned = now - since
                log.warning("run %s: the retry of the training stage has waited %.0f s for %d task slots, %d free%s; "
                            "it gives up at %.0f s (stallTimeout)", self.run_id, now - since, self.n, free,
                            "" if self.elastic else "; with elastic=True (minWorkers) it would continue on them",
                            self.give_up_s)

    def close(self) -> None:
        self._stop.set()


def _launch_once(spark, spec: WorkerSpec, callbacks: Sequence[TrainingCallback], show_bar: bool,
                 t0: float, log_every_s: float = 30.0, elastic: Optional[ElasticPolicy] = None,
                 handlers: Optional[Mapping[str, RequestHandler]] = None) -> LaunchResult:
    first = _FirstStep()
    host = spark_compat.driver_host(spark)
    per_rank = 2 if spec.backend == "mwms" else 1  # a Keras MWMS rank reports from its task and its child
    server = ProgressServer(host, [first, *callbacks], epochs=spec.optim.epochs, show_bar=show_bar,
                            log_every_s=log_every_s,
                            max_connections=connection_cap(spec.num_workers, per_rank)) if host else None
    for op, handler in (handlers or {}).items():
        if server is not None:
            server.on_request(op, handler)
    group = spark_compat.current_group(spark)
    own_group = group is None
    group = group or f"sparktrain-{spec.run_id}-{uuid.uuid4().hex[:8]}"
    watchdog: Optional[StallWatchdog] = None
    slots: Optional[_SlotMonitor] = None
    try:
        if server is not None:
            spec = replace(spec, progress_address=server.address, token=server.token)
            n_tasks = spec.num_workers
            watchdog = StallWatchdog(spec.num_workers, spec.failure.stall_timeout_s,
                                     on_stall=lambda info: spark_compat.cancel_group(spark, group),
                                     task_state=spark_compat.TaskStates(spark, group, n_tasks),
                                     run=spec.run_id)  # every rank's events carry it; the stall error names it
            server.listeners.append(watchdog)
        spec = replace(spec, failure=replace(spec.failure, max_attempts=spark_compat.task_max_failures(spark)),
                       launch_id=uuid.uuid4().hex[:12])
        n = spec.num_workers
        # The shuffle after the barrier stage makes it a ShuffleMapStage: Spark retries a failed barrier
        # map stage as a whole (up to spark.task.maxFailures), but never a barrier ResultStage.
        profile = training_profile(spark, spec.scaling.gpus_per_worker)
        df = spark_compat.map_in_arrow_barrier(spark.range(0, n, 1, numPartitions=n), make_task(spec),
                                               RESULT_SCHEMA, profile).repartition(1)
        if own_group:
            slots = _SlotMonitor(spark, group, n, spec.run_id, elastic, give_up_s=spec.failure.stall_timeout_s)
        try:
            if own_group:
                with spark_compat.job_group(spark, group, f"sparktrain training, run {spec.run_id}"):
                    rows = df.collect()
            else:  # already in a caller's job group (a tuning trial): a stall cancels that group
                rows = df.collect()
        except Exception as exc:  # py4j / PythonException / Connect errors
            stalled = watchdog.stalled if watchdog is not None else None
            if stalled is not None:
                raise TrainingStalledError(stalled, spec.failure.stall_timeout_s) from exc
            if slots is not None and slots.gave_up is not None:
                raise SlotsUnavailableError(spec.run_id, n, int(slots.gave_up["free"]), slots.gave_up["waited_s"],
                                            _first_failure(spark, group, spec),
                                            elastic.min_workers if elastic is not None else None) from exc
            if spark_compat.lost_connect_server(spark, exc):
                raise TrainingError(f"lost the Spark Connect server: it did not answer for "
                                    f"{spark_compat.CONNECT_RETRY_S} s ({spark_compat.error_summary(exc, 300)}). "
                                    f"Its executors, which ran the ranks, went with it") from exc
            if slots is not None and slots.free is not None:
                raise _SlotsLost(f"{_first_failure(spark, group, spec) or 'a rank failed'} -- Spark's retry waited "
                                 f"for {n} task slots, {slots.free} free", slots.free) from exc
            raise worker_error(exc, _root_cause(spec) or (server.first_error() if server else None),
                               died=died_ranks(spark, group, n)) from exc
        except BaseException:  # Ctrl-C in a notebook or a shell: the ranks must not train on, unseen
            _stop_stage(spark, group, spec.run_id)
            raise
    finally:
        if slots is not None:
            slots.close()
        if watchdog is not None:
            watchdog.close()
        if server is not None:
            time.sleep(0.05)  # let the last events drain
            server.close()
    by_rank = {r["rank"]: r for r in rows}
    rank0 = by_rank[0]
    from sparktrain.train._executor.checkpoint import Checkpointer
    model_bytes, written = Checkpointer(spec.store, spec.run_id).read_model()  # rank 0 wrote it to the store
    if written.get("launch") != spec.launch_id:
        raise TrainingError(f"the model in the store of run {spec.run_id} was not written by this fit "
                            f"(launch {written.get('launch')!r}, expected {spec.launch_id!r})", rank=0, host=None)
    return LaunchResult(
        history=json.loads(rank0["history"]), model_bytes=model_bytes,
        param_digests={k: v["param_digest"] for k, v in by_rank.items()},
        attempts=max(r["attempt"] for r in rows) + 1, seconds=time.perf_counter() - t0,
        first_step_s=(first.t - t0) if first.t else None, hosts={k: v["host"] for k, v in by_rank.items()},
        devices={rank: {k: event.get(k) for k in ("addresses", "device", "note", "host")}
                 for rank, event in (server.devices.items() if server is not None else ())})


#: seconds an interrupted fit waits for its cancelled training stage to end (its run's lease is held meanwhile)
INTERRUPT_WAIT_S = 60.0


def _stop_stage(spark, group: str, run_id: str) -> None:
    """Cancel the training stage of an interrupted fit and wait for its tasks to end.

    The caller's lease on the run is released only after this returns, so no other fit can claim the
    run while its ranks still write checkpoints.
    """
    log.warning("run %s: interrupted; cancelling its training stage (job group %s)", run_id, group)
    try:
        spark_compat.cancel_group(spark, group)
        if not spark_compat.wait_group_ended(spark, group, INTERRUPT_WAIT_S):
            log.warning("run %s: its training stage still ran %.0f s after the cancel; see the Spark UI (job group "
                        "%s)", run_id, INTERRUPT_WAIT_S, group)
    except Exception as exc:  # noqa: BLE001 - a stopping context: the interrupt is what the caller must see
        log.warning("run %s: could not cancel its training stage: %s", run_id, exc)


def _root_cause(spec: WorkerSpec) -> Optional[Dict[str, Any]]:
    """The earliest worker error recorded in the store (a peer's error is often just the echo)."""
    try:
        from sparktrain.train._executor.checkpoint import Checkpointer
        failures = Checkpointer(spec.store, spec.run_id, spec.launch_id).failures()
    except Exception:
        return None
    return failures[0] if failures else None


def _first_failure(spark, group: str, spec: WorkerSpec) -> str:
    """One line on what failed first: a rank's own error, or the rank whose worker died or executor was lost.

    A lost executor's rank reports nothing, and its peers' collectives fail with an echo of it
    ("connection closed by peer"): the lost rank is named instead of that echo.
    """
    reported = _root_cause(spec)
    dead = died_ranks(spark, group, spec.num_workers)
    if dead and (not reported or is_echo(reported)):
        rank = min(dead)
        return describe_dead(rank, dead[rank], hint=False)
    return str((reported or {}).get("message", "")).strip().splitlines()[0][:300] if reported else ""


def died_ranks(spark, group: str, num_workers: int) -> Dict[int, Dict[str, str]]:
    """Ranks of ``group``'s barrier stage whose Python worker died or whose executor was lost.

    ``{rank: {"message": Spark's reason, "host": ..., "why": "died" | "lost"}}``.  Such a rank
    reports nothing itself: only Spark knows (``{}`` where its status store cannot say).
    """
    try:
        failed = spark_compat.failed_tasks(spark, group, num_workers)
    except Exception as exc:  # noqa: BLE001 - advisory: the reported errors still name a rank
        log.debug("status store: %s", exc)
        return {}
    found = {}
    for rank, f in failed.items():
        why = "lost" if _LOST_RE.search(f["message"]) else "died" if _DIED_RE.search(f["message"]) else None
        if why:
            found[rank] = dict(f, message=f["message"].strip().splitlines()[0][:500], why=why)
    return found


def describe_dead(rank: int, dead: Mapping[str, str], hint: bool = True) -> str:
    """What happened to a rank that reported nothing: its Python worker died, or its executor was lost."""
    if dead.get("why") == "lost":
        where = f" on {dead['host']}" if dead.get("host") else ""
        return f"the executor of rank {rank}{where} was lost: {dead['message']}{_LOST_HINT if hint else ''}"
    return f"the Python worker of rank {rank} died: {dead['message']}{_DIED_HINT if hint else ''}"


def is_echo(reported: Optional[Mapping[str, Any]]) -> bool:
    """Whether a rank's reported error is a collective's connection closed/reset by a peer (the peer's echo)."""
    return reported is not None and bool(_ECHO_RE.search(str(reported.get("message", ""))))


def worker_error(exc: BaseException, reported: Optional[Dict[str, Any]],
                 died: Optional[Mapping[int, Mapping[str, str]]] = None) -> TrainingError:
    """Rebuild the worker's failure (rank, host, traceback) from what reached the driver.

    ``reported`` is the earliest error a rank reported; ``died`` the ranks whose Python worker
    died (:func:`died_ranks`).  A dead rank reports nothing, and its peers' collectives fail with
    "connection closed by peer": when the reported error is such an echo, the dead rank is named.
    """
    dead = {r: d for r, d in (died or {}).items() if not reported or r != reported.get("rank")}
    if dead and (not reported or is_echo(reported)):
        lost_rank = min(dead)
        message = describe_dead(lost_rank, dead[lost_rank])
        if reported:
            message += (f". Rank {reported.get('rank')}'s error is only the echo of it: "
                        f"{reported.get('message', '')}")
        return _training_error(message, rank=lost_rank, host=dead[lost_rank].get("host") or None,
                               remote_traceback=(reported or {}).get("traceback") or _tail(str(exc)))
    if reported and reported.get("traceback"):
        return _training_error(reported.get("message", "worker failed"), rank=reported.get("rank"),
                               host=reported.get("host"), remote_traceback=reported["traceback"])
    text = str(exc)
    match = _MARKER_RE.search(text)
    if match:
        try:
            info = json.loads(match.group(1))
            return _training_error(info["message"], rank=info["rank"], host=info["host"],
                                   remote_traceback=info["traceback"])
        except (ValueError, KeyError):
            pass
    if reported:
        return _training_error(reported.get("message", "worker failed"), rank=reported.get("rank"),
                               host=reported.get("host"), remote_traceback=reported.get("traceback", ""))
    lost = _LOST_TASK_RE.search(text)
    rank = int(lost.group(1)) if lost else None
    hint = _LOST_HINT if _LOST_RE.search(text) else _DIED_HINT if _DIED_RE.search(text) else ""
    summary = spark_compat.error_summary(text, limit=500) if text.strip() else type(exc).__name__
    return _training_error(summary + hint, rank=rank, host=None, remote_traceback=_tail(text))


def _training_error(message: str, rank: Optional[int], host: Optional[str], remote_traceback: str) -> TrainingError:
    """A :class:`TrainingError`, masked: the executor masks what it reports, but not Spark's own error text."""
    return TrainingError(mask_value(message), rank=rank, host=host, remote_traceback=mask_value(remote_traceback))


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
