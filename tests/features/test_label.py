"""Labels of every common type through materialize: features.json's label entry, the written values, each refusal."""

from __future__ import annotations

import json
import logging
import math
import re

from pathlib import Path

import pytest
from sparktrain.config import parse_config
from sparktrain.errors import ConfigError, DataError, SchemaError

ROWS = 240
FEATURES = [{"name": "x", "type": "numeric"}, {"name": "c", "type": "categorical"}]
# label column -> SQL over id (0..ROWS-1)
LABELS = {
    "lab_bool": "id % 3 = 0",
    "lab_int01": "CAST(id % 2 AS INT)",
    "lab_int3": "CAST(id % 3 AS BIGINT)",
    "lab_sparse": "CAST(3 + 2 * (id % 3) AS INT)",          # 3, 5, 7
    "lab_str2": "IF(id % 4 = 0, 'yes', 'no')",
    "lab_str3": "element_at(array('mid', 'low', 'high'), CAST(id % 3 + 1 AS INT))",
    "lab_float": "CAST(id AS DOUBLE) / 4",
}


@pytest.fixture(scope="module")
def raw(spark):
    cols = ", ".join(f"{sql} AS {name}" for name, sql in LABELS.items())
    return spark.sql(f"SELECT id, CAST(id % 7 AS DOUBLE) AS x, element_at(array('a', 'b', 'c'), CAST(id % 3 + 1 AS "
                     f"INT)) AS c, {cols} FROM range({ROWS})").cache()


def _cfg(path, label, key="id", train=None, **data):
    raw = {"name": "labels", "data": {"source": "unused.parquet", "label": label, "key": key, **data},
           "features": FEATURES, "output": {"path": str(path), "row_group_rows": 4096}}
    if train is not None:
        raw["train"] = train
    return parse_config(raw)


def _written(spark, result, label):
    from functools import reduce

    frames = [spark.read.parquet(result.split_path(s)) for s in ("train", "validation", "test")]
    return reduce(lambda a, b: a.unionByName(b), frames).select("id", label)


# (label, train section, task, dtype, vocabulary, num_classes, class_counts, id -> written value)
CASES = [
    ("lab_bool", None, "binary", "float32", None, 2, [160, 80], lambda i: 1.0 if i % 3 == 0 else 0.0),
    ("lab_int01", None, "binary", "int32", None, 2, [120, 120], lambda i: i % 2),
    ("lab_int3", None, "multiclass", "int32", None, 3, [80, 80, 80], lambda i: i % 3),
    ("lab_sparse", None, "multiclass", "int32", [3, 5, 7], 3, [80, 80, 80], lambda i: i % 3),
    ("lab_str2", None, "binary", "int32", ["no", "yes"], 2, [180, 60], lambda i: 1 if i % 4 == 0 else 0),
    ("lab_str3", None, "multiclass", "int32", ["high", "low", "mid"], 3, [80, 80, 80],
     lambda i: {0: 2, 1: 1, 2: 0}[i % 3]),
    ("lab_float", None, "regression", "float32", None, None, None, lambda i: i / 4),
    ("lab_int3", {"task": "regression"}, "regression", "float32", None, None, None, lambda i: float(i % 3)),
]


@pytest.mark.parametrize("label, train, task, dtype, vocabulary, num_classes, counts, expected", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_label_types_are_encoded_and_described(spark, raw, tmp_path, label, train, task, dtype, vocabulary,
                                               num_classes, counts, expected):
    from sparktrain.features.materialize import materialize

    result = materialize(spark, _cfg(tmp_path / "ds", label, train=train), raw, stage_input=False)
    entry = json.loads(Path(result.features_json).read_text())["label"]
    assert entry["column"] == label and entry["task"] == task and entry["dtype"] == dtype
    assert entry["vocabulary"] == vocabulary and entry["num_classes"] == num_classes
    assert entry["class_counts"] == counts
    assert result.features["task"] == task
    if task == "regression":
        assert entry["stats"]["min"] == 0.0 and entry["stats"]["max"] == pytest.approx(expected(ROWS - 1))
    rows = _written(spark, result, label).collect()
    assert len(rows) == ROWS
    assert all(r[label] == pytest.approx(expected(r["id"])) for r in rows)
    written_type = dict(_written(spark, result, label).dtypes)[label]
    assert written_type == {"float32": "float", "int32": "int"}[dtype]


def test_the_saved_pipeline_and_transform_local_index_a_string_label_alike(spark, raw, tmp_path):
    import pyarrow as pa
    from pyspark.ml import PipelineModel
    from sparktrain.serve.local import transform_local
    from sparktrain.features.materialize import materialize

    result = materialize(spark, _cfg(tmp_path / "ds", "lab_str3"), raw, stage_input=False)
    model = PipelineModel.load(result.pipeline_model)
    new = spark.createDataFrame([(1, 2.0, "a", "low"), (2, 3.0, "b", "unseen"), (3, 1.0, "c", None)],
                                "id long, x double, c string, lab_str3 string")
    got = [r["lab_str3"] for r in model.transform(new).orderBy("id").collect()]
    assert got == [1, None, None]  # a class the data never had is no class: null
    local = transform_local(pa.table({"id": [1, 2, 3], "x": [2.0, 3.0, 1.0], "c": ["a", "b", "c"],
                                      "lab_str3": ["low", "unseen", None]}), result.features)
    assert local["lab_str3"].tolist() == [1, -1, -1]
    scored = model.transform(new.drop("lab_str3"))  # scoring rows without a label
    assert "lab_str3" not in scored.columns


def test_a_string_label_in_a_hand_built_pipeline_is_indexed_and_round_trips(spark, raw, tmp_path):
    from pyspark.ml import PipelineModel
    from sparktrain.features.compile import compile_pipeline
    from sparktrain.features.spec import parse_features

    types = {f.name: f.dataType.simpleString() for f in raw.schema.fields}
    pipe = compile_pipeline(parse_features(FEATURES), key="id", label="lab_str2", types=types)
    model = pipe.fit(raw)
    model.write().save(str(tmp_path / "m"))
    again = PipelineModel.load(str(tmp_path / "m"))
    rows = again.transform(raw).select("id", "lab_str2").collect()
    assert all(r["lab_str2"] == (1 if r["id"] % 4 == 0 else 0) for r in rows)


# ---------------------------------------------------------------- refusals: the column, the value, the fix


def _refused(spark, tmp_path, df, cfg, error, *words):
    from sparktrain.features.materialize import materialize

    with pytest.raises(error) as info:
        materialize(spark, cfg, df)
    for w in words:
        assert w in str(info.value), str(info.value)
    assert not (tmp_path / "ds").exists()
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_null_labels_are_dropped_and_counted_or_refused(spark, raw, tmp_path, caplog):
    from sparktrain.features.materialize import materialize

    df = raw.selectExpr("*", "IF(id % 10 = 0, NULL, lab_str3) AS lab_null")
    _refused(spark, tmp_path, df, _cfg(tmp_path / "ds", "lab_null", drop_null_labels=False), DataError,
             "label column 'lab_null' (data.label / labelCol) is null in 24 of 240 rows (value: null)",
             "data.drop_null_labels: true")
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        result = materialize(spark, _cfg(tmp_path / "ds", "lab_null"), df)
    assert sum(result.row_counts.values()) == ROWS - 24
    assert result.features["dataset"]["null_labels_dropped"] == 24
    # probe M: 10% (over 5%) is a warning that names the usual misreading: a CSV's quoted line breaks
    assert "24 of 240 rows (10%) have a null label and are dropped" in caplog.text
    assert "multiLine: true" in caplog.text


def test_a_single_class_is_refused(spark, raw, tmp_path):
    df = raw.selectExpr("*", "'same' AS one")
    _refused(spark, tmp_path, df, _cfg(tmp_path / "ds", "one"), DataError,
             "label column 'one' (data.label / labelCol) has a single class, 'same', in all 240 labelled rows",
             "nothing to learn", "Check data.label")


def test_more_classes_than_max_classes_are_refused(spark, tmp_path):
    df = spark.sql("SELECT id, CAST(id % 7 AS DOUBLE) AS x, 'a' AS c, CAST(id AS STRING) AS many FROM range(1001)")
    _refused(spark, tmp_path, df, _cfg(tmp_path / "ds", "many"), DataError,
             "label column 'many' (data.label / labelCol) has more than 1,000 classes", "train.max_classes=1000",
             "raise train.max_classes")


@pytest.mark.parametrize("value, words", [("CAST('NaN' AS DOUBLE)", "1 NaN and 0 infinite values (value: NaN)"),
                                          ("CAST('-Infinity' AS DOUBLE)", "0 NaN and 1 infinite values")])
def test_nan_or_inf_in_a_regression_label_is_refused(spark, raw, tmp_path, value, words):
    df = raw.selectExpr("*", f"IF(id = 5, {value}, lab_float) AS y")
    _refused(spark, tmp_path, df, _cfg(tmp_path / "ds", "y"), DataError,
             f"label column 'y' (data.label / labelCol) (double, a regression label) has {words}", "must be finite",
             "WHERE NOT isnan(y)")


@pytest.mark.parametrize("sql, type_text", [("named_struct('a', id)", "struct<a:bigint>"),
                                            ("array(id)", "array<bigint>"), ("map('k', id)", "map<string,bigint>"),
                                            ("CAST(CAST(id AS STRING) AS BINARY)", "binary")])
def test_a_label_type_no_model_learns_is_refused_before_any_job(spark, raw, tmp_path, sql, type_text):
    df = raw.selectExpr("*", f"{sql} AS odd")
    _refused(spark, tmp_path, df, _cfg(tmp_path / "ds", "odd"), SchemaError,
             f"label column 'odd' (data.label / labelCol) has type {type_text}, which a model cannot learn",
             "Use a boolean, integer or string column (classes) or a float column (regression)")


def test_binary_task_on_three_classes_is_a_config_error(spark, raw, tmp_path):
    _refused(spark, tmp_path, raw, _cfg(tmp_path / "ds", "lab_str3", train={"task": "binary"}), ConfigError,
             "config key 'train.task' = 'binary'", "has 3 classes; use multiclass or auto")


# ---------------------------------------------------------------- keyless split


def test_keyless_split_is_deterministic_and_logged(spark, raw, tmp_path, caplog):
    from sparktrain.features.materialize import materialize

    df = spark.sql("SELECT CAST(id % 97 AS DOUBLE) AS x, element_at(array('a', 'b', 'c'), CAST(id % 3 + 1 AS INT)) "
                   "AS c, CAST(id AS DOUBLE) AS y FROM range(4000)")
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        first = materialize(spark, _cfg(tmp_path / "a", "y", key=None), df)
        assert caplog.text.count("no data.key: a row's split is a hash of its columns x, c, y") == 1
    second = materialize(spark, _cfg(tmp_path / "b", "y", key=None), df.repartition(5), stage_input=False)
    assert first.features["key"] is None and first.features["dataset"]["split"]["columns"] == ["x", "c", "y"]
    assert dict(first.row_counts) == dict(second.row_counts)
    for split, frac in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
        a = spark.read.parquet(first.split_path(split)).select("y")
        b = spark.read.parquet(second.split_path(split)).select("y")
        assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0, split
        assert abs(first.row_counts[split] / 4000 - frac) < 0.03, split
    assert "y" in spark.read.parquet(first.split_path("train")).columns


# ---------------------------------------------------------------- profile


def test_profile_counts_string_classes_without_casting_them(spark, raw):
    from sparktrain.profile import profile

    df = raw.selectExpr("*", "IF(id % 10 = 0, NULL, lab_str3) AS s")
    p = profile(df, label="s")
    assert p.rows == ROWS and p.nulls["s"] == 24 and p.label_dtype == "string"
    assert p.classes == [("high", 72), ("low", 72), ("mid", 72)]
    assert p.label_rate is None
    text = p.format()
    assert "label 's' (string): 3 classes" in text and "columns: 11 (1 with nulls)" in text
    assert re.search(r"^  high +72 \( 33\.3%\)$", text, re.MULTILINE)


def test_profile_of_bool_and_int_labels_gives_classes_and_rate(spark, raw):
    from sparktrain.profile import profile

    p = profile(raw, label="lab_bool")
    assert p.classes == [("false", 160), ("true", 80)] and p.label_rate == pytest.approx(1 / 3)
    assert "label 'lab_bool' rate: 0.3333" in p.format()
    p = profile(raw, label="lab_sparse")
    assert p.classes == [("3", 80), ("5", 80), ("7", 80)] and p.label_rate is None


def test_profile_of_a_float_label_gives_moments(spark, raw):
    from sparktrain.profile import profile

    df = raw.selectExpr("*", "IF(id = 0, CAST('NaN' AS DOUBLE), lab_float) AS y")
    p = profile(df, label="y")
    values = [i / 4 for i in range(1, ROWS)]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert p.classes is None and p.label_rate is None
    assert p.label_stats["mean"] == pytest.approx(mean) and p.label_stats["std"] == pytest.approx(std)
    assert (p.label_stats["min"], p.label_stats["max"], p.label_stats["nan"]) == (0.25, (ROWS - 1) / 4, 1)
    assert "label 'y' (double): mean " in p.format() and "(1 NaN, 0 infinite)" in p.format()
