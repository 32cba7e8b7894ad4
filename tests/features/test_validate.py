"""Bad input gets a clear error before any fitting, from one aggregation pass."""

from __future__ import annotations

import numpy as np
import pytest
from sparktrain.errors import DataError, MissingColumnError, SchemaError
from sparktrain.features.spec import parse_features

SCHEMA = "id string, y boolean, num double, txt string, cat string, ts timestamp, arr array<int>"


@pytest.fixture(scope="module")
def frame(spark):
    import datetime as dt

    t = dt.datetime(2024, 1, 1, 12)
    rows = [
        ("a", True, 1.0, "1.5", "u", t, [1]),
        ("b", False, 2.0, "abc", "v", t, [2]),
        ("c", True, 4.0, None, "w", None, None),
        ("d", False, None, "2", None, t, []),
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _validate(df, features, **kw):
    from sparktrain.features.validate import validate

    return validate(df, parse_features(features), key="id", label="y", **kw)


def test_clean_input_passes_with_one_job_and_reports_counts(spark, frame):
    sc = spark.sparkContext
    sc.setJobGroup("validate-one-pass", "count jobs")
    aqe = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # AQE would run the map side as a job of its own
    try:
        report = _validate(frame, [{"name": "num", "type": "numeric"}, {"name": "cat", "type": "categorical"},
                                   {"name": "ts", "type": "datetime"}])
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.adaptive.enabled", aqe)
    assert len(sc.statusTracker().getJobIdsForGroup("validate-one-pass")) == 1
    assert report.rows == 4
    assert report.features["num"]["present"] == 3 and report.features["num"]["nan"] == 0
    assert report.features["cat"] == {"present": 3, "distinct": 3}
    assert report.features["ts"]["present"] == 3


def test_missing_column_is_named_with_the_columns_that_exist(frame):
    with pytest.raises(MissingColumnError) as err:
        _validate(frame, [{"name": "nmu", "type": "numeric"}])
    msg = str(err.value)
    assert "column 'nmu'" in msg and "feature 'nmu'" in msg and "Did you mean 'num'?" in msg
    assert "id, y, num, txt, cat, ts, arr" in msg
    with pytest.raises(MissingColumnError, match="crossed_col"):
        _validate(frame, [{"name": "x", "type": "crossed", "columns": ["cat", "crossed_col"], "hash_buckets": 8}])
    from sparktrain.features.validate import validate
    with pytest.raises(MissingColumnError, match=r"column 'label_x'.*data.label"):
        validate(frame, parse_features([{"name": "num", "type": "numeric"}]), label="label_x")


def test_values_that_cannot_be_cast_are_named_with_a_sample(frame):
    with pytest.raises(DataError) as err:
        _validate(frame, [{"name": "n", "column": "txt", "type": "numeric"}])
    msg = str(err.value)
    assert "column 'txt'" in msg and "1 of 4 values" in msg and "'abc'" in msg and "a number" in msg
    with pytest.raises(DataError, match=r"column 'cat'.*cannot be cast to a timestamp, e\.g\. 'u'"):
        _validate(frame, [{"name": "cat", "type": "datetime"}])


@pytest.mark.parametrize("text, words", [
    ("1,234.56", "drop the thousands separators"), ("3,14", "read the decimal comma"),
    ("-", "make '-' a missing value: data.options nullValue: '-'"),
    ("abc", "declare the feature as categorical if it is a code"),
])
def test_the_fix_for_text_a_number_cannot_be_read_from_matches_the_text(spark, text, words):
    """Probe M: "1,234.56", "3,14" and "-" were all told to "declare the feature as categorical", which would make
    every amount a category of its own."""
    df = spark.createDataFrame([("a", True, "2.5"), ("b", False, text)], "id string, y boolean, amount string")
    with pytest.raises(DataError) as err:
        _validate(df, [{"name": "amount", "type": "numeric"}])
    assert words in str(err.value), str(err.value)


def test_a_type_that_cannot_feed_the_feature_is_a_schema_error(frame):
    with pytest.raises(SchemaError, match=r"column 'arr' has type array<int>.*numeric feature"):
        _validate(frame, [{"name": "arr", "type": "numeric"}])
    with pytest.raises(SchemaError, match=r"column 'ts' has type timestamp.*numeric"):
        _validate(frame, [{"name": "ts", "type": "numeric"}])


def test_all_null_column_is_refused(spark):
    df = spark.createDataFrame([("a", True, None, None), ("b", False, None, None)],
                               "id string, y boolean, x double, c string")
    with pytest.raises(DataError, match=r"column 'x' \(feature 'x', numeric\) is null, NaN or infinite in all 2 rows"):
        _validate(df, [{"name": "x", "type": "numeric"}])
    with pytest.raises(DataError, match=r"column 'c' .* is null in all 2 rows"):
        _validate(df, [{"name": "c", "type": "categorical", "hash_buckets": 4}])
    nan_only = spark.createDataFrame([("a", True, float("nan"))], "id string, y boolean, x double")
    with pytest.raises(DataError, match="null, NaN or infinite in all 1 rows"):
        _validate(nan_only, [{"name": "x", "type": "numeric"}])


def test_vocabulary_over_its_limit_is_refused(spark):
    df = spark.range(300).selectExpr("CAST(id AS STRING) AS id", "id % 2 = 0 AS y", "CAST(id % 120 AS STRING) AS c")
    with pytest.raises(DataError, match=r"column 'c' .* about 1\d\d distinct values, over its vocab_limit=50.*"
                                        r"max_vocab.*hash_buckets"):
        _validate(df, [{"name": "c", "type": "categorical", "vocab_limit": 50}])
    # a maximum size, or hashing, makes it fine
    _validate(df, [{"name": "c", "type": "categorical", "vocab_limit": 50, "max_vocab": 50}])
    _validate(df, [{"name": "c", "type": "categorical", "vocab_limit": 50, "hash_buckets": 64}])


def test_exact_vocabulary_check_after_fitting():
    from sparktrain.features.metadata import check_vocabularies

    meta = {"features": [{"name": "c", "source": "c", "encoding": "vocabulary", "max_vocab": None,
                          "vocab_size": 11, "vocab_limit": 10}]}
    with pytest.raises(DataError, match=r"has 11 distinct values, over its vocab_limit=10"):
        check_vocabularies(meta)


@pytest.fixture(scope="module")
def invalid_numbers(spark):
    rows = [("a", True, 1.0), ("b", False, float("nan")), ("c", True, float("inf")), ("d", False, 3.0),
            ("e", True, -float("inf")), ("f", False, None)]
    return spark.createDataFrame(rows, "id string, y boolean, x double")


def test_nan_and_inf_are_rejected_with_on_invalid_error(spark, invalid_numbers):
    with pytest.raises(DataError, match=r"column 'x' .* has 1 NaN and 2 infinite values \(on_invalid: error\)"):
        _validate(invalid_numbers, [{"name": "x", "type": "numeric", "on_invalid": "error"}])


def test_nan_and_inf_are_imputed_with_on_invalid_impute_in_spark_and_locally(spark, invalid_numbers):
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.serve.local import transform_local

    specs = parse_features([{"name": "x", "type": "numeric", "scale": "none"}])
    report = _validate(invalid_numbers, [{"name": "x", "type": "numeric"}])
    assert (report.features["x"]["nan"], report.features["x"]["inf"], report.features["x"]["present"]) == (1, 2, 2)
    model = compile_pipeline(specs, key="id", label="y").fit(invalid_numbers)
    got = {r["id"]: r["x"] for r in model.transform(invalid_numbers).collect()}  # 6 rows
    assert got == {"a": 1.0, "b": 2.0, "c": 2.0, "d": 3.0, "e": 2.0, "f": 2.0}  # mean of the finite values
    meta = md.build_metadata(plan_features(specs, "id", "y"), md.fitted_values(model))
    local = transform_local({"id": list(got), "x": [1.0, float("nan"), float("inf"), 3.0, -float("inf"), None]},
                            meta)
    np.testing.assert_array_equal(local["x"], np.array([1, 2, 2, 3, 2, 2], np.float32))


def test_on_invalid_error_also_guards_the_fitted_model_and_the_local_transform(spark):
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.serve.local import transform_local

    specs = parse_features([{"name": "x", "type": "numeric", "on_invalid": "error"}])
    clean = spark.createDataFrame([("a", 1.0), ("b", 2.0)], "id string, x double")
    model = compile_pipeline(specs, key="id").fit(clean)
    dirty = spark.createDataFrame([("c", float("nan"))], "id string, x double")
    with pytest.raises(Exception, match=r"column 'x' \(feature 'x'\) has a NaN or infinite value"):
        model.transform(dirty).collect()
    meta = md.build_metadata(plan_features(specs, "id"), md.fitted_values(model))
    with pytest.raises(DataError, match=r"column 'x' \(feature 'x'\) has a NaN or infinite value"):
        transform_local({"x": np.array([1.0, np.inf])}, meta)


def test_a_validation_or_test_split_of_a_few_rows_is_warned_about(caplog):
    """Probe M: a 20-row table gave a 1-row validation split and a 2-row test split; the model was registered and
    made champion on test_auc over 2 rows, without a word."""
    import logging

    from sparktrain.features.materialize import _warn_small_splits

    with caplog.at_level(logging.WARNING, logger="sparktrain.features.materialize"):
        _warn_small_splits({"train": 17, "validation": 1, "test": 2})
        _warn_small_splits({"train": 17000, "validation": 2000, "test": 2000})
    assert len(caplog.records) == 1
    assert "validation 1 row, test 2 rows: metrics on so few rows" in caplog.records[0].getMessage()


def test_categories_that_differ_only_in_spaces_or_case_are_warned_about(caplog):
    """Probe M: the vocabulary ['blue  ', 'Red', 'red', 'blue', 'red '] held 5 categories for what are probably 2,
    without a word (the label warns about exactly this)."""
    import logging

    from sparktrain.features.materialize import _warn_lookalike_categories

    features = [{"name": "color", "source": "color", "type": "categorical",
                 "vocabulary": ["blue  ", "Red", "red", "blue", "red ", "green"]},
                {"name": "city", "source": "city", "type": "categorical", "vocabulary": ["lyon", "nice"]}]
    with caplog.at_level(logging.WARNING, logger="sparktrain.features.materialize"):
        _warn_lookalike_categories(features)
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "feature 'color' (column 'color') has categories that differ only in spaces or letter case: " \
           "'blue  ' and 'blue'; 'Red' and 'red' and 'red '" in text
