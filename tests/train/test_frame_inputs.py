"""What ``fit(df)`` does with each column: used (a vector or array ``featuresCol`` too) or refused by name.

Real Spark, real torch and Keras.  The refusals come before any Spark job and
write nothing; the float blocks' lengths and values are checked in the one
aggregation job a DataFrame fit runs anyway, also before anything is written.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from sparktrain.errors import ColumnClashError, DataError, MissingColumnError, SchemaError

ROWS = 1600


def _est(tmp_path, cls=None, **kw):
    from sparktrain.train.estimator import TorchEstimator

    params = dict(numWorkers=1, epochs=4, batchSize=64, learningRate=0.02, hiddenUnits=[32],
                  store=str(tmp_path / "store"))
    params.update(kw)
    est = (cls or TorchEstimator)(**params)
    est.show_progress = False
    return est


@pytest.fixture(scope="module")
def mixed(spark):
    """``features`` (a Spark ML vector, dense and sparse rows), a boolean ``flag``, a decimal ``amount``.

    ``label`` = (a + b > 0) XOR flag: no column alone predicts it; ``amount`` is noise.
    """
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df = spark.range(ROWS).select(
        F.col("id"), (F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b"),
        (F.rand(3) > 0.5).alias("flag"), (F.rand(4) * 10).cast("decimal(10,4)").alias("amount"))
    df = df.withColumn("label", ((F.col("a") + F.col("b") > 0) != F.col("flag")).cast("double"))
    df = df.withColumn("b", F.when(F.col("id") % 5 == 0, F.lit(0.0)).otherwise(F.col("b")))  # sparse rows
    return VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(df).drop("a", "b").cache()


def _jobs_during(spark, fn):
    """Run ``fn``; the ids of the Spark jobs it started."""
    sc = spark.sparkContext
    sc.setJobGroup("sparktrain-test-refusal", "refusal")
    try:
        fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return list(sc.statusTracker().getJobIdsForGroup("sparktrain-test-refusal"))


def test_unusable_columns_are_refused_in_one_error_before_any_job(spark, mixed, tmp_path):
    from pyspark.sql import functions as F

    df = mixed.select("*", F.lit("x").alias("name"), F.current_timestamp().alias("seen_at"),
                      F.create_map(F.lit("k"), F.col("id")).alias("attrs"),
                      F.struct(F.col("id").alias("n")).alias("nested"),
                      F.array(F.lit("a"), F.lit("b")).alias("tags"))
    errors = []

    def fit():
        with pytest.raises(SchemaError) as info:
            _est(tmp_path, excludeCols=["id"]).fit(df)
        errors.append(str(info.value))

    assert _jobs_during(spark, fit) == []
    text = errors[0]
    assert text.startswith("fit() cannot use 5 column(s) of the DataFrame, and drops none silently")
    for part in ("'name' (string: text", "'seen_at' (timestamp: a point in time", "'attrs' (map<string,bigint>",
                 "'nested' (struct<n:bigint>", "'tags' (array<string>: only arrays of numbers"):
        assert part in text, text
    assert "excludeCols=['name', 'seen_at', 'attrs', 'nested', 'tags']" in text and "featuresCol" in text
    assert not (tmp_path / "store").exists()

    # the same columns excluded: every other column is an input, converted in Spark
    plan = _est(tmp_path, excludeCols=["id", "name", "seen_at", "attrs", "nested", "tags"]).plan(df)
    assert plan.inputs.numeric == ("flag", "amount") and plan.inputs.vectors == (("features", 2),)
    assert plan.inputs.categorical == () and plan.inputs.numeric_width == 4
    written = dict(spark.read.parquet(plan.train_path).dtypes)
    assert (written["features"], written["flag"], written["amount"]) == ("array<float>", "float", "double")
    assert "attrs" not in written and written["id"] == "bigint"  # excluded columns kept as they are (no map)


def test_a_label_named_as_an_input_or_excluded_is_refused_as_the_label(spark, mixed, tmp_path):
    """Probe F: a string label in numericCols was told to 'encode it first (StringIndexer)', as an input; the label
    in excludeCols was taken silently."""
    from pyspark.sql import functions as F

    df = mixed.withColumn("grade", F.when(F.col("label") > 0, "high").otherwise("low"))
    for kw in ({"numericCols": ["grade"]}, {"categoricalCols": ["grade"]}, {"excludeCols": ["grade", "id"]}):
        with pytest.raises(SchemaError) as info:
            _est(tmp_path, labelCol="grade", **kw).plan(df.drop("label"))
        param = next(iter(kw))
        assert str(info.value).startswith("column 'grade' is the label (labelCol) and ")
        assert param in str(info.value) and "StringIndexer" not in str(info.value), str(info.value)
    assert not (tmp_path / "store").exists()


def test_no_trainable_row_under_skip_names_the_inputs_that_left_every_row_out(spark, mixed, tmp_path):
    """Probe F: handleInvalid='skip' with an all-null input: 'no row can be trained on' did not say which."""
    from pyspark.sql import functions as F

    df = mixed.withColumn("empty", F.lit(None).cast("double")).withColumn(
        "half", F.when(F.col("id") % 2 == 0, F.lit(None)).otherwise(F.lit(1.0)))
    with pytest.raises(DataError) as info:
        _est(tmp_path, handleInvalid="skip", excludeCols=["id"]).plan(df)
    text = str(info.value)
    assert f"The inputs with the most: 'empty' ({ROWS:,} of {ROWS:,} rows), 'half' ({ROWS // 2:,} of {ROWS:,} " \
        "rows)." in text, text
    assert text.endswith("or leave out the input(s) without a value in any row (excludeCols=['empty'])"), text


def test_inputs_far_from_unit_scale_are_warned_about_for_the_default_network(spark, mixed, tmp_path):
    """Probe F: dollar-scale columns went into the default network raw, and the fit ended worse than predicting the
    most common class, without a word.  The fingerprint's job measures each input's root mean square (a block's
    over its elements); the default network's fit warns by name; a network of the user's own does not."""
    import warnings

    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df = mixed.withColumn("dollars", (F.rand(7) * 5000).cast("decimal(10,2)"))
    df = VectorAssembler(inputCols=["dollars", "amount"], outputCol="raw").transform(df)

    def warned(est, frame):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            plan = est.plan(frame)
        return plan, [str(w.message) for w in seen if "reach the network unscaled" in str(w.message)]

    plan, texts = warned(_est(tmp_path, excludeCols=["id"], numericCols=["dollars", "amount", "flag"],
                              featuresCol="raw"), df)
    assert len(texts) == 1, texts
    named = texts[0][len("input column(s) "):texts[0].index(" (root mean square)")]
    assert named.startswith("'dollars' (2,") and ", 'raw' (2," in named and "amount" not in named, texts
    assert "StandardScaler(withMean=True, withStd=True)" in texts[0]
    fingerprint = plan.fingerprint["data"]["dataframe"]
    assert "large_inputs" not in fingerprint  # a measurement, not content: a resumed run's data still matches
    _, texts = warned(_est(tmp_path, excludeCols=["id", "dollars", "raw"]), df)
    assert texts == []  # amount (up to 10), flag, features (-1..1)

    est = _est(tmp_path, excludeCols=["id", "raw"])
    est.setModelFactory(lambda inputs, model: None)  # never built: plan() trains nothing
    assert warned(est, df)[1] == []


def test_a_binary_model_worse_than_chance_is_warned_about():
    """Probe F: a 1%-positive label after 3 epochs: val_auc 0.13, every prediction 0, and fit() said nothing."""
    import warnings

    from sparktrain.train.estimator import _warn_unlearned

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _warn_unlearned([{"train_auc": 0.3, "val_auc": 0.45}, {"train_auc": 0.19, "val_auc": 0.13}], "r1", 128, 0.001)
        _warn_unlearned([{"train_auc": 0.61, "val_auc": 0.55}], "r2", 128, 0.001)  # learning: no word
        _warn_unlearned([{"train_loss": 0.5, "val_loss": 0.6}], "r3", 128, 0.001)  # not binary: no AUC
        _warn_unlearned([{"train_auc": 0.31}], "r4", 512, 0.01)  # no validation split: the training AUC
    texts = [str(w.message) for w in seen]
    assert len(texts) == 2, texts
    assert texts[0].startswith("the model of run 'r1' ranks worse than chance after 2 epochs (val_auc 0.130)")
    assert "learningRate (now 0.001)" in texts[0] and "batchSize (now 128)" in texts[0] and "runId='r1'" in texts[0]
    assert texts[1].startswith("the model of run 'r4' ranks worse than chance after 1 epoch (train_auc 0.310)")


@pytest.mark.slow  # ~50 s here: Spark plans the fingerprint's ~1,800 aggregates of 600 columns
def test_a_dataframe_of_600_float_columns_is_planned(spark, tmp_path):
    """Probe H: 600 float columns (no VectorAssembler) failed with a raw java.lang.StackOverflowError: the
    'any input invalid' flag was a chain of 600 ORs, as deep as the column count, which Spark's analyser walks
    recursively.  It is a balanced tree now (depth 10)."""
    from pyspark.sql import functions as F

    cols = [(F.rand(i) * 2 - 1).cast("float").alias(f"c{i}") for i in range(600)]
    df = spark.range(200).select(*cols).withColumn("label", (F.col("c0") + F.col("c599") > 0).cast("double"))
    plan = _est(tmp_path, validationFraction=0.0).plan(df)
    assert plan.inputs.numeric_width == 600 and plan.inputs.numeric[-1] == "c599"
    assert spark.read.parquet(plan.train_path).count() == 200


def test_a_join_s_duplicate_columns_and_an_input_named_like_an_output_are_refused_by_name(spark, mixed, tmp_path):
    """Probe H: duplicate names from a join ended in Spark's raw AMBIGUOUS_REFERENCE; a leftover 'prediction'
    column was trained on as an input, and the model then could not score the DataFrame it was fitted on."""
    from pyspark.sql import functions as F

    from sparktrain.errors import DuplicateColumnError

    joined = mixed.join(mixed.select("id", "flag", "amount"), "id")
    with pytest.raises(DuplicateColumnError) as dup:
        _est(tmp_path).plan(joined)
    assert dup.value.names == ["flag", "amount"]
    assert str(dup.value).startswith("the DataFrame passed to fit() has more than one column named 'flag', "
                                     "'amount' (a join keeps both sides' columns)")
    leftover = mixed.withColumn("prediction", F.rand(1))
    with pytest.raises(SchemaError) as out:
        _est(tmp_path, excludeCols=["id"]).plan(leftover)
    assert str(out.value).startswith("column 'prediction' of the DataFrame passed to fit() would be an input, but "
                                     "the model adds a column of that name (predictionCol)")
    assert "excludeCols=['prediction']" in str(out.value)
    plan = _est(tmp_path, excludeCols=["id"], predictionCol="pred").plan(leftover)  # the other fix
    assert "prediction" in plan.inputs.numeric
    assert not any((tmp_path / "store").glob("*/run.json"))


def test_named_inputs_leave_the_rest_out_and_the_log_says_so(spark, mixed, tmp_path, caplog):
    from pyspark.sql import functions as F

    df = mixed.withColumn("name", F.lit("x"))  # not refused: the inputs are named
    with caplog.at_level(logging.INFO, logger="sparktrain.train.estimator"):
        plan = _est(tmp_path, featuresCol="features", numericCols=["flag"]).plan(df)
    assert plan.inputs.columns == ["flag", "features"] and plan.inputs.vectors == (("features", 2),)
    assert set(plan.unused) == {"id", "amount", "name"}
    from sparktrain.train.frame import describe

    assert describe(plan.inputs, plan.unused) == \
        "numeric [flag]; float blocks [features (2)]; not used: [id, amount, name]"
    from dataclasses import replace  # a preprocessed dataset's text and set features are bags of ids: named too
    with_bags = replace(plan.inputs, bags=(("note", 16, 1000, "mean"), ("tags", 4, 30, "sum")))
    assert describe(with_bags) == ("numeric [flag]; float blocks [features (2)]; bags of ids [note (16 ids of "
                                   "1000, mean), tags (4 ids of 30, sum)]")


def test_bad_float_blocks_are_refused_naming_the_column(spark, mixed, tmp_path):
    from pyspark.sql import functions as F

    est = _est(tmp_path, excludeCols=["id"])
    with pytest.raises(MissingColumnError, match=r"'vec'.*featuresCol"):
        est.copy({est.featuresCol: "vec"}).fit(mixed)
    tagged = mixed.withColumn("tags", F.array(F.lit("a")))
    with pytest.raises(SchemaError, match=r"featuresCol 'tags' has type array<string>; it must be a Spark ML vector"):
        est.copy({est.featuresCol: "tags"}).fit(tagged)
    ragged = mixed.withColumn("arr", F.expr("IF(id % 3 = 0, array(1.0, 2.0, 3.0), array(1.0, 2.0))"))
    with pytest.raises(DataError, match=r"column 'arr' holds rows of different lengths \(2, 3\)"):
        est.fit(ragged)
    with_nan = mixed.withColumn("arr", F.expr("IF(id = 7, array(CAST('NaN' AS DOUBLE), 1.0), array(0.5, 1.0))"))
    with pytest.raises(DataError, match=r"column 'arr' has NaN, infinite or null values in 1 of 1,600 row\(s\)"):
        est.fit(with_nan)
    null_element = mixed.withColumn("arr", F.expr("IF(id = 9, array(CAST(NULL AS DOUBLE), 1.0), array(0.5, 1.0))"))
    with pytest.raises(DataError, match=r"column 'arr' has NaN, infinite or null values in 1 of 1,600 row\(s\)") \
            as info:
        est.fit(null_element)
    assert "VectorAssembler(handleInvalid='skip')), or set handleInvalid='skip' on the estimator (those rows are " \
           "left out), or leave it out with excludeCols=['arr']" in str(info.value)
    with_null = mixed.withColumn("arr", F.expr("IF(id = 7, NULL, array(0.5, 1.0))"))
    with pytest.raises(DataError, match=r"column 'arr' is null in 1 of 1,600 row\(s\)") as info:
        est.fit(with_null)
    assert "or set handleInvalid='skip' on the estimator (those rows are left out)" in str(info.value)  # probe D
    store = tmp_path / "store"
    assert not store.exists() or not any(store.iterdir())  # nothing written for any of them


def test_a_parquet_dataset_follows_the_same_rules(spark, mixed, tmp_path):
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path / "ds"
    write_parquet(mixed.select(vector_to_array("features", "float32").alias("features"), "flag", "label",
                               F.lit("x").alias("name")), str(root / "train"))
    with pytest.raises(SchemaError, match=r"cannot use 1 column\(s\) of the training data at .*'name' \(string\)"):
        _est(tmp_path).plan(str(root))
    plan = _est(tmp_path, excludeCols=["name"]).plan(str(root))
    assert plan.inputs.vectors == (("features", 2),) and plan.inputs.numeric == ("flag",)
    # a Spark ML vector as Spark writes it (a struct of type, size, indices, values), sparse rows too
    write_parquet(mixed.select("features", "label"), str(tmp_path / "vec" / "train"))
    plan = _est(tmp_path).plan(str(tmp_path / "vec"))
    assert plan.inputs.vectors == (("features", 2),) and plan.inputs.columns == ["features"]


@pytest.fixture(scope="module")
def torch_model(spark, mixed, tmp_path_factory):
    """Torch on the vector + boolean + decimal columns, inferred (``id`` excluded); the fit's log records."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, logger = Keep(level=logging.INFO), logging.getLogger("sparktrain.train.estimator")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        model = _est(tmp_path_factory.mktemp("vec_torch"), numWorkers=2, excludeCols=["id"]).fit(mixed)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return model, records


@pytest.mark.torch
def test_a_vector_column_trains_and_scores_with_spark_evaluators(spark, mixed, torch_model):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
    from pyspark.sql import functions as F

    model, records = torch_model
    assert model.inputs.vectors == (("features", 2),) and model.inputs.numeric == ("flag", "amount")
    assert any("inputs: numeric [flag, amount]; float blocks [features (2)]" in r for r in records), records
    scored = model.transform(mixed).cache()
    assert dict(scored.dtypes)["rawPrediction"] == "double"
    auc = BinaryClassificationEvaluator().evaluate(scored)  # default columns: label, rawPrediction
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy", probabilityCol="").evaluate(scored)
    assert auc > 0.95 and accuracy > 0.85, (auc, accuracy)  # XOR of the vector's sign and the flag
    no_probability = model.copy({model.probabilityCol: ""}).transform(mixed)  # Spark ML's "": no column
    assert "probability" not in no_probability.columns
    assert MulticlassClassificationEvaluator().evaluate(no_probability) > 0.85  # every default column
    rows = scored.select("probability", "rawPrediction").toPandas()
    np.testing.assert_allclose(rows["probability"], 1 / (1 + np.exp(-rows["rawPrediction"])), atol=1e-9)
    # the same values as a numeric array column score the same
    from pyspark.ml.functions import vector_to_array

    as_array = mixed.withColumn("features", vector_to_array("features"))
    again = model.transform(as_array).select("id", "probability").orderBy("id").toPandas()
    first = scored.select("id", "probability").orderBy("id").toPandas()
    np.testing.assert_allclose(again["probability"], first["probability"], atol=1e-6)
    wide = mixed.withColumn("features", F.array(F.lit(1.0), F.lit(2.0), F.lit(3.0)))
    with pytest.raises(Exception, match=r"column 'features' is a float block of 2 values per row for this model, "
                                        r"but a batch has 3"):
        model.transform(wide).collect()
    with pytest.raises(ColumnClashError, match=r"^the DataFrame to score already has column\(s\) prediction that the "
                                               r"model adds; drop or rename them, or give the model other names "
                                               r"\(model.setPredictionCol"):
        model.transform(scored.select("id", "features", "flag", "amount", "label", "prediction"))


@pytest.mark.torch
def test_the_model_reads_its_column_params_as_spark_ml_models_do(spark, mixed, torch_model, caplog):
    """Probe S: a model's featuresCol/numericCols were shown by getFeaturesCol() but ignored by transform,
    which read the trained names (a stale 'features' column scored every row alike); the output setters the
    clash error advised did not exist; predictionCol '' added a column named ''; a join's duplicate input
    failed inside Spark's Arrow reader."""
    import logging

    from pyspark.sql import functions as F

    from sparktrain.errors import ConfigError, DuplicateColumnError, MissingColumnError

    model, _ = torch_model
    reference = model.transform(mixed).select("id", "probability").orderBy("id").toPandas()["probability"]
    from pyspark.ml.functions import array_to_vector

    renamed = (mixed.withColumnRenamed("features", "scaled").withColumnRenamed("flag", "f2")  # stale copies:
               .withColumn("features", array_to_vector(F.array(F.lit(0.0), F.lit(0.0))))
               .withColumn("flag", F.lit(True)))
    moved = model.copy().setFeaturesCol("scaled").setNumericCols(["f2", "amount"])
    assert moved.getFeaturesCol() == "scaled" and model.getFeaturesCol() != "scaled"  # copy() left model alone
    got = moved.transform(renamed).select("id", "probability").orderBy("id").toPandas()["probability"]
    np.testing.assert_allclose(got, reference, atol=1e-6)
    by_map = model.transform(renamed, {model.featuresCol: "scaled", model.numericCols: ["f2", "amount"]})
    np.testing.assert_allclose(by_map.select("id", "probability").orderBy("id").toPandas()["probability"],
                               reference, atol=1e-6)
    stale = model.transform(renamed).select("id", "probability").orderBy("id").toPandas()["probability"]
    assert np.abs(stale - reference).max() > 0.2  # unset, the trained names are read: the stale columns

    with pytest.raises(ConfigError, match=r"'numericCols' = \['f2'\]: the model was trained on 2 such column\(s\) "
                                          r"\(flag, amount\): give one column per trained input"):
        model.copy().setNumericCols(["f2"]).transform(renamed)
    with pytest.raises(MissingColumnError, match=r"column 'nope' is not in the DataFrame to score \(featuresCol, "
                                                 r"the model's input 'features'\)"):
        model.copy().setFeaturesCol("nope").transform(renamed)

    named = model.copy().setPredictionCol("p2").setProbabilityCol("").setRawPredictionCol("raw2")
    assert named.transform(mixed).columns[-2:] == ["p2", "raw2"]
    no_prediction = model.copy().setPredictionCol("").transform(mixed)
    assert "" not in no_prediction.columns and no_prediction.columns[-2:] == ["probability", "rawPrediction"]
    with caplog.at_level(logging.WARNING, logger="sparktrain.train.model"):
        nothing = model.copy().setPredictionCol("").setProbabilityCol("").setRawPredictionCol("").transform(mixed)
    assert nothing.columns == mixed.columns
    assert any("adds no column: predictionCol, probabilityCol and rawPredictionCol are all empty" in r.getMessage()
               for r in caplog.records)

    joined = mixed.join(mixed.select("id", "flag"), "id")  # both sides keep 'flag', an input
    with pytest.raises(DuplicateColumnError, match=r"the DataFrame to score has more than one column named 'flag'"):
        model.transform(joined)


@pytest.mark.slow  # TensorFlow's import and a Keras fit: ~30 s on a quiet machine
@pytest.mark.tensorflow
def test_keras_takes_an_array_features_col_beside_a_categorical(spark, tmp_path):
    """Keras: featuresCol an ``array<double>`` of 3, plus an integer index named in categoricalCols."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.sql import functions as F

    from sparktrain.train.estimator import KerasEstimator
    from sparktrain.train.model import KerasModel

    df = spark.range(ROWS).select(
        F.array(*[(F.rand(i) * 2 - 1) for i in (5, 6, 7)]).alias("arr"), (F.col("id") % 4).cast("int").alias("k"),
        F.lit("ignored").alias("note"))
    df = df.withColumn("label", ((F.col("arr")[0] > 0) != (F.col("k") >= 2)).cast("int")).cache()
    est = _est(tmp_path, cls=KerasEstimator, featuresCol="arr", categoricalCols=["k"], epochs=5,
               learningRate=0.03)
    model = est.fit(df)
    assert model.inputs.vectors == (("arr", 3),) and model.inputs.categorical == (("k", 4),)
    assert model.getFeaturesCol() == "arr"
    scored = model.transform(df)
    assert BinaryClassificationEvaluator().evaluate(scored) > 0.9
    path = str(tmp_path / "keras_model")
    model.write().overwrite().save(path)
    loaded = KerasModel.load(path)
    assert loaded.inputs == model.inputs
    a = scored.select("probability").toPandas()["probability"]
    b = loaded.transform(df).select("probability").toPandas()["probability"]
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.torch
def test_overwrite_replaces_a_saved_model_and_refuses_a_folder_it_did_not_write(torch_model, tmp_path):
    """model.write().overwrite().save(path): PySpark's handler needs the JVM (probe E: it failed on Spark Connect
    with JVM_ATTRIBUTE_NOT_SUPPORTED) and deletes whatever the folder holds. sparktrain's replaces a saved
    sparktrain model through pyarrow, and refuses, keeping every file, a folder that holds anything else."""
    from sparktrain.errors import OutputNotOwnedError
    from sparktrain.train.model import TorchModel

    model = torch_model[0]
    path = tmp_path / "model"
    model.write().save(str(path))
    assert (path / "metadata").is_dir()
    model.write().overwrite().save(str(path))  # its own earlier save: replaced
    assert TorchModel.load(str(path)).inputs == model.inputs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputNotOwnedError) as info:
        model.write().overwrite().save(str(mine))
    assert f"'{mine}' holds notes.txt, and no sparktrain marker (metadata/ of a saved sparktrain model)" in \
        str(info.value)
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(OutputNotOwnedError, match="a file \\(4 bytes\\), not a folder"):
        model.write().overwrite().save(str(a_file))
    assert a_file.read_text() == "mine"
    model.write().overwrite().save(str(tmp_path / "new"))  # nothing there yet: saved
    assert TorchModel.load(str(tmp_path / "new")).inputs == model.inputs


def test_an_inferred_integer_categorical_is_warned_about_with_the_fix(caplog):
    """Probe S: an int count column became an embedding with only an INFO line; new data above the training
    maximum then failed transform.  A Spark ML user reads an integer as a number: the warning says what
    inference did and how to say otherwise; naming the column either way silences it."""
    from pyspark.sql.types import DoubleType, IntegerType, StructField, StructType

    from sparktrain.train.frame import resolve

    schema = StructType([StructField("visits", IntegerType()), StructField("x", DoubleType()),
                         StructField("label", DoubleType())])
    with caplog.at_level(logging.WARNING, logger="sparktrain.train.frame"):
        inferred = resolve(schema, "label")
        assert inferred.categorical == ("visits",) and inferred.numeric == ("x",)
        said = [r.getMessage() for r in caplog.records]
        assert any("integer column(s) 'visits' are inferred as categorical indices" in m and
                   "name it in numericCols" in m and "categoricalCols=['visits'] says they are indices" in m
                   for m in said), said
        caplog.clear()
        assert resolve(schema, "label", categorical=["visits"]).categorical == ("visits",)
        assert resolve(schema, "label", numeric=["visits", "x"], categorical=[]).numeric == ("visits", "x")
        assert not caplog.records
