"""Barrier-mode training on real Spark, real torch and real TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sparktrain.errors import (ConfigError, MissingColumnError, MissingDependencyError, PreflightError,
                               TrainingError)

REPO = Path(__file__).resolve().parents[2]


def _synthetic(spark, n: int, seed: int = 1):
    from pyspark.sql import functions as F

    df = spark.range(n).select(
        (F.rand(seed) * 2 - 1).cast("float").alias("x1"),
        (F.rand(seed + 1) * 2 - 1).cast("float").alias("x2"),
        (F.col("id") % 7).cast("int").alias("c1"))
    return df.withColumn("label", F.col("x1") + F.col("x2") * 0.5 + (F.col("c1") == 3).cast("float") > 0.2)


@pytest.fixture(scope="module")
def dataset(spark, tmp_path_factory):
    """A materialized dataset (train/validation/test) of 12,001 synthetic rows."""
    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("train_ds") / "ds"
    df = _synthetic(spark, 12_001).cache()
    for name, cond in (("train", "x2 > -0.6"), ("validation", "x2 <= -0.6 and x2 > -0.8"),
                       ("test", "x2 <= -0.8")):
        write_parquet(df.where(cond).coalesce(1), str(root / name))
    return str(root)


def _estimator(cls, tmp_path, **kw):
    params = dict(numWorkers=2, epochs=2, batchSize=256, labelCol="label", store=str(tmp_path / "store"),
                  logEverySteps=5, learningRate=0.01)
    params.update(kw)
    return cls(**params)


class _Recorder:
    def __init__(self):
        self.steps, self.epochs = [], []

    def on_step(self, epoch, step, metrics):
        self.steps.append((epoch, step, dict(metrics)))

    def on_epoch(self, epoch, metrics):
        self.epochs.append((epoch, dict(metrics)))


@pytest.mark.torch
def test_torch_ddp_two_workers_identical_params_and_live_metrics(spark, dataset, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    rec = _Recorder()
    est = _estimator(TorchEstimator, tmp_path).setCallbacks([rec])
    model = est.fit(dataset)
    launch = est.last_launch
    assert set(launch.param_digests) == {0, 1}
    assert launch.param_digests[0] == launch.param_digests[1]  # DDP kept every rank identical
    assert [h["epoch"] for h in model.history] == [0, 1]
    assert model.history[1]["train_loss"] < model.history[0]["train_loss"]
    assert model.history[-1]["val_auc"] > 0.9
    assert model.inputs.task == "binary"
    assert model.inputs.categorical == (("c1", 7),)
    # the callback got all-reduced epoch metrics while training ran, and periodic step metrics
    assert [e for e, _ in rec.epochs] == [0, 1]
    assert rec.epochs[-1][1]["val_loss"] == pytest.approx(model.history[-1]["val_loss"])
    assert rec.steps and all(m["samples_per_s"] > 0 for _, _, m in rec.steps)
    # checkpoint log: each epoch started and finished once
    from sparktrain.train._executor.checkpoint import Checkpointer
    events = Checkpointer(str(tmp_path / "store"), model.getRunId()).events()
    assert [e["epoch"] for e in events if e["event"] == "epoch_finished"] == [0, 1]


@pytest.mark.tensorflow
@pytest.mark.parametrize("backend", ["auto", "mwms"])
def test_keras_two_workers_identical_weights(spark, dataset, tmp_path, backend):
    """gloo (the default) and MultiWorkerMirroredStrategy: both ranks end with the same weights."""
    from sparktrain.train.estimator import KerasEstimator

    est = _estimator(KerasEstimator, tmp_path, epochs=2, backend=backend)
    model = est.fit(dataset)
    digests = est.last_launch.param_digests
    assert len(digests) == 2 and digests[0] == digests[1]
    assert model.history[-1]["val_auc"] > 0.9
    scored = model.transform(spark.read.parquet(os.path.join(dataset, "test")))
    row = scored.selectExpr("avg(cast(prediction = cast(label as double) as double)) as acc",
                            "min(probability) as lo", "max(probability) as hi").first()
    assert row.acc > 0.85 and 0.0 <= row.lo <= row.hi <= 1.0


@pytest.mark.tensorflow
def test_keras_gloo_averages_batchnorm_statistics(spark, dataset, tmp_path):
    """Under gloo only gradients are summed: BatchNorm's moving statistics are averaged before checkpoints."""
    from sparktrain.train.estimator import KerasEstimator

    def factory(inputs, model_spec):
        import keras

        from sparktrain.train._executor.keras_model import build_default_model
        base = build_default_model(inputs, model_spec)
        return keras.Model(base.inputs, keras.layers.BatchNormalization(name="bn")(base.output))

    est = _estimator(KerasEstimator, tmp_path, epochs=1).setModelFactory(factory)
    model = est.fit(dataset)
    digests = est.last_launch.param_digests  # over get_weights(): the moving mean and variance included
    assert len(digests) == 2 and digests[0] == digests[1]
    assert np.isfinite(model.history[-1]["val_loss"])


def _bias_only_net(inputs, model_spec):
    import torch

    class BiasOnly(torch.nn.Module):  # its output is a view of a parameter: it requires grad even under no_grad
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x_num, x_cat):
            return self.b.expand(x_num.shape[0], 1)

    return BiasOnly()


@pytest.mark.torch
def test_a_network_returning_a_view_of_a_parameter_trains_and_scores(spark, dataset, tmp_path):
    """Any valid nn.Module trains: sparktrain detaches outputs before numpy() in its eval step and its scorer."""
    from pyspark.sql import functions as F

    from sparktrain.train.estimator import TorchEstimator

    est = _estimator(TorchEstimator, tmp_path, numWorkers=1, learningRate=0.1).setModelFactory(_bias_only_net)
    model = est.fit(dataset)
    train = spark.read.parquet(os.path.join(dataset, "train"))
    rate = train.select(F.avg(F.col("label").cast("double"))).first()[0]
    assert np.isfinite(model.history[-1]["val_loss"])
    row = model.transform(spark.read.parquet(os.path.join(dataset, "test"))).select(
        F.min("probability").alias("lo"), F.max("probability").alias("hi")).first()
    assert row.lo == pytest.approx(row.hi)  # one bias: one probability for every row
    assert row.hi == pytest.approx(rate, abs=0.05)  # ... the positive rate it learned from


@pytest.mark.torch
def test_a_fit_keeps_its_generation_while_another_job_commits_the_dataset(spark, dataset, tmp_path):
    """Another job re-preprocesses the dataset mid-fit: the fit finishes on the rows it started with (it used to
    die in validation, its generation deleted under it), and the next write removes that generation."""
    from sparktrain.data.commit import Generation, read_record
    from sparktrain.data.manifest import write_parquet
    from sparktrain.train.estimator import TorchEstimator

    root = str(tmp_path / "ds")
    with Generation(root, "output.path") as gen:
        for split in ("train", "validation", "test"):
            write_parquet(spark.read.parquet(os.path.join(dataset, split)), f"{gen.uri}/{split}")
    first = read_record(root)["path"]
    commits = []

    class OtherJob:  # commits a new generation of the dataset after the first epoch, as a second `run` does
        def on_step(self, epoch, step, metrics):
            pass

        def on_epoch(self, epoch, metrics):
            if epoch == 0:
                with Generation(root, "output.path") as other:
                    write_parquet(spark.range(5).selectExpr("CAST(id AS FLOAT) AS x1"), f"{other.uri}/train")
                commits.append(read_record(root)["path"])

    model = _estimator(TorchEstimator, tmp_path, epochs=3).setCallbacks([OtherJob()]).fit(root)
    assert len(commits) == 1 and commits[0] != first
    assert [h["epoch"] for h in model.history] == [0, 1, 2] and model.history[-1]["val_auc"] > 0.9
    assert os.path.isdir(os.path.join(root, first))  # kept until the next write
    assert not [n for n in os.listdir(tmp_path) if ".pin-" in n]  # the fit's pin is released
    with Generation(root, "output.path"):
        pass
    assert first not in os.listdir(root)


@pytest.mark.torch
def test_worker_exception_reaches_driver_with_rank_and_traceback(spark, dataset, tmp_path, monkeypatch):
    from sparktrain.train.estimator import TorchEstimator

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:3:raise")
    est = _estimator(TorchEstimator, tmp_path, epochs=1)
    with pytest.raises(TrainingError) as info:
        est.fit(dataset)
    err = info.value
    assert err.rank == 1
    assert err.host
    assert "injected failure on rank 1 at epoch 0 step 3" in str(err)
    assert "maybe_inject_fault" in err.remote_traceback  # the full worker traceback, not "see logs"


@pytest.mark.torch
def test_a_finished_run_fitted_with_fewer_epochs_warns_and_returns_its_model(spark, dataset, tmp_path):
    """epochs is not in a run's fingerprint (more epochs continue it), so fewer is no RunMismatchError; the run's
    model is returned as it is, with a warning that names the run, both epoch counts and the fix."""
    import warnings

    from sparktrain.train.estimator import TorchEstimator

    def fit(epochs):
        est = _estimator(TorchEstimator, tmp_path, numWorkers=1, epochs=epochs, runId="done-2")
        est.show_progress = False
        return est.fit(dataset)

    from sparktrain.data.run_store import RunStore

    trained = fit(2)
    events = RunStore(str(tmp_path / "store"), "done-2").read_events()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the same epochs again: the same model, no warning
        again = fit(2)
    assert again.history == trained.history and again.launch.attempts == 0
    # returned from the store: no barrier stage started (probe G: it launched the ranks, which found nothing to do)
    assert RunStore(str(tmp_path / "store"), "done-2").read_events() == events
    with pytest.warns(UserWarning) as caught:
        fewer = fit(1)
    assert len(fewer.history) == 2 and fewer.history == trained.history
    assert ("run 'done-2' had already trained 2 epochs, more than epochs=1: fit returned its 2-epoch model, not "
            "trained back to 1 epoch. To train 1 epoch afresh, fit with a new runId") in str(caught[-1].message)


@pytest.mark.torch
def test_uneven_rows_across_ranks_do_not_hang(spark, tmp_path):
    """1,001 rows in one row group over 2 ranks: equal step counts keep all-reduce in step."""
    from sparktrain.data.manifest import write_parquet
    from sparktrain.session import get_or_create_session  # noqa: F401 - same session as the fixture
    from sparktrain.train.estimator import TorchEstimator

    root = tmp_path / "uneven"
    write_parquet(_synthetic(spark, 1001).coalesce(1), str(root / "train"))
    result = {}

    def run():
        try:
            result["model"] = _estimator(TorchEstimator, tmp_path, numWorkers=2, batchSize=64, epochs=1
                                         ).fit(str(root))
        except BaseException as exc:  # surfaced below
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=240)
    assert not t.is_alive(), "training hung on uneven shards"
    assert "error" not in result, result.get("error")
    assert len(result["model"].history) == 1


@pytest.mark.torch
def test_save_load_transform_inside_pipeline(spark, dataset, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer

    from sparktrain.train.estimator import TorchEstimator

    test_df = spark.read.parquet(os.path.join(dataset, "test"))
    model = _estimator(TorchEstimator, tmp_path, numWorkers=1, epochs=1).fit(dataset)
    pipe = Pipeline(stages=[SQLTransformer(statement="SELECT * FROM __THIS__"), model]).fit(test_df)
    path = str(tmp_path / "pipeline_model")
    pipe.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    a = pipe.transform(test_df).selectExpr("sum(probability) as s", "count(*) as n").first()
    b = loaded.transform(test_df).selectExpr("sum(probability) as s", "count(*) as n").first()
    assert a.n == b.n == test_df.count()
    assert a.s == pytest.approx(b.s, abs=1e-9)
    assert type(loaded.stages[1]).__name__ == "TorchModel"
    assert loaded.stages[1].inputs == model.inputs
    assert loaded.stages[1].history == model.history


@pytest.mark.torch
def test_fit_accepts_a_dataframe(spark, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    df = _synthetic(spark, 4000)
    model = _estimator(TorchEstimator, tmp_path, numWorkers=1, epochs=1).fit(df)
    assert model.inputs.numeric == ("x1", "x2")
    assert model.history[0]["val_loss"] > 0
    from sparktrain.data.commit import resolve

    assert os.path.isfile(os.path.join(resolve(str(tmp_path / "store" / model.run_id / "data" / "train")),
                                       "_manifest.json"))


def test_preflight_slots(spark, dataset, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    with pytest.raises(PreflightError, match=r"numWorkers = 3, but the cluster can run only 2 task\(s\)"):
        _estimator(TorchEstimator, tmp_path, numWorkers=3).fit(dataset)


def test_preflight_missing_dataset_and_label(spark, dataset, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    with pytest.raises(Exception, match="nope. does not exist"):
        _estimator(TorchEstimator, tmp_path).fit(str(tmp_path / "nope"))
    with pytest.raises(MissingColumnError, match="column 'lable' is not in .*Did you mean 'label'"):
        _estimator(TorchEstimator, tmp_path, labelCol="lable").fit(dataset)


def test_preflight_unpicklable_factory(spark, dataset, tmp_path):
    from sparktrain.train.estimator import TorchEstimator

    lock = threading.Lock()

    def factory(inputs, model_spec):  # captures a lock: cannot be shipped to executors
        with lock:
            return None

    est = _estimator(TorchEstimator, tmp_path).setModelFactory(factory)
    with pytest.raises(PreflightError, match="cannot be pickled"):
        est.fit(dataset)


def test_keras_with_horovod_is_refused_with_reason(spark, dataset, tmp_path):
    from sparktrain.train.estimator import KerasEstimator

    with pytest.raises(PreflightError, match="silently does not average gradients"):
        _estimator(KerasEstimator, tmp_path, backend="horovod").fit(dataset)


def test_params_validate_ranges():
    from sparktrain.train.estimator import TorchEstimator

    with pytest.raises(ConfigError, match="^parameter 'numWorkers' = 0: must be >= 1"):
        TorchEstimator(numWorkers=0)
    with pytest.raises(ConfigError, match="^parameter 'backend' = 'nccl': must be one of"):  # a Param, one word
        TorchEstimator(backend="nccl")
    with pytest.raises(ConfigError, match=r"^parameter 'minWorkers' = 3: must be in \[1, numWorkers = 2\]"):
        TorchEstimator(numWorkers=2, minWorkers=3).checked_settings()


def test_horovod_missing_names_the_make_target(spark, dataset, tmp_path):
    import importlib.util

    from sparktrain.train.estimator import TorchEstimator

    if importlib.util.find_spec("horovod") is not None:
        pytest.skip("horovod is installed; test_horovod covers it")
    with pytest.raises(MissingDependencyError, match="make horovod"):
        _estimator(TorchEstimator, tmp_path, backend="horovod").fit(dataset)


_RESUME_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {python!r})
from sparktrain.session import get_or_create_session
from sparktrain.errors import PreflightError
from sparktrain.train.estimator import TorchEstimator

out = {{}}
# 1) dynamic allocation is refused by the preflight
spark = get_or_create_session("local[2]", conf={{"spark.dynamicAllocation.enabled": "true",
                                                 "spark.shuffle.service.enabled": "false",
                                                 "spark.dynamicAllocation.shuffleTracking.enabled": "true"}})
try:
    TorchEstimator(numWorkers=2, labelCol="label", store={store!r}).fit({dataset!r})
except PreflightError as e:
    out["dynamic_allocation_error"] = str(e)
spark.stop()

# 2) local[2,2]: a failed barrier stage is retried once
# (confs of the first session's JVM launch persist as system properties: override explicitly)
spark = get_or_create_session("local[2,2]", conf={{"spark.dynamicAllocation.enabled": "false"}})
def fit(run_id):
    est = TorchEstimator(numWorkers=2, epochs=3, batchSize=256, learningRate=0.01, labelCol="label",
                         store={store!r}, runId=run_id, logEverySteps=5)
    est.show_progress = False
    m = est.fit({dataset!r})
    return m.history, est.last_launch.attempts
os.environ["SPARKTRAIN_FAULT_INJECT"] = "1:1:5:exit"   # rank 1 os._exit()s in epoch 2 (index 1)
out["faulty"], out["faulty_attempts"] = fit("faulty")
del os.environ["SPARKTRAIN_FAULT_INJECT"]
out["clean"], out["clean_attempts"] = fit("clean")
out["rerun"], _ = fit("clean")  # same run id again: nothing left to train, nothing repeated
print("RESULT " + json.dumps(out))
"""


@pytest.mark.torch
@pytest.mark.slow
def test_resume_after_worker_killed_and_dynamic_allocation_refused(dataset, tmp_path):
    store = str(tmp_path / "store")
    script = _RESUME_SCRIPT.format(python=str(REPO / "python"), store=store, dataset=dataset)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(line[0][len("RESULT "):])
    assert "spark.dynamicAllocation.enabled" in out["dynamic_allocation_error"]
    assert out["faulty_attempts"] == 2 and out["clean_attempts"] == 1

    from sparktrain.train._executor.checkpoint import Checkpointer
    events = Checkpointer(store, "faulty").events()
    finished = [e["epoch"] for e in events if e["event"] == "epoch_finished"]
    assert finished == [0, 1, 2]  # every epoch completed exactly once
    assert [e["event"] for e in events if e["event"] in ("started", "resumed")] == ["started", "resumed"]
    assert [e["from_epoch"] for e in events if e["event"] == "resumed"] == [1]
    started = [e["epoch"] for e in events if e["event"] == "epoch_started"]
    assert started == [0, 1, 1, 2]  # epoch 1 was interrupted once, epoch 0 never repeated
    # the resumed run ends where an uninterrupted run ends
    for a, b in zip(out["faulty"], out["clean"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4)
    assert out["rerun"] == out["clean"]
    clean_events = Checkpointer(store, "clean").events()
    assert [e["epoch"] for e in clean_events if e["event"] == "epoch_finished"] == [0, 1, 2]


def test_an_optimizer_step_larger_than_the_training_split_is_warned_about(tmp_path, caplog):
    """Probe U: accumulateSteps x batchSize x numWorkers above the rows made every epoch one optimizer step,
    silently (correct, and rarely meant)."""
    import logging
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparktrain.data import build_manifest, write_manifest
    from sparktrain.train._executor.spec import OptimSpec
    from sparktrain.train.estimator import _warn_one_step

    root = tmp_path / "train"
    root.mkdir()
    pq.write_table(pa.table({"x": list(range(1800))}), root / "part-0.parquet")
    write_manifest(str(root), build_manifest(str(root)))
    with caplog.at_level(logging.WARNING, logger="sparktrain.train.estimator"):
        _warn_one_step(str(root), SimpleNamespace(optim=OptimSpec(batch_size=100, accumulate_steps=4), num_workers=2))
        assert not caplog.records  # 800 rows a step: 2 steps an epoch
        _warn_one_step(str(root), SimpleNamespace(optim=OptimSpec(batch_size=100, accumulate_steps=64), num_workers=2))
    said = [r.getMessage() for r in caplog.records]
    assert said == ["one optimizer step is accumulateSteps 64 x batchSize 100 x numWorkers 2 = 12,800 rows, more "
                    "than the training split's 1,800: each epoch is a single optimizer step over all its rows. Lower "
                    "accumulateSteps (train.accumulate_steps) or batchSize for more steps per epoch"], said
