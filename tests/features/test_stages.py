"""Our own Spark ML stages: fitted values, transforms, save -> load -> transform."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sparktrain.errors import ConfigError, DataError


def _rows(df, *cols):
    return [tuple(r[c] for c in cols) for r in df.orderBy("id").select(*cols).collect()]


def test_column_scaler_fits_sample_std_and_range_and_persists(spark, tmp_path):
    from sparktrain.features.stages import ColumnScaler, ColumnScalerModel

    a = [1.0, 2.0, 4.0, None, 8.0]
    b = [10.0, 30.0, 20.0, 40.0, None]
    c = [5.0, 5.0, 5.0, 5.0, 5.0]
    df = spark.createDataFrame([(i, a[i], b[i], c[i]) for i in range(5)], "id int, a double, b double, c double")
    scaler = ColumnScaler(inputCols=["a", "b", "c"], outputCols=["a_s", "b_s", "c_s"],
                          methods=["standard", "minmax", "standard"])
    model = scaler.fit(df)
    av = np.array([1.0, 2.0, 4.0, 8.0])
    assert model.getOffsets() == pytest.approx([av.mean(), 10.0, 5.0])
    assert model.getScales() == pytest.approx([av.std(ddof=1), 30.0, 1.0])  # constant column: scale 1
    out = _rows(model.transform(df), "a_s", "b_s", "c_s")
    assert out[0][0] == pytest.approx((1.0 - av.mean()) / av.std(ddof=1))
    assert out[3][0] is None  # nulls stay null
    assert [r[1] for r in out[:4]] == pytest.approx([0.0, 2 / 3, 1 / 3, 1.0])
    assert {r[2] for r in out} == {0.0}

    model.write().overwrite().save(str(tmp_path / "m"))
    loaded = ColumnScalerModel.load(str(tmp_path / "m"))
    assert loaded.getMethods() == ["standard", "minmax", "standard"]
    assert _rows(loaded.transform(df), "a_s", "b_s", "c_s") == out
    scaler.write().overwrite().save(str(tmp_path / "e"))
    assert ColumnScaler.load(str(tmp_path / "e")).getMethods() == scaler.getMethods()


def test_column_scaler_rejects_unknown_method_and_length_mismatch(spark):
    from sparktrain.features.stages import ColumnScaler

    with pytest.raises(TypeError, match="robust"):
        ColumnScaler(inputCols=["a"], outputCols=["b"], methods=["robust"])
    df = spark.createDataFrame([(1.0,)], "a double")
    with pytest.raises(ConfigError, match="one method per input column"):
        ColumnScaler(inputCols=["a"], outputCols=["b"], methods=["standard", "minmax"]).fit(df)


def test_vocabulary_indexer_layout_min_frequency_max_vocab(spark, tmp_path):
    from sparktrain.features.stages import VocabularyIndexer, VocabularyIndexerModel

    x = ["a", "b", "a", "c", "b", "a", "d", None, "c", "e"]
    y = [1, 1, 2, 2, 3, 3, 3, 4, None, 5]
    df = spark.createDataFrame([(i, x[i], y[i]) for i in range(10)], "id int, x string, y int")
    est = VocabularyIndexer(inputCols=["x", "y"], outputCols=["xi", "yi"], minFrequencies=[2, 1],
                            maxVocabSizes=[0, 2])
    model = est.fit(df)
    # x: a=3, b=2, c=2 (tie: alphabetical), d/e rarer than 2; y: 3 (x3) then 1/2 (x2, tie -> "1")
    assert model.getLabelsArray() == [["a", "b", "c"], ["3", "1"]]
    got = _rows(model.transform(df), "xi", "yi")
    assert [r[0] for r in got] == [0, 1, 0, 2, 1, 0, 3, 3, 2, 3]  # d, null and e -> reserved 3
    assert [r[1] for r in got] == [1, 1, 2, 2, 0, 0, 0, 2, 2, 2]  # 2, 4, 5 and null -> reserved 2

    model.write().overwrite().save(str(tmp_path / "vm"))
    loaded = VocabularyIndexerModel.load(str(tmp_path / "vm"))
    assert loaded.getLabelsArray() == model.getLabelsArray()
    new = spark.createDataFrame([(0, "zzz", 3), (1, "c", 99)], "id int, x string, y int")
    assert _rows(loaded.transform(new), "xi", "yi") == [(3.0, 0.0), (2.0, 2.0)]


def test_vocabulary_indexer_matches_string_indexer_without_options(spark, flights_sample):
    from pyspark.ml.feature import StringIndexer
    from sparktrain.features.stages import VocabularyIndexer

    ours = VocabularyIndexer(inputCols=["dest", "tailnum"], outputCols=["a", "b"]).fit(flights_sample)
    theirs = StringIndexer(inputCols=["dest", "tailnum"], outputCols=["a", "b"], handleInvalid="keep",
                           stringOrderType="frequencyDesc").fit(flights_sample)
    assert ours.getLabelsArray() == [list(v) for v in theirs.labelsArray]


def test_vocabulary_indexer_refuses_vocabulary_over_limit_and_empty(spark):
    from sparktrain.features.stages import VocabularyIndexer

    df = spark.range(50).selectExpr("cast(id as string) as x")
    with pytest.raises(DataError, match=r"column 'x' has more than 10 distinct values.*vocab_limit=10"):
        VocabularyIndexer(inputCols=["x"], outputCols=["i"], vocabLimits=[10]).fit(df)
    # with a maximum size the limit is not hit: the 10 "most frequent" (ties: by value) are kept
    model = VocabularyIndexer(inputCols=["x"], outputCols=["i"], vocabLimits=[10], maxVocabSizes=[10]).fit(df)
    assert model.getLabelsArray() == [sorted(str(i) for i in range(50))[:10]]
    with pytest.raises(DataError, match="no value seen at least 2 times"):
        VocabularyIndexer(inputCols=["x"], outputCols=["i"], minFrequencies=[2]).fit(df)


def test_flat_feature_assembler_types_label_and_optional_passthrough(spark, tmp_path):
    from sparktrain.features.stages import FlatFeatureAssembler

    df = spark.createDataFrame([("k1", True, 1.5, 2.0, "raw"), ("k2", False, None, 3.0, "raw")],
                               "key string, late boolean, __st_f double, __st_i double, other string")
    asm = FlatFeatureAssembler(floatInputCols=["__st_f"], floatOutputCols=["f"], intInputCols=["__st_i"],
                               intOutputCols=["i"], keyCol="key", labelCol="late")
    out = asm.transform(df)
    assert out.dtypes == [("key", "string"), ("late", "float"), ("f", "float"), ("i", "int")]
    assert [tuple(r) for r in out.orderBy("key").collect()] == [("k1", 1.0, 1.5, 2), ("k2", 0.0, None, 3)]
    # scoring data without key and label
    assert asm.transform(df.drop("key", "late")).columns == ["f", "i"]
    asm.setKeepInputCols(True)
    assert asm.transform(df).columns == ["key", "late", "other", "f", "i"]
    asm.write().overwrite().save(str(tmp_path / "a"))
    loaded = FlatFeatureAssembler.load(str(tmp_path / "a"))
    assert loaded.getKeepInputCols() is True and loaded.getLabelCol() == "late"
    assert math.isclose(loaded.transform(df).where("key = 'k1'").first()["f"], 1.5)


def test_top_values_ranks_the_same_on_the_driver_and_on_the_cluster(spark, flights_sample):
    from pyspark.sql import functions as F
    from sparktrain.features.stages import top_values

    cols = [F.col("dest"), F.col("carrier"), F.col("engines")]
    # roomy caps: every counted value fits the bound, so the ranking happens on the driver
    roomy = top_values(flights_sample, cols, [20, 1, 1], [10_000, 10_000, 10_000])
    # tight caps: more counted values than sum(caps) + 1, so the window ranks them on the cluster
    tight = top_values(flights_sample, cols, [20, 1, 1], [5, 3, 2])
    assert [r[:c] for r, c in zip(roomy, (5, 3, 2))] == tight
    want = (flights_sample.where("carrier IS NOT NULL").groupBy("carrier").count()
            .orderBy(F.desc("count"), F.asc("carrier")).collect())
    assert roomy[1] == [r["carrier"] for r in want]
    assert all(v.isdigit() for v in roomy[2])  # an int column is counted by its text
    assert len(roomy[0]) == flights_sample.groupBy("dest").count().where("count >= 20 AND dest IS NOT NULL").count()
