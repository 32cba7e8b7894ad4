"""Resume mid-epoch with nothing redone but the steps after the last checkpoint, on 2 -> 1 and 1 -> 2 workers.

Real Spark (``local[2,2]``: a failed barrier stage is retried once), real torch / Keras, real
process deaths (``os._exit`` in the Python worker).  Each step's row ids are traced
(``SPARKTRAIN_TRACE_ROWS``); the rows whose updates are in the final model are the rows each
launch trained up to the checkpoint the next launch resumed from.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN_ROWS = 3200  # 2 ranks x 25 steps x 64 rows: no shard wraps, so every row once per epoch

_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {python!r})
from sparktrain.session import get_or_create_session
from sparktrain.errors import TrainingError
from sparktrain.train.estimator import {cls}

spark = get_or_create_session("local[2,2]")
out = {{}}

def fit(run_id, workers, fault=None, **kw):
    os.environ["SPARKTRAIN_TRACE_ROWS"] = "row_id:" + os.path.join({traces!r}, run_id)
    if fault:
        os.environ["SPARKTRAIN_FAULT_INJECT"] = fault
    params = dict(numWorkers=workers, epochs=2, batchSize=64, learningRate=0.01, labelCol="label",
                  store={store!r}, runId=run_id, logEverySteps=5, checkpointEverySteps=5,
                  excludeCols=["row_id"], shuffleBuffer=256, seed=3)
    params.update(kw)
    est = {cls}(**params)
    est.show_progress = False
    try:
        m = est.fit({dataset!r})
        return {{"history": m.history, "attempts": est.last_launch.attempts}}
    except TrainingError as e:
        return {{"error": str(e).splitlines()[0]}}
    finally:
        os.environ.pop("SPARKTRAIN_FAULT_INJECT", None)

for name, args in {scenarios}:
    out[name] = fit(*args[:2], **args[2])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def rows_dataset(spark, tmp_path_factory):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("resume") / "ds"
    df = spark.range(TRAIN_ROWS + 800).select(
        F.col("id").cast("int").alias("row_id"), (F.rand(7) * 2 - 1).cast("float").alias("x1"),
        (F.rand(8) * 2 - 1).cast("float").alias("x2"))
    df = df.withColumn("label", (F.col("x1") + F.col("x2") * 0.5 > 0).cast("float"))
    write_parquet(df.where(f"row_id < {TRAIN_ROWS}").coalesce(1), str(root / "train"), row_group_rows=1024)
    write_parquet(df.where(f"row_id >= {TRAIN_ROWS}").coalesce(1), str(root / "validation"))
    return str(root)


def _run(cls: str, dataset: str, tmp_path: Path, scenarios) -> dict:
    store, traces = str(tmp_path / "store"), str(tmp_path / "traces")
    script = _SCRIPT.format(python=str(REPO / "python"), cls=cls, store=store, traces=traces, dataset=dataset,
                            scenarios=repr(scenarios))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(line[0][len("RESULT "):])


def _events(store: Path, run_id: str):
    from sparktrain.train._executor.checkpoint import Checkpointer
    return Checkpointer(str(store), run_id).events()


def committed_rows(store: Path, traces: Path, run_id: str):
    """``({epoch: Counter(row ids) in the final model}, steps redone (rank 0), [(world, from_epoch, from_step)])``."""
    starts = [e for e in _events(store, run_id) if e["event"] in ("started", "resumed")]
    lines = []
    for f in sorted((traces / run_id).glob("*.jsonl")):
        lines += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    by_start = collections.defaultdict(list)
    for x in lines:
        by_start[(x["launch"], x["attempt"])].append(x)
    kept: dict = collections.defaultdict(collections.Counter)
    redone = 0
    for i, s in enumerate(starts):
        mine = by_start[(s["launch"], s["attempt"])]
        if i + 1 < len(starts):
            nxt = starts[i + 1]
            stop = (nxt["from_epoch"], nxt["from_step"])
        else:
            stop = (10 ** 9, 0)
        for x in mine:
            if (x["epoch"], x["step"]) <= stop or (x["epoch"] < stop[0]):
                kept[x["epoch"]].update(x["ids"])
            elif x["rank"] == 0:
                redone += 1
    return kept, redone, [(s["world_size"], s["from_epoch"], s["from_step"]) for s in starts]


def _global_batches(traces: Path, run_id: str, world: int = 0) -> dict:
    """``{(epoch, step): set of row ids}`` over all ranks of the launches with ``world`` ranks (0: all)."""
    out: dict = collections.defaultdict(set)
    for f in sorted((traces / run_id).glob("*.jsonl")):
        for x in (json.loads(line) for line in f.read_text().splitlines() if line.strip()):
            if not world or x["world"] == world:
                out[(x["epoch"], x["step"])].update(x["ids"])
    return dict(out)


def _check_every_row_once(kept) -> None:
    for epoch in (0, 1):
        counts = kept[epoch]
        assert sum(counts.values()) == TRAIN_ROWS and set(counts) == set(range(TRAIN_ROWS)), epoch


@pytest.mark.torch
def test_torch_mid_epoch_resume_and_elastic_world_size(rows_dataset, tmp_path):
    scenarios = [
        ("clean", ("clean", 2, {})),
        ("killed", ("killed", 2, {"fault": "1:1:12:exit"})),           # rank 1's Python worker dies
        ("ckpt_crash", ("ckpt_crash", 2, {"fault": "0:1:10:ckpt"})),   # rank 0 dies writing a checkpoint
        ("shrink_fail", ("shrink", 2, {"fault": "1:1:12:raise"})),     # fails on both attempts...
        ("shrink", ("shrink", 1, {})),                                  # ...then resumes on 1 worker
        ("grow_fail", ("grow", 1, {"fault": "0:1:12:raise"})),
        ("grow", ("grow", 2, {})),
    ]
    out = _run("TorchEstimator", rows_dataset, tmp_path, scenarios)
    store, traces = tmp_path / "store", tmp_path / "traces"
    clean = out["clean"]["history"]

    # a Python worker killed mid-epoch: back at the last checkpoint (step 10), 2 steps redone
    kept, redone, starts = committed_rows(store, traces, "killed")
    assert starts == [(2, 0, 0), (2, 1, 10)] and redone == 2 and out["killed"]["attempts"] == 2
    _check_every_row_once(kept)
    for a, b in zip(out["killed"]["history"], clean):  # the same run as without the crash
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-6)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)

    # a crash while writing the checkpoint at step 10: the half-written file is ignored, step 5's is used
    kept, redone, starts = committed_rows(store, traces, "ckpt_crash")
    assert starts == [(2, 0, 0), (2, 1, 5)] and redone == 5
    _check_every_row_once(kept)
    assert out["ckpt_crash"]["history"][-1]["val_loss"] == pytest.approx(clean[-1]["val_loss"], abs=1e-6)

    # 2 workers fail at epoch 1 step 12 twice; the run then continues on 1 worker from step 10
    assert "injected failure on rank 1" in out["shrink_fail"]["error"]
    kept, _, starts = committed_rows(store, traces, "shrink")
    assert starts == [(2, 0, 0), (2, 1, 10), (1, 1, 10)]
    _check_every_row_once(kept)
    assert len(out["shrink"]["history"]) == 2
    # 1 divides 2: the one rank trains both of the run's shards, so each global batch holds the rows it
    # had in the clean run (the rest of epoch 1 and, with more epochs, every later one)...
    clean_batches, shrunk_batches = _global_batches(traces, "clean"), _global_batches(traces, "shrink", world=1)
    assert shrunk_batches and all(ids == clean_batches[key] for key, ids in shrunk_batches.items())
    # ...and the run ends where the clean one does (gradients summed in another order: float noise only)
    for a, b in zip(out["shrink"]["history"], clean):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
    resumed = [e for e in _events(store, "shrink") if e["event"] == "resumed"][-1]
    assert resumed["batch_size"] == 128  # the global batch (2 x 64) is kept on 1 worker

    # 1 worker fails, 2 workers finish: the rest of epoch 1 re-sharded over 2 ranks
    kept, _, starts = committed_rows(store, traces, "grow")
    assert starts == [(1, 0, 0), (1, 1, 10), (2, 1, 10)]
    _check_every_row_once(kept)
    assert [e for e in _events(store, "grow") if e["event"] == "resumed"][-1]["batch_size"] == 32

    # checkpoints are pruned to the newest 2 plus the best epoch's
    names = sorted(p.name for p in (store / "killed" / "checkpoints").glob("ckpt-*.ckpt"))
    assert 2 <= len(names) <= 3
    assert not list((store / "ckpt_crash" / "checkpoints").glob("ckpt-*.tmp*"))


@pytest.mark.torch
@pytest.mark.slow
def test_torch_kill_mid_accumulation_in_bf16_resumes_with_nothing_skipped_or_repeated(rows_dataset, tmp_path):
    """4 micro-batches of 16 rows per optimizer step (64 rows, as above), bf16 autocast on CPU; rank 1's
    Python worker dies after the first micro-batch of step 12.  The retry resumes at the step-10 checkpoint
    (steps count optimizer steps), trains every row once, and ends where the uninterrupted bf16 run does."""
    kw = {"batchSize": 16, "accumulateSteps": 4, "precision": "bf16"}
    scenarios = [("clean", ("clean", 2, kw)), ("killed", ("killed", 2, {"fault": "1:1:12:micro", **kw}))]
    out = _run("TorchEstimator", rows_dataset, tmp_path, scenarios)
    kept, redone, starts = committed_rows(tmp_path / "store", tmp_path / "traces", "killed")
    assert starts == [(2, 0, 0), (2, 1, 10)] and redone == 2 and out["killed"]["attempts"] == 2
    _check_every_row_once(kept)
    for a, b in zip(out["killed"]["history"], out["clean"]["history"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-6)
    started = [e for e in _events(tmp_path / "store", "clean") if e["event"] == "started"][0]
    assert started["batch_size"] == 64 and started["global_batch"] == 128  # optimizer-step rows, not micro


@pytest.mark.tensorflow
@pytest.mark.slow
def test_keras_mid_epoch_resume_counts_every_row_once(rows_dataset, tmp_path):
    scenarios = [("clean", ("clean", 2, {})), ("killed", ("killed", 2, {"fault": "1:1:12:exit"}))]
    out = _run("KerasEstimator", rows_dataset, tmp_path, scenarios)
    kept, redone, starts = committed_rows(tmp_path / "store", tmp_path / "traces", "killed")
    assert starts == [(2, 0, 0), (2, 1, 10)] and redone == 2
    _check_every_row_once(kept)
    for a, b in zip(out["killed"]["history"], out["clean"]["history"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)


_TUNE = r"""
import json, os, sys
sys.path.insert(0, {python!r})
from sparktrain.config import parse_config
from sparktrain.session import get_or_create_session
from sparktrain.tune.search import run_search

spark = get_or_create_session("local[2,2]")
out = {{}}
for mode, fault in (("single", "0:1:12:exit"), ("distributed", "1:1:12:exit")):
    os.environ["SPARKTRAIN_FAULT_INJECT"] = fault  # the trial's worker dies once mid-epoch
    cfg = parse_config({{"name": "t", "data": {{"source": {dataset!r}, "label": "label"}},
                        "train": {{"num_workers": 2, "epochs": 2, "batch_size": 64, "store": {store!r} + "/" + mode,
                                  "checkpoint_every_steps": 5, "log_every_steps": 5, "seed": 3}},
                        "tune": {{"mode": mode, "max_trials": 1, "parallelism": 1, "algo": "random",
                                 "space": {{"learning_rate": {{"choice": [0.01]}}}}}},
                        "tracking": {{"enabled": False}}}})
    result = run_search(spark, cfg, {dataset!r})
    os.environ.pop("SPARKTRAIN_FAULT_INJECT")
    out[mode] = [t.status for t in result.trials]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.torch
@pytest.mark.slow
def test_tuning_trials_resume_where_they_stopped(rows_dataset, tmp_path):
    store = tmp_path / "store"
    script = _TUNE.format(python=str(REPO / "python"), dataset=rows_dataset, store=str(store))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = json.loads(line[0][len("RESULT "):])
    assert out == {"single": ["FINISHED"], "distributed": ["FINISHED"]}
    for mode, world in (("single", 1), ("distributed", 2)):
        (run_dir,) = [p for p in (store / mode).iterdir() if (p / "checkpoints" / "events").is_dir()
                      and not p.name.endswith("-plan")]
        events = _events(store / mode, run_dir.name)
        starts = [(e["event"], e["from_epoch"], e["from_step"], e["world_size"]) for e in events
                  if e["event"] in ("started", "resumed")]
        # checkpoints every 5 steps, the fault at step 12 of epoch 1: the retried trial continues at step 10
        assert starts == [("started", 0, 0, world), ("resumed", 1, 10, world)], (mode, starts)


class _SlotHolder:
    """A training callback that, at the end of epoch 0, starts another job holding one task slot ``seconds`` long.

    Its task queues behind the barrier stage and takes a slot when a rank's failure frees them.
    """

    def __init__(self, sc, group: str, seconds: float) -> None:
        import threading

        self.sc, self.group, self.seconds = sc, group, seconds
        self.started, self.done = threading.Event(), threading.Event()
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        import time

        seconds = self.seconds
        self.sc.setJobGroup(self.group, "a job holding one task slot", interruptOnCancel=True)
        self.started.set()
        try:
            self.outcome["rows"] = self.sc.parallelize([0], 1).map(lambda x: time.sleep(seconds) or x).collect()
        except Exception as exc:  # noqa: BLE001 - cancelled by stop()
            self.outcome["error"] = str(exc)[:200]
        self.done.set()

    def on_step(self, epoch, step, metrics):
        pass

    def on_epoch(self, epoch, metrics):
        import time

        if epoch == 0 and self.thread.ident is None:
            self.thread.start()
            self.started.wait(10)
            time.sleep(1.0)  # its task is queued behind the barrier stage

    def stop(self) -> None:
        self.sc.cancelJobGroup(self.group)
        if self.thread.ident is not None:
            self.thread.join(60)


@pytest.mark.torch
def test_elastic_run_continues_on_the_free_slots(spark, rows_dataset, tmp_path):
    """elastic=True: a rank fails while another job holds a slot; the run continues on 1 worker, every row once.

    ``local[2]``: rank 1 raises at epoch 1, step 12; a job that started waiting for a slot at the end
    of epoch 0 gets one of the two freed slots.  Spark's retry of the barrier stage then waits for two
    slots (without a timeout); the driver sees it, cancels it and relaunches on 1 worker from the
    checkpoint at step 10 (without that, this test waited for the holder's 120 s sleep and failed).
    """

    from sparktrain.train.estimator import TorchEstimator

    sc = spark.sparkContext
    holder = _SlotHolder(sc, "hold-a-slot", 120)

    store, traces = tmp_path / "store", tmp_path / "traces"
    os.environ["SPARKTRAIN_TRACE_ROWS"] = f"row_id:{traces}/elastic"
    os.environ["SPARKTRAIN_FAULT_INJECT"] = "1:1:12:raise"
    try:
        est = TorchEstimator(numWorkers=2, epochs=3, batchSize=64, learningRate=0.01, labelCol="label",
                             store=str(store), runId="elastic", logEverySteps=5, checkpointEverySteps=5,
                             excludeCols=["row_id"], shuffleBuffer=256, seed=3, elastic=True, minWorkers=1)
        est.show_progress = False
        est.setCallbacks([holder])
        model = est.fit(rows_dataset)
    finally:
        os.environ.pop("SPARKTRAIN_FAULT_INJECT", None)
        os.environ.pop("SPARKTRAIN_TRACE_ROWS", None)
        holder.stop()
    assert est.last_launch.world_sizes == [2, 1]
    assert [h["epoch"] for h in model.history] == [0, 1, 2]
    kept, _, starts = committed_rows(store, traces, "elastic")
    assert starts == [(2, 0, 0), (1, 1, 10)]
    for epoch in (0, 1, 2):  # the rest of epoch 1 re-sharded onto 1 rank, epoch 2 on 1 rank: every row once
        assert sum(kept[epoch].values()) == TRAIN_ROWS and set(kept[epoch]) == set(range(TRAIN_ROWS)), epoch
    resumed = [e for e in _events(store, "elastic") if e["event"] == "resumed"][-1]
    assert resumed["world_size"] == 1 and resumed["batch_size"] == 128
    assert model.history[-1]["val_loss"] < 0.5 and model.history[-1]["val_accuracy"] > 0.8


@pytest.mark.torch
def test_a_retry_that_never_gets_its_slots_ends_with_a_clear_error(spark, rows_dataset, tmp_path):
    """Not elastic: after a rank fails, another job holds one of the two slots; Spark's retry would wait forever.

    The wait is bounded by stallTimeout: the retry is cancelled (the other job is not) and the error
    names the slots needed and free, the rank's failure, the fixes and the run id to resume; the
    run's checkpoint stays in the store.
    """
    import time

    from sparktrain.errors import SlotsUnavailableError
    from sparktrain.train.estimator import TorchEstimator

    holder = _SlotHolder(spark.sparkContext, "hold-a-slot-2", 45)
    store = tmp_path / "store"
    os.environ["SPARKTRAIN_FAULT_INJECT"] = "1:1:12:raise"
    t0 = time.monotonic()
    try:
        est = TorchEstimator(numWorkers=2, epochs=3, batchSize=64, learningRate=0.01, labelCol="label",
                             store=str(store), runId="no-slots", logEverySteps=5, checkpointEverySteps=5,
                             excludeCols=["row_id"], shuffleBuffer=256, seed=3, stallTimeout=12.0)
        est.show_progress = False
        est.setCallbacks([holder])
        with pytest.raises(SlotsUnavailableError) as info:
            est.fit(rows_dataset)
        waited = time.monotonic() - t0
        time.sleep(2.0)  # a cancel of the other job would have ended it by now
        tracker = spark.sparkContext.statusTracker()
        holder_jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("hold-a-slot-2")]
        holder_running = not holder.done.is_set() and [j.status for j in holder_jobs if j] == ["RUNNING"]
    finally:
        os.environ.pop("SPARKTRAIN_FAULT_INJECT", None)
        holder.stop()  # ours to end (cancelled here: waiting out its 45 s cost half a minute of make test)
    err = info.value
    assert (err.needed, err.free, err.run_id) == (2, 1, "no-slots")
    assert 12.0 <= err.waited_s < 40.0 and waited < 45.0  # ended by stallTimeout, not by the holder's end
    text = str(err)
    assert "injected failure on rank 1" in text, text  # the rank's own failure comes first
    for words in ("2 task slots", "only 1 were free", "stallTimeout", "elastic=True", "minWorkers <= 1",
                  "runId='no-slots'"):
        assert words in text, (words, text)
    assert holder_running  # the other job was not cancelled: still running after the error
    assert any((store / "no-slots" / "checkpoints").rglob("*")), "the run's checkpoint is kept to resume from"
