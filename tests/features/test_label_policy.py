"""One label policy and one split expression for preprocess and ``fit(df)`` (real Spark, real torch).

A string label passed to ``fit(df)`` is indexed as preprocess indexes it and
predicted back as its strings; a label neither path can train on is refused
by both with the same error; the split of a DataFrame is the seeded
expression preprocess uses.
"""

from __future__ import annotations

import pytest
from sparktrain.config import parse_config
from sparktrain.errors import DataError, SchemaError

ROWS = 300
CLASSES = ["high", "low", "mid"]  # sorted by text, as preprocess orders string classes


def _est(tmp_path, **kw):
    from sparktrain.train.estimator import TorchEstimator

    params = dict(numWorkers=1, epochs=1, batchSize=32, learningRate=0.05, hiddenUnits=[16],
                  store=str(tmp_path / "store"))
    params.update(kw)
    est = TorchEstimator(**params)
    est.show_progress = False
    return est


@pytest.fixture(scope="module")
def graded(spark):
    """``x`` in [0, 1) and its grade: low below 1/3, mid below 2/3, high above (three string classes)."""
    return spark.sql(f"SELECT id, CAST(id AS DOUBLE) / {ROWS} AS x, CASE WHEN id * 3 < {ROWS} THEN 'low' "
                     f"WHEN id * 3 < {2 * ROWS} THEN 'mid' ELSE 'high' END AS grade FROM range({ROWS})").cache()


def test_a_string_label_is_indexed_and_its_classes_recorded(spark, graded, tmp_path):
    plan = _est(tmp_path, labelCol="grade", excludeCols=["id"]).plan(graded)
    assert plan.inputs.task == "multiclass" and plan.inputs.num_classes == 3
    assert plan.inputs.classes == tuple(CLASSES) and plan.inputs.prediction_type == "string"
    assert plan.inputs.columns == ["x"]
    written = spark.read.parquet(plan.train_path)
    assert dict(written.dtypes)["grade"] == "int"  # the class index, as preprocess writes it
    index = {c: i for i, c in enumerate(CLASSES)}
    got = {r["id"]: r["grade"] for r in written.select("id", "grade").collect()}
    expected = {r["id"]: index[r["grade"]] for r in graded.select("id", "grade").collect()}
    assert got and all(v == expected[k] for k, v in got.items())


@pytest.mark.torch
def test_fit_on_a_string_label_predicts_the_strings(spark, graded, tmp_path):
    from pyspark.sql import functions as F

    model = _est(tmp_path, labelCol="grade", epochs=4, excludeCols=["id"], validationFraction=0.0).fit(graded)
    assert model.labels == CLASSES and model.inputs.task == "multiclass"
    scored = model.transform(graded)
    assert dict(scored.dtypes)["prediction"] == "string"
    assert {r[0] for r in scored.select("prediction").distinct().collect()} <= set(CLASSES)
    accuracy = scored.select(F.avg((F.col("prediction") == F.col("grade")).cast("double"))).first()[0]
    assert accuracy > 0.85, accuracy  # three ordered bands of one feature (0.96-0.97 for seeds 0-2)
    row = scored.where("id = 0").select("prediction", "probability").first()
    assert len(row.probability) == 3 and CLASSES[max(range(3), key=lambda i: row.probability[i])] == row.prediction


def test_a_boolean_label_is_binary_and_kept(spark, tmp_path):
    df = spark.sql(f"SELECT CAST(id AS DOUBLE) / {ROWS} AS x, id % 2 = 0 AS flag FROM range({ROWS})")
    plan = _est(tmp_path, labelCol="flag").plan(df)
    assert plan.inputs.task == "binary" and plan.inputs.classes == ()
    assert dict(spark.read.parquet(plan.train_path).dtypes)["flag"] == "boolean"


# ---------------------------------------------------------------- the same refusal on both paths


def _preprocess_error(spark, df, tmp_path, label):
    from sparktrain.features.materialize import materialize

    cfg = parse_config({"name": "labels", "data": {"source": "unused.parquet", "label": label, "key": "id"},
                        "features": [{"name": "x", "type": "numeric"}],
                        "output": {"path": str(tmp_path / "ds"), "row_group_rows": 4096}})
    with pytest.raises((DataError, SchemaError)) as info:
        materialize(spark, cfg, df, stage_input=False)
    return info.value


@pytest.mark.parametrize("sql, error, words", [
    ("IF(id = 5, CAST('NaN' AS DOUBLE), x)", DataError, "(double, a regression label) has 1 NaN and 0 infinite "
                                                        "values (value: NaN)"),
    ("CAST(NULL AS DOUBLE)", DataError, f"is null in all {ROWS:,} rows"),
    ("'same'", DataError, "has a single class, 'same'"),
    # all 1.0: Spark ML's 0.0/1.0 convention made it 'binary' with one class (train AUC NaN), silently
    ("IF(id = 3, NULL, CAST(1 AS DOUBLE))", DataError, f"holds one value, 1.0, in all {ROWS - 1:,} labelled rows"),
    ("map('k', id)", SchemaError, "has type map<string,bigint>, which a model cannot learn"),
    # probe M: classes 2^60 and 2^60+1 were predicted back as the same double
    ("CAST(1152921504606846976 + id % 2 AS BIGINT)", DataError, "has class values beyond 2^53 (e.g. "
                                                                "1152921504606846976)"),
], ids=["nan", "all-null", "one-class", "one-float-value", "map", "huge-ids"])
def test_a_bad_label_gets_the_same_error_on_both_paths(spark, tmp_path, sql, error, words):
    df = spark.sql(f"SELECT id, CAST(id AS DOUBLE) / {ROWS} AS x, {sql} AS y FROM range({ROWS})")
    from_preprocess = _preprocess_error(spark, df, tmp_path, "y")
    with pytest.raises(error) as info:
        _est(tmp_path, labelCol="y").fit(df)
    assert type(from_preprocess) is type(info.value) is error
    assert str(info.value) == str(from_preprocess)
    assert str(info.value).startswith("label column 'y' (data.label / labelCol)") and words in str(info.value)
    assert not (tmp_path / "store").exists() and not (tmp_path / "ds").exists()  # refused before any write


# ---------------------------------------------------------------- one split expression


def _validation_ids(spark, plan):
    return {r[0] for r in spark.read.parquet(plan.val_path).select("id").collect()}


def test_the_split_of_a_dataframe_is_seeded_and_deterministic(spark, tmp_path):
    from pyspark.sql import functions as F
    from sparktrain.config import SplitConfig
    from sparktrain.features.materialize import split_expression
    from sparktrain.features.split import split_case

    df = spark.sql(f"SELECT id, CAST(id AS DOUBLE) / {ROWS} AS x, id % 2 AS y FROM range({ROWS})")
    est = _est(tmp_path, labelCol="y", validationFraction=0.3, excludeCols=["id"])
    first = _validation_ids(spark, est.copy({est.seed: 1}).plan(df))
    again = _validation_ids(spark, est.copy({est.seed: 1}).plan(df.repartition(3)))
    other = _validation_ids(spark, est.copy({est.seed: 2}).plan(df))
    assert first == again  # the same rows and seed: the same split, whatever the partitioning
    assert first != other and abs(len(other) / ROWS - 0.3) < 0.1
    assert abs(len(first) / ROWS - 0.3) < 0.1
    # it is the expression preprocess uses (keyless: a hash of every column)
    expr = split_case(1, df.columns, [("train", 0.7), ("validation", 0.3)])
    assert {r[0] for r in df.where(F.expr(expr) == "validation").select("id").collect()} == first
    keyless = split_expression(None, SplitConfig(train=0.7, validation=0.2, test=0.1, seed=1), df.columns)
    assert keyless == split_case(1, df.columns, [("train", 0.7), ("validation", 0.2), ("test", 0.1)])


# ---------------------------------------------------------------- an integer label with many values


@pytest.mark.parametrize("task, warns", [(None, True), ("multiclass", False), ("regression", False)])
def test_an_integer_label_with_many_classes_warns_under_auto(spark, task, warns):
    """A rounded measurement as an int is a 70-way classifier under auto: the user is told how to get a regression."""
    import warnings

    from sparktrain.features.label import decide_label

    df = spark.sql(f"SELECT CAST(round(id * 7 / 30) AS INT) - 20 AS y FROM range({ROWS})")  # -20 .. 50
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        decision = decide_label(df, "y", "int", task)
    texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    assert decision.encoding.task == (task or "multiclass")
    if warns:
        assert texts == ["integer label column 'y' has 71 classes (values -20 to 50), so task auto trains a 71-way "
                         "classifier. If it is a quantity (a count, an amount, a rounded measurement), set "
                         "task='regression' (config: train.task: regression); set task='multiclass' to keep the "
                         "classes and silence this warning"]
    else:
        assert texts == []


def test_a_few_integer_classes_and_parquet_labels_warn_only_when_many(spark, tmp_path):
    import warnings

    from sparktrain.features.label import decide_label
    from sparktrain.train.inputs import infer_inputs

    few = spark.sql(f"SELECT CAST(id % 5 AS INT) AS y FROM range({ROWS})")
    raw = str(tmp_path / "raw")  # any Parquet, no features.json: the estimator's own rule (classes 0..max)
    spark.sql(f"SELECT CAST(id AS DOUBLE) AS x, CAST(id % 40 AS INT) AS y FROM range({ROWS})").write.parquet(raw)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert decide_label(few, "y", "int").encoding.task == "multiclass"
        spec = infer_inputs(raw, "y")
    texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    assert (spec.task, spec.num_classes) == ("multiclass", 40)
    assert texts == [t for t in texts if "'y' has 40 classes (values 0 to 39)" in t] and len(texts) == 1


# ---------------------------------------------------------------- a float label of class indices


@pytest.mark.parametrize("expr, task, warns", [
    ("CAST(id % 3 AS DOUBLE)", None, True),  # 0.0, 1.0, 2.0: StringIndexer's output without its metadata
    ("CAST(id % 3 AS DOUBLE)", "regression", False),  # the user said so
    ("CAST(id % 3 AS DOUBLE) + 0.5", None, False),  # fractional: a measurement
    ("CAST(id % 3 AS DOUBLE) + 1", None, False),  # 1..3: not indices from 0
    ("CAST(id % 40 AS DOUBLE)", None, False),  # 40 values: more like a quantity
])
def test_a_float_label_of_whole_numbers_from_0_warns_that_auto_trains_a_regression(spark, expr, task, warns):
    """Probe D: a StringIndexer output (double 0..K-1) trained as a regression under auto with no word on it."""
    import warnings

    from sparktrain.features.label import decide_label

    df = spark.sql(f"SELECT {expr} AS y FROM range({ROWS})")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        decision = decide_label(df, "y", "double", task)
    texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    assert decision.encoding.task == "regression"
    if warns:
        assert texts == ["float label column 'y' holds only the whole numbers 0 to 2, so task auto trains a "
                         "regression on them. If they are class indices (a StringIndexer output, as Spark ML "
                         "classifiers read such a column), set task='multiclass' (config: train.task: multiclass); "
                         "set task='regression' to keep the regression and silence this warning"]
    else:
        assert texts == []


@pytest.mark.parametrize("expr, warns", [
    ("IF(id % 2 = 0, '>50K', '<=50K') || IF(id % 10 = 1, ' ', '')",
     "'<=50K' (200 rows) and '<=50K ' (50 rows); each is a class of its own, so the model learns 3 classes where "
     "there may be 2"),
    ("IF(id % 2 = 0, 'Yes', IF(id % 4 = 1, 'yes', 'no'))", "'Yes' (250 rows) and 'yes' (125 rows)"),
    ("IF(id % 2 = 0, 'a', 'b')", None),
])
def test_text_classes_that_differ_only_in_spaces_or_case_are_warned_about(spark, expr, warns):
    """Probe F: '>50K' and '>50K ' (a CSV export's padding) were two classes each, silently: a binary label became
    a 4-class one.  They still are (a label may be case-sensitive), but the warning names them and the fix."""
    import warnings

    from sparktrain.features.label import decide_label

    df = spark.sql(f"SELECT {expr} AS income FROM range(500)")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        decision = decide_label(df, "income", "string")
    texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    if warns is None:
        assert texts == [] and decision.encoding.task == "binary"
        return
    assert decision.encoding.task == "multiclass" and len(texts) == 1, texts
    assert texts[0].startswith("label column 'income' has classes that differ only in spaces or letter case: ")
    assert warns in texts[0] and "F.trim(F.col('income'))" in texts[0] and "ignoreTrailingWhiteSpace" in texts[0]


def test_a_label_with_spark_ml_nominal_metadata_is_classes_under_auto(spark):
    """StringIndexer's output carries a nominal attribute: fit(df) reads it as Spark ML classifiers do (3 values:
    multiclass; Binarizer's binary attribute: binary); a plain double column is left to the value rule."""
    from pyspark.ml.feature import Binarizer, StringIndexer
    from pyspark.sql import functions as F

    from sparktrain.train.plan import dataframe_label, nominal_classes

    df = spark.range(ROWS).select(F.element_at(F.array(*[F.lit(c) for c in CLASSES]),
                                               (F.col("id") % 3 + 1).cast("int")).alias("grade"),
                                  (F.col("id") / ROWS).alias("score"))
    indexed = StringIndexer(inputCol="grade", outputCol="grade_idx").fit(df).transform(df)
    indexed = Binarizer(threshold=0.5, inputCol="score", outputCol="passed").transform(indexed)
    assert nominal_classes(indexed, "grade_idx") == 3 and nominal_classes(indexed, "passed") == 2
    assert nominal_classes(indexed, "score") is None
    keep = StringIndexer(inputCol="grade", outputCol="k", handleInvalid="keep").fit(df).transform(df)
    assert nominal_classes(keep, "k") == 3  # its extra index for unseen values is no class of the data
    multi = dataframe_label(indexed, "grade_idx")
    assert multi.encoding.task == "multiclass" and multi.encoding.entry["vocabulary"] == [0.0, 1.0, 2.0]
    assert dataframe_label(indexed, "passed").encoding.task == "binary"
    assert dataframe_label(indexed, "grade_idx", task="regression").encoding.task == "regression"  # the user's say
    plain = indexed.select((F.col("grade_idx") + 0).alias("y"))  # arithmetic drops the metadata: the value rule
    assert nominal_classes(plain, "y") is None
    with pytest.warns(UserWarning, match="'y' holds only the whole numbers 0 to 2, so task auto trains a regression"):
        assert dataframe_label(plain, "y").encoding.task == "regression"
