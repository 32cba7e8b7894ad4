"""The estimators keep Spark ML's contract: fit is a pure function of (params, data).

Real Spark, real torch: a new run per fit, resume only on an explicit runId with the
same data and params, CrossValidator / TrainValidationSplit unchanged, bad labels refused
before any barrier stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sparktrain.data.commit import resolve

from sparktrain.errors import ConfigError, DataError, MissingColumnError, RunMismatchError, SchemaError

REPO = Path(__file__).resolve().parents[2]


def _two_tasks(spark, n: int = 3000):
    """Two datasets with the same columns and opposite tasks: y = x > 0.5 and y = z > 0.5."""
    from pyspark.sql import functions as F

    base = spark.range(n).select((F.rand(11)).cast("float").alias("x"), (F.rand(12)).cast("float").alias("z"))
    df1 = base.withColumn("label", (F.col("x") > 0.5).cast("double"))
    df2 = base.withColumn("label", (F.col("z") > 0.5).cast("double"))
    return df1.cache(), df2.cache()


def _accuracy(model, df) -> float:
    return model.transform(df).selectExpr("avg(cast(prediction = label as double)) as a").first().a


def _est(tmp_path, **kw):
    from sparktrain.train.estimator import TorchEstimator

    params = dict(numWorkers=2, epochs=3, batchSize=64, learningRate=0.02, hiddenUnits=[16],
                  store=str(tmp_path / "store"))
    params.update(kw)
    est = TorchEstimator(**params)
    est.show_progress = False
    return est


@pytest.mark.torch
def test_two_fits_on_different_data_give_two_models(spark, tmp_path):
    df1, df2 = _two_tasks(spark)
    est = _est(tmp_path)
    m1 = est.fit(df1)
    m2 = est.fit(df2)
    assert not est.isSet(est.runId)  # the run id lives on the model, never on the estimator
    assert m1.getRunId() != m2.getRunId() and len(m1.getRunId()) == 12
    assert m1.history != m2.history
    assert m1.inputs.task == m2.inputs.task == "binary"  # 0.0/1.0 double labels, Spark ML's convention
    assert _accuracy(m1, df1) > 0.9 and _accuracy(m2, df2) > 0.9
    assert _accuracy(m2, df1) < 0.7  # m2 learned df2's task, not df1's
    store = tmp_path / "store"
    for m in (m1, m2):  # each fit materialized its own DataFrame under its own run
        assert (Path(resolve(str(store / m.getRunId() / "data" / "train"))) / "_manifest.json").is_file()
        run = json.loads((store / m.getRunId() / "run.json").read_text())
        assert run["fingerprint"]["label"] == "label"


@pytest.mark.torch
def test_explicit_run_id_resumes_only_the_same_data_and_params(spark, tmp_path):
    df1, df2 = _two_tasks(spark)
    est = _est(tmp_path, runId="named", epochs=2)
    first = est.fit(df1)
    assert first.getRunId() == "named"
    data_dir = tmp_path / "store" / "named" / "data"
    before = sorted(p.name for p in Path(resolve(str(data_dir / "train"))).iterdir())

    again = est.fit(df1)  # same data, same params: the finished run is resumed, nothing retrained
    assert again.history == first.history
    longer = est.copy({est.epochs: 3}).fit(df1)  # more epochs continue the same run
    assert longer.history[:2] == first.history and len(longer.history) == 3

    with pytest.raises(RunMismatchError, match=r"data\.dataframe\.hash") as info:
        est.fit(df2)  # other data under the same run id
    assert "unset runId" in str(info.value)
    with pytest.raises(RunMismatchError, match=r"params\.learning_rate: 0\.02 -> 0\.05"):
        est.copy({est.learningRate: 0.05}).fit(df1)
    with pytest.raises(RunMismatchError, match=r"params\.hidden_units: \[16\] -> \[8\]"):
        est.copy({est.hiddenUnits: [8]}).fit(df1)
    assert sorted(p.name for p in Path(resolve(str(data_dir / "train"))).iterdir()) == before  # nothing rewritten


@pytest.mark.torch
def test_explicit_run_id_on_a_path_dataset_names_the_changed_split(spark, tmp_path):
    from sparktrain.data.manifest import write_parquet

    df1, df2 = _two_tasks(spark, 1000)
    a, b = tmp_path / "a", tmp_path / "b"
    write_parquet(df1, str(a / "train"))
    write_parquet(df2, str(b / "train"))
    est = _est(tmp_path, runId="on-path", numWorkers=1, epochs=1)
    est.fit(str(a))
    with pytest.raises(RunMismatchError, match=r"data\.train\.digest: \"sha256:"):
        est.fit(str(b))
    assert est.fit(str(a)).getRunId() == "on-path"


def test_bad_labels_are_refused_before_any_barrier_stage(spark, tmp_path):
    from pyspark.sql import functions as F

    base = spark.range(50).select(F.rand(1).cast("float").alias("x"))
    est = _est(tmp_path)
    with pytest.raises(MissingColumnError, match="column 'label' is not in the DataFrame passed to fit"):
        est.fit(base)
    # preprocess's label policy and errors (sparktrain.features.label): tests/features/test_label_policy.py
    with pytest.raises(DataError, match=r"label column 'label' \(data.label / labelCol\) has a single class, 'yes'"):
        est.fit(base.withColumn("label", F.lit("yes")))
    with pytest.raises(SchemaError, match=r"has type map<string,int>, which a model cannot learn"):
        est.fit(base.withColumn("label", F.create_map(F.lit("a"), F.lit(1))))
    with pytest.raises(DataError, match=r"has 50 NaN and 0 infinite values \(value: NaN\)"):
        est.fit(base.withColumn("label", F.lit(float("nan"))))
    with pytest.raises(DataError, match="is null in all 50 rows"):
        est.fit(base.withColumn("label", F.lit(None).cast("double")))
    with pytest.raises(ConfigError, match="'runId' = '../x'"):
        est.setRunId("../x")
    assert not (tmp_path / "store").exists()  # nothing was written for any of them


@pytest.mark.torch
def test_null_labels_are_dropped_and_store_uri_is_honoured(spark, tmp_path, caplog):
    from pyspark.sql import functions as F

    df = spark.range(800).select(F.rand(5).cast("float").alias("x"))
    df = df.withColumn("label", F.when(F.col("x") < 0.05, None).otherwise((F.col("x") > 0.5).cast("int")))
    nulls = df.where("label is null").count()
    est = _est(tmp_path, numWorkers=1, epochs=1, store=f"file://{tmp_path}/uri-store")
    with caplog.at_level("WARNING", logger="sparktrain.train.plan"):
        model = est.fit(df)
    assert f"{nulls} row(s) with a null label 'label' left out" in caplog.text
    data = tmp_path / "uri-store" / model.getRunId() / "data"
    manifests = [json.loads((Path(resolve(str(data / s))) / "_manifest.json").read_text())
                 for s in ("train", "validation")]
    assert sum(m["num_rows"] for m in manifests) == 800 - nulls
    assert not Path("file:").exists()  # the URI was not taken for a relative local path


@pytest.mark.torch
def test_exclude_cols_and_features_json_key_leave_inputs(spark, tmp_path):
    from pyspark.sql import functions as F

    df = spark.range(600).select(F.col("id").cast("int").alias("row_id"), F.rand(2).cast("float").alias("x"))
    df = df.withColumn("label", (F.col("x") > 0.5).cast("int"))
    plan = _est(tmp_path, numWorkers=1, excludeCols=["row_id"]).plan(df)
    assert plan.inputs.columns == ["x"] and plan.inputs.task == "binary"
    assert not plan.resume and len(plan.run_id) == 12
    plain = _est(tmp_path, numWorkers=1).plan(df)  # without excludeCols, an int column is a categorical input
    assert "row_id" in plain.inputs.columns


def _xor(spark, n: int, seed: int):
    from pyspark.sql import functions as F

    df = spark.range(n).select((F.rand(seed) * 2 - 1).cast("float").alias("x1"),
                               (F.rand(seed + 1) * 2 - 1).cast("float").alias("x2"))
    return df.withColumn("label", ((F.col("x1") * F.col("x2")) > 0).cast("double"))


_CV_LOAD = r"""
import json, sys
sys.path.insert(0, {python!r})
from sparktrain.session import get_or_create_session
from pyspark.ml.tuning import CrossValidatorModel
spark = get_or_create_session("local[2]")
cv = CrossValidatorModel.load({path!r})
rows = cv.transform(spark.read.parquet({data!r})).orderBy("x1", "x2").select("probability").collect()
print("RESULT " + json.dumps([r[0] for r in rows]))
"""


@pytest.mark.torch
def test_cross_validator_picks_the_better_grid_point_and_persists(spark, tmp_path):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, CrossValidatorModel, ParamGridBuilder

    df = _xor(spark, 2400, 3).cache()
    est = _est(tmp_path, numWorkers=1, batchSize=64, hiddenUnits=[16, 16], validationFraction=0.0)
    grid = (ParamGridBuilder().addGrid(est.epochs, [1, 10]).addGrid(est.learningRate, [0.004])
            .addGrid(est.hiddenUnits, [[16, 16]]).build())
    evaluator = BinaryClassificationEvaluator(rawPredictionCol="probability", labelCol="label")
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=7)
    cv_model = cv.fit(df)
    auc_1, auc_10 = cv_model.avgMetrics
    assert auc_10 > auc_1 + 0.1, cv_model.avgMetrics  # the grid points differ
    best = cv_model.bestModel
    assert len(best.history) == 10 and best.getRunId() not in (None, "")
    # which grid point won, from the model itself (probe S), and Spark ML's uid convention
    assert (best.getEpochs(), best.getLearningRate(), best.uid) == (10, 0.004, est.uid)
    assert not hasattr(best, "setEpochs")  # read-only: the model was trained with them
    assert evaluator.evaluate(best.transform(df)) > 0.9

    path = str(tmp_path / "cv_model")
    cv_model.save(path)
    data = str(tmp_path / "score_input")
    df.write.parquet(data)
    here = [r[0] for r in cv_model.transform(spark.read.parquet(data)).orderBy("x1", "x2")
            .select("probability").collect()]
    same_session = CrossValidatorModel.load(path)
    assert same_session.avgMetrics == cv_model.avgMetrics and same_session.bestModel.getEpochs() == 10
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    script = _CV_LOAD.format(python=str(REPO / "python"), path=path, data=data)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    there = json.loads(line[0][len("RESULT "):])
    assert there == pytest.approx(here, abs=1e-7)  # a new session scores identically


@pytest.mark.torch
def test_train_validation_split_with_a_multiclass_evaluator(spark, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit
    from pyspark.sql import functions as F

    df = spark.range(2400).select((F.rand(8) * 3).cast("float").alias("x"))
    df = df.withColumn("label", F.floor("x").cast("int")).cache()  # three classes: 0, 1, 2
    est = _est(tmp_path, numWorkers=2, batchSize=32, hiddenUnits=[16], validationFraction=0.0)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-5, 0.05]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy", labelCol="label")
    tvs = TrainValidationSplit(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, trainRatio=0.75,
                               seed=3).fit(df)
    low, high = tvs.validationMetrics
    assert high > low + 0.2 and high > 0.8, tvs.validationMetrics
    assert tvs.bestModel.inputs.task == "multiclass" and tvs.bestModel.inputs.num_classes == 3


def linear_net(inputs, model_spec):  # a factory of the user's own, at module level as Spark ML users write it
    import torch

    return torch.nn.Linear(inputs.numeric_width, 1)


def test_a_saved_estimator_keeps_no_secret_and_a_dropped_factory_refuses_the_fit_until_set(spark, tmp_path):
    """Probe S: a Pipeline (or CrossValidator) holding the estimator wrote the store's password in clear, and
    after load the custom network was gone: fit() trained the default MLP without a word.  Now the params are
    masked, the metadata records the dropped factory, and the loaded estimator refuses to fit until the factory
    is set again (or cleared), and until the masked store is given again."""
    from pyspark.ml import Pipeline

    from sparktrain.train.estimator import TorchEstimator

    est = _est(tmp_path, store="s3://ana:hunter2@bucket/store", epochs=2).setModelFactory(linear_net)
    path = tmp_path / "pipeline"
    with pytest.warns(UserWarning, match=r"saving TorchEstimator without its model factory .*linear_net"):
        Pipeline(stages=[est]).write().save(str(path))
    written = "".join(p.read_text() for p in path.rglob("part-*"))
    assert "hunter2" not in written and "s3://ana:***@bucket/store" in written and "linear_net" in written

    loaded = Pipeline.load(str(path)).getStages()[0]
    assert isinstance(loaded, TorchEstimator) and loaded.getEpochs() == 2 and loaded.uid == est.uid
    df = spark.range(10).selectExpr("cast(id as double) as x", "cast(id % 2 as double) as label")
    with pytest.raises(ConfigError, match=r"'setModelFactory' = '.*linear_net': this TorchEstimator was saved with "
                                          r"the model factory .*linear_net, which is code and was not persisted; "
                                          r"without it fit\(\) would train the default network. Fix: call "
                                          r"setModelFactory\(linear_net\) again after load\(\)"):
        loaded.fit(df)
    copied = loaded.copy()  # a copy's factory is its own: the original still refuses
    copied.setModelFactory(linear_net)
    assert not copied._unrestored and set(loaded._unrestored) == {"model"}
    again = tmp_path / "again"  # saved again before the factory is set: the record stays
    loaded.write().save(str(again))
    assert TorchEstimator.load(str(again))._unrestored == {"model": loaded._unrestored["model"]}
    loaded.setModelFactory(linear_net)
    with pytest.raises(ConfigError, match=r"'store' = 's3://ana:\*\*\*@bucket/store': its credentials are masked"):
        loaded.fit(df)  # the factory is back; the store's password is not
    cleared = TorchEstimator.load(str(again)).setModelFactory(None)  # the default network, said explicitly
    cleared._check_factories_restored()
