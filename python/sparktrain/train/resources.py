"""GPUs for the training stage, from Spark: stage-level scheduling, the slot check, and what local mode can do.

A GPU on a Spark cluster is a task resource.  With ``gpusPerWorker = g``
the barrier stage gets its own ``ResourceProfile``: each task asks for ``g``
GPUs and for the CPUs that go with them on its executor (the executor's
cores times ``g`` over its GPUs), so a training task has its share of the
host to itself instead of being packed beside ETL tasks, as xgboost.spark
does.  Every rank then takes the device its task was given
(``TaskContext.resources()["gpu"].addresses``), never one picked by rank.

Where no profile is needed or possible it says so once and uses what the
session gives: ``local[N]`` has no executors to size, and an application
that sets ``spark.task.resource.gpu.amount`` for every task already gives
each task its GPUs (Spark 3.5 cannot put a profile on a DataFrame stage).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sparktrain._internal import spark_compat
from sparktrain._internal.secrets import mask_value
from sparktrain.errors import PreflightError

log = logging.getLogger(__name__)

_said: set = set()  # what was logged once per process


def _once(key: str, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        log.info(message, *args)


def _number(spark, key: str) -> Optional[float]:
    value = spark_compat.conf_get(spark, key)
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def training_profile(spark, gpus_per_worker: int) -> Optional[Any]:
    """The ``ResourceProfile`` of the barrier stage, or None when the session's task resources apply."""
    if gpus_per_worker <= 0:
        return None
    cluster_wide = _number(spark, "spark.task.resource.gpu.amount")
    if cluster_wide is not None and cluster_wide >= gpus_per_worker:
        _once("cluster-wide", "gpusPerWorker = %d: every task of this application already gets "
              "spark.task.resource.gpu.amount = %g GPU(s); the training stage uses that", gpus_per_worker,
              cluster_wide)
        return None
    if not spark_compat.supports_stage_profiles(spark):
        _once("local", "gpusPerWorker = %d: master %s cannot schedule a stage with its own resources "
              "(stage-level scheduling needs standalone, YARN or Kubernetes); the ranks use the session's task "
              "resources (spark.task.resource.gpu.amount = %s)", gpus_per_worker,
              mask_value(spark_compat.master(spark)), cluster_wide if cluster_wide is not None else "unset")
        return None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    cores = _number(spark, "spark.executor.cores")
    per_executor = _number(spark, "spark.executor.resource.gpu.amount")
    cpus = int(_number(spark, "spark.task.cpus") or 1)
    if cores and per_executor:  # the GPU's share of its executor's cores
        cpus = max(cpus, int(cores * gpus_per_worker // per_executor))
    requests = TaskResourceRequests().cpus(cpus).resource("gpu", float(gpus_per_worker))
    profile = ResourceProfileBuilder().require(requests).build
    log.info("training stage: each task asks for %d GPU(s) and %d CPU(s) (ResourceProfile %s)",
             gpus_per_worker, cpus, getattr(profile, "id", "?"))
    return profile


def check_gpu_slots(spark, num_workers: int, gpus_per_worker: int, precision: str = "fp32") -> None:
    """Refuse, before launch, a GPU request the cluster's executors cannot hold all at once (barrier mode).

    On a master that gives tasks no GPU (``local[N]`` without ``spark.task.resource.gpu.amount``), the ranks
    train on CPU: a warning says so, and ``precision`` fp16, which needs a GPU's loss scaling, is refused."""
    if gpus_per_worker <= 0:
        return
    if not spark_compat.supports_stage_profiles(spark):
        amount = _number(spark, "spark.task.resource.gpu.amount")
        if amount is None:
            master = mask_value(spark_compat.master(spark))
            if precision == "fp16":
                from sparktrain.errors import ConfigError
                from sparktrain.train._executor.spec import FP16_ON_CPU

                raise ConfigError("precision", "fp16", FP16_ON_CPU.format(
                    why=f"gpusPerWorker = {gpus_per_worker}, but master {master} gives tasks no GPU"),
                    kind="parameter")
            if "local-no-gpu" not in _said:
                _said.add("local-no-gpu")
                log.warning("gpusPerWorker = %d on master %s, which gives tasks no GPU "
                            "(spark.task.resource.gpu.amount is unset): the ranks train on CPU. For GPUs on one "
                            "machine use a standalone or local-cluster master whose workers have GPU resources "
                            "(docs/gpu.md)", gpus_per_worker, master)
        return
    counts = spark_compat.executor_resources(spark, "gpu")
    if counts is None:
        log.warning("cannot tell how many GPUs the cluster's executors have (master %s); the training stage "
                    "asks for %d x %d", mask_value(spark_compat.master(spark)), num_workers, gpus_per_worker)
        return
    slots = sum(n // gpus_per_worker for n in counts)
    if slots < num_workers:
        have = ", ".join(str(n) for n in counts) or "none registered"
        most = max(counts, default=0)
        lower = (f"lower numWorkers (train.num_workers) to <= {slots}" if slots else
                 f"no executor holds {gpus_per_worker} GPU(s): lower gpusPerWorker (train.gpus_per_worker) to "
                 f"<= {most}" if most else "no executor has a GPU: start executors with GPUs")
        raise PreflightError(
            f"gpusPerWorker = {gpus_per_worker} x numWorkers = {num_workers} needs {num_workers} GPU task slot(s), "
            f"but the cluster's executors hold {sum(counts)} GPU(s) ({have} per executor), room for {slots} "
            f"rank(s) at once (master {mask_value(spark_compat.master(spark))}). Barrier mode needs every rank "
            f"at the same time: {lower}, or give executors more GPUs (spark.executor.resource.gpu.amount, and "
            "spark.worker.resource.gpu.amount with a discovery script on standalone).")
