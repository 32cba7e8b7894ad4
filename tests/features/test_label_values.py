"""Predictions come back in the label's original values (real Spark, real torch)."""

from __future__ import annotations

import json
import re

import pytest


@pytest.fixture(scope="module")
def species(spark, tmp_path_factory):
    """Three classes indexed 0..2 as preprocess writes them, with the vocabulary in features.json."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("labels") / "ds"
    df = spark.range(3000).select((F.rand(4) * 3).cast("float").alias("size"))
    df = df.withColumn("kind", F.floor("size").cast("int"))
    write_parquet(df.where("rand(9) < 0.85"), str(root / "train"))
    write_parquet(df.limit(300), str(root / "test"))
    meta = {"format": "sparktrain.features/1", "key": None, "task": "multiclass",
            "label": {"column": "kind", "dtype": "int32", "source_dtype": "string", "task": "multiclass",
                      "num_classes": 3, "vocabulary": ["adder", "boa", "cobra"]},
            "columns": [], "features": []}
    (root / "features.json").write_text(json.dumps(meta))
    return str(root)


@pytest.fixture(scope="module")
def species_model(species, tmp_path_factory):
    from sparktrain.train.estimator import TorchEstimator

    est = TorchEstimator(numWorkers=2, epochs=4, batchSize=64, learningRate=0.02, labelCol="kind",
                         store=str(tmp_path_factory.mktemp("store")))
    est.show_progress = False
    return est.fit(species)


@pytest.mark.torch
def test_string_classes_are_predicted_as_strings(spark, species, species_model, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import IndexToString
    from pyspark.sql import functions as F

    from sparktrain.train.evaluate import evaluate_model, mllib_baseline
    from sparktrain.train.model import TorchModel

    model = species_model
    assert model.inputs.task == "multiclass" and model.inputs.num_classes == 3
    assert model.labels == model.getLabels() == ["adder", "boa", "cobra"]
    test = spark.read.parquet(f"{species}/test")
    scored = model.transform(test)
    assert dict(scored.dtypes)["prediction"] == "string"
    truth = IndexToString(inputCol="kind", outputCol="kind_name", labels=model.labels).transform(scored)
    acc = truth.selectExpr("avg(cast(prediction = kind_name as double))").first()[0]
    assert acc > 0.85
    # probability is in vocabulary order: its argmax names the predicted class
    row = scored.select("prediction", "probability").first()
    assert model.labels[max(range(3), key=lambda i: row.probability[i])] == row.prediction
    # the test metrics (on the indexed split) and the multinomial MLlib baseline
    metrics = evaluate_model(model, test).metrics
    assert metrics["test_accuracy"] == pytest.approx(acc, abs=1e-9)
    base = mllib_baseline(spark, species, model.inputs, "kind").metrics
    assert set(base) == {"test_accuracy"} and base["test_accuracy"] > 0.8
    # saved and loaded, the vocabulary travels with the model
    path = str(tmp_path / "m")
    model.save(path)
    loaded = TorchModel.load(path)
    assert loaded.labels == model.labels
    again = loaded.transform(test).agg(F.count_if(F.col("prediction") == "cobra")).first()[0]
    assert again == scored.agg(F.count_if(F.col("prediction") == "cobra")).first()[0]
    assert MulticlassClassificationEvaluator(labelCol="kind", metricName="accuracy").evaluate(
        model._score(test, decode=False)) == pytest.approx(acc, abs=1e-9)


@pytest.mark.torch
def test_confusion_matrix_of_string_classes(spark, species, species_model):
    """Regression: the MLflow confusion matrix cast the decoded prediction ('cobra') to int and failed."""
    import numpy as np

    from sparktrain.track.plots import confusion_figure, test_score_summary
    from sparktrain.train.evaluate import evaluate_model

    test = spark.read.parquet(f"{species}/test")
    summary = test_score_summary(species_model, test)
    assert summary.labels == ["adder", "boa", "cobra"]
    assert summary.rows == test.count() == 300
    accuracy = evaluate_model(species_model, test).metrics["test_accuracy"]
    assert np.trace(summary.confusion) / summary.rows == pytest.approx(accuracy, abs=1e-9)
    assert confusion_figure(summary, label_name="kind") is not None


@pytest.mark.torch
def test_regression_metrics_and_linear_baseline(spark, tmp_path):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet
    from sparktrain.train.estimator import TorchEstimator
    from sparktrain.train.evaluate import evaluate_model, mllib_baseline

    root = tmp_path / "reg"
    df = spark.range(3000).select(F.rand(1).cast("float").alias("a"), F.rand(2).cast("float").alias("b"))
    df = df.withColumn("y", (F.col("a") * 3 - F.col("b") + F.randn(3) * 0.05).cast("double"))
    write_parquet(df.where("a < 0.9"), str(root / "train"))
    write_parquet(df.where("a >= 0.9"), str(root / "test"))
    est = TorchEstimator(numWorkers=1, epochs=6, batchSize=64, learningRate=0.01, labelCol="y",
                         store=str(tmp_path / "store"))
    est.show_progress = False
    model = est.fit(str(root))
    assert model.inputs.task == "regression" and model.labels == []
    test = spark.read.parquet(str(root / "test"))
    metrics = evaluate_model(model, test).metrics
    base = mllib_baseline(spark, str(root), model.inputs, "y").metrics
    assert set(metrics) == set(base) == {"test_rmse", "test_r2"}
    assert base["test_r2"] > 0.5 and metrics["test_rmse"] < 0.5
    assert dict(model.transform(test).dtypes)["prediction"] == "double"


def test_the_mllib_baseline_takes_float_blocks(spark, tmp_path):
    """Probe P: a `type: vector` feature (a float block) made the baseline fail after training ("Can not infer
    column lengths with handleInvalid = keep"): array_to_vector carries no size; the baseline now gives it."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet
    from sparktrain.train._executor.spec import InputSpec
    from sparktrain.train.evaluate import mllib_baseline

    root = tmp_path / "blocks"
    df = spark.range(2000).select(F.rand(1).cast("float").alias("a"),
                                  F.array(F.rand(2), F.rand(3), F.rand(4)).cast("array<float>").alias("blk"))
    df = df.withColumn("y", (F.col("blk")[0] + F.col("a") * 0.2 > 0.6).cast("float"))
    write_parquet(df.where("id % 5 != 0"), str(root / "train"))
    write_parquet(df.where("id % 5 = 0"), str(root / "test"))
    inputs = InputSpec(numeric=("a",), categorical=(), label="y", task="binary", vectors=(("blk", 3),))
    base = mllib_baseline(spark, str(root), inputs, "y").metrics
    assert set(base) == {"test_auc", "test_accuracy"} and base["test_auc"] > 0.9  # blk[0] decides the label


def test_a_failing_baseline_leaves_the_trained_model_with_a_warning(spark, tmp_path, caplog):
    """Probe P: the baseline's failure after training ended the whole job with a Py4J trace, and nothing was
    registered; the comparison is optional, so it is left out with a warning naming the setting."""
    import logging
    from types import SimpleNamespace

    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet
    from sparktrain.job import _baseline
    from sparktrain.train._executor.spec import InputSpec

    root = tmp_path / "ds"
    df = spark.range(200).select(F.rand(1).cast("float").alias("a"), (F.rand(2) > 0.5).cast("float").alias("y"))
    write_parquet(df, str(root / "train"))
    write_parquet(df, str(root / "test"))
    model = SimpleNamespace(inputs=InputSpec(numeric=("gone",), categorical=(), label="y", task="binary"))
    with caplog.at_level(logging.WARNING, logger="sparktrain.job"):
        assert _baseline(spark, str(root), model, "y") == {}
    said = " ".join(r.getMessage() for r in caplog.records)  # not caplog.text: a JSON log format escapes quotes
    assert re.search(r"the LogisticRegression baseline failed \(\w+Exception: .*`?gone`? ", said), said
    assert "Set train.compare_baseline: false to skip it" in said and "Traceback" not in said
