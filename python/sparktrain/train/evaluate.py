"""Test-set metrics for a fitted model, and the Spark MLlib baseline it must beat (every task).

Both run as Spark jobs over the materialized test split (an evaluator's
aggregation, never a collect of rows).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from sparktrain.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    """Metrics on one split."""

    metrics: Dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def estimator_from_config(train: TrainConfig, label: str, run_id: Optional[str] = None):
    """A Torch/Keras estimator with the params of a job config's ``train:`` section.

    ``run_id`` names the run (and resumes it when the store already holds it,
    on the same data and params); without it each ``fit`` is a new run.
    """
    from sparktrain.train.estimator import KerasEstimator, TorchEstimator
    from sparktrain.train.params import params_from_config

    cls = TorchEstimator if train.framework == "torch" else KerasEstimator
    est = cls(**params_from_config(train), labelCol=label)
    if run_id:
        est.setRunId(run_id)
    return est


def evaluate_model(model, df) -> EvalResult:
    """Test metrics of ``model`` on a materialized split ``df`` (its label as written: class indices).

    Binary: AUC and accuracy; multiclass: accuracy; regression: RMSE and R².
    """
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, RegressionEvaluator
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    scored = model._score(df, decode=False).withColumn("__y", F.col(model.getLabelCol()).cast("double"))
    pred = model.getPredictionCol()
    task = model.inputs.task
    out: Dict[str, float] = {}
    labels = df.select(F.col(model.getLabelCol()).cast("double").alias("__y"))  # not the scored frame: no 2nd pass
    if task == "binary" and both_classes(labels, "__y", "the test split"):
        out["test_auc"] = BinaryClassificationEvaluator(
            rawPredictionCol=model.getProbabilityCol(), labelCol="__y", metricName="areaUnderROC").evaluate(scored)
    if task in ("binary", "multiclass"):
        out["test_accuracy"] = scored.agg(F.avg((F.col("__y") == F.col(pred)).cast("double"))).first()[0]
    else:
        for metric in ("rmse", "r2"):
            out[f"test_{metric}"] = RegressionEvaluator(labelCol="__y", predictionCol=pred,
                                                        metricName=metric).evaluate(scored)
    return EvalResult(metrics={k: float(v) for k, v in out.items()}, seconds=time.perf_counter() - t0)


def both_classes(df, label: str, where: Optional[str]) -> bool:
    """Whether a binary split holds both classes; AUC is undefined otherwise (Spark's evaluator says 0.0, which
    would read as the worst model and lose the registry's champion comparison), so it is left out, with a
    warning naming ``where`` (None: no warning)."""
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.col(label)).alias("n"), F.sum((F.col(label) > 0.5).cast("long")).alias("pos")).first()
    n, pos = int(row["n"] or 0), int(row["pos"] or 0)
    if 0 < pos < n:
        return True
    if where is not None:
        log.warning("%s holds %d row(s), all of class %s: its AUC is undefined and left out of the test metrics "
                    "(test_accuracy stays). A rare class needs a larger split: raise split.test, or give a "
                    "data.key / split.seed that spreads the class", where, n, "positive" if pos else "negative")
    return False


def baseline_name(task: str) -> str:
    """The Spark MLlib model :func:`mllib_baseline` fits for ``task``."""
    return "LinearRegression" if task == "regression" else "LogisticRegression"


def mllib_baseline(spark, dataset_path: str, inputs: Any, label: str) -> EvalResult:
    """Spark MLlib on the same inputs (categoricals one-hot encoded, bags of ids as counts), scored like
    :func:`evaluate_model`.

    Binary: LogisticRegression (AUC, accuracy); multiclass: multinomial
    LogisticRegression (accuracy); regression: LinearRegression (RMSE, R²).
    """
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.evaluation import (BinaryClassificationEvaluator, MulticlassClassificationEvaluator,
                                       RegressionEvaluator)
    from pyspark.ml.feature import OneHotEncoder, VectorAssembler
    from pyspark.ml.regression import LinearRegression
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import committed_files

    t0 = time.perf_counter()
    y = F.col(label).cast("double")
    train = spark.read.parquet(*committed_files(os.path.join(dataset_path, "train"))).withColumn("__y", y)
    test = spark.read.parquet(*committed_files(os.path.join(dataset_path, "test"))).withColumn("__y", y)
    blocks = [c for c, _ in inputs.vectors]
    if blocks:  # VectorAssembler takes vectors, not arrays: each float block as a vector
        from pyspark.ml.functions import array_to_vector

        for c in blocks:
            train = train.withColumn(f"{c}__vec", array_to_vector(F.col(f"`{c}`")))
            test = test.withColumn(f"{c}__vec", array_to_vector(F.col(f"`{c}`")))
    cats = [c for c, _ in inputs.categorical]
    stages: List[Any] = []
    if blocks:  # array_to_vector carries no size, which VectorAssembler(handleInvalid="keep") needs
        from pyspark.ml.feature import VectorSizeHint

        stages += [VectorSizeHint(inputCol=f"{c}__vec", size=int(width), handleInvalid="optimistic")
                   for c, width in inputs.vectors]
    bags = [b[0] for b in inputs.bags]
    if bags:  # a text or set feature's ids as a bag of words: CountVectorizer over the ids as strings
        from pyspark.ml.feature import CountVectorizer

        for c in bags:
            train = train.withColumn(f"{c}__ids", F.col(f"`{c}`").cast("array<string>"))
            test = test.withColumn(f"{c}__ids", F.col(f"`{c}`").cast("array<string>"))
        stages += [CountVectorizer(inputCol=f"{c}__ids", outputCol=f"{c}__bow", vocabSize=rows)
                   for c, _, rows, _ in inputs.bags]
    if cats:
        stages.append(OneHotEncoder(inputCols=cats, outputCols=[f"{c}__oh" for c in cats], dropLast=False,
                                    handleInvalid="keep"))
    stages.append(VectorAssembler(inputCols=[*inputs.numeric, *(f"{c}__vec" for c in blocks),
                                             *(f"{c}__oh" for c in cats), *(f"{c}__bow" for c in bags)],
                                  outputCol="__x",
                                  handleInvalid="keep"))
    task = inputs.task
    if task == "regression":
        stages.append(LinearRegression(featuresCol="__x", labelCol="__y", maxIter=50, regParam=1e-4))
    else:
        stages.append(LogisticRegression(featuresCol="__x", labelCol="__y", maxIter=50, regParam=1e-4,
                                         family="binomial" if task == "binary" else "multinomial"))
    scored = Pipeline(stages=stages).fit(train).transform(test)
    out: Dict[str, float] = {}
    if task == "binary" and both_classes(test, "__y", None):
        out["test_auc"] = BinaryClassificationEvaluator(rawPredictionCol="rawPrediction", labelCol="__y",
                                                        metricName="areaUnderROC").evaluate(scored)
    if task in ("binary", "multiclass"):
        out["test_accuracy"] = MulticlassClassificationEvaluator(labelCol="__y", metricName="accuracy"
                                                                 ).evaluate(scored)
    else:
        for metric in ("rmse", "r2"):
            out[f"test_{metric}"] = RegressionEvaluator(labelCol="__y", metricName=metric).evaluate(scored)
    return EvalResult(metrics={k: float(v) for k, v in out.items()}, seconds=time.perf_counter() - t0)
