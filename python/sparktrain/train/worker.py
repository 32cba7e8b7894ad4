"""Executor-side contracts of training, public: describe a run, train one worker, score batches.

This is what :mod:`sparktrain.tune` and :mod:`sparktrain.track` use from the
executor side; :mod:`sparktrain.train._executor` stays private to ``train/``.
Like the modules behind it, this one imports nothing from the driver side
(no pyspark.ml, MLflow or Hyperopt), so a Spark task or a pyfunc server pays
only for what it uses.

* :class:`WorkerSpec`, :class:`InputSpec`, :class:`ModelSpec`: the plain,
  picklable description of a run that a task receives.
* :func:`train_local`: train with ``world_size = 1`` inside the current
  process (a single-task tuning trial).
* :func:`predict_arrays`: score a dict of numpy columns with a trained
  network (cached per process by the network's digest); :func:`to_outputs`
  turns its output into ``prediction`` (in the label's original values) and
  ``probability`` columns.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import numpy as np

from sparktrain.train._executor.spec import InputSpec, ModelSpec, WorkerSpec

from sparktrain.train._executor.predict import to_outputs

__all__ = ["WorkerSpec", "InputSpec", "ModelSpec", "train_local", "predict_arrays", "to_outputs"]


def train_local(spec: WorkerSpec) -> Dict[str, Any]:
    """Train one model with ``world_size = 1`` (no barrier, no rendezvous) in this process.

    Returns
    -------
    dict
        ``history`` (one dict per epoch) and ``model_bytes`` (the exported network).
    """
    from sparktrain.train._executor.checkpoint import Checkpointer
    from sparktrain.train._executor.context import WorkerContext
    from sparktrain.train._executor.rendezvous import executor_host, free_port
    from sparktrain.train._executor.reporter import Reporter

    os.environ.update(spec.env)
    host = executor_host(None)
    aux = free_port(host) if spec.framework == "keras" else 0
    checkpointer = Checkpointer(spec.store, spec.run_id)
    # a retried task (its Python worker died) resumes from the trial's last checkpoint: count the earlier starts
    attempt = sum(1 for e in checkpointer.events() if e.get("event") in ("started", "resumed"))
    # a search's trial reports to the search's channel (pruning verdicts, heartbeats); a plain one to nobody
    reporter = Reporter(spec.progress_address, 0, host, spec.token, run=spec.run_id)
    ctx = WorkerContext(rank=0, world_size=1, host=host, master_host=host, master_port=0, aux_port=aux,
                        attempt=attempt, checkpointer=checkpointer, reporter=reporter, gpu_addresses=_task_gpus())
    from sparktrain.train._executor.task import train_rank

    try:
        result = train_rank(spec, ctx, [{"host": host, "port": None, "aux": aux}])
    finally:
        reporter.close()
    return {"history": result.get("history", []), "model_bytes": result.get("model_bytes")}


def _task_gpus() -> list:
    """The GPU addresses of the Spark task this runs in (none outside a task): the device comes from Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:  # a pyfunc server without pyspark
        return []
    ctx = TaskContext.get()
    resources = ctx.resources() if ctx is not None else {}
    return list(resources["gpu"].addresses) if "gpu" in resources else []


def predict_arrays(framework: str, model_bytes: bytes, inputs: InputSpec, arrays: Dict[str, Any],
                   key: str = "") -> np.ndarray:
    """Probabilities (binary: of class 1; multiclass: per class) or values for numpy input columns.

    Parameters
    ----------
    framework : str
        ``torch`` or ``keras``.
    model_bytes : bytes
        The exported network.
    inputs : InputSpec
        Its inputs (``arrays`` must hold every column of ``inputs.columns``).
    arrays : dict of str to numpy.ndarray
        One array per input column, equal lengths.
    key : str, optional
        Cache key (the network's digest; computed when empty).
    """
    from sparktrain.train._executor.batches import scoring_arrays
    from sparktrain.train._executor.predict import get_predictor

    return get_predictor(framework, model_bytes, inputs, key)(*scoring_arrays(arrays, inputs))
