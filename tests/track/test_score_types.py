"""Scoring when the input's types drift from training's: the Spark paths read each column as the model was
trained on it, and agree with each other (probe J).

One tiny model, fitted once for the module on a synthetic table: ``seg`` an integer categorical (vocabulary),
``zone`` an integer categorical (hashed), ``city`` a string categorical, ``x`` numeric; none of them had nulls
in training.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.torch
MODEL = "score-types"


@pytest.fixture(autouse=True)
def _registry(mlflow_server, restore_mlflow_uri):
    """score_dataframe and load_spark_model read the process's MLflow URIs: the shared server's."""
    import mlflow

    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_registry_uri(mlflow_server)


@pytest.fixture(scope="module")
def model(spark, mlflow_server, tmp_path_factory):
    """``(models:/score-types@champion, the raw scoring rows)``, registered on the shared MLflow server."""
    from pyspark.sql import functions as F

    from sparktrain.config import parse_config
    from sparktrain.job import run_job

    base = tmp_path_factory.mktemp("score_types")
    rows = spark.range(3000).select(
        F.col("id").alias("row"), (F.col("id") % 5).alias("seg"), (F.col("id") % 7).alias("zone"),
        F.element_at(F.array(*[F.lit(c) for c in ("lyon", "nice", "paris")]), (F.col("id") % 3 + 1).cast("int"))
        .alias("city"), (F.rand(5) * 2 - 1).alias("x"))
    rows = rows.withColumn("label", (F.col("seg") >= 3) | (F.col("x") > 0.6))
    rows.write.parquet(str(base / "raw.parquet"))
    cfg = parse_config({
        "name": MODEL, "data": {"source": str(base / "raw.parquet"), "label": "label", "key": "row"},
        "features": [{"name": "x", "type": "numeric"}, {"name": "seg", "type": "categorical"},
                     {"name": "zone", "type": "categorical", "hash_buckets": 16},
                     {"name": "city", "type": "categorical"}],
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1, "seed": 1},
        "output": {"path": str(base / "dataset")},
        "train": {"framework": "torch", "num_workers": 1, "epochs": 4, "store": str(base / "store"),
                  "compare_baseline": False, "learning_rate": 0.05},
        "tracking": {"uri": mlflow_server, "experiment": MODEL, "model_name": MODEL}})
    run_job(cfg, stages=("preprocess", "train"), spark=spark)
    return f"models:/{MODEL}@champion", spark.read.parquet(str(base / "raw.parquet")).where("row % 25 = 0")


def _scores(df) -> np.ndarray:
    return np.array([r["probability"] for r in df.orderBy("row").select("probability").collect()])


def test_an_integer_categorical_given_as_double_scores_as_its_integers_on_every_path(model, spark):
    """``seg``/``zone`` as double (1.0): the Spark pipeline read "1.0", a category it never saw, so every row
    silently moved (15 of 200 classes flipped in probe J) while score_dataframe scored them right."""
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    uri, rows = model
    reference = _scores(score_dataframe(spark, rows, uri))
    assert reference.std() > 0.05  # the model tells rows apart: a drift would show
    doubled = rows.withColumn("seg", rows["seg"].cast("double")).withColumn("zone", rows["zone"].cast("double"))
    pipeline = load_spark_model(uri)
    np.testing.assert_allclose(_scores(pipeline.transform(doubled)), reference, atol=1e-6)
    np.testing.assert_allclose(_scores(score_dataframe(spark, doubled, uri)), reference, atol=1e-6)
    kept = pipeline.transform(doubled).orderBy("row").select("seg").collect()
    assert [r["seg"] for r in kept][:3] == [0.0, 0.0, 0.0] and dict(pipeline.transform(doubled).dtypes)["seg"] == \
        "double"  # the raw column comes back as given


def test_a_null_in_an_integer_categorical_scores_as_unknown_instead_of_failing_the_job(model, spark):
    """One null in ``seg`` failed score_dataframe's whole job (MLflow's pandas long has no null), and the CLI
    printed 419 lines; the Spark pipeline scored it as an unknown category.  Now both do, and agree."""
    from pyspark.sql import functions as F

    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    uri, rows = model
    holed = rows.withColumn("seg", F.when(F.col("row") % 50 == 0, None).otherwise(F.col("seg"))) \
        .withColumn("zone", F.when(F.col("row") % 75 == 0, None).otherwise(F.col("zone")))
    udf_path = _scores(score_dataframe(spark, holed, uri))
    np.testing.assert_allclose(_scores(load_spark_model(uri).transform(holed)), udf_path, atol=1e-6)
    reference = _scores(score_dataframe(spark, rows, uri))
    changed = np.abs(udf_path - reference) > 1e-6
    nulls = np.array([r["row"] % 50 == 0 or r["row"] % 75 == 0 for r in rows.orderBy("row").collect()])
    assert changed[~nulls].sum() == 0 and changed[nulls].sum() >= 1  # only the rows with a null moved


def test_a_number_where_the_model_read_text_is_refused_by_name_on_every_path(model, spark):
    """``city`` as an integer: every value an unseen category, scored without a word.  Now refused, naming
    the column, both types and the cast."""
    from pyspark.sql import functions as F

    from sparktrain.errors import SchemaError
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    uri, rows = model
    numbered = rows.withColumn("city", F.length("city"))
    for score in (lambda d: score_dataframe(spark, d, uri), lambda d: load_spark_model(uri).transform(d)):
        with pytest.raises(SchemaError) as info:
            score(numbered)
        text = str(info.value)
        assert "column 'city' is int here" in text and "trained on it as text (string)" in text, text
        assert "F.col('city').cast('string')" in text


def test_the_registry_pipeline_reads_text_numbers_and_refuses_a_join_s_duplicates(model, spark):
    """load_spark_model(...).transform named an internal column (``__st_x__prep must be of type numeric``) for
    a number given as text, and gave Spark's AMBIGUOUS_REFERENCE for a join's duplicate column."""
    from sparktrain.errors import DuplicateColumnError
    from sparktrain.serve.pyfunc import load_spark_model

    uri, rows = model
    pipeline = load_spark_model(uri)
    reference = _scores(pipeline.transform(rows))
    texty = rows.withColumn("x", rows["x"].cast("string"))
    np.testing.assert_allclose(_scores(pipeline.transform(texty)), reference, atol=1e-6)
    joined = rows.join(rows.select("row", "city"), "row")
    with pytest.raises(DuplicateColumnError) as info:
        pipeline.transform(joined)
    assert "city" in str(info.value)


def test_the_python_api_names_what_the_registry_lacks_as_the_cli_does(model, spark, tmp_path):
    """score_dataframe and load_spark_model gave MLflow's raw "Registered model alias nope not found" (the CLI
    listed the aliases and versions), and load_spark_model("models:/NAME") failed with "Logged model with ID
    'NAME' not found" although the docs call it the latest version."""
    import mlflow

    from sparktrain.errors import ModelNotFoundError
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    uri, rows = model
    with pytest.raises(ModelNotFoundError, match=rf"model '{MODEL}' has no alias 'nope' \(aliases: champion;"):
        score_dataframe(spark, rows, f"models:/{MODEL}@nope")
    with pytest.raises(ModelNotFoundError, match=rf"model '{MODEL}' has no version 99 \(versions: 1\)"):
        load_spark_model(f"models:/{MODEL}/99")
    with pytest.raises(ModelNotFoundError, match=f"Registered models: .*{MODEL}"):
        score_dataframe(spark, rows, f"models:/{MODEL}x@champion")
    latest = load_spark_model(f"models:/{MODEL}")
    np.testing.assert_allclose(_scores(latest.transform(rows)), _scores(load_spark_model(uri).transform(rows)))
    gone = tmp_path / "moved" / "mlflow.db"  # a store moved away: MLflow would create an empty one to say no
    mlflow.set_registry_uri(f"sqlite:///{gone}")
    with pytest.raises(ModelNotFoundError, match="there is no MLflow store at .*moved/mlflow.db"):
        score_dataframe(spark, rows, uri)
    assert not gone.exists() and not gone.parent.exists()


def test_a_version_whose_files_are_gone_is_named_with_its_run(model, spark, tmp_path, tracking_uri):
    """A version whose artifact folder was deleted: "No such artifact: ''" from the Python API, and a 47-line
    traceback from the CLI.  Now a ModelNotFoundError names the version, its run and where its files were."""
    import shutil

    import mlflow
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    from sparktrain.errors import ModelNotFoundError
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    uri, rows = model
    copy = download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "copy"))
    meta = Model.load(f"{copy}/MLmodel")
    meta.model_id = None  # the copy is registered in another store, which has no record of the logged model
    meta.save(f"{copy}/MLmodel")
    client = MlflowClient(tracking_uri, tracking_uri)
    client.create_registered_model("gone")
    run = client.create_run(client.create_experiment("gone")).info.run_id
    client.create_model_version("gone", copy, run_id=run)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    assert _scores(score_dataframe(spark, rows, "models:/gone/1")).std() > 0.05  # it scores while its files exist
    shutil.rmtree(copy)
    for score in (lambda: score_dataframe(spark, rows, "models:/gone/1"), lambda: load_spark_model("models:/gone")):
        with pytest.raises(ModelNotFoundError) as info:
            score()
        text = str(info.value)
        assert "is models:/gone/1, whose files are gone" in text and f"run {run}" in text, text
        assert str(copy) in text and "register the model again" in text


def test_a_fresh_process_reads_the_store_sparktrain_score_reads(model, spark, tmp_path, monkeypatch, mlflow_server):
    """Probe K: in a fresh notebook (no MLflow URI set) score_dataframe and load_spark_model looked in MLflow's
    default ./mlflow.db, found "Registered models: (none)" and left an empty store there; the CLI reads the job
    default sqlite:///work/mlflow.db.  Now they read that one (refusing it by name while it does not exist),
    or tracking_uri=."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    from sparktrain.errors import ModelNotFoundError
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe

    from mlflow.artifacts import download_artifacts

    uri, rows = model
    copy = download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "copy"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(utils, "_tracking_uri", None)  # what a fresh process has: no URI set
    with pytest.raises(ModelNotFoundError) as info:
        score_dataframe(spark, rows, uri)
    assert f"there is no MLflow store at sqlite:///{tmp_path}/work/mlflow.db" in str(info.value)
    assert "Pass tracking_uri=" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no stray store made
    by_path = _scores(load_spark_model(copy).transform(rows))  # a path needs no store: none is opened or made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"] and not utils._tracking_uri
    scored = _scores(load_spark_model(uri, tracking_uri=mlflow_server).transform(rows))
    assert scored.std() > 0.05 and mlflow.get_tracking_uri() == mlflow_server  # configured, as the CLI does
    np.testing.assert_allclose(by_path, scored, atol=1e-6)


def test_read_as_reads_whole_fractions_as_integers_and_a_double_above_2_53_as_missing(spark):
    """An integer categorical given as double: 1.0 is 1, 1.5 and a double above 2**53 (which names no one integer:
    2**60 + 1 reads as 2**60) are missing; an exact decimal keeps its integer."""
    from decimal import Decimal

    from pyspark.sql import types as T

    from sparktrain.serve.spark_model import read_as

    big = 2 ** 60 + 1
    schema = T.StructType([T.StructField("d", T.DoubleType()), T.StructField("m", T.DecimalType(38, 0))])
    df = spark.createDataFrame([(1.0, Decimal(big)), (1.5, Decimal(7)), (float(big), None)], schema)
    rows = df.select(read_as("d", "double", "bigint").alias("d"),
                     read_as("m", "decimal(38,0)", "bigint").alias("m")).collect()
    assert [(r.d, r.m) for r in rows] == [(1, big), (None, 7), (None, None)]


def test_the_input_example_reads_a_spark_ml_vector_column(spark, caplog):
    """Probe P: a raw VectorAssembler column made the input example's cast fail: Spark logged a multi-kilobyte
    ERROR (CAST_WITHOUT_SUGGESTION) during a successful run and the model was logged without an example."""
    import logging

    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    from sparktrain._internal.spark_compat import try_cast
    from sparktrain.track.stages import _as_signature_type

    schema = T.StructType([T.StructField("vec", VectorUDT()), T.StructField("n", T.StringType())])
    df = spark.createDataFrame([(Vectors.dense([1.0, 2.5]), "3"), (Vectors.sparse(2, [1], [4.0]), "x")], schema)
    with caplog.at_level(logging.WARNING):
        rows = df.select(_as_signature_type(df, "vec", "array<double>", try_cast),
                         _as_signature_type(df, "n", "bigint", try_cast)).collect()
    assert [(list(r.vec), r.n) for r in rows] == [([1.0, 2.5], 3), ([0.0, 4.0], None)]
    assert "CAST" not in caplog.text
