"""VectorEncoder and TokenIndexer on small frames: values, save -> load -> transform, and the bad inputs of issue 23."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from sparktrain.errors import ConfigError, DataError, SchemaError

REPO = Path(__file__).resolve().parents[2]


def _cfg(out, features, label="label"):
    from sparktrain.config import load_config
    from sparktrain.features.spec import parse_features

    cfg = load_config(REPO / "conf" / "flights.yaml")
    return replace(cfg, data=replace(cfg.data, label=label, key="id"), features=parse_features(features),
                   output=replace(cfg.output, path=str(out)))


def test_a_vector_udt_column_becomes_a_scaled_array_and_round_trips(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler
    from sparktrain.features.array_stages import VectorEncoder, VectorEncoderModel

    df = spark.createDataFrame([(1.0, 10.0), (3.0, 10.0), (float("nan"), 40.0)], "a double, b double")
    df = VectorAssembler(inputCols=["a", "b"], outputCol="v", handleInvalid="keep").transform(df)
    model = VectorEncoder(inputCols=["v"], outputCols=["out"], scaled=[True]).fit(df)
    assert model.getWidths() == [2]
    assert model.getMeans()[0] == [2.0, 20.0]  # the NaN is left out of the first element's moments
    assert model.getStds()[0] == pytest.approx([math.sqrt(2.0), math.sqrt(300.0)])
    path = str(tmp_path / "enc")
    model.write().overwrite().save(path)
    rows = [r["out"] for r in VectorEncoderModel.load(path).transform(df).collect()]
    assert rows[0] == pytest.approx([-1 / math.sqrt(2.0), -10 / math.sqrt(300.0)])
    assert rows[2] == pytest.approx([0.0, 20 / math.sqrt(300.0)])  # NaN -> 0 after scaling (the mean)


def test_vector_rows_of_different_lengths_name_the_column_and_the_lengths(spark):
    from sparktrain.features.array_stages import VectorEncoder

    df = spark.createDataFrame([([1.0, 2.0],), ([1.0, 2.0, 3.0],), (None,)], "emb array<double>")
    with pytest.raises(DataError, match=r"column 'emb' \(feature 'emb', vector\) holds rows of different lengths "
                                        r"\(lengths seen: 2, 3\)"):
        VectorEncoder(inputCols=["emb"], outputCols=["o"], features=["emb"]).fit(df)


def test_a_row_of_another_length_at_transform_time_fails_naming_the_column(spark):
    from sparktrain.features.array_stages import VectorEncoder

    model = VectorEncoder(inputCols=["emb"], outputCols=["o"]).fit(
        spark.createDataFrame([([1.0, 2.0],)], "emb array<double>"))
    with pytest.raises(Exception, match="column 'emb' .* another length than the 2 values"):
        model.transform(spark.createDataFrame([([1.0],)], "emb array<double>")).collect()


def test_nan_in_a_vector_follows_on_invalid(spark):
    from sparktrain.features.array_stages import VectorEncoder

    df = spark.createDataFrame([([1.0, float("nan")],), (None,), ([3.0, 4.0],)], "emb array<double>")
    out = VectorEncoder(inputCols=["emb"], outputCols=["o"]).fit(df).transform(df).collect()
    assert [r["o"] for r in out] == [[1.0, 0.0], [0.0, 0.0], [3.0, 4.0]]
    with pytest.raises(DataError, match=r"column 'emb' .* 1 rows with a NaN, infinite or null element and 1 null "
                                        r"rows \(on_invalid: error\)"):
        VectorEncoder(inputCols=["emb"], outputCols=["o"], onInvalid=["error"]).fit(df)


def test_token_ids_pad_cut_and_mark_unknown_tokens_and_round_trip(spark, tmp_path):
    from sparktrain.features.array_stages import TokenIndexer, TokenIndexerModel

    df = spark.createDataFrame([(["a", "b", "a"],), (["a", "c"],), ([],), (None,)], "t array<string>")
    model = TokenIndexer(inputCols=["t"], outputCols=["ids"], maxLengths=[2], minFrequencies=[2]).fit(df)
    assert model.getVocabularies() == [["a"]] and model.numIds() == [3]
    path = str(tmp_path / "tok")
    model.write().overwrite().save(path)
    got = [r["ids"] for r in TokenIndexerModel.load(path).transform(df).collect()]
    assert got == [[2, 1], [2, 1], [0, 0], [0, 0]]  # b (once) is unknown; cut at 2; empty and null are padding
    hashed = TokenIndexer(inputCols=["t"], outputCols=["ids"], maxLengths=[4], hashBuckets=[5]).fit(df)
    assert hashed.numIds() == [7]
    ids = [r["ids"] for r in hashed.transform(df).collect()]
    assert ids[0][0] == ids[0][2] == ids[1][0] and all(2 <= i < 7 for i in ids[0][:3]) and ids[0][3] == 0


def test_a_text_column_empty_after_tokenization_is_refused_before_writing(spark, tmp_path):
    from sparktrain.features.materialize import materialize

    df = spark.createDataFrame([(i, " ,. " if i % 2 else None, float(i % 2)) for i in range(40)],
                               "id long, title string, label double")
    out = tmp_path / "ds"
    with pytest.raises(DataError, match=r"column 'title' \(feature 'title', text\) has no token in any row .* null or "
                                        r"empty in every row after tokenization"):
        materialize(spark, _cfg(out, [{"name": "title", "type": "text"}]), df)
    assert not out.exists()


def test_a_set_over_its_vocabulary_limit_is_refused_with_its_size_and_the_fix(spark, tmp_path):
    from sparktrain.features.materialize import materialize

    df = spark.createDataFrame([(i, f"t{i}|t{i + 1}", float(i % 2)) for i in range(60)],
                               "id long, tags string, label double")
    out = tmp_path / "ds"
    with pytest.raises(DataError, match=r"column 'tags' \(feature 'tags', set\) has \d+ distinct values .* over its "
                                        r"vocab_limit=20. Set max_vocab"):
        materialize(spark, _cfg(out, [{"name": "tags", "type": "set", "delimiter": "|", "vocab_limit": 20}]), df)
    assert not out.exists()


def test_datetime_format_counts_unparseable_values_and_refuses_them(spark, tmp_path):
    from sparktrain.features.materialize import materialize

    rows = [(i, f"2012/0{1 + i % 9}/1{i % 10}", float(i % 2)) for i in range(30)] + [(99, "2012-01-01", 1.0)]
    df = spark.createDataFrame(rows, "id long, day string, label double")
    out = tmp_path / "ds"
    with pytest.raises(DataError, match=r"column 'day' .* 1 of 31 values that cannot be cast to a timestamp, "
                                        r"e.g. '2012-01-01' \(read with format 'yyyy/MM/dd'\)"):
        materialize(spark, _cfg(out, [{"name": "day", "type": "datetime", "format": "yyyy/MM/dd"}]), df)
    assert not out.exists()
    with pytest.raises(DataError, match="set format: to its Spark datetime pattern"):  # ISO only without format
        materialize(spark, _cfg(out, [{"name": "day", "type": "datetime"}]), df)


def test_schema_and_spec_errors_name_the_key(spark):
    from sparktrain.features.spec import parse_features
    from sparktrain.features.validate import check_schema

    df = spark.createDataFrame([("a|b", "x", ["1"])], "tags string, title string, strs array<string>")
    with pytest.raises(SchemaError, match="column 'tags' is a string, which a set feature .* delimiter"):
        check_schema(df.schema, parse_features([{"name": "tags", "type": "set"}]))
    with pytest.raises(SchemaError, match="column 'strs' has type array<string>, which a vector feature"):
        check_schema(df.schema, parse_features([{"name": "strs", "type": "vector"}]))
    with pytest.raises(SchemaError, match="format .* parses strings only"):
        check_schema(spark.range(1).selectExpr("current_timestamp() AS t").schema,
                     parse_features([{"name": "t", "type": "datetime", "format": "yyyy"}]))
    with pytest.raises(ConfigError, match=r"features\.title\.max_tokens. = 0: must be >= 1"):
        parse_features([{"name": "title", "type": "text", "max_tokens": 0}])
    with pytest.raises(ConfigError, match="hashing has no vocabulary"):
        parse_features([{"name": "tags", "type": "set", "hash_buckets": 8, "max_vocab": 3}])
