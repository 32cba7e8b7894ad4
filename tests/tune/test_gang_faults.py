"""A reused gang under faults, on local[2,2] (a failed barrier stage is retried once), in its own process:
a dead rank's trial resumes on the retried stage; a hung trial is cut off at its timeout and the next trial
gets a new gang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.torch, pytest.mark.slow]  # ~70 s: a session of its own and three searches

_DATA = r'''
df = spark.range(20000).select("id", (F.rand(3) * 2 - 1).cast("float").alias("x1"),
                               (F.rand(4) * 2 - 1).cast("float").alias("x2"))
df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2")) > 0.1)
write_parquet(df.where("id % 5 > 0").drop("id").coalesce(1), root + "/ds/train")
write_parquet(df.where("id % 5 = 0").drop("id").coalesce(1), root + "/ds/validation")
'''.strip()  # the searches' dataset, written by each script's session

_SCRIPT = r'''
import json, os, sys
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.config import parse_config
from sparktrain.data.manifest import write_parquet
from sparktrain.data.run_store import RunStore
from sparktrain.session import get_or_create_session
from sparktrain.tune.search import run_search

spark = get_or_create_session("local[2,2]", conf={{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}})
root = {root!r}
{data}

def search(name, fault, stall=120, **tune):
    os.environ["SPARKTRAIN_FAULT_INJECT"] = fault
    cfg = parse_config({{"data": {{"label": "label"}}, "tracking": {{"enabled": False}},
        "train": {{"epochs": 1, "batch_size": 512, "num_workers": 2, "store": root + "/store", "seed": 2,
                  "checkpoint_every_steps": 2, "stall_timeout_s": stall}},
        "tune": {{"mode": "distributed", "max_trials": 4, "parallelism": 1, "algo": "random",
                 "space": {{"learning_rate": {{"loguniform": [1.0e-3, 3.0e-2]}}, "epochs": {{"choice": [1, 2]}}}},
                 **tune}}}})
    result = run_search(spark, cfg, root + "/ds")
    prefix = result.trials[0].job_group.rsplit("-trial-", 1)[0]
    out = []
    for t in result.trials:
        events = RunStore(root + "/store", f"{{prefix}}-t{{t.number:03d}}").read_events()
        out.append({{"number": t.number, "status": t.status, "epochs": t.params["epochs"], "ran": t.epochs,
                    "error": t.error, "starts": [(e["event"], e.get("attempt")) for e in events
                                                 if e["event"] in ("started", "resumed")]}})
    print("RESULT", name, json.dumps(out), flush=True)

search("warm", "")  # the Python workers import torch once
search("dead", "1:1:3:exit")  # rank 1's worker dies in epoch 2 of a 2-epoch trial (first attempt only)
search("hang", "1:1:3:hang", trial_timeout_s=20)  # rank 1 blocks for good in epoch 2 of a 2-epoch trial
search("stall", "1:1:3:hang", stall=8)  # the same, caught by the stall watchdog
'''


def test_a_dead_rank_resumes_its_trial_and_a_hung_trial_is_killed(tmp_path):
    script = _SCRIPT.format(python=str(REPO / "python"), root=str(tmp_path), data=_DATA)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
    results = {line.split()[1]: json.loads(line.split(" ", 2)[2]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")}
    assert set(results) == {"warm", "dead", "hang", "stall"}, proc.stdout[-3000:] + proc.stderr[-6000:]
    # seed 2 draws epochs 1, 2, 1, 1: trial 2 is the one the fault hits
    assert [t["epochs"] for t in results["dead"]] == [1, 2, 1, 1]
    dead = {t["number"]: t for t in results["dead"]}
    why = {n: (t["status"], t["error"]) for n, t in dead.items()}
    assert all(t["status"] == "FINISHED" for t in dead.values()), (why, proc.stderr[-6000:])
    assert dead[2]["ran"] == 2 and dead[2]["starts"] == [["started", 0], ["resumed", 1]]  # the retried stage
    hang = {t["number"]: t for t in results["hang"]}
    assert hang[2]["status"] == "KILLED" and "timed out after 20 s" in hang[2]["error"], hang
    assert "gang" in hang[2]["error"]
    assert hang[3]["status"] == hang[4]["status"] == "FINISHED"  # on a new gang
    # probe G: the stalled rank is named, not its waiting peer's gloo error (which came first and was raised)
    stall = {t["number"]: t for t in results["stall"]}
    assert stall[2]["status"] == "FAILED" and "TrainingStalledError" in stall[2]["error"], stall[2]
    assert "rank 1 made no progress" in stall[2]["error"], stall[2]
    assert stall[3]["status"] == stall[4]["status"] == "FINISHED"


_INTERRUPT_SCRIPT = r'''
import glob, json, os, signal, sys, threading, time
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.config import parse_config
from sparktrain.data.manifest import write_parquet
from sparktrain.data.run_store import RunStore
from sparktrain.session import get_or_create_session
from sparktrain.tune.search import run_search

spark = get_or_create_session("local[2]", conf={{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}})
root = {root!r}
{data}
EPOCHS = 60

def events(folder):
    return RunStore(root + "/store", os.path.basename(folder)).read_events()

def finished(evs):
    return [e["epoch"] for e in evs if e["event"] == "epoch_finished"]

def interrupt_once_training():  # Ctrl-C once trial 1's gang has finished an epoch
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = glob.glob(root + "/store/tune-*-t001")
        if runs and finished(events(runs[0])):
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.2)

cfg = parse_config({{"data": {{"label": "label"}}, "tracking": {{"enabled": False}},
    "train": {{"epochs": EPOCHS, "batch_size": 512, "num_workers": 2, "store": root + "/store", "seed": 2}},
    "tune": {{"mode": "distributed", "max_trials": 2, "parallelism": 1, "algo": "random",
             "space": {{"learning_rate": {{"loguniform": [1.0e-3, 3.0e-2]}}}}}}}})
threading.Thread(target=interrupt_once_training, daemon=True).start()
try:
    run_search(spark, cfg, root + "/ds")
    print("RESULT", json.dumps({{"interrupted": False}}), flush=True)
except KeyboardInterrupt:
    sc = spark.sparkContext
    active_tasks = sum(s.numActiveTasks for s in (sc.statusTracker().getStageInfo(i)
                                                   for i in sc.statusTracker().getActiveStageIds()) if s)
    run = glob.glob(root + "/store/tune-*-t001")[0]
    before = events(run)
    time.sleep(2.0)
    after = events(run)
    print("RESULT", json.dumps({{"interrupted": True, "active_jobs": sc.statusTracker().getActiveJobsIds(),
                                "active_tasks": active_tasks, "epochs": finished(before), "planned": EPOCHS,
                                "events_before": len(before), "events_after": len(after)}}), flush=True)
'''


def test_an_interrupted_distributed_search_stops_its_gang_before_it_raises(tmp_path):
    """Ctrl-C during a trial on a reused gang: the gang's stage (in a job group of its own, not the trial's) is
    cancelled and its tasks have ended when KeyboardInterrupt reaches the caller. Before, the search waited for
    the running trial to train all its epochs, and only then closed the gang."""
    script = _INTERRUPT_SCRIPT.format(python=str(REPO / "python"), root=str(tmp_path), data=_DATA)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    lines = [json.loads(x.split(" ", 1)[1]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = lines[0]
    assert out["interrupted"] is True
    assert out["active_jobs"] == [] and out["active_tasks"] == 0
    assert 1 <= len(out["epochs"]) < out["planned"], out  # stopped mid-trial, not after all its epochs
    assert out["events_after"] == out["events_before"]  # no rank wrote anything after the raise
    assert "trial 1 was interrupted" in proc.stderr


_CAPACITY_SCRIPT = r'''
import glob, json, os, sys
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.config import parse_config
from sparktrain.data.manifest import write_parquet
from sparktrain.errors import SearchStoppedError
from sparktrain.session import get_or_create_session
from sparktrain.tune.search import run_search

spark = get_or_create_session({master!r}, conf=json.loads({conf!r}))
root = {root!r}
{data}
cfg = parse_config({{"data": {{"label": "label"}}, "tracking": {{"enabled": False}},
    "train": {{"epochs": 400, "batch_size": 512, "num_workers": 2, "store": root + "/store", "seed": 2,
              "stall_timeout_s": 20}},
    "tune": {{"engine": "optuna", "sampler": "random", "pruner": "none", "study": "capacity", "mode": "distributed",
             "max_trials": 3, "parallelism": 1, "space": {{"learning_rate": {{"loguniform": [1.0e-3, 3.0e-2]}}}}}}}})
print("SEARCH", flush=True)
try:
    run_search(spark, cfg, root + "/ds")
    out = {{"error": None}}
except SearchStoppedError as exc:
    out = {{"error": type(exc).__name__, "message": str(exc)}}
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
journal = JournalStorage(JournalFileBackend(root + "/store/_studies/capacity.journal"))
out["trials"] = [(t.state.name, t.user_attrs.get("error", "")) for t in
                 optuna.load_study(study_name="capacity", storage=journal).trials]
print("RESULT", json.dumps(out), flush=True)
'''


@pytest.mark.cluster
def test_a_search_that_loses_a_worker_stops_with_an_error_and_keeps_its_budget(tmp_path):
    """Probe G: after a Worker died, every trial left failed at once on Spark's SPARK-24819 slot check, each one
    counted against max_trials, so the persistent study was spent and its rerun refused.  Now the search waits a
    bounded time for the slots, then stops with a SearchStoppedError that says so; the trial is recorded as
    interrupted (not spent) and no other trial is started."""
    from sparktrain.data.run_store import RunStore
    from tests.test_cluster import kill_a_worker_mid_run

    def trained() -> bool:
        runs = [p.name for p in (tmp_path / "store").glob("tune-*-t001")]
        return bool(runs) and any(e["event"] == "epoch_finished"
                                  for e in RunStore(str(tmp_path / "store"), runs[0]).read_events())

    result, err, ended = kill_a_worker_mid_run(
        tmp_path, lambda master, conf: _CAPACITY_SCRIPT.format(python=str(REPO / "python"), master=master,
                                                               conf=conf, root=str(tmp_path), data=_DATA), trained)
    assert result["error"] == "SearchStoppedError", (result, err[-6000:])
    assert "a trial needs: an executor was lost and not replaced" in result["message"] or \
        "SPARK-24819" in result["message"], result
    assert "run the same search again" in result["message"]
    assert len(result["trials"]) == 1, result["trials"]  # no trial burnt on the missing slots
    state, error = result["trials"][0]
    assert state == "FAIL" and error.startswith("interrupted: "), result["trials"]  # not counted: it runs again
    assert ended < 300
