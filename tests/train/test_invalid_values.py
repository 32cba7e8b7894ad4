"""Rows a network cannot use: nulls, NaN and infinities in the inputs (``handleInvalid``), and other bad input.

Real Spark and torch.  A user's table with a string label, nulls in number,
boolean and integer columns, no id column and a dotted column name: refused by
name before anything is written (``handleInvalid='error'``, the default), or
left out of training (``'skip'``, ``'keep'``); at scoring, refused, dropped or
scored as null.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparktrain.errors import ConfigError, DataError, MissingColumnError, OutputOverlapError, SchemaError

ROWS = 1200


def _est(tmp_path, **kw):
    from sparktrain.train.estimator import TorchEstimator

    params = dict(numWorkers=1, epochs=4, batchSize=64, learningRate=0.03, hiddenUnits=[16],
                  store=str(tmp_path / "store"), labelCol="grade")
    params.update(kw)
    est = TorchEstimator(**params)
    est.show_progress = False
    return est


@pytest.fixture(scope="module")
def holes(spark):
    """``grade`` ('high'/'low') = x + y > 0; nulls in ``x`` (double), ``on`` (boolean), ``k`` (int), NaN in ``m.y``.

    No id column; the dotted ``m.y`` is an input like any other.
    """
    from pyspark.sql import functions as F

    i = F.col("id")
    df = spark.range(ROWS).select(
        i, (F.rand(1) * 2 - 1).alias("x"), (F.rand(2) * 2 - 1).alias("m.y"), (F.rand(3) > 0.5).alias("on"),
        (i % 3).cast("int").alias("k"))
    df = df.withColumn("grade", F.when(F.col("x") + F.col("`m.y`") > 0, "high").otherwise("low"))
    df = (df.withColumn("x", F.when(i % 40 == 1, None).otherwise(F.col("x")))
            .withColumn("on", F.when(i % 50 == 2, None).otherwise(F.col("on")))
            .withColumn("k", F.when(i % 60 == 3, None).otherwise(F.col("k")))
            .withColumn("m.y", F.when(i % 100 == 4, float("nan")).otherwise(F.col("`m.y`"))))
    return df.drop("id").cache()


BAD_ROWS = {"x": ROWS // 40, "on": ROWS // 50, "k": ROWS // 60, "m.y": ROWS // 100}  # ids i % n == r: disjoint


def test_nulls_and_nan_in_any_input_are_refused_by_name_before_anything_is_written(holes, tmp_path):
    with pytest.raises(DataError) as info:
        _est(tmp_path).fit(holes)
    text = str(info.value)
    for col, n in BAD_ROWS.items():
        assert f"'{col}' ({n:,} of {ROWS:,} rows)" in text, text
    assert "handleInvalid='skip'" in text and "Imputer" in text and "excludeCols" in text
    store = tmp_path / "store"
    assert not store.exists() or not any(p.is_file() and "data" in p.parts for p in store.rglob("*"))


@pytest.mark.torch
def test_skip_trains_on_the_valid_rows_and_scoring_refuses_skips_or_keeps_invalid_rows(spark, holes, tmp_path):
    from pyspark.sql import functions as F

    valid = ROWS - sum(BAD_ROWS.values())
    est = _est(tmp_path, handleInvalid="skip")
    plan = est.plan(holes)
    written = spark.read.parquet(plan.train_path).count() + spark.read.parquet(plan.val_path).count()
    assert written == valid
    model = est.fit(holes)
    assert model.getHandleInvalid() == "skip"  # copied from the estimator, as Spark ML's Params are
    assert all(np.isfinite(h["train_loss"]) and np.isfinite(h["val_loss"]) for h in model.history)
    assert model.labels == ["high", "low"] or model.labels == ["low", "high"]

    skipped = model.transform(holes).cache()  # the dotted input column is read like any other
    assert skipped.count() == valid
    acc = skipped.where(F.col("prediction") == F.col("grade")).count() / valid
    assert acc > 0.85, acc  # a linear rule on x and m.y
    kept = model.setHandleInvalid("keep").transform(holes).cache()
    assert kept.count() == ROWS and kept.columns == [*holes.columns, "prediction", "probability", "rawPrediction"]
    bad = (F.col("x").isNull() | F.col("on").isNull() | F.col("k").isNull() | F.isnan(F.col("`m.y`")))
    assert kept.where(bad & F.col("prediction").isNull() & F.col("probability").isNull()).count() == \
        sum(BAD_ROWS.values())
    assert kept.where(~bad & F.col("prediction").isNotNull()).count() == valid
    same = kept.where(~bad).select("prediction").toPandas()["prediction"].tolist()
    assert same == skipped.select("prediction").toPandas()["prediction"].tolist()  # same rows, same order
    with pytest.raises(Exception) as err:  # one partition: one batch of all the rows, so its counts are the total
        model.setHandleInvalid("error").transform(holes.coalesce(1)).collect()
    text = str(err.value)
    assert "input column(s) '" in text and "rows) of one batch of the rows to score hold nulls, NaN or infinite " \
           "values; the counts are this batch's, other batches may hold more. Fix:" in text, text
    assert all(f"'{c}' ({n:,} of the {ROWS:,} rows)" in text for c, n in BAD_ROWS.items()), text
    assert "embedding row" not in text and "takes 0 .. 2" not in text  # 'k' holds nulls, no index outside 0 .. 2
    assert model.transform(holes.where(~bad)).count() == valid  # 'error' scores clean rows
    unseen = holes.where(~bad).withColumn("k", F.lit(7))  # trained on k in 0..2: no embedding row for 7
    n_unseen = unseen.count()
    with pytest.raises(Exception) as err:
        model.transform(unseen.coalesce(1)).collect()
    assert f"input column(s) 'k' ({n_unseen:,} of the {n_unseen:,} rows) of one batch of the rows to score hold " \
           f"nulls, NaN or infinite values, or category indices that are not whole numbers or have no embedding row " \
           f"('k' takes 0 .. 2, and {n_unseen:,} of these rows hold another index)" in str(err.value), str(err.value)
    # a fractional index is no category: it was cast to the index below it (2.7 scored as 2), silently
    clean = holes.where(~bad)
    fractional = clean.withColumn("k", F.col("k").cast("double") + F.when(F.col("x") > 0, 0.7).otherwise(0.0))
    n_frac = clean.where(F.col("x") > 0).count()
    with pytest.raises(Exception, match=rf"'k' \({n_frac:,} of the {valid:,} rows\).*not whole numbers.*'k' takes "
                                        rf"0 \.\. 2, and {n_frac:,} of these rows hold another index"):
        model.transform(fractional.coalesce(1)).collect()
    assert model.setHandleInvalid("skip").transform(fractional).count() == valid - n_frac
    model.setHandleInvalid("error")
    # a number arriving as text: refused by column and type before any job (was Spark's CAST_INVALID_INPUT)
    text = clean.withColumn("x", F.when(F.col("k") == 1, F.lit("abc")).otherwise(F.col("x").cast("string")))
    with pytest.raises(SchemaError, match=r"column 'x' of the DataFrame to score has type string; the model reads "
                                          r"it as a number.*cast\('double'\)"):
        model.transform(text)


def test_bad_parameters_and_tiny_inputs_get_named_errors(spark, holes, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    from pyspark.sql import functions as F

    clean = holes.where(F.col("x").isNotNull() & F.col("on").isNotNull() & F.col("k").isNotNull()).limit(30).cache()
    with pytest.raises(DataError, match=r"(train|validation) split of the DataFrame passed to fit\(\) came out "
                                        r"empty .*validationFraction=0"):
        _est(tmp_path, excludeCols=["m.y"], validationFraction=0.001).fit(clean)  # 30 rows: none drawn
    with pytest.raises(MissingColumnError, match=r"column 'idd' is not in the DataFrame passed to fit\(\) "
                                                 r"\(excludeCols\)"):
        _est(tmp_path, excludeCols=["idd"]).plan(holes)
    with pytest.raises(ConfigError, match=r"labelCol.*None.*name the DataFrame's label column"):
        TorchEstimator(labelCol=None, store=str(tmp_path / "s2")).plan(holes)  # type: ignore[arg-type]
    a_file = tmp_path / "store-file"
    a_file.write_text("not a folder")
    with pytest.raises(OutputOverlapError, match=r"is a file, not a folder"):
        _est(tmp_path, store=str(a_file / "runs")).plan(holes)
    assert a_file.read_text() == "not a folder"
    with pytest.raises(ConfigError, match=r"handleInvalid.*'drop'.*error, skip, keep"):
        _est(tmp_path, handleInvalid="drop")


@pytest.mark.torch
def test_a_fit_that_diverges_returns_no_model(spark, tmp_path):
    """Finite inputs near float32's limit overflow the first layer: the loss is NaN, and fit says so."""
    from pyspark.sql import functions as F

    df = spark.range(400).select((F.rand(5) * 3.0e38).alias("x"), (F.rand(6) * 3.0e38).alias("z"),
                                 (F.rand(7) > 0.5).cast("double").alias("grade"))
    with pytest.raises(Exception, match=r"the network diverged in run .*(train_loss|val_loss) = (nan|inf) after "
                                        r"epoch 1.*lower learningRate \(now 0.03\)"):
        _est(tmp_path, epochs=1).fit(df)


@pytest.mark.torch
def test_float_indices_null_array_elements_and_a_rare_index(spark, tmp_path):
    """NaN in a float index column and a null element in an array are invalid rows in fit and transform alike;
    an index held by one row gets its embedding row whichever split the row lands in."""
    from pyspark.sql import functions as F

    i = F.col("id")
    df = spark.range(900).select(
        i, (F.rand(8) * 2 - 1).alias("x"), F.when(i == 5, 9).otherwise(i % 3).cast("int").alias("k"),
        F.when(i % 70 == 0, float("nan")).otherwise((i % 4).cast("double")).alias("f"),
        F.when(i % 90 == 1, F.array(F.lit(None).cast("double"), F.lit(1.0)))
         .otherwise(F.array(F.rand(9), F.lit(1.0))).alias("arr"))
    df = df.withColumn("grade", F.when(F.col("x") > 0, "up").otherwise("down")).cache()
    invalid = {n for n in range(900) if n % 70 == 0 or n % 90 == 1}
    est = _est(tmp_path, categoricalCols=["k", "f"], excludeCols=["id"], epochs=2)
    with pytest.raises(DataError, match=r"column 'arr' has NaN, infinite or null values in 10 of 900 row"):
        est.fit(df)
    with pytest.raises(DataError, match=r"'f' \(13 of 900 rows\)"):
        est.fit(df.withColumn("arr", F.array(F.lit(0.5), F.lit(1.0))))  # a float index: NaN is counted, not cast

    est.setHandleInvalid("skip")
    model = est.fit(df)
    assert dict(model.inputs.categorical) == {"k": 10, "f": 4}  # k = 9 in one row, train or validation
    scored = model.transform(df).select("id", "prediction").toPandas()
    assert set(scored["id"]) == set(range(900)) - invalid  # the row with k = 9 is scored, the invalid ones not
    assert set(scored["prediction"]) <= {"up", "down"}


@pytest.mark.torch
def test_samples_per_s_counts_the_rows_trained_not_the_batch_size(spark, tmp_path):
    """A batch larger than the data: the throughput is rows over time (it was batchSize x steps over time)."""
    from pyspark.sql import functions as F

    df = spark.range(300).select((F.rand(10) * 2 - 1).alias("x"),
                                 F.when(F.rand(11) > 0.5, "a").otherwise("b").alias("grade"))
    est = _est(tmp_path, epochs=1, batchSize=1_000_000)
    plan = est.plan(df)
    train_rows = spark.read.parquet(plan.train_path).count()
    (epoch,) = est.fit(df).history
    # epoch_time_s spans the training (and the validation): rows/s x epoch time is at least the rows trained,
    # and nowhere near the 10^6 a batch-size count gave
    assert train_rows <= epoch["samples_per_s"] * epoch["epoch_time_s"] < 100 * train_rows, (epoch, train_rows)
