"""materialize / run_preprocess: deterministic split, Parquet + manifests + features.json + model, atomic."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from sparktrain.config import load_config
from sparktrain.errors import DataError, DatasetExistsError, MissingColumnError

REPO = Path(__file__).resolve().parents[2]


def _cfg(path, source=None, features=None, **output):
    cfg = load_config(REPO / "conf" / "flights.yaml")
    data = replace(cfg.data, source=source) if source else cfg.data
    out = replace(cfg.output, path=str(path), row_group_rows=4096, **output)
    cfg = replace(cfg, data=data, output=out)
    if features is not None:
        from sparktrain.features.spec import parse_features
        cfg = replace(cfg, features=parse_features(features))
    return cfg


@pytest.fixture(scope="module")
def sample_dir(flights_sample):
    return os.path.dirname(urlparse(flights_sample.inputFiles()[0]).path)


@pytest.fixture(scope="module")
def result(spark, sample_dir, tmp_path_factory):
    from sparktrain.job import run_preprocess

    out = tmp_path_factory.mktemp("mat") / "dataset"
    return run_preprocess(spark, _cfg(out, source=sample_dir))


def test_layout_counts_manifests_and_features_json(result, flights_sample):
    gen = Path(result.generation)  # the committed generation, named by the commit record written last
    assert sorted(p.name for p in Path(result.path).iterdir()) == sorted(["_manifest.json", gen.name])
    record = json.loads((Path(result.path) / "_manifest.json").read_text())
    assert record["format"] == "sparktrain.commit/1" and record["path"] == gen.name and record["kind"] == "preprocess"
    assert record["rows"] == dict(result.row_counts)
    assert sorted(p.name for p in gen.iterdir()) == ["_generation.json", "features.json", "pipeline_model", "test",
                                                     "train", "validation"]
    assert sorted(p.name for p in Path(result.path).parent.iterdir()) == ["dataset"]  # no staging, no lease left
    root = gen
    total = flights_sample.count()
    assert sum(result.row_counts.values()) == total
    for split, frac in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
        assert abs(result.row_counts[split] / total - frac) < 0.02, split
        man = result.manifests[split]
        assert man["num_rows"] == result.row_counts[split]
        assert json.loads((root / split / "_manifest.json").read_text())["digest"] == man["digest"]
        assert all(g <= 4096 for f in man["files"] for g in f["row_groups"])
        types = {c["name"]: c["type"] for c in man["schema"]}
        assert types.pop("flight_id") == "string" and types.pop("late") == "float"
        assert set(types.values()) == {"float", "int32"}
    meta = json.loads((root / "features.json").read_text())
    assert meta == json.loads(json.dumps(result.features))
    assert meta["dataset"]["splits"]["train"]["rows"] == result.row_counts["train"]
    assert meta["dataset"]["split"]["fractions"] == {"train": 0.8, "validation": 0.1, "test": 0.1}
    assert [f["name"] for f in meta["features"]][:3] == ["carrier", "origin", "dest"]
    assert meta["dataset"]["pipeline_model"] == "pipeline_model"


def test_split_is_by_key_only_whatever_the_partitioning(spark, result, flights_sample):
    from pyspark.sql import functions as F
    from sparktrain.config import SplitConfig
    from sparktrain.features.materialize import split_expression

    expr = split_expression("flight_id", SplitConfig(seed=42))
    a = flights_sample.repartition(7).select("flight_id", F.expr(expr).alias("s"))
    b = flights_sample.coalesce(1).select("flight_id", F.expr(expr).alias("s"))
    assert a.exceptAll(b).count() == 0
    for split in ("train", "validation", "test"):
        written = spark.read.parquet(result.split_path(split)).select("flight_id")
        expected = a.where(F.col("s") == split).select("flight_id")
        assert written.exceptAll(expected).count() == 0 and expected.exceptAll(written).count() == 0
    # golden values: a change of hash function or seed handling would move every row
    golden = spark.createDataFrame([("2013-01-01|UA|1545|EWR|515|N14228",), ("a",), ("f",), ("g",)], "flight_id string")
    assert [r[0] for r in golden.select(F.expr(expr)).collect()] == ["test", "train", "test", "validation"]
    other_seed = split_expression("flight_id", SplitConfig(seed=7))
    assert a.where(F.expr(other_seed) != F.col("s")).count() > 0


def test_saved_pipeline_model_rescores_raw_rows_like_the_written_split(spark, result, flights_sample):
    from pyspark.ml import PipelineModel

    model = PipelineModel.load(result.pipeline_model)
    test_keys = spark.read.parquet(result.split_path("test")).select("flight_id")
    rescored = model.transform(flights_sample.join(test_keys, "flight_id", "left_semi"))
    written = spark.read.parquet(result.split_path("test"))
    assert rescored.columns == written.columns
    assert rescored.exceptAll(written).count() == 0


def test_format_summary_lists_splits_and_columns(result):
    from sparktrain.features.materialize import format_summary

    text = format_summary(result)
    assert f"{result.row_counts['train']:,} rows" in text
    card = {c["name"]: c["cardinality"] for c in result.features["columns"] if c["dtype"] == "int32"}
    assert f"carrier={card['carrier']}" in text and "float32" in text and "rows/s" in text
    # text and set features (array<int> ids) and float blocks are counted, not left out of the line
    from dataclasses import replace
    columns = [*result.features["columns"], {"name": "note", "dtype": "array<int>"},
               {"name": "tags", "dtype": "array<int>"}, {"name": "emb", "dtype": "array<float>"}]
    wider = format_summary(replace(result, features={**result.features, "columns": columns}))
    assert (f"{len(result.features['float_columns'])} float32 + {len(result.features['int_columns'])} int32 "
            f"columns + 1 array<float> column(s) + 2 array<int> column(s)\n") in wider


def test_failure_after_staging_leaves_the_previous_dataset_untouched(spark, flights_sample, tmp_path):
    from sparktrain.features.materialize import materialize

    out = tmp_path / "dataset"
    out.mkdir()
    previous = json.dumps({"format": "sparktrain.features/1", "run": "previous"})
    (out / "features.json").write_text(previous)  # an earlier dataset (older layout): replaceable, kept on failure
    # passes the checks, then the vocabulary limit stops the fit (halfway: input staged, nothing fitted)
    cfg = _cfg(out, features=[{"name": "tailnum", "type": "categorical", "min_frequency": 2, "vocab_limit": 5},
                              {"name": "distance", "type": "numeric"}])
    with pytest.raises(DataError, match="more than 5 distinct values"):
        materialize(spark, cfg, flights_sample)
    assert [p.name for p in out.iterdir()] == ["features.json"]  # the new generation went, the old data stayed
    assert (out / "features.json").read_text() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no staging folder left behind


def test_bad_input_fails_before_writing_anything(spark, flights_sample, tmp_path):
    from sparktrain.features.materialize import materialize

    cfg = _cfg(tmp_path / "dataset", features=[{"name": "dep_dealy", "type": "numeric"}])
    with pytest.raises(MissingColumnError, match="Did you mean 'dep_delay'"):
        materialize(spark, cfg, flights_sample)
    bad = flights_sample.selectExpr("*", "IF(distance > 1000, CAST('Infinity' AS DOUBLE), distance) AS d").drop(
        "distance").withColumnRenamed("d", "distance")
    cfg = _cfg(tmp_path / "dataset", features=[{"name": "distance", "type": "numeric", "on_invalid": "error"}])
    with pytest.raises(DataError, match=r"column 'distance' .* infinite values \(on_invalid: error\)"):
        materialize(spark, cfg, bad)
    assert list(tmp_path.iterdir()) == []


def test_a_vocabulary_over_its_limit_is_refused_exactly_without_writing(spark, sample_dir, tmp_path):
    from sparktrain.features.materialize import materialize

    tails = spark.read.parquet(sample_dir).where("pmod(xxhash64(CAST(42 AS BIGINT), flight_id), 10000) < 8000") \
        .select("tailnum").distinct().where("tailnum IS NOT NULL").count()
    assert tails > 50
    cfg = _cfg(tmp_path / "dataset", source=sample_dir,  # Parquet source: checks and fit share one pass
               features=[{"name": "tailnum", "type": "categorical", "vocab_limit": 50},
                         {"name": "distance", "type": "numeric"}])
    with pytest.raises(DataError, match=r"column 'tailnum' \(feature 'tailnum', categorical\) has more than 50 "
                                        r"distinct values, over its vocab_limit=50\. Set max_vocab"):
        materialize(spark, cfg)
    assert list(tmp_path.iterdir()) == []
    ok = replace(cfg, output=replace(cfg.output, path=str(tmp_path / "ok")),
                 features=tuple(replace(f, vocab_limit=tails) if f.name == "tailnum" else f for f in cfg.features))
    result = materialize(spark, ok)  # exactly at the limit: accepted
    assert next(f for f in result.features["features"] if f["name"] == "tailnum")["vocab_size"] == tails


def test_a_min_frequency_no_value_reaches_names_the_source_column_not_the_pipelines(spark, sample_dir, tmp_path):
    from sparktrain.features.materialize import materialize

    top = spark.read.parquet(sample_dir).groupBy("dest").count().orderBy("count", ascending=False).first()
    cfg = _cfg(tmp_path / "dataset", source=sample_dir,
               features=[{"name": "destination", "type": "categorical", "column": "dest",
                          "min_frequency": top["count"] + 1},
                         {"name": "distance", "type": "numeric"}])
    with pytest.raises(DataError) as err:
        materialize(spark, cfg)
    msg = str(err.value)
    assert (f"column 'dest' (feature 'destination', categorical) has no value seen at least {top['count'] + 1:,} "
            f"times (min_frequency) in the rows the features are fitted on" in msg)
    assert f"Lower min_frequency (now {top['count'] + 1})" in msg and "__st_" not in msg
    assert list(tmp_path.iterdir()) == []


def test_a_categorical_null_in_every_train_row_is_refused_by_its_source_column(spark, flights_sample, tmp_path):
    from pyspark.sql import functions as F
    from sparktrain.features.materialize import materialize, split_expression

    cfg = _cfg(tmp_path / "dataset", features=[{"name": "destination", "type": "categorical", "column": "dest"},
                                               {"name": "distance", "type": "numeric"}])
    split = F.expr(split_expression(cfg.data.key, cfg.split))
    df = flights_sample.withColumn("dest", F.when(split == "train", F.lit(None)).otherwise(F.col("dest")))
    assert df.where("dest IS NOT NULL").count() > 0  # not all-null: the train split alone has none
    with pytest.raises(DataError) as err:
        materialize(spark, cfg, df)
    msg = str(err.value)
    assert ("column 'dest' (feature 'destination', categorical) is null in every row the features are fitted on "
            "(the train split)" in msg)
    assert "Check the split (data.key, split.*)" in msg and "__st_" not in msg
    assert not (tmp_path / "dataset").exists()


def test_overwrite_false_refuses_an_existing_dataset(spark, flights_sample, tmp_path):
    from sparktrain.features.materialize import materialize

    (tmp_path / "dataset").mkdir()
    cfg = _cfg(tmp_path / "dataset", overwrite=False, features=[{"name": "distance", "type": "numeric"}])
    with pytest.raises(DatasetExistsError):
        materialize(spark, cfg, flights_sample)


def test_an_empty_split_is_written_as_an_empty_dataset(spark, flights_sample, tmp_path):
    from sparktrain.config import SplitConfig
    from sparktrain.features.materialize import materialize

    cfg = replace(_cfg(tmp_path / "dataset", features=[{"name": "distance", "type": "numeric"}]),
                  split=SplitConfig(train=0.9, validation=0.1, test=0.0))
    result = materialize(spark, cfg, flights_sample)  # a DataFrame: staged input
    assert result.row_counts["test"] == 0 and result.manifests["test"]["num_rows"] == 0
    assert result.row_counts["train"] + result.row_counts["validation"] == flights_sample.count()
    assert pq.read_table(result.split_path("test")).schema.names == ["flight_id", "late", "distance"]


def test_feature_names_with_dots_and_spaces_are_prepared_and_rescored(spark, flights_sample, tmp_path):
    """A dot in a feature's name (``area.sqft``) reached Spark ML's JVM stages inside an intermediate column's
    name, which they read as a struct field: FIELD_NOT_FOUND on ``__st_area.sqft__prep`` at the split write.
    The outputs keep the user's names; the saved pipeline rescores raw rows like the written split."""
    from pyspark.ml import PipelineModel
    from sparktrain.features.materialize import materialize

    raw = (flights_sample.withColumnRenamed("distance", "dist.miles").withColumnRenamed("dep_delay", "dep delay")
           .withColumnRenamed("carrier", "car.rier"))
    cfg = _cfg(tmp_path / "dataset", features=[
        {"name": "dist.miles", "type": "numeric", "impute": "median", "buckets": 4},
        {"name": "dep delay", "type": "numeric", "impute": "mean", "scale": "minmax"},
        {"name": "car.rier", "type": "categorical"}])
    result = materialize(spark, cfg, raw)
    written = spark.read.parquet(result.split_path("test"))
    assert {"dist.miles", "dist.miles_bucket", "dep delay", "car.rier"} <= set(written.columns)
    assert not [c for c in written.columns if c.startswith("__st_")]
    card = {c["name"]: c["cardinality"] for c in result.features["columns"] if c["dtype"] == "int32"}
    assert card["car.rier"] == flights_sample.select("carrier").distinct().count() + 1  # + the unseen index
    assert written.where("`dist.miles_bucket` > 0").count() > 0  # buckets really split the distances
    model = PipelineModel.load(result.pipeline_model)
    keys = written.select("flight_id")
    rescored = model.transform(raw.join(keys, "flight_id", "left_semi"))
    assert rescored.columns == written.columns
    assert rescored.exceptAll(written).count() == 0 and written.count() > 0
