"""An Optuna search with pruning, unchanged, through a real Spark Connect server (sc://), from the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests._connect import connect_env, connect_server

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.connect, pytest.mark.torch, pytest.mark.slow]  # ~80 s: a Connect server and a search


_env = connect_env


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """A real Spark Connect server (local[2], 127.0.0.1, free port) in its own JVM; yields its sc:// URL."""
    with connect_server(tmp_path_factory.mktemp("tune_connect"), "sparktrain-tune-connect-test") as url:
        yield url


def _dataset(spark, dataset: Path) -> None:
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    df = spark.range(10_000).select(
        "id", (F.rand(3) * 2 - 1).cast("float").alias("x1"), (F.rand(4) * 2 - 1).cast("float").alias("x2"))
    df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2") + (F.rand(5) - 0.5) * 0.4) > 0.1)
    write_parquet(df.where("id % 5 > 0").drop("id").coalesce(1), str(dataset / "train"))
    write_parquet(df.where("id % 5 = 0").drop("id").coalesce(1), str(dataset / "validation"))


def test_optuna_search_with_asha_pruning_over_spark_connect(connect_url, spark, tmp_path):
    from mlflow import MlflowClient

    from sparktrain.data.run_store import RunStore

    dataset = tmp_path / "ds"
    _dataset(spark, dataset)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tune-connect",
        "data": {"label": "label"},
        "output": {"path": str(dataset)},
        "train": {"epochs": 3, "batch_size": 512, "num_workers": 1, "store": str(tmp_path / "store"), "seed": 7},
        "tune": {"engine": "optuna", "sampler": "random", "pruner": "asha", "max_trials": 4, "parallelism": 1,
                 # seed 7 draws bad, good, bad learning rates first; one at a time, the third (bad, after a
                 # good one) is pruned after its first epoch
                 "space": {"learning_rate": {"choice": [3.0e-2, 1.0e-6]}, "hidden_units": {"choice": [[16], [8]]}}},
        "tracking": {"uri": tracking, "experiment": "tune-connect", "model_name": "tune-connect-model",
                     "artifact_location": str(tmp_path / "artifacts")},
    }))
    proc = subprocess.run([sys.executable, "-m", "sparktrain", "tune", str(config), "--master", connect_url],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900, check=False)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-4000:]
    assert "new Optuna study 'tune-connect-" in err
    rows = {int(m.group(1)): (m.group(2), int(m.group(3)))
            for m in re.finditer(r"^\*?\s+(\d+)\s+(FINISHED|PRUNED|FAILED|KILLED)\s+[0-9.e-]+\s+[0-9.]+\s+(\d+)",
                                 out, re.MULTILINE)}
    assert sorted(rows) == [1, 2, 3, 4], out
    assert re.search(r"^\s+1\s+FINISHED .* 1e-06\s*$", out, re.MULTILINE), out
    assert re.search(r"^\*\s+2\s+FINISHED .* 0\.03\s*$", out, re.MULTILINE), out  # the best
    assert rows[3] == ("PRUNED", 1), out  # bad, and worse than trial 2 at the first rung
    assert all(epochs == 3 for status, epochs in rows.values() if status == "FINISHED")
    assert "optuna, mode single" in out and re.search(r", \d pruned\)", out), out

    # the verdict went through the store, not a socket: the pruned trial's run folder holds it
    store = tmp_path / "store"
    runs = [p.name for p in store.iterdir() if re.match(r"tune-[0-9a-f]{8}-t003$", p.name)]
    assert len(runs) == 1
    stop = RunStore(str(store), runs[0]).stop_requested()
    assert stop is not None and stop["epoch"] == 0 and stop["stop"] is True
    assert (store / "_studies").is_dir()

    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name("tune-connect")
    trials = client.search_runs([exp.experiment_id], "tags.`sparktrain.kind` = 'trial'")
    by_number = {int(r.data.tags["sparktrain.trial"]): r for r in trials}
    assert by_number[3].data.tags["sparktrain.status"] == "PRUNED" and by_number[3].info.status == "KILLED"
    assert by_number[3].data.metrics["epochs_ran"] == 1
    assert {r.data.tags["sparktrain.status"] for n, r in by_number.items() if rows[n][0] == "FINISHED"} == {"FINISHED"}


def test_a_connect_server_lost_mid_search_stops_the_search_with_an_error_and_keeps_the_study(spark, tmp_path):
    """Each trial's Connect calls used to retry a lost server for 10+ minutes, silently, and the search then went
    on to its next trial, which waited as long again.  Now the trial's calls give up in about a minute, the search
    stops with one error, and its running trials are recorded as interrupted (not spent) in the study and MLflow:
    the same search continues once the server is back."""
    import signal
    import time

    import optuna
    from mlflow import MlflowClient
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    dataset, store = tmp_path / "ds", tmp_path / "store"
    _dataset(spark, dataset)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tune-lost", "data": {"label": "label"}, "output": {"path": str(dataset)},
        "train": {"epochs": 400, "batch_size": 64, "num_workers": 1, "store": str(store)},
        "tune": {"engine": "optuna", "sampler": "random", "pruner": "none", "max_trials": 4, "parallelism": 2,
                 "study": "lost", "space": {"learning_rate": {"loguniform": [1.0e-3, 1.0e-1]}}},
        "tracking": {"uri": tracking, "experiment": "tune-lost", "artifact_location": str(tmp_path / "artifacts")},
    }))
    base = tmp_path / "server"
    base.mkdir()
    with connect_server(base, "sparktrain-tune-lost") as url:
        proc = subprocess.Popen([sys.executable, "-m", "sparktrain", "tune", str(config), "--master", url],
                                cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(store.glob("tune-*-t00*/checkpoints/*")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(1.0)  # kill it once a trial has trained
        time.sleep(3.0)
        os.killpg(int((base / "server.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert time.monotonic() - killed < 400, err[-3000:]  # bounded: each trial used to wait 10+ minutes
    assert "error: lost the Spark Connect server during trial" in err and "run the same search again" in err, \
        err[-3000:]
    journal = JournalStorage(JournalFileBackend(str(store / "_studies" / "lost.journal")))
    trials = optuna.load_study(study_name="lost", storage=journal).trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"], trials  # the two running ones, no third
    assert all(t.user_attrs["error"].startswith("interrupted:") for t in trials)  # not spent: they run again
    assert any("lost the Spark Connect server" in t.user_attrs["error"] for t in trials)
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("tune-lost").experiment_id])
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    assert sorted(r.info.status for r in runs if r.data.tags.get("sparktrain.kind") == "trial") == \
        ["KILLED", "KILLED"]
