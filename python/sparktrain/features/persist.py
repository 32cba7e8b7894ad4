"""Save a fitted feature ``PipelineModel`` with its stages written concurrently.

``PipelineModel.write().save(path)`` writes the pipeline's metadata, then each
stage, one after another; every stage is one to three tiny Spark jobs
(metadata, then a Parquet file of fitted values for the JVM models), so a
nine-stage model costs about as many round trips.  :func:`save_pipeline_model`
writes the same files, in the same layout (PySpark's
``PipelineSharedReadWrite``), with the stages saved from a few threads:
``PipelineModel.load`` reads the result like any other saved model.  On a
local path, metadata that ``DefaultParamsWriter`` would write with a one-row
Spark job (the pipeline's own, and that of every pure-Python stage) is
written as the same single text file directly.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional
from urllib.parse import unquote, urlparse


def save_pipeline_model(model: Any, path: str, parallel: int = 4) -> None:
    """Write ``model`` to ``path`` like ``model.write().save(path)`` (``path`` must not exist).

    Parameters
    ----------
    model : pyspark.ml.PipelineModel
    path : str
        Target folder (any URI the session can write).
    parallel : int
        Stages saved at the same time.

    Examples
    --------
    >>> save_pipeline_model(fitted, "/data/flights/pipeline_model")   # doctest: +SKIP
    >>> PipelineModel.load("/data/flights/pipeline_model")            # doctest: +SKIP
    PipelineModel_...
    """
    from pyspark import inheritable_thread_target
    from pyspark.ml.pipeline import PipelineSharedReadWrite
    from pyspark.ml.util import DefaultParamsWriter
    from pyspark.sql import SparkSession
    from pyspark.sql.utils import is_remote

    stages = list(model.stages)
    if is_remote() or PipelineSharedReadWrite.checkStagesForJava(stages):
        model.write().save(path)  # Spark Connect, or an all-JVM model (Spark saves it in one JVM call)
        return
    PipelineSharedReadWrite.validateStages(stages)
    spark = SparkSession.active()
    stages_dir = path.rstrip("/") + "/stages"

    local = _local_dir(path, spark)

    def save_metadata(instance: Any, target: str, param_map: Any = None) -> None:
        if local is None:
            DefaultParamsWriter.saveMetadata(instance, target, spark, paramMap=param_map)
            return
        text = DefaultParamsWriter._get_metadata_to_save(instance, spark, None, param_map)
        folder = os.path.join(_local_dir(target, spark) or target, "metadata")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "part-00000"), "w", encoding="utf-8") as fh:  # what spark.read.text reads
            fh.write(text + "\n")

    def save_stage(index: int) -> None:
        stage = stages[index]
        target = PipelineSharedReadWrite.getStagePath(stage.uid, index, len(stages), stages_dir)
        writer = stage.write()
        if type(writer) is DefaultParamsWriter:  # its saveImpl is exactly saveMetadata
            save_metadata(stage, target)
        else:
            writer.session(spark).save(target)

    if local is not None and os.path.exists(local):
        raise FileExistsError(f"'{path}' already exists; choose a new folder for the model")
    run = inheritable_thread_target(spark)
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        meta = pool.submit(run(save_metadata), model, path, {"stageUids": [s.uid for s in stages],
                                                             "language": "Python"})
        futures = [meta, *[pool.submit(run(save_stage), i) for i in range(len(stages))]]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise errors[0]


def _local_dir(path: str, spark: Any) -> Optional[str]:
    """The local folder of ``path`` (a ``file:`` URI, or a plain path when Hadoop's default filesystem is
    local), or None for any other filesystem."""
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    if "://" in path:
        return None
    default_fs = spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    return os.path.abspath(path) if default_fs.startswith("file:") else None


__all__ = ["save_pipeline_model"]
