"""Save a fitted feature ``PipelineModel`` without a Spark job per stage.

``PipelineModel.write().save(path)`` writes the pipeline's metadata, then each
stage, one after another; every stage is one to three tiny Spark jobs
(metadata, then a Parquet file of fitted values for the JVM models), so a
nine-stage model costs about as many jobs, which compete for the task slots
with whatever runs beside them.  :func:`save_pipeline_model` writes the same
files, in the same layout (PySpark's ``PipelineSharedReadWrite``), and
``PipelineModel.load`` reads the result like any other saved model:

* On a local path the pipeline's metadata and every stage whose writer is
  ``DefaultParamsWriter`` (Python or JVM) are written as plain files, with
  no Spark job: the metadata JSON as ``DefaultParamsWriter`` renders it (for
  a JVM stage, Spark's own ``DefaultParamsWriter.getMetadataToSave``); so
  are the JVM models this pipeline uses, with their one-row Parquet data file
  in the schema their Spark writer gives it (``ImputerModel``: one double
  column per input column; ``StringIndexerModel``: ``labelsArray``).  Other
  JVM stages, and Python stages with writers of their own, use those writers.
* Elsewhere (HDFS, object stores) each stage is saved by its own writer, a
  few stages at a time.
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
        Stages saved at the same time by their own writers (paths that are not local).

    Examples
    --------
    >>> save_pipeline_model(fitted, "/data/houses/pipeline_model")   # doctest: +SKIP
    >>> PipelineModel.load("/data/houses/pipeline_model")            # doctest: +SKIP
    PipelineModel_...
    """
    from sparktrain._internal.spark_compat import inheritable_target
    from pyspark.ml.pipeline import PipelineSharedReadWrite
    from pyspark.ml.util import DefaultParamsWriter, JavaMLWriter
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

    def local_of(target: str) -> str:  # target lies under path, so under local
        return os.path.join(str(local), os.path.relpath(target, path))

    def save_metadata(instance: Any, target: str, param_map: Any = None) -> None:
        if local is None:
            DefaultParamsWriter.saveMetadata(instance, target, spark, paramMap=param_map)
            return
        _write_metadata(local_of(target), DefaultParamsWriter._get_metadata_to_save(instance, spark, None, param_map))

    def save_stage(index: int) -> None:
        stage = stages[index]
        target = PipelineSharedReadWrite.getStagePath(stage.uid, index, len(stages), stages_dir)
        writer = stage.write()
        if type(writer) is DefaultParamsWriter:  # its saveImpl is exactly saveMetadata
            save_metadata(stage, target)
        elif (local is None or type(writer) is not JavaMLWriter
              or not _save_java_stage_files(stage, writer, local_of(target), spark)):
            writer.session(spark).save(target)

    if local is not None and os.path.exists(local):
        raise FileExistsError(f"'{path}' already exists; choose a new folder for the model")
    if local is not None:  # plain files: no thread pool needed
        save_metadata(model, path, {"stageUids": [s.uid for s in stages], "language": "Python"})
        for i in range(len(stages)):
            save_stage(i)
        return
    run = inheritable_target(spark)
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        meta = pool.submit(run(save_metadata), model, path, {"stageUids": [s.uid for s in stages],
                                                             "language": "Python"})
        futures = [meta, *[pool.submit(run(save_stage), i) for i in range(len(stages))]]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise errors[0]


_METADATA_ONLY = "org.apache.spark.ml.util.DefaultParamsWriter"
_IMPUTER_WRITER = "org.apache.spark.ml.feature.ImputerModel$ImputerModelWriter"
_INDEXER_WRITER = "org.apache.spark.ml.feature.StringIndexerModel$StringIndexModelWriter"


def _save_java_stage_files(stage: Any, writer: Any, folder: str, spark: Any) -> bool:
    """Write a JVM stage's ``metadata/`` (and ``data/``) under the local ``folder`` as its Spark writer would.

    ``writer`` is ``stage.write()`` (a ``JavaMLWriter``).  Returns False,
    writing nothing, for a stage whose JVM writer is not one of the known ones
    (the caller then uses that writer).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    java = stage._java_obj  # stage.write() has just moved the Python params to it
    kind = writer._jwrite.getClass().getName()
    if kind == _METADATA_ONLY:  # e.g. SQLTransformer, Bucketizer: params only
        data = None
    elif kind == _IMPUTER_WRITER:  # surrogateDF: one row, one non-null double per input column
        row = stage.surrogateDF.head().asDict()  # a local relation when fitted here: no job
        data = pa.table([pa.array([float(v)], pa.float64()) for v in row.values()],
                        schema=pa.schema([pa.field(n, pa.float64(), nullable=False) for n in row]))
    elif kind == _INDEXER_WRITER:  # Data(labelsArray: Array[Array[String]])
        labels = [list(column) for column in stage.labelsArray]  # one JVM call for all of them
        data = pa.table({"labelsArray": pa.array([labels], pa.list_(pa.list_(pa.string())))})
    else:
        return False
    from sparktrain._internal.spark_compat import java_params_metadata

    _write_metadata(folder, java_params_metadata(spark, java))
    if data is not None:
        os.makedirs(os.path.join(folder, "data"))
        pq.write_table(data, os.path.join(folder, "data", "part-00000.snappy.parquet"), compression="snappy")
    return True


def _write_metadata(folder: str, text: str) -> None:
    """``folder/metadata/part-00000``: the one text file ``DefaultParamsReader`` reads (with ``spark.read.text``)."""
    os.makedirs(os.path.join(folder, "metadata"), exist_ok=True)
    with open(os.path.join(folder, "metadata", "part-00000"), "w", encoding="utf-8") as fh:
        fh.write(text + "\n")


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
