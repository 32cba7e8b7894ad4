"""Reused gangs: barrier stages that train trial after trial (the driver side; tasks in ``_executor.gang``).

A distributed search trial used to be a barrier stage of its own (2-3 s of
Spark job, Python workers, rendezvous and process group per trial).  A
:class:`Gang` launches the stage once and hands it trials over the progress
channel: the ranks ask ``next`` (with their result of the trial before), the
driver answers with the next trial's signed spec.  :class:`GangPool` keeps one
gang per trial that may run at once (``tune.parallelism``), and registers the
``next`` operation on the search's progress server.

Failures, as a separate barrier stage per trial handled them:

* a trial that raises ends that trial (its error comes back as its result),
  not the gang;
* a rank that dies fails the stage; Spark retries it (``spark.task.maxFailures``)
  and the new tasks get the running trial, which resumes from its last
  checkpoint.  When Spark gives up, the trial fails with the root cause and
  the pool launches a new gang for the next trial;
* a stalled trial (the stall watchdog, per trial) and a trial past its
  timeout cancel the gang's stage; the next trial gets a new gang.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from sparktrain._internal import spark_compat
from sparktrain.errors import TrainingError, TrainingStalledError
from sparktrain.train._executor.channel import sign
from sparktrain.train._executor.gang import GANG_SCHEMA, make_gang_task
from sparktrain.train._executor.spec import WorkerSpec
from sparktrain.train.launcher import LaunchResult, died_ranks, is_echo, worker_error
from sparktrain.train.progress import ProgressServer
from sparktrain.train.resources import training_profile
from sparktrain.train.watchdog import StallWatchdog

log = logging.getLogger(__name__)

#: seconds an idle gang's tasks wait for a trial before they end (the driver closes gangs it is done with)
IDLE_S = 900.0
#: seconds close() waits for a gang's stage to end after "stop"
CLOSE_S = 30.0
#: seconds the other ranks get to report after one reported its trial failed (else the gang is cancelled)
FAIL_GRACE_S = 3.0
#: a rank that sent something within this many seconds is alive (heartbeats come every second)
ALIVE_S = 2.5


def can_reuse(spec: WorkerSpec) -> Tuple[bool, str]:
    """Whether trials of ``spec`` can run on a reused gang, and why not."""
    if spec.backend == "horovod":
        return False, "Horovod initializes once per process"
    if spec.backend == "mwms":
        return False, "Keras MWMS trains in a child process per run"
    if spec.failure.elastic:
        return False, "an elastic run changes its number of workers"
    return True, ""


@dataclass
class _Trial:
    seq: int
    spec: WorkerSpec
    job: Dict[str, Any]
    started: float
    results: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    sent: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # client -> the job it was given (re-asks)
    dispatches: int = 0  # hand-outs to a whole gang (a retried stage asks again)
    gave_up: bool = False  # handed out max_attempts times already


@dataclass
class _Ask:
    """A rank's pending ``next`` request."""

    after: int
    client: str
    request: Dict[str, Any]
    reply: Callable[[Any], None]


class Gang:
    """One barrier stage of ``num_workers`` tasks that runs the trials :meth:`run` hands it, one at a time."""

    def __init__(self, spark, server: ProgressServer, num_workers: int, gpus_per_worker: int = 0) -> None:
        self.spark, self.server, self.n = spark, server, num_workers
        self.id = uuid.uuid4().hex[:10]
        self.group = f"sparktrain-gang-{self.id}"
        self.trials = 0
        self.error: Optional[BaseException] = None
        self.ended = False
        self.killed: Optional[str] = None
        self._cond = threading.Condition()
        self._seq = -1
        self._trial: Optional[_Trial] = None
        self._waiting: Dict[int, _Ask] = {}  # rank -> its newest unanswered "next"
        self._closing = False
        self._profile = training_profile(spark, gpus_per_worker)
        self._thread = threading.Thread(target=self._stage, name=f"sparktrain-gang-{self.id}", daemon=True)
        self._thread.start()
        log.info("gang %s: a barrier stage of %d task(s) for the search's trials", self.id, num_workers)

    @property
    def alive(self) -> bool:
        return not self.ended and self.killed is None

    def _stage(self) -> None:
        task = make_gang_task(self.id, self.server.address, self.server.token, IDLE_S)
        try:
            with spark_compat.job_group(self.spark, self.group, f"sparktrain tune: gang {self.id}"):
                df = spark_compat.map_in_arrow_barrier(self.spark.range(0, self.n, 1, numPartitions=self.n), task,
                                                       GANG_SCHEMA, self._profile).repartition(1)
                df.collect()  # see launcher: the shuffle makes the barrier stage retryable
        except BaseException as exc:  # noqa: BLE001 - kept for the running trial
            self.error = exc
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    # -- the "next" operation (called on the server's connection threads) ----------------------------------------

    def on_next(self, request: Dict[str, Any], reply: Callable[[Any], None]) -> None:
        ask = _Ask(int(request.get("after", -1)), str(request.get("client", "")), request, reply)
        rank = int(request.get("rank", -1))
        result = request.get("result")
        with self._cond:
            trial = self._trial
            if (isinstance(result, dict) and trial is not None and result.get("seq") == trial.seq
                    and result.get("attempt") == trial.dispatches - 1):  # not a stale one of a retried stage's
                trial.results[int(result.get("rank", -1))] = dict(result, time=time.monotonic())
                self._cond.notify_all()
            if self._closing:
                answers = [(reply, {"stop": True})]
            elif trial is not None and ask.client in trial.sent and ask.after < trial.seq:
                answers = [(reply, trial.sent[ask.client])]  # asked again after a reconnect: the same answer
            else:
                self._waiting[rank] = ask
                answers = self._dispatch()
        for answer, value in answers:
            answer(value)

    def _dispatch(self) -> List[Tuple[Callable[[Any], None], Any]]:
        """The current trial to every rank, once all ``n`` ask for it, with one plan for the process group.

        The kept group is reused when every rank reports the same whole group; otherwise (the first
        trial, a failed one, a retried stage) it is rebuilt from rank 0's fresh port.  Called with the lock.
        """
        trial = self._trial
        if trial is None or len(trial.results) >= self.n or trial.gave_up:
            return []
        ready = {r: a for r, a in self._waiting.items() if a.after < trial.seq}
        if sorted(ready) != list(range(self.n)):
            return []
        if trial.dispatches >= trial.spec.failure.max_attempts:  # Spark retried the stage under it that often
            trial.gave_up = True
            self._cond.notify_all()
            return []
        groups = {a.request.get("group") for a in ready.values()}
        reuse = len(groups) == 1 and None not in groups
        master = ready[0].request
        plan = {"id": groups.pop() if reuse else uuid.uuid4().hex[:12], "reuse": reuse,
                "master": [master.get("master_host"), master.get("master_port")],
                "hosts": [ready[r].request.get("host") for r in range(self.n)]}
        job = {**trial.job, "group": plan, "attempt": trial.dispatches}
        trial.dispatches += 1
        trial.results = {}  # a retried stage runs the trial again: the earlier attempt's results are void
        trial.sent = {a.client: job for a in ready.values()}
        for r in ready:
            del self._waiting[r]
        return [(a.reply, job) for a in ready.values()]

    # -- the driver's side -------------------------------------------------------------------------------------

    def run(self, spec: WorkerSpec) -> LaunchResult:
        """Train ``spec`` on the gang; raise :class:`TrainingError` when the trial failed or the gang died."""
        t0 = time.perf_counter()
        spec = replace(spec, progress_address=self.server.address, token=self.server.token,
                       launch_id=uuid.uuid4().hex[:12],
                       failure=replace(spec.failure, max_attempts=spark_compat.task_max_failures(self.spark)))
        watchdog = StallWatchdog(self.n, spec.failure.stall_timeout_s, on_stall=lambda info: self.kill("stalled"),
                                 task_state=spark_compat.TaskStates(self.spark, self.group, self.n),
                                 run=spec.run_id)
        self.server.listeners.append(watchdog)
        with self._cond:
            self._seq += 1
            trial = self._trial = _Trial(self._seq, spec, {"seq": self._seq, "spec": sign(spec, self.server.token)},
                                         time.time())
            answers = self._dispatch()
            self._cond.notify_all()
        for answer, value in answers:
            answer(value)
        try:
            with self._cond:
                while len(trial.results) < self.n and not self.ended and not trial.gave_up:
                    self._cond.wait(0.2)
                    failed_at = min((r["time"] for r in trial.results.values() if not r.get("ok")), default=None)
                    if (failed_at is not None and time.monotonic() - failed_at > FAIL_GRACE_S and self.killed is None
                            and peers_alive(self.n, trial.results, watchdog)):
                        self._cond.release()  # cancelling waits on Spark: not under the lock
                        try:
                            self.kill(f"run {spec.run_id} failed on a rank while its peers wait in a collective")
                        finally:
                            self._cond.acquire()
        finally:
            self.server.listeners.remove(watchdog)
            watchdog.close()
        self.trials += 1
        if trial.gave_up:
            root = _root_cause(spec) or {"message": "a rank was lost", "rank": None, "host": None}
            raise TrainingError(f"{root.get('message')} (gave up after {trial.dispatches} attempt(s))",
                                rank=root.get("rank"), host=root.get("host"),
                                remote_traceback=root.get("traceback", ""))
        failed = [r["error"] for r in trial.results.values() if not r.get("ok")]
        if len(trial.results) < self.n and watchdog.stalled is not None:  # the stalled rank, not its peers' gloo
            raise TrainingStalledError(watchdog.stalled, spec.failure.stall_timeout_s) from self.error
        if len(trial.results) < self.n and failed:  # the gang was stopped for it: its own error, not the cancel
            first = _root_cause(spec) or min(failed, key=lambda e: e.get("rank", 0))
            # a rank whose Python worker died reports nothing: its peers' "connection closed" must not be blamed
            dead = died_ranks(self.spark, self.group, self.n) if is_echo(first) else {}
            if any(r != first.get("rank") for r in dead):
                raise worker_error(self.error or RuntimeError(str(first.get("message"))), first, died=dead)
            raise TrainingError(first.get("message", "worker failed"), rank=first.get("rank"),
                                host=first.get("host"), remote_traceback=first.get("traceback", ""))
        if len(trial.results) < self.n:  # the stage ended under the trial
            failed = [r["error"] for r in trial.results.values() if not r.get("ok")]
            cause = self.error or RuntimeError(f"gang {self.id} ended")
            if self.killed and not failed:
                raise TrainingError(f"gang {self.id} was stopped ({self.killed}) during run {spec.run_id}",
                                    rank=None, host=None) from cause
            raise worker_error(cause, _root_cause(spec) or (failed[0] if failed else None),
                               died=died_ranks(self.spark, self.group, self.n)) from cause
        failed = [r for r in trial.results.values() if not r.get("ok")]
        if failed:
            first = _root_cause(spec) or min((r["error"] for r in failed), key=lambda e: e.get("rank", 0))
            raise TrainingError(first.get("message", "worker failed"), rank=first.get("rank"),
                                host=first.get("host"), remote_traceback=first.get("traceback", ""))
        from sparktrain.train._executor.checkpoint import Checkpointer

        model_bytes, written = Checkpointer(spec.store, spec.run_id).read_model()
        if written.get("launch") != spec.launch_id:
            raise TrainingError(f"the model in the store of run {spec.run_id} was not written by this trial "
                                f"(launch {written.get('launch')!r}, expected {spec.launch_id!r})", rank=0, host=None)
        by_rank = trial.results
        log.debug("gang %s, run %s: %.3f s in all; rank 0: %s", self.id, spec.run_id, time.perf_counter() - t0,
                  by_rank[0].get("timing"))
        return LaunchResult(history=list(by_rank[0].get("history") or []), model_bytes=model_bytes,
                            param_digests={r: v.get("digest", "") for r, v in by_rank.items()},
                            attempts=max(v.get("attempt", 0) for v in by_rank.values()) + 1,
                            seconds=time.perf_counter() - t0, hosts={r: v.get("host", "") for r, v in by_rank.items()},
                            world_sizes=[self.n],
                            devices={r: {"addresses": list(v.get("gpus") or []), "host": v.get("host", "")}
                                     for r, v in by_rank.items()})

    def kill(self, why: str) -> None:
        """Cancel the gang's stage (a stalled or timed-out trial); the running trial fails."""
        if self.killed is None:
            self.killed = why
            log.warning("gang %s: cancelling its barrier stage (%s)", self.id, why)
        spark_compat.cancel_group(self.spark, self.group)

    def close(self) -> None:
        """Tell the ranks to stop and wait for the stage to end (cancelled after ``CLOSE_S``)."""
        with self._cond:
            self._closing = True
            waiting, self._waiting = self._waiting, {}
        for ask in waiting.values():
            ask.reply({"stop": True})
        self._thread.join(timeout=CLOSE_S)
        if self._thread.is_alive():
            self.kill("did not stop")
            self._thread.join(timeout=10)
        if self.killed is not None and not spark_compat.wait_group_ended(self.spark, self.group, CLOSE_S):
            # a cancelled stage ends before its tasks do: the ranks may still hold their slots
            log.warning("gang %s: its tasks still ran %.0f s after its stage was cancelled (job group %s)", self.id,
                        CLOSE_S, self.group)


def peers_alive(num_workers: int, results: Dict[int, Any], watchdog: StallWatchdog) -> bool:
    """Whether every rank without a result still sends heartbeats for the watched trial (stuck in a collective).

    A dead rank's peers report its lost connection; its task failed, and Spark retries the stage
    (the trial is handed out again) or fails it: that is Spark's to handle, not a reason to cancel.
    Only events that name the trial's run count: a retried stage's new task pings before it is
    handed the trial again, and its ping is no sign that the dead rank is stuck.
    """
    now = time.time()
    missing = [r for r in range(num_workers) if r not in results]
    return bool(missing) and all(now - float(watchdog.ranks.get(r, {}).get("seen_run", 0.0)) < ALIVE_S
                                 for r in missing)


def _root_cause(spec: WorkerSpec) -> Optional[Dict[str, Any]]:
    """The earliest worker error of this trial recorded in the store (a peer's error is often just the echo)."""
    try:
        from sparktrain.train._executor.checkpoint import Checkpointer
        failures = Checkpointer(spec.store, spec.run_id, spec.launch_id).failures()
    except Exception:  # noqa: BLE001
        return None
    return failures[0] if failures else None


class GangPool:
    """Gangs for a search's distributed trials: one per trial that runs at once, relaunched when one dies.

    Registers the ``next`` operation on ``server`` (shared with the search's pruning verdicts).
    """

    def __init__(self, spark, server: ProgressServer, num_workers: int, gpus_per_worker: int = 0) -> None:
        self.spark, self.server, self.n, self.gpus = spark, server, num_workers, gpus_per_worker
        self._lock = threading.Lock()
        self._free: List[Gang] = []
        self._all: Dict[str, Gang] = {}
        self.launched = 0
        server.on_request("next", self._on_next)

    def _on_next(self, request: Dict[str, Any], reply: Callable[[Any], None]) -> None:
        with self._lock:
            gang = self._all.get(str(request.get("gang")))
        if gang is None:
            reply({"stop": True})
        else:
            gang.on_next(request, reply)

    def acquire(self) -> Gang:
        """A free live gang, or a new one."""
        with self._lock:
            while self._free:
                gang = self._free.pop()
                if gang.alive:
                    return gang
                self._all.pop(gang.id, None)
            gang = Gang(self.spark, self.server, self.n, self.gpus)
            self._all[gang.id] = gang
            self.launched += 1
            return gang

    def release(self, gang: Gang) -> None:
        """Hand ``gang`` back after a trial; a dead or killed one is closed and forgotten."""
        if gang.alive:
            with self._lock:
                self._free.append(gang)
            return
        gang.close()
        with self._lock:
            self._all.pop(gang.id, None)

    def close(self) -> None:
        with self._lock:
            gangs, self._free = list(self._all.values()), []
            self._all.clear()
        for gang in gangs:
            gang.close()
