"""sparktrain: data-parallel deep learning on Spark DataFrames.

Preprocess out of core with Spark ML stages, stream Parquet into Keras or
PyTorch, train in Spark barrier mode, search with Hyperopt, record everything
in MLflow, score as a Transformer or an MLflow model.

Layers, lowest first (a module imports only from its own layer or lower ones,
counting imports inside functions, with no cycle; ``tests/test_import_graph.py``
holds the code to this table)::

    errors, _internal, settings, sparktrain
    jvm, session
    data
    features, profile
    config
    train
    tune, track, serve
    job, datasets
    cli, __main__

- ``errors``, ``_internal``, ``settings`` (every training setting, declared
  once) and this package's ``__init__`` import nothing above them.
- ``jvm`` (the Spark JVM side: lineage listener, Spark version) and
  ``session`` (the SparkSession) import only ``errors``, ``_internal`` and
  ``jvm``; they sit below ``data`` so any layer may use them.
- ``data``: Parquet datasets, manifests, readers and the output guard.
- ``features``: the feature spec, its Spark ML stages, and preprocessing,
  with the ``data:``, ``split:`` and ``output:`` sections it reads
  (``features.sections``).  ``profile`` imports ``features.compile``, so it
  sits here.
- ``config``: the whole job config (YAML), over ``features.sections``.
- ``train``: the estimators, their models and the executors (``train._executor``).
- ``tune``, ``track`` and ``serve`` are one layer: search, MLflow recording,
  and scoring (the pyfunc model, ``sparktrain score``, the Spark-free
  transform).  They may import each other, never in a cycle.
- ``job`` runs the stages; ``datasets`` holds the demo's embedded data and is
  imported only by ``job``, ``cli`` and tests (the job hands it down as
  ``embedded=``, so no lower layer knows a dataset by name).
- ``cli`` and ``__main__``: the command line.
"""

__version__ = "0.1.0"

# Refused at import, before any job: a Python outside 3.10-3.12, or an installed pyspark outside >= 3.5, < 5
# (read from its metadata; pyspark is not imported here).  Java is checked when a session starts its JVM.
from sparktrain._internal.spark_compat import check_pyspark as _check_pyspark  # noqa: E402
from sparktrain._internal.spark_compat import check_python as _check_python  # noqa: E402

_check_python()
_check_pyspark()
