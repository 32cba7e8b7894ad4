"""Scoring a trained model: in Spark, through MLflow, or without Spark.

* :mod:`sparktrain.serve.pyfunc`: the one MLflow pyfunc model that carries
  the fitted feature transforms and the network (:class:`SparktrainModel`,
  logged "from code" by :mod:`sparktrain.serve._model_code`), its signature,
  :func:`log_pyfunc_model` and :func:`load_spark_model` (the registered
  model as a Spark ``PipelineModel``, built by :mod:`sparktrain.serve.spark_model`:
  raw columns in, the same raw columns plus the outputs out);
* :mod:`sparktrain.serve.scoring`: ``sparktrain score``, raw Parquet or CSV
  scored in Spark with ``mlflow.pyfunc.spark_udf`` (:func:`score_path`,
  :func:`score_dataframe`);
* :mod:`sparktrain.serve.local`: :func:`transform_local`, the fitted feature
  pipeline applied with numpy and pyarrow only (what the pyfunc model runs).

The Spark ML Transformers themselves (``TorchModel``, ``KerasModel``) are
:mod:`sparktrain.train.model`.  Importing this package imports neither
pyspark nor MLflow: names are resolved lazily on first access, so
``sparktrain.serve.local`` works where only numpy and pyarrow are installed.
"""

from __future__ import annotations

from sparktrain._internal.lazy import lazy_exports

_EXPORTS = {
    "SparktrainModel": "pyfunc",
    "log_pyfunc_model": "pyfunc",
    "load_spark_model": "pyfunc",
    "raw_columns": "pyfunc",
    "score_path": "scoring",
    "score_dataframe": "scoring",
    "transform_local": "local",
}

__all__ = ["SparktrainModel", "load_spark_model", "log_pyfunc_model", "raw_columns", "score_dataframe",
           "score_path", "transform_local"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
