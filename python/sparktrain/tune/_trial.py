"""Executor side of a single-task trial (``tune.mode: single``).

A trial is one Spark task: ``spark.range(1, numPartitions=1).mapInArrow(task, RESULT_SCHEMA)``.
The task calls a zero-argument callable built on the driver, either
``functools.partial(train_single, spec)`` (train a one-worker model from the
materialized Parquet, by path) or ``functools.partial(user_objective, params)``.

On classic Spark the search plans that job once and reuses it for every trial
(:func:`make_planned_task`): the callable then comes pickled in the job's local
property :data:`CALL_PROPERTY` rather than inside the plan, sealed
(:mod:`sparktrain._internal.seal`) with a per-search key that only the planned
function carries: Spark writes local properties to its event log unredacted.
Each task also freezes (``gc.freeze()``) the modules that the trials before
it imported in this reused Python worker, so the ``gc.collect()`` PySpark
runs after every task no longer walks them
(:mod:`sparktrain._internal.daemon` does the same for what the daemon imports).

Failures of the objective are *returned* as a row (``ok = false`` with the
message and traceback), not raised: Spark would otherwise retry the task
``spark.task.maxFailures`` times on a cluster.  Only a crashed or killed task
(e.g. a trial timeout cancelling the job group) reaches the driver as a Spark
error.

This module imports nothing from the driver side (no Hyperopt, MLflow or
``sparktrain`` driver modules), so a reused Python worker pays for it once.
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import socket
import sys
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List

from sparktrain._internal.seal import seal, unseal
from sparktrain._internal.secrets import mask_value
from sparktrain.train.worker import WorkerSpec

RESULT_SCHEMA = ("ok BOOLEAN, metrics STRING, history STRING, model BINARY, error STRING, traceback STRING, "
                 "seconds DOUBLE, host STRING, pid INT, gpus STRING")
#: the job's local property that carries a trial's pickled callable to the planned trial task
CALL_PROPERTY = "sparktrain.trial.call"

_frozen_modules: List[int] = [0]  # len(sys.modules) at this process's last gc.freeze()


def freeze_imports() -> bool:
    """``gc.freeze()`` when modules were imported since the last freeze in this process (a reused worker).

    Called at a task's start: the previous task's garbage is gone (PySpark's worker loop collects
    after every task), so what is frozen is the imported modules, plus this task's own small
    closure once per freeze.  After the first trials import their framework, nothing new is
    imported and nothing more is frozen.  ``SPARKTRAIN_GC_FREEZE=0`` (the worker's environment) turns it off.
    """
    if os.environ.get("SPARKTRAIN_GC_FREEZE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if len(sys.modules) <= _frozen_modules[0]:
        return False
    gc.freeze()
    _frozen_modules[0] = len(sys.modules)
    return True


def encode_call(call: Callable[[], Any], key: bytes) -> str:
    """``call`` pickled (by value where needed: cloudpickle) and sealed with ``key``: :data:`CALL_PROPERTY`'s text."""
    from pyspark import cloudpickle

    return seal(cloudpickle.dumps(call), key)


class _PropertyCall:
    """The trial's callable, read from the task's local property; opening errors are the trial's failure."""

    def __init__(self, encoded: Any, key: bytes) -> None:
        self.encoded, self.key = encoded, key

    def __call__(self) -> Any:
        if not self.encoded:
            raise RuntimeError(f"the trial's task found no local property {CALL_PROPERTY!r}: the planned trial job "
                               "was run outside sparktrain's search (or without its property)")
        return pickle.loads(unseal(self.encoded, self.key))()  # only what this search's key sealed is unpickled


def make_planned_task(metric: str, key: bytes) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of the search's planned trial job: the callable comes with each job.

    ``key`` (the search's, from :func:`sparktrain._internal.seal.new_key`) travels in this function only.
    """

    def planned_trial_task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        call = _PropertyCall(ctx.getLocalProperty(CALL_PROPERTY) if ctx is not None else None, key)
        return make_trial_task(call, metric)(batches)

    return planned_trial_task


def make_trial_task(call: Callable[[], Any], metric: str = "loss") -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of one trial; it captures ``call`` and the metric name only.

    A bare number returned by ``call`` is reported as ``metric``.
    """

    def trial_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:  # one placeholder row
            pass
        freeze_imports()
        t0 = time.perf_counter()
        row: Dict[str, Any] = {"ok": True, "metrics": "{}", "history": "[]", "model": None, "error": None,
                               "traceback": None, "host": socket.gethostname(), "pid": os.getpid(),
                               "gpus": json.dumps(task_gpus())}
        try:
            out = normalize(call(), metric)
            row.update(metrics=json.dumps(out["metrics"]), history=json.dumps(out["history"]),
                       model=out["model_bytes"])
        except Exception as exc:  # noqa: BLE001 - returned to the driver as data
            row.update(ok=False, error=mask_value(f"{type(exc).__name__}: {exc}"),
                       traceback=mask_value(getattr(exc, "remote_traceback", None) or traceback.format_exc()))
        row["seconds"] = time.perf_counter() - t0
        yield pa.RecordBatch.from_pylist([row], schema=_arrow_schema())

    return trial_task


def _arrow_schema():
    import pyarrow as pa

    return pa.schema([("ok", pa.bool_()), ("metrics", pa.string()), ("history", pa.string()),
                      ("model", pa.binary()), ("error", pa.string()), ("traceback", pa.string()),
                      ("seconds", pa.float64()), ("host", pa.string()), ("pid", pa.int32()),
                      ("gpus", pa.string())])


def task_gpus() -> List[str]:
    """The GPU addresses Spark gave the running task (its ``ResourceProfile`` or the session's task resources)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    resources = ctx.resources() if ctx is not None else {}
    return list(resources["gpu"].addresses) if "gpu" in resources else []


def normalize(out: Any, metric: str = "loss") -> Dict[str, Any]:
    """An objective's return value as ``{"metrics", "history", "model_bytes"}``.

    A number is the searched metric (``{metric: x}``); a dict without
    ``metric`` but with ``loss`` reports its ``loss`` as ``metric``.  A dict gives its numeric entries
    as metrics; the keys ``history`` (list of per-epoch dicts) and
    ``model_bytes`` are passed through.
    """
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        out = {metric: out}
    elif not isinstance(out, dict):
        raise TypeError(f"the objective returned {type(out).__name__}; return a number (the loss) or a dict "
                        "of metrics, e.g. {'loss': 0.3}")
    metrics = {str(k): float(v) for k, v in out.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if metric not in metrics and "loss" in metrics:
        metrics[metric] = metrics["loss"]
    return {"metrics": {k: (v if math.isfinite(v) else None) for k, v in metrics.items()},
            "history": list(out.get("history") or []), "model_bytes": out.get("model_bytes")}


def train_single(spec: WorkerSpec) -> Dict[str, Any]:
    """Train one model with ``world_size = 1`` and report its last epoch.

    Returns
    -------
    dict
        The last epoch's metrics, plus ``history`` and ``model_bytes``.
    """
    from sparktrain.train.worker import train_local

    result = train_local(spec)
    history = result["history"]
    last = {k: v for k, v in (history[-1] if history else {}).items() if k != "epoch"}
    return {**last, "history": history, "model_bytes": result["model_bytes"]}
