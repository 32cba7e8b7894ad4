"""Faults have designed outcomes: a stalled rank is named and the fit stops; nothing is lost."""

from __future__ import annotations

import pytest

from sparktrain.errors import TrainingStalledError


@pytest.fixture(scope="module")
def small(spark, tmp_path_factory):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("faults") / "ds"
    df = spark.range(6400).select((F.rand(1) * 2 - 1).cast("float").alias("x"))
    write_parquet(df.withColumn("label", (F.col("x") > 0).cast("float")).coalesce(1), str(root / "train"))
    return str(root)


@pytest.mark.torch
def test_a_stalled_rank_is_named_and_the_fit_stops(spark, small, tmp_path, monkeypatch, caplog):
    from sparktrain.train.estimator import TorchEstimator

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:20:hang")  # rank 1 blocks for good before step 21
    est = TorchEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=str(tmp_path / "store"),
                         stallTimeout=8.0, logEverySteps=5)
    est.show_progress = False
    with caplog.at_level("WARNING", logger="sparktrain.train.watchdog"):
        with pytest.raises(TrainingStalledError) as info:
            est.fit(small)
    err = info.value
    assert err.rank == 1 and err.host
    assert err.info["epoch"] == 0 and err.info["step"] == 20 and err.info["phase"] == "compute"
    assert 8.0 <= err.info["seconds"] < 8.0 + 5.0  # detected within the timeout plus the poll interval
    assert "rank 1 made no progress" in str(err) and "stallTimeout = 8 s" in str(err)
    assert "made no progress for" in caplog.text
    run = err.info["run"]  # the error says which run to fit again to resume
    assert (tmp_path / "store" / run / "run.json").exists()
    # stalled 8 s into its first epoch, before any checkpoint: fitting again reuses its data (no checkpoint promised)
    assert f"fit again with runId='{run}' to reuse run {run}'s data (it failed before its first checkpoint" in str(err)
    # the cancelled stage freed its slots: the session trains again right away
    monkeypatch.delenv("SPARKTRAIN_FAULT_INJECT")
    est2 = TorchEstimator(numWorkers=2, epochs=1, batchSize=256, labelCol="label", store=str(tmp_path / "store"))
    est2.show_progress = False
    assert len(est2.fit(small).history) == 1


@pytest.mark.torch
def test_an_interrupted_fit_stops_its_ranks_before_it_lets_go_of_the_run(spark, small, tmp_path):
    """Ctrl-C during fit (SIGINT, as a shell or a notebook's interrupt button sends it) cancels the training stage
    and waits for it: when fit raises, no job runs, the run's lease is free and no checkpoint is written after.
    Before, the ranks trained on unseen (checkpoints kept coming until the session stopped) with the lease gone."""
    import os
    import signal
    import threading
    import time

    from sparktrain.train.estimator import TorchEstimator

    store = tmp_path / "store"
    ckpts = store / "ctrl-c" / "checkpoints"
    est = TorchEstimator(numWorkers=2, epochs=2000, batchSize=64, labelCol="label", store=str(store),
                         runId="ctrl-c", checkpointEverySteps=5)
    est.show_progress = False
    sent = threading.Event()

    def interrupt_once_training() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (ckpts.is_dir() and any(ckpts.glob("*.ckpt"))):
            time.sleep(0.1)
        sent.set()
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C or a notebook's interrupt button sends

    threading.Thread(target=interrupt_once_training, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        est.fit(small)
        sent.wait()  # the interrupt lands here if the fit ended first: the test fails on the check below
        time.sleep(5)
    assert sent.is_set() and any(ckpts.glob("*.ckpt"))
    tracker = spark.sparkContext.statusTracker()
    assert tracker.getActiveJobsIds() == []
    assert not any(p.name.endswith(".lease") for p in store.iterdir())  # released, and only now
    written = sorted(os.listdir(ckpts))
    time.sleep(3)
    assert sorted(os.listdir(ckpts)) == written  # nobody trains on
    again = TorchEstimator(numWorkers=2, epochs=1, batchSize=256, labelCol="label", store=str(store))
    again.show_progress = False
    assert len(again.fit(small).history) == 1  # the slots are free


@pytest.mark.torch
def test_a_rank_whose_python_worker_died_is_named_not_its_peers_echo(spark, small, tmp_path, monkeypatch):
    """Rank 1's Python worker exits mid-epoch (local[2]: no task retry). It reports nothing; rank 0's gloo
    collective fails with "connection closed by peer". The error names rank 1, with Spark's reason and the
    hint, and calls rank 0's error the echo."""
    from sparktrain.errors import TrainingError
    from sparktrain.train.estimator import TorchEstimator

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:3:exit")  # rank 1 os._exit()s before step 4
    est = TorchEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=str(tmp_path / "store"))
    est.show_progress = False
    with pytest.raises(TrainingError) as info:
        est.fit(small)
    err = info.value
    text = str(err)
    assert err.rank == 1 and err.host, text
    assert "the Python worker of rank 1 died" in text and "exited unexpectedly" in text
    assert "use local[N,F] locally" in text  # the hint
    assert "Rank 0's error is only the echo of it" in text and "by peer" in text
    # the run to resume, in the message and on the error (probe D: the user had to guess among the store's runs)
    runs = [p.name for p in (tmp_path / "store").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
    assert runs == [err.run_id], (runs, err.run_id)
    # rank 1 died in the first epoch, before any checkpoint: fitting again reuses the data, not a checkpoint
    assert f"Run {err.run_id} failed before its first checkpoint: once the cause is fixed, fit again with " \
           f"runId='{err.run_id}' to reuse its data (it trains from the first epoch)" in text


def test_the_resume_advice_says_whether_the_failed_run_saved_a_checkpoint(tmp_path):
    """With a checkpoint, fitting again with the run id resumes from it; without one, it reuses the run's data
    and trains from the first epoch, and the message must not promise a checkpoint.  A store that cannot say
    keeps the general wording."""
    from sparktrain.errors import TrainingError
    from sparktrain.train.estimator import _saved_checkpoints

    store = tmp_path / "store"
    (store / "r1" / "checkpoints").mkdir(parents=True)
    assert _saved_checkpoints(str(store), "r1") == 0
    none = str(TrainingError("boom", rank=1, host="h").name_run("r1", _saved_checkpoints(str(store), "r1")))
    assert "Run r1 failed before its first checkpoint: once the cause is fixed, fit again with runId='r1' to " \
           "reuse its data (it trains from the first epoch)" in none and "keeps its checkpoints" not in none
    (store / "r1" / "checkpoints" / "ckpt-000003.ckpt").write_bytes(b"x")
    (store / "r1" / "checkpoints" / ".tmp-ckpt-000004.ckpt").write_bytes(b"half")  # never counted
    assert _saved_checkpoints(str(store), "r1") == 1
    some = str(TrainingError("boom").name_run("r1", 1))
    assert "Run r1 keeps its checkpoints in the store: once the cause is fixed, fit again with runId='r1' to " \
           "resume it from the last one" in some
    assert "keeps its checkpoints" in str(TrainingError("boom").name_run("r1", None))
    assert _saved_checkpoints("nosuchscheme://x/store", "r1") is None  # the store cannot say: no guess
    # a stall's own advice (it names the runId) is reworded the same way when there is no checkpoint
    info = {"rank": 1, "host": "h", "epoch": 0, "step": 0, "phase": "setup", "seconds": 121.0, "run": "r1"}
    stalled = str(TrainingStalledError(info, 10.0).name_run("r1", 0))
    assert "fit again with runId='r1' to reuse run r1's data (it failed before its first checkpoint: it trains " \
           "from the first epoch)" in stalled and "last checkpoint" not in stalled
    assert "to resume run r1 from its last checkpoint" in str(TrainingStalledError(info, 10.0).name_run("r1", 2))


def _keras_children():
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if "sparktrain.train._executor.keras_worker" in cmd:
            out.append(p)
    return out


def _wait_gone(seconds: float = 20.0):
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = _keras_children()
        if not left:
            return []
        time.sleep(0.2)
    return _keras_children()


@pytest.mark.tensorflow
def test_keras_children_die_with_a_failed_fit_and_a_timed_out_trial(spark, small, tmp_path, monkeypatch):
    from sparktrain.config import parse_config
    from sparktrain.errors import TrainingError
    from sparktrain.train.estimator import KerasEstimator
    from sparktrain.tune.search import run_search

    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:3:raise")  # rank 1 fails; rank 0 waits in a collective
    est = KerasEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=str(tmp_path / "store"))
    est.show_progress = False
    with pytest.raises(TrainingError, match="injected failure on rank 1"):
        est.fit(small)
    assert _wait_gone() == [], "Keras worker processes outlived the failed fit"  # and with them their TF ports
    monkeypatch.delenv("SPARKTRAIN_FAULT_INJECT")

    # a single-task Keras trial cancelled by tune.trial_timeout_s: its child is killed with the task
    cfg = parse_config({"name": "timeouts", "data": {"source": small, "label": "label"},
                        "train": {"framework": "keras", "num_workers": 1, "epochs": 50, "batch_size": 16,
                                  "store": str(tmp_path / "store2")},
                        "tune": {"max_trials": 1, "parallelism": 1, "algo": "random", "trial_timeout_s": 12,
                                 "metric": "train_loss", "space": {"learning_rate": {"uniform": [0.001, 0.01]}}},
                        "tracking": {"enabled": False}})
    try:
        run_search(spark, cfg, small)
    except Exception:  # noqa: BLE001 - every trial timed out: the search reports it; the children are the point
        pass
    assert _wait_gone() == [], "a Keras worker outlived its timed-out trial"


_BIG_MODEL = r"""
import json, sys
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.config import parse_config
from sparktrain.job import run_job
from sparktrain.session import get_or_create_session

spark = get_or_create_session("local[2]", conf={{"spark.driver.maxResultSize": "1m"}})
raw = {base!r} + "/raw"
spark.range(4000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b")) \
    .withColumn("label", F.col("a") > F.col("b")).write.parquet(raw)
cfg = parse_config({{"name": "big", "data": {{"source": raw, "label": "label"}},
                    "features": [{{"name": "a", "type": "numeric"}}, {{"name": "b", "type": "numeric"}}],
                    "output": {{"path": {base!r} + "/dataset"}},
                    "train": {{"num_workers": 2, "epochs": 1, "hidden_units": [1024, 512], "store": {base!r} + "/store",
                              "compare_baseline": False}},
                    "tracking": {{"uri": "sqlite:///" + {base!r} + "/mlflow.db", "model_name": "big"}}}})
result = run_job(cfg, stages=("preprocess", "train"), spark=spark)
m = result.train.model
print("RESULT " + json.dumps({{"bytes": len(m.model_bytes), "version": result.tracking.model.version,
                               "max": spark.sparkContext.getConf().get("spark.driver.maxResultSize")}}))
"""


@pytest.mark.torch
@pytest.mark.slow
def test_a_model_over_max_result_size_trains_and_registers(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = _BIG_MODEL.format(python=str(repo / "python"), base=str(tmp_path))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(line[0][len("RESULT "):])
    assert out["max"] == "1m" and out["bytes"] > 2 * 1024 * 1024  # the network is over twice the limit
    assert out["version"] == 1


@pytest.mark.torch
def test_a_progress_channel_cut_mid_fit_is_no_stall(spark, small, tmp_path, monkeypatch, caplog):
    """Every rank's connection is cut for longer than stallTimeout in the middle of a real fit: the ranks
    reconnect and deliver what they buffered; the watchdog asks Spark, hears the tasks run, and waits."""
    import threading

    from sparktrain.train import launcher
    from sparktrain.train.estimator import TorchEstimator
    from sparktrain.train.progress import ProgressServer

    servers = []

    class CutServer(ProgressServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            servers.append(self)
            self.cut_at = None
            self.listeners.append(self._maybe_cut)

        def _maybe_cut(self, event):
            if self.cut_at is None and event.get("type") == "step" and event.get("epoch") == 1:
                self.cut_at = event["step"]
                threading.Thread(target=self.drop_connections, args=(9.0,), daemon=True).start()

    monkeypatch.setattr(launcher, "ProgressServer", CutServer)
    # stallTimeout 8 s, cut 9 s: excused up to 16 s, which leaves room for the last heartbeat before the cut and
    # the reconnect backoff; with 5 s, a loaded machine's slow epoch end (rank 1 waiting in a collective on rank 0's
    # validation) was taken for a stall now and then
    est = TorchEstimator(numWorkers=2, epochs=4, batchSize=8, labelCol="label", store=str(tmp_path / "store"),
                         stallTimeout=8.0, logEverySteps=20)
    est.show_progress = False
    with caplog.at_level("WARNING", logger="sparktrain.train.watchdog"):
        model = est.fit(small)
    (server,) = servers
    assert server.cut_at is not None and len(model.history) == 4
    assert sorted(server.epochs_seen) == list(range(4))  # every epoch event arrived, the ones sent in the cut too
    assert server.accepted_connections >= 4  # both ranks came back
    assert "Spark reports its task running" in caplog.text  # silent ranks were checked, not blamed


@pytest.mark.torch
def test_the_cli_prints_how_to_resume_a_failed_training_and_resume_continues_that_run(spark, small, tmp_path,
                                                                                       monkeypatch, capsys, caplog):
    """`sparktrain train` whose rank dies: the error ends with the command that resumes it (the Python API's
    runId advice is no use from a shell); `--resume RUN` fits that run again, in the same store folder. A run the
    store lacks, or --resume with another stage, is refused before Spark, naming the run and the store's runs."""
    import logging
    import re

    import yaml

    from sparktrain.cli import main

    store, raw, dataset = tmp_path / "store", tmp_path / "raw", tmp_path / "dataset"
    spark.read.parquet(f"{small}/train").write.parquet(str(raw))
    conf = tmp_path / "job.yaml"
    conf.write_text(yaml.safe_dump({
        "name": "resume-cli", "data": {"source": str(raw), "label": "label"},
        "features": [{"name": "x", "type": "numeric"}], "output": {"path": str(dataset)},
        "train": {"epochs": 2, "batch_size": 64, "num_workers": 2, "store": str(store), "compare_baseline": False},
        "tracking": {"enabled": False}}))
    assert main(["train", str(conf)]) == 1  # nothing preprocessed yet: refused, nothing trained
    first = capsys.readouterr().err
    assert "error: " in first and str(dataset) in first and not store.exists(), first[-1500:]
    assert main(["preprocess", str(conf)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("SPARKTRAIN_FAULT_INJECT", "1:0:3:exit")  # rank 1's Python worker dies before step 4
    assert main(["train", str(conf), "--set", "train.learning_rate=0.01"]) == 1
    err = capsys.readouterr().err
    found = re.search(r"resume: sparktrain train (\S+) --set train.learning_rate=0.01 --resume (\w+)$", err.strip())
    assert found and found[1] == str(conf), err[-2000:]
    assert "runId=" not in err and "run the resume: command below to reuse its data" in err  # no API advice in a shell
    run = found[2]
    assert [p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))] == [run]

    monkeypatch.delenv("SPARKTRAIN_FAULT_INJECT")
    assert main(["train", str(conf), "--resume", "nope"]) == 1
    assert f"'--resume' = 'nope': train.store {store} holds no run 'nope' (its runs: {run})" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # argparse: `run` has no --resume (its preprocess is other data)
        main(["run", str(conf), "--resume", run])
    assert usage.value.code == 2 and "unrecognized arguments: --resume" in capsys.readouterr().err
    with caplog.at_level(logging.INFO, logger="sparktrain.train.estimator"):
        assert main(["train", str(conf), "--set", "train.learning_rate=0.01", "--resume", run]) == 0
    assert f"resuming run {run}" in caplog.text
    assert [p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))] == [run]
    out = capsys.readouterr().out
    assert "epochs: 2" in out and f"model saved: {store / run / 'model'}" in out  # trained to the end, saved
    # probe E: resuming the finished run again trained nothing and registered the same model again
    assert main(["train", str(conf), "--set", "train.learning_rate=0.01", "--resume", run]) == 1
    # (probe O: it said "not registered" of a model the job or `register --from-store` had registered)
    assert f"run {run} finished 2 epochs and its model is saved ({store / run / 'model'}): nothing to resume. " \
           f"Set train.epochs above 2 to train it further; if its tracking failed, `sparktrain register " \
           f"--from-store {store / run}` registers it (and says so when it is registered already)" \
           in capsys.readouterr().err
    # other settings: said in the CLI's words, not fit()'s and runId's
    assert main(["train", str(conf), "--set", "train.epochs=3", "--set", "train.learning_rate=0.05",
                 "--resume", run]) == 1
    err = capsys.readouterr().err
    assert f"option '--resume' = '{run}': run {run} was trained on other data or settings (" in err
    assert "learning_rate: 0.01 -> 0.05" in err and "resume it with its own --set values and dataset, or drop " \
           "--resume to train a new run" in err and "runId" not in err.split("error: ")[-1]


def test_the_job_refuses_to_train_on_a_dataset_without_features_json(spark, small, tmp_path):
    """`sparktrain train` on Parquet that preprocess did not write trained, then failed saving the model (it scores
    raw rows through features.json): refused before training now, with both ways forward."""
    from sparktrain.config import parse_config
    from sparktrain.errors import DataError
    from sparktrain.job import train_stage

    cfg = parse_config({"name": "t", "data": {"label": "label"}, "output": {"path": small},
                        "train": {"num_workers": 1, "epochs": 1, "store": str(tmp_path / "store")},
                        "tracking": {"enabled": False}})
    with pytest.raises(DataError) as info:
        train_stage(spark, cfg, small)
    assert f"output.path '{small}' has no features.json" in str(info.value)
    assert "Run `sparktrain preprocess CONFIG`" in str(info.value) and "TorchEstimator(...).fit(path)" in \
        str(info.value)
    assert not (tmp_path / "store").exists()


@pytest.mark.torch
def test_a_run_folder_deleted_mid_fit_is_said_and_recorded_again_so_the_run_still_resumes(spark, small, tmp_path,
                                                                                          caplog):
    """Probe G: `rm -rf` of the store mid-fit: the fit reported success without a word, the run had lost its
    run.json (every later fit with its runId was refused, with a fix that could not work) and its lease file was
    written again silently.  Now the fit warns, run.json is written again and the run resumes."""
    import shutil
    import threading
    import time
    import warnings

    from sparktrain.data.run_store import RunStore
    from sparktrain.train.estimator import TorchEstimator

    store = tmp_path / "store"

    def remove_after_an_epoch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(e["event"] == "epoch_finished" for e in RunStore(str(store), "gone").read_events()):
                for _ in range(20):  # files may appear while it removes them
                    shutil.rmtree(store, ignore_errors=True)
                    if not store.exists():
                        return
                return
            time.sleep(0.05)

    est = TorchEstimator(numWorkers=1, epochs=12, batchSize=32, labelCol="label", store=str(store), runId="gone",
                         checkpointEverySteps=50)
    est.show_progress = False
    remover = threading.Thread(target=remove_after_an_epoch, daemon=True)
    remover.start()
    with warnings.catch_warnings(record=True) as seen, caplog.at_level("WARNING", logger="sparktrain.data.lease"):
        warnings.simplefilter("always")
        model = est.fit(small)
    remover.join()
    assert len(model.history) == 12
    texts = [str(w.message) for w in seen if "vanished from the store during the fit" in str(w.message)]
    assert len(texts) == 1 and "runId='gone' still resumes" in texts[0], [str(w.message) for w in seen]
    assert (store / "gone" / "run.json").exists()
    resumed = TorchEstimator(numWorkers=1, epochs=13, batchSize=32, labelCol="label", store=str(store), runId="gone",
                             checkpointEverySteps=50)
    resumed.show_progress = False
    assert len(resumed.fit(small).history) == 13  # resumed from the checkpoints written after the removal
