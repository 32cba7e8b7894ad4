"""Faults have designed outcomes: a stalled rank is named and the fit stops; nothing is lost."""

from __future__ import annotations

import pytest

from sparktrain.errors import TrainingStalledError


@pytest.fixture(scope="module")
def small(spark, tmp_path_factory):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("faults") / "ds"
    df = spark.range(6400).select((F.rand(1) * 2 - 1).cast("float").alias("x"))
    write_parquet(df.withColumn("label", (F.col("x") > 0).cast("float")).coalesce(1), str(root / "train"))
    return str(root)


@pytest.mark.torch
def test_a_stalled_rank_is_named_and_the_fit_stops(spark, small, tmp_path, monkeypatch, caplog):
    from sparktrain.train.estimator import TorchEstimator

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:20:hang")  # rank 1 blocks for good before step 21
    est = TorchEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=str(tmp_path / "store"),
                         stallTimeout=8.0, logEverySteps=5)
    est.show_progress = False
    with caplog.at_level("WARNING", logger="sparktrain.train.watchdog"):
        with pytest.raises(TrainingStalledError) as info:
            est.fit(small)
    err = info.value
    assert err.rank == 1 and err.host
    assert err.info["epoch"] == 0 and err.info["step"] == 20 and err.info["phase"] == "compute"
    assert 8.0 <= err.info["seconds"] < 8.0 + 5.0  # detected within the timeout plus the poll interval
    assert "rank 1 made no progress" in str(err) and "stallTimeout = 8 s" in str(err)
    assert "made no progress for" in caplog.text
    # the cancelled stage freed its slots: the session trains again right away
    monkeypatch.delenv("SPARKTRAIN_FAULT_INJECT")
    est2 = TorchEstimator(numWorkers=2, epochs=1, batchSize=256, labelCol="label", store=str(tmp_path / "store"))
    est2.show_progress = False
    assert len(est2.fit(small).history) == 1
