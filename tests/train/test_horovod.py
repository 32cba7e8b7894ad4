"""Horovod (gloo) backend for torch, when `make horovod` has built it."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.horovod,
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                       reason="Horovod is not built: run `make horovod` (builds horovod==0.28.1 for torch, ~3 min)"),
]


def test_horovod_torch_two_workers_average_gradients(spark, tmp_path):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet
    from sparktrain.train.estimator import TorchEstimator

    df = spark.range(6000).select((F.rand(5) * 2 - 1).cast("float").alias("x"),
                                  (F.col("id") % 5).cast("int").alias("c"))
    write_parquet(df.withColumn("label", F.col("x") > 0), str(tmp_path / "ds" / "train"))
    est = TorchEstimator(numWorkers=2, epochs=2, batchSize=128, labelCol="label", backend="horovod",
                         store=str(tmp_path / "store"), learningRate=0.01)
    model = est.fit(str(tmp_path / "ds"))
    digests = est.last_launch.param_digests
    assert digests[0] == digests[1]  # gradients were averaged: both ranks hold the same weights
    assert model.history[1]["train_loss"] < model.history[0]["train_loss"]
