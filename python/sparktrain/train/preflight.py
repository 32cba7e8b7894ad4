"""Driver-side checks before a barrier stage launches: fail before spending compute."""

from __future__ import annotations

import importlib.util
import logging
from typing import Optional

from sparktrain._internal import spark_compat
from sparktrain._internal.secrets import mask_value
from sparktrain.errors import MissingDependencyError, PreflightError
from sparktrain.train._executor.spec import WorkerSpec
from sparktrain.train.resources import check_gpu_slots

log = logging.getLogger(__name__)

INSTALL = {
    "torch": "pip install torch==2.13.0",
    "tensorflow": "pip install tensorflow-cpu==2.21.0",
    "horovod": "make horovod  (builds horovod==0.28.1 with -std=c++17 for torch)",
}


def check_slots(spark, num_workers: int) -> None:
    """Barrier mode needs every rank scheduled at once (else SPARK-24819 fails when the stage starts)."""
    slots = spark_compat.max_concurrent_tasks(spark)
    if slots is None:  # Spark Connect to a server whose settings do not say
        log.warning("cannot tell how many tasks the Spark Connect server's cluster runs at once (master %s); "
                    "barrier mode needs %d: set spark.cores.max or spark.executor.instances and "
                    "spark.executor.cores on the server so this is checked before launch",
                    mask_value(spark_compat.master(spark)), num_workers)
        return
    if slots < num_workers:
        raise PreflightError(
            f"numWorkers = {num_workers}, but the cluster can run only {slots} task(s) at once "
            f"(master {mask_value(spark_compat.master(spark))}). Barrier mode needs all ranks at the same time: lower "
            f"numWorkers (train.num_workers) to <= {slots}, or add slots (local[{num_workers}] locally; "
            "spark.executor.instances x spark.executor.cores / spark.task.cpus on a cluster). On a shared "
            "cluster other applications may hold the rest of its cores: this application got executors for "
            f"{slots} task(s) (see spark.cores.max and the master's UI).")


def check_dynamic_allocation(spark) -> None:
    value = (spark_compat.conf_get(spark, "spark.dynamicAllocation.enabled", "false") or "false").lower()
    if value == "true":
        raise PreflightError(
            "spark.dynamicAllocation.enabled = true: Spark refuses barrier stages with dynamic allocation. "
            "Set spark.dynamicAllocation.enabled=false for the training job.")


def check_framework(framework: str, backend: str) -> None:
    module = {"torch": "torch", "keras": "tensorflow"}[framework]
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(module, INSTALL[module], f"framework '{framework}'")
    if framework == "keras" and backend in ("auto", "gloo") and importlib.util.find_spec("torch") is None:
        raise MissingDependencyError("torch", INSTALL["torch"], "Keras backend 'gloo' (torch.distributed "
                                     "all-reduces the gradients); or use backend 'mwms'")
    if backend == "horovod":
        if framework == "keras":
            raise PreflightError(
                "backend 'horovod' with Keras is refused: with Keras 3, hvd.DistributedOptimizer inside "
                "model.fit runs but silently does not average gradients. Use backend 'gloo' (default) or "
                "'mwms' for Keras, or framework 'torch' with horovod.")
        if importlib.util.find_spec("horovod") is None:
            raise MissingDependencyError("horovod", INSTALL["horovod"], "backend 'horovod'")


def check_dataset(train_path: str, val_path: Optional[str]) -> None:
    from sparktrain.train.inputs import exists
    for name, path in (("training", train_path), ("validation", val_path)):
        if path and not exists(path):
            raise PreflightError(f"the {name} dataset '{path}' does not exist; run `sparktrain preprocess "
                                 "CONFIG` first or pass a DataFrame to fit()")


def check_picklable(spec: WorkerSpec) -> None:
    """The task closure must pickle; user factories are the usual culprits."""
    import cloudpickle

    from sparktrain.train._executor.task import make_task
    try:
        cloudpickle.dumps(make_task(spec))
    except Exception as exc:
        raise PreflightError(f"the training function cannot be pickled for the executors: {exc}. "
                             "Model/loss/optimizer factories must be plain functions or classes that do not "
                             "capture a SparkSession, DataFrame, lock or open file.") from exc


def check_factories(spec: WorkerSpec) -> None:
    """A custom model or loss factory is built here and checked on two rows before any Spark work
    (:mod:`~sparktrain.train._executor.contract`): what the network takes, logits of the task's width, no final
    sigmoid/softmax, a Keras export that loads back, a loss finite and lower for right predictions.  Skipped
    where this process lacks the framework (a Spark Connect client): the ranks then meet the same rules."""
    if not (spec.model_factory or spec.loss_factory):
        return
    needed = ("tensorflow", "keras") if spec.framework == "keras" else ("torch",)
    if any(importlib.util.find_spec(m) is None for m in needed):
        log.info("no %s in this process: the model and loss factories are checked on the executors", needed[0])
        return
    import cloudpickle

    from sparktrain.train._executor.contract import check_factories as check

    check(spec.inputs, spec.model, spec.model_factory and cloudpickle.loads(spec.model_factory),
          spec.loss_factory and cloudpickle.loads(spec.loss_factory), spec.framework)


def run_all(spark, spec: WorkerSpec) -> None:
    """Every check, cheapest first."""
    check_framework(spec.framework, spec.backend)
    check_dynamic_allocation(spark)
    check_slots(spark, spec.num_workers)
    check_gpu_slots(spark, spec.num_workers, spec.scaling.gpus_per_worker, spec.optim.precision)
    check_dataset(spec.train_path, spec.val_path)
    check_picklable(spec)
    check_factories(spec)
