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
from typing import Any, Dict, List, Optional, Sequence

from sparktrain._internal import spark_compat
from sparktrain.errors import TrainingError
from sparktrain.train._executor.spec import WorkerSpec
from sparktrain.train._executor.task import ERROR_MARKER, RESULT_SCHEMA, make_task
from sparktrain.train.progress import ProgressServer, TrainingCallback

log = logging.getLogger(__name__)

_MARKER_RE = re.compile(re.escape(ERROR_MARKER) + r"(.*?)" + re.escape(ERROR_MARKER), re.S)
_LOST_TASK_RE = re.compile(r"(?:Lost task|Task) (\d+)(?:\.\d+)? in stage")


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


def launch(spark, spec: WorkerSpec, callbacks: Sequence[TrainingCallback] = (), show_bar: bool = True
           ) -> LaunchResult:
    """Train with ``spec.num_workers`` barrier tasks; raise :class:`TrainingError` on failure."""
    t0 = time.perf_counter()
    first = _FirstStep()
    host = spark_compat.driver_host(spark)
    server = ProgressServer(host, [first, *callbacks], epochs=spec.epochs, show_bar=show_bar) if host else None
    try:
        if server is not None:
            spec = replace(spec, progress_address=server.address, token=server.token)
        spec = replace(spec, max_attempts=spark_compat.task_max_failures(spark), launch_id=uuid.uuid4().hex[:12])
        n = spec.num_workers
        # The shuffle after the barrier stage makes it a ShuffleMapStage: Spark retries a failed barrier
        # map stage as a whole (up to spark.task.maxFailures), but never a barrier ResultStage.
        df = (spark.range(0, n, 1, numPartitions=n)
              .mapInArrow(make_task(spec), RESULT_SCHEMA, barrier=True).repartition(1))
        try:
            rows = df.collect()
        except Exception as exc:  # py4j / PythonException / Connect errors
            raise worker_error(exc, _root_cause(spec) or (server.first_error() if server else None)) from exc
    finally:
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
        first_step_s=(first.t - t0) if first.t else None, hosts={k: v["host"] for k, v in by_rank.items()})


def _root_cause(spec: WorkerSpec) -> Optional[Dict[str, Any]]:
    """The earliest worker error recorded in the store (a peer's error is often just the echo)."""
    try:
        from sparktrain.train._executor.checkpoint import Checkpointer
        failures = Checkpointer(spec.store, spec.run_id, spec.launch_id).failures()
    except Exception:
        return None
    return failures[0] if failures else None


def worker_error(exc: BaseException, reported: Optional[Dict[str, Any]]) -> TrainingError:
    """Rebuild the worker's failure (rank, host, traceback) from what reached the driver."""
    if reported and reported.get("traceback"):
        return TrainingError(reported.get("message", "worker failed"), rank=reported.get("rank"),
                             host=reported.get("host"), remote_traceback=reported["traceback"])
    text = str(exc)
    match = _MARKER_RE.search(text)
    if match:
        try:
            info = json.loads(match.group(1))
            return TrainingError(info["message"], rank=info["rank"], host=info["host"],
                                 remote_traceback=info["traceback"])
        except (ValueError, KeyError):
            pass
    if reported:
        return TrainingError(reported.get("message", "worker failed"), rank=reported.get("rank"),
                             host=reported.get("host"), remote_traceback=reported.get("traceback", ""))
    lost = _LOST_TASK_RE.search(text)
    rank = int(lost.group(1)) if lost else None
    hint = ""
    if "crashed" in text or "exited unexpectedly" in text or "EOFError" in text:
        hint = (" (the Python worker process died, e.g. killed for memory or by os._exit; "
                "raise spark.task.maxFailures, or use local[N,F] locally, to let training resume "
                "from its last checkpoint)")
    summary = text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__
    return TrainingError(summary + hint, rank=rank, host=None, remote_traceback=_tail(text))


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
