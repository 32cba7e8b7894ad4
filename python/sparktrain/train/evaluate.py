"""Test-set metrics for a fitted model, and the Spark MLlib baseline it must beat.

Both run as Spark jobs over the materialized test split (an evaluator's
aggregation, never a collect of rows).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from sparktrain.config import TrainConfig


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
    """AUC / accuracy (classification) or RMSE (regression) of ``model`` on ``df``."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, RegressionEvaluator
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    scored = model.transform(df)
    label = model.getLabelCol()
    task = model.inputs.task
    out: Dict[str, float] = {}
    if task == "binary":
        scored = scored.withColumn("__y", F.col(label).cast("double"))
        out["test_auc"] = BinaryClassificationEvaluator(
            rawPredictionCol=model.getProbabilityCol(), labelCol="__y", metricName="areaUnderROC").evaluate(scored)
        out["test_accuracy"] = scored.agg(F.avg((F.col("__y") == F.col(model.getPredictionCol())).cast("double"))
                                          ).first()[0]
    elif task == "multiclass":
        out["test_accuracy"] = scored.agg(F.avg((F.col(label).cast("double") == F.col(model.getPredictionCol()))
                                                .cast("double"))).first()[0]
    else:
        out["test_rmse"] = RegressionEvaluator(labelCol=label, predictionCol=model.getPredictionCol(),
                                               metricName="rmse").evaluate(scored)
    return EvalResult(metrics={k: float(v) for k, v in out.items()}, seconds=time.perf_counter() - t0)


def logistic_baseline(spark, dataset_path: str, inputs: Any, label: str) -> EvalResult:
    """Spark MLlib LogisticRegression on the same inputs (categoricals one-hot encoded)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.feature import OneHotEncoder, VectorAssembler
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    train = spark.read.parquet(os.path.join(dataset_path, "train")).withColumn("__y", F.col(label).cast("double"))
    test = spark.read.parquet(os.path.join(dataset_path, "test")).withColumn("__y", F.col(label).cast("double"))
    cats = [c for c, _ in inputs.categorical]
    stages: List[Any] = []
    if cats:
        stages.append(OneHotEncoder(inputCols=cats, outputCols=[f"{c}__oh" for c in cats], dropLast=False,
                                    handleInvalid="keep"))
    stages += [VectorAssembler(inputCols=[*inputs.numeric, *(f"{c}__oh" for c in cats)], outputCol="__x",
                               handleInvalid="keep"),
               LogisticRegression(featuresCol="__x", labelCol="__y", maxIter=50, regParam=1e-4)]
    fitted = Pipeline(stages=stages).fit(train)
    auc = BinaryClassificationEvaluator(rawPredictionCol="rawPrediction", labelCol="__y",
                                        metricName="areaUnderROC").evaluate(fitted.transform(test))
    return EvalResult(metrics={"test_auc": float(auc)}, seconds=time.perf_counter() - t0)
