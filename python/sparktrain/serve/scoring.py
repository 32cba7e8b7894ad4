"""Score raw Parquet or CSV with a model from the registry, in Spark, and write Parquet.

``sparktrain score --model models:/churn@champion --input raw.parquet --output scored.parquet``
runs :func:`score_path`: check the model URI against the registry, check the
input has every column of the model's signature, cast them to the signature's
types, apply ``mlflow.pyfunc.spark_udf`` and write the input columns plus
``prediction`` (and ``probability``), atomically, with a ``_manifest.json``.
``--output`` must be new, empty or an earlier scored output
(:mod:`sparktrain.data.guard`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from sparktrain._internal.secrets import mask_value
from sparktrain.errors import ConfigError, MissingColumnError, TrackingError

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///work/mlflow.db"


def resolve_tracking_uri(tracking_uri: Optional[str] = None) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the job default ``sqlite:///work/mlflow.db``."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def input_format(path: str, fmt: Optional[str] = None) -> str:
    """``parquet`` or ``csv``: ``fmt`` when given, else by extension (a folder of ``.csv`` files is CSV)."""
    if fmt:
        if fmt not in ("parquet", "csv"):
            raise ConfigError("--format", fmt, "use parquet or csv")
        return fmt
    if path.lower().endswith(".csv"):
        return "csv"
    if os.path.isdir(path):
        names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
        if names and all(n.lower().endswith(".csv") for n in names):
            return "csv"
    return "parquet"


def read_input(spark: Any, path: str, fmt: Optional[str] = None, options: Optional[Dict[str, str]] = None):
    """The raw rows at ``path`` as a DataFrame (CSV: header row, types inferred; ``options`` win)."""
    if "://" not in path and not os.path.exists(path):
        from sparktrain.errors import DatasetNotFoundError
        raise DatasetNotFoundError(f"scoring input '{path}' does not exist; pass a Parquet folder or a .csv file")
    if input_format(path, fmt) == "csv":
        return spark.read.options(**{"header": "true", "inferSchema": "true", **(options or {})}).csv(path)
    return spark.read.options(**(options or {})).parquet(path)


def signature_columns(model_uri: str) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """``(inputs, outputs)`` of the model's signature as ``[(name, MLflow type string)]``."""
    from mlflow.models import get_model_info

    sig = get_model_info(model_uri).signature
    if sig is None or sig.inputs is None:
        raise TrackingError(f"model {model_uri} has no signature; log it with sparktrain (it records the raw "
                            f"input columns)")

    from mlflow.types import DataType

    def cols(schema: Any) -> List[Tuple[str, str]]:
        return [(c.name, c.type.name if isinstance(c.type, DataType) else str(c.type)) for c in schema.inputs]

    return cols(sig.inputs), (cols(sig.outputs) if sig.outputs is not None else [("prediction", "double")])


def _spark_type(mlflow_type: str) -> str:
    from sparktrain.serve.pyfunc import MLFLOW_TO_SPARK

    t = mlflow_type.lower()
    if t.startswith("array"):
        inner = t[t.index("(") + 1:t.rindex(")")] if "(" in t else "double"
        return f"array<{MLFLOW_TO_SPARK.get(inner, inner)}>"
    return MLFLOW_TO_SPARK.get(t, "string")


def score_dataframe(spark: Any, df: Any, model_uri: str, where: str = "the DataFrame to score"):
    """``df`` with the model's outputs added, via ``mlflow.pyfunc.spark_udf`` (lazy)."""
    import mlflow.pyfunc
    from pyspark.sql import functions as F

    from sparktrain._internal.spark_compat import try_cast

    inputs, outputs = signature_columns(model_uri)
    for name, _ in inputs:
        if name not in df.columns:
            raise MissingColumnError(name, df.columns, where=f"{where} (model {model_uri} reads it)")
    clashes = [n for n, _ in outputs if n in df.columns]
    if clashes:
        raise ConfigError("--input", where, f"it already has column(s) {', '.join(clashes)} that scoring adds; "
                                            f"drop or rename them")
    result_type = ", ".join(f"`{n}` {_spark_type(t)}" for n, t in outputs)
    udf = mlflow.pyfunc.spark_udf(spark, model_uri, result_type=result_type, env_manager="local")
    args = F.struct(*[try_cast(n, _spark_type(t)).alias(n) for n, t in inputs])  # "NA" -> null
    tmp = "__sparktrain_scores"
    return df.withColumn(tmp, udf(args)).select("*", *[F.col(f"{tmp}.{n}").alias(n) for n, _ in outputs]).drop(tmp)


def score_path(spark: Any, model_uri: str, input_path: str, output_path: str, fmt: Optional[str] = None,
               tracking_uri: Optional[str] = None, options: Optional[Dict[str, str]] = None) -> int:
    """Score raw rows at ``input_path`` with ``model_uri`` and write Parquet to ``output_path``.

    Parameters
    ----------
    spark : SparkSession
    model_uri : str
        ``models:/NAME@champion``, ``models:/NAME/3``, ``runs:/...`` or a path.
    input_path : str
        Raw Parquet (folder or file) or CSV (``.csv`` file or folder of them).
    output_path : str
        Parquet folder.  Written to a staging folder and renamed into place
        when complete, with a ``_manifest.json`` (files, rows, schema, the
        model and input); it replaces only an earlier scored output or an
        empty folder.
    fmt : {"parquet", "csv"}, optional
        Input format; by extension when omitted.
    options : dict, optional
        Spark reader options (``nullValue``, ``sep``...).
    tracking_uri : str, optional
        Where the registry is (see :func:`resolve_tracking_uri`).

    Returns
    -------
    int
        Rows written.

    Raises
    ------
    ModelNotFoundError
        The model name (or alias/version) is not in the registry; the message
        lists the registered models.
    MissingColumnError
        The input lacks a column the model reads.
    OutputNotOwnedError
        ``output_path`` holds files sparktrain did not write (before any Spark job).
    OutputOverlapError
        ``output_path`` is ``/``, the current or home directory, the input or
        around it, or the MLflow store's folder (before any Spark job).
    """
    from mlflow import MlflowClient

    from sparktrain.data.guard import check_output_location, check_replaceable, mlflow_paths
    from sparktrain.data.manifest import atomic_dir, build_manifest, write_manifest
    from sparktrain.track import store
    from sparktrain.track.registry import check_model_uri

    raw_uri = resolve_tracking_uri(tracking_uri)
    apart, keep_out = mlflow_paths(raw_uri)
    check_output_location(output_path, "--output", inputs=[("--input", input_path)], keep_apart=apart,
                          keep_out=keep_out)
    check_replaceable(output_path, "--output")  # before the registry, the model and any Spark job
    uri = store.preflight(raw_uri)
    store.configure(uri)
    check_model_uri(MlflowClient(uri, uri), model_uri)
    df = read_input(spark, input_path, fmt, options)
    scored = score_dataframe(spark, df, model_uri, where=f"the scoring input '{input_path}'")
    with atomic_dir(output_path) as staging:  # a failed job leaves the previous output as it was
        scored.write.parquet(staging)
        manifest = build_manifest(staging, extra={"written_by": "sparktrain score", "model": model_uri,
                                                  "input": input_path}, compute_digest=False)
        write_manifest(staging, manifest)
    n = int(manifest["num_rows"])
    log.info("scored %d rows of %s with %s -> %s", n, mask_value(input_path), model_uri, mask_value(output_path))
    return n
