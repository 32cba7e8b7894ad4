"""Faults and their designed outcomes, measured in one run next to a clean fit.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/faults.py [--stall-timeout 20] [--no-flights]

One ``local[2,2]`` session (a failed barrier stage is retried once) with
``spark.driver.maxResultSize=1m`` for every row.  Rows:

* **foreign output folder**: ``output.path`` on a folder holding a user's file;
* **rank stalled**: rank 1 blocks for good at step 20 (``stallTimeout`` = 20 s);
* **tracking server killed**: a real ``mlflow server`` dies at epoch 2 of 6;
* **oversized model**: a 2+ MB network under ``maxResultSize=1m``;
* **kill -9 mid-epoch**: rank 1's Python worker dies at epoch 1, step 22 (checkpoints every 10 steps);
* **shrink 2 -> 1**: 2 workers fail at epoch 1, step 22; the run resumes on 1 worker;
* **kill -9, store in S3**: the kill -9 row with the dataset and the store in S3 (moto's server on
  127.0.0.1, reached through ``AWS_ENDPOINT_URL``; tests/_s3.py): back in <= 5 s, 0 rows skipped, 0 repeated;
* **torn newest checkpoint**: rank 0 dies leaving the checkpoint of epoch 1, step 20 truncated under its
  final name; the retry skips it (a warning, and the ``resumed`` event lists it) and resumes from step 10;
* **disk full in a checkpoint**: the store's writes raise ENOSPC (tests/_faultfs.py) during the third
  checkpoint: a ``StoreWriteError`` naming the path, no temporary file left, the previous checkpoint intact;
* **two jobs on one runId**: a second fit with the same ``runId`` starts while the first trains: it is refused
  (``LeaseHeldError`` naming the holder) and the first finishes every epoch with no row skipped or repeated;
* **two preprocess jobs on one output.path**: likewise; the first's dataset is committed and readable, the
  second left nothing behind;
* **300 progress clients: no false stall**: 300 simulated ranks (the real reporter and heartbeat, in 4
  processes, ``tests/train/_ranks.py``) report to one progress server; every connection is cut for 9 s,
  longer than the 8 s ``stallTimeout``: every rank must come back with nothing lost, and the watchdog (told by
  the status-tracker hook that the tasks run, as Spark would) must not declare a stall.

Each row prints the seconds from the fault to a clear error or to training
again, whether anything was lost, and where the model is; the resume rows
also count rows skipped / repeated (by row id) and steps redone, and compare
the final ``val_loss`` with the clean run; the same clean fit with another
seed shows how far two runs that only differ in init and data order land.  With ``--flights`` (default) the
checkpoint overhead is measured on the flights job: samples/s with
checkpoints every 50 steps and with the default cadence, against none.
Results go to ``work/bench/faults.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))  # tests.train._ranks, tests.train.test_resume
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TRAIN_ROWS = 6400  # 2 ranks x 50 steps x 64 rows
INTERVAL = 10
EPOCHS = 5


def _store_events(store: Path) -> List[List[Dict[str, Any]]]:
    """Every run's event log in a local store (one object per event: ``<run>/checkpoints/events/``)."""
    from sparktrain.data.run_store import RunStore

    return [RunStore(str(store), d.parent.parent.name).read_events() for d in store.glob("*/checkpoints/events")]


def _dataset(spark, root: Path) -> str:
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    df = spark.range(TRAIN_ROWS + 1600).select(
        F.col("id").cast("int").alias("row_id"), (F.rand(7) * 2 - 1).cast("float").alias("x1"),
        (F.rand(8) * 2 - 1).cast("float").alias("x2"))
    noisy = F.col("x1") + 0.5 * F.col("x2") + (F.rand(9) - 0.5) * 0.6  # a plateau val_loss, not a race to 0
    df = df.withColumn("label", (noisy > 0).cast("float"))
    write_parquet(df.where(f"row_id < {TRAIN_ROWS}").coalesce(1), str(root / "train"), row_group_rows=1024)
    write_parquet(df.where(f"row_id >= {TRAIN_ROWS}").coalesce(1), str(root / "validation"))
    return str(root)


def _fit(path: str, store: str, run_id: str, workers: int, traces: str, fault: str = "", **kw: Any):
    from sparktrain.errors import TrainingError
    from sparktrain.train.estimator import TorchEstimator

    os.environ["SPARKTRAIN_TRACE_ROWS"] = f"row_id:{traces}/{run_id}"
    if fault:
        os.environ["SPARKTRAIN_FAULT_INJECT"] = fault
    params = dict(numWorkers=workers, epochs=EPOCHS, batchSize=64, learningRate=0.01, labelCol="label", store=store,
                  runId=run_id, logEverySteps=5, checkpointEverySteps=INTERVAL, excludeCols=["row_id"],
                  hiddenUnits=[32, 32], seed=3)
    params.update(kw)
    est = TorchEstimator(**params)
    est.show_progress = False
    try:
        return est.fit(path), None
    except TrainingError as exc:
        return None, exc
    finally:
        os.environ.pop("SPARKTRAIN_FAULT_INJECT", None)
        os.environ.pop("SPARKTRAIN_TRACE_ROWS", None)


def _resume_row(name: str, store: Path, traces: Path, run_id: str, clean_val: float, val: float) -> Dict[str, Any]:
    from tests.train.test_resume import committed_rows  # the same accounting the tests use

    kept, redone, _ = committed_rows(store, traces, run_id)
    full = collections.Counter(range(TRAIN_ROWS))
    skipped = repeated = 0
    for epoch in range(EPOCHS):
        counts = kept.get(epoch, collections.Counter())
        skipped += sum((full - counts).values())
        repeated += sum((counts - full).values())
    lines = []
    for f in sorted((traces / run_id).glob("*.jsonl")):
        lines += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    by = collections.defaultdict(list)
    for x in lines:
        by[(x["launch"], x["attempt"])].append(x["t"])
    spans = sorted((min(v), max(v)) for v in by.values())
    back = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return {"row": name, "fault_to_training_s": round(max(back), 2) if back else None, "steps_redone": redone,
            "interval": INTERVAL, "rows_skipped": skipped, "rows_repeated": repeated, "val_loss": val,
            "clean_val_loss": clean_val, "val_loss_rel": abs(val - clean_val) / clean_val, "lost": skipped > 0}


def _s3_server():
    """moto's S3 server (tests/_s3.py), its variables set for this process before Spark starts; None without moto."""
    try:
        from _s3 import MotoS3
        server = MotoS3().start()
    except ImportError:
        return None
    os.environ.update(server.env())
    return server


def _s3_kill(s3, path: str, traces: Path, clean_val: float) -> Dict[str, Any]:
    """kill -9 of rank 1's Python worker with the dataset and the store in S3: the retried stage resumes."""
    if s3 is None:
        return {"row": "kill -9, store in S3", "outcome": "skipped: moto[server] is not installed", "lost": False}
    dataset, store = s3.prefix("ds"), s3.prefix("store")
    s3.upload(path, dataset)
    killed, err = _fit(dataset, store, "s3-killed", 2, str(traces), fault="1:1:22:exit")
    if killed is None:
        return {"row": "kill -9, store in S3", "outcome": f"failed: {str(err).splitlines()[0]}", "lost": True,
                "silent_hang": False}
    row = _resume_row("kill -9, store in S3", store, traces, "s3-killed", clean_val, killed.history[-1]["val_loss"])
    row["lost"] = row["lost"] or row["rows_repeated"] > 0
    row["model"] = f"{store}/s3-killed/model/network.ckpt"
    return row


def _torn_checkpoint(path: str, store: Path, traces: Path, clean_val: float) -> Dict[str, Any]:
    """Rank 0 leaves the newest checkpoint truncated and dies: the retry falls back to the one before."""
    from sparktrain.train._executor.checkpoint import Checkpointer

    torn, err = _fit(path, str(store), "torn", 2, str(traces), fault="0:1:20:torn")
    if torn is None:
        return {"row": "torn newest checkpoint", "outcome": f"failed: {str(err).splitlines()[0]}", "lost": True,
                "silent_hang": False}
    row = _resume_row("torn newest checkpoint", store, traces, "torn", clean_val, torn.history[-1]["val_loss"])
    resumed = [e for e in Checkpointer(str(store), "torn").events() if e["event"] == "resumed"]
    skipped = resumed[0].get("skipped_checkpoints") if resumed else None
    row["outcome"] = (f"resumed from epoch {resumed[0]['from_epoch']}, step {resumed[0]['from_step']}, skipping "
                      f"checkpoint {skipped}") if resumed else "never resumed (!)"
    row["lost"] = row["lost"] or row["rows_repeated"] > 0 or not skipped
    return row


def _disk_full(base: Path) -> Dict[str, Any]:
    """ENOSPC from the store's writer during a checkpoint: a clear error, the previous checkpoint intact."""
    from pyarrow import fs as pafs

    from _faultfs import FullDisk
    from sparktrain.data.run_store import Store
    from sparktrain.errors import StoreWriteError
    from sparktrain.train._executor.checkpoint import Checkpointer

    root = base / "store-full"
    disk = FullDisk(pafs.LocalFileSystem(), room=1 << 30)
    ck = Checkpointer(Store(str(root), filesystem=disk), "full")
    state = os.urandom(1 << 20)
    for seq in (1, 2):
        ck.save(seq, {"epoch": seq}, state, keep=2)
    disk.room = 1 << 19  # half of the next checkpoint fits
    t0 = time.perf_counter()
    try:
        ck.save(3, {"epoch": 3}, state, keep=2)
        return {"row": "disk full in a checkpoint", "outcome": "no error (!)", "lost": True, "silent_hang": False}
    except StoreWriteError as exc:
        seconds = time.perf_counter() - t0
        names = sorted(p.name for p in (root / "full" / "checkpoints").iterdir())
        latest = ck.load_latest()
        intact = latest is not None and latest[0] == 2 and latest[2] == state
        named = str(root / "full" / "checkpoints" / "ckpt-000003.ckpt") in str(exc)
        return {"row": "disk full in a checkpoint", "fault_to_error_s": round(seconds, 3), "goal_s": 5.0,
                "outcome": f"StoreWriteError naming the path ({named}); left {names}; previous intact: {intact}",
                "lost": not (intact and named and not [n for n in names if n.startswith(".tmp")]),
                "silent_hang": False, "model": "checkpoint 2"}


def _stall(path: str, store: str, timeout: float) -> Dict[str, Any]:
    from sparktrain.errors import TrainingStalledError
    from sparktrain.train.estimator import TorchEstimator

    os.environ["SPARKTRAIN_FAULT_INJECT"] = "1:0:20:hang"
    est = TorchEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=store, stallTimeout=timeout,
                         excludeCols=["row_id"], logEverySteps=5)
    est.show_progress = False
    try:
        est.fit(path)
        return {"row": "rank stalled", "outcome": "no error (!)", "silent_hang": True, "lost": False}
    except TrainingStalledError as exc:
        raised = time.time()
        info = exc.info
        return {"row": "rank stalled", "fault_to_error_s": round(raised - info["progress_at"], 1),
                "goal_s": timeout + 10, "outcome": f"TrainingStalledError naming rank {info['rank']} "
                f"(epoch {info['epoch']}, step {info['step']}, {info['phase']})", "silent_hang": False,
                "lost": False, "model": "last checkpoint in the store"}
    finally:
        os.environ.pop("SPARKTRAIN_FAULT_INJECT", None)


def _foreign_output(spark, raw: str, base: Path) -> Dict[str, Any]:
    from sparktrain.config import parse_config
    from sparktrain.errors import SparktrainError
    from sparktrain.job import run_preprocess

    folder = base / "reports"
    folder.mkdir()
    (folder / "q3.pdf").write_bytes(b"a user's report")
    cfg = parse_config({"name": "foreign", "data": {"source": raw, "label": "label"},
                        "features": [{"name": "a", "type": "numeric"}], "output": {"path": str(folder)}})
    t0 = time.perf_counter()
    try:
        run_preprocess(spark, cfg)
        outcome, ok = "written (!)", False
    except SparktrainError as exc:
        outcome, ok = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}", True
    survived = (folder / "q3.pdf").is_file() and (folder / "q3.pdf").read_bytes() == b"a user's report"
    return {"row": "foreign output folder", "fault_to_error_s": round(time.perf_counter() - t0, 2),
            "outcome": outcome, "lost": not survived, "silent_hang": False, "refused": ok}


def _outage(spark, raw: str, base: Path) -> Dict[str, Any]:
    from sparktrain.config import parse_config
    from sparktrain.errors import TrackingError
    from sparktrain.job import run_job
    from sparktrain.track.server import MlflowServer

    server = MlflowServer(f"sqlite:///{base / 'mlflow.db'}", str(base / "artifacts"),
                          log_path=str(base / "server.log")).start()
    store = base / "store-outage"
    cfg = parse_config({"name": "outage", "data": {"source": raw, "label": "label"},
                        "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}],
                        "output": {"path": str(base / "dataset-outage")},
                        "train": {"num_workers": 2, "epochs": 6, "batch_size": 64, "store": str(store),
                                  "compare_baseline": False},
                        "tracking": {"uri": server.url, "experiment": "outage", "model_name": "outage"}})
    killed: Dict[str, float] = {}

    def killer() -> None:
        while not killed:
            for events in _store_events(store):
                if any(e.get("event") == "epoch_finished" and e.get("epoch") == 1 for e in events):
                    server.stop(timeout=5)
                    killed["at"] = time.time()
                    return
            time.sleep(0.1)

    threading.Thread(target=killer, daemon=True).start()
    try:
        run_job(cfg, stages=("preprocess", "train"), spark=spark)
        return {"row": "tracking server killed", "outcome": "no error (!)", "lost": True, "silent_hang": False}
    except TrackingError as exc:
        raised = time.time()
        ends = [e for events in _store_events(store) for e in events]
        trained = max(e["time"] for e in ends if e.get("event") == "epoch_finished")
        folder = str(exc).split("the store at ")[1].split(". ")[0]
        return {"row": "tracking server killed", "fault_to_error_s": round(raised - killed["at"], 1),
                "after_training_s": round(raised - trained, 1), "goal_s": 60.0, "silent_hang": False,
                "lost": not (Path(folder) / "bundle.json").is_file(), "model": folder,
                "outcome": "TrackingError with 'sparktrain register --from-store'"}
    finally:
        server.stop()


def _oversized(spark, raw: str, base: Path) -> Dict[str, Any]:
    from sparktrain.config import parse_config
    from sparktrain.job import run_job

    cfg = parse_config({"name": "big", "data": {"source": raw, "label": "label"},
                        "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}],
                        "output": {"path": str(base / "dataset-big")},
                        "train": {"num_workers": 2, "epochs": 1, "hidden_units": [1024, 512],
                                  "store": str(base / "store-big"), "compare_baseline": False},
                        "tracking": {"uri": f"sqlite:///{base / 'big.db'}", "model_name": "big"}})
    t0 = time.perf_counter()
    result = run_job(cfg, stages=("preprocess", "train"), spark=spark)
    mb = len(result.train.model.model_bytes) / 2 ** 20
    return {"row": "oversized model", "job_s": round(time.perf_counter() - t0, 1), "model_mb": round(mb, 2),
            "outcome": f"registered version {result.tracking.model.version} (maxResultSize 1m)", "lost": False,
            "silent_hang": False, "model": f"{cfg.train.store}/<run>/model"}


def _overhead(spark, base: Path, repeats: int) -> Dict[str, Any]:
    """Flights samples/s: no mid-epoch checkpoints, the default cadence (30 s), every 50 steps."""
    from sparktrain.config import load_config
    from sparktrain.job import run_preprocess
    from sparktrain.train.estimator import TorchEstimator

    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=["tracking.enabled=false",
                                                                 f"output.path={base / 'flights'}"])
    path = run_preprocess(spark, cfg).path
    settings = {"none": dict(checkpointEverySeconds=None), "default (30 s)": {},
                "every 50 steps": dict(checkpointEverySteps=50, checkpointEverySeconds=None)}
    runs: Dict[str, List[float]] = {k: [] for k in settings}
    for i in range(repeats + 1):
        for name, kw in settings.items():
            est = TorchEstimator(numWorkers=2, epochs=2, batchSize=512, labelCol="late", learningRate=0.002,
                                 store=str(base / "store-overhead"), **kw)
            est.show_progress = False
            m = est.fit(path)
            if i:  # the first round warms up
                runs[name].append(statistics.mean(h["samples_per_s"] for h in m.history))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"runs": runs, "median": med, "ratio_default": med["default (30 s)"] / med["none"],
            "ratio_every_50": med["every 50 steps"] / med["none"]}


def _wait_until(condition, limit: float = 120.0) -> bool:
    end = time.monotonic() + limit
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _second_job_refused(run, target: str, what: str) -> Dict[str, Any]:
    """Run ``run()`` (the second job) while the first holds the lease on ``target``: it must be refused."""
    from sparktrain.errors import LeaseHeldError

    t0 = time.perf_counter()
    try:
        run()
        return {"outcome": "ran (!)", "refused": False, "fault_to_error_s": round(time.perf_counter() - t0, 2)}
    except LeaseHeldError as exc:
        holder = exc.holder
        return {"outcome": f"LeaseHeldError: {what} in use by host {holder.get('host')} pid {holder.get('pid')}",
                "refused": True, "fault_to_error_s": round(time.perf_counter() - t0, 2)}


def _two_fits_one_run(path: str, store: Path, traces: Path, clean_val: float) -> Dict[str, Any]:
    """Two real fits on one runId: the second is refused, the first trains every epoch, nothing lost."""
    from tests.train.test_resume import committed_rows

    from sparktrain.train.estimator import TorchEstimator

    run_id = "shared"
    first: Dict[str, Any] = {}

    def fit_first() -> None:
        first["model"], first["error"] = _fit(path, str(store), run_id, 2, str(traces))

    thread = threading.Thread(target=fit_first, daemon=True)
    thread.start()
    started = _wait_until(lambda: (store / run_id / "run.json").is_file() or not thread.is_alive())

    def fit_second() -> None:
        est = TorchEstimator(numWorkers=2, epochs=EPOCHS, batchSize=64, labelCol="label", store=str(store),
                             runId=run_id, excludeCols=["row_id"], hiddenUnits=[32, 32], seed=3)
        est.show_progress = False
        est.fit(path)

    row = _second_job_refused(fit_second, str(store / run_id), "runId") if started and thread.is_alive() else \
        {"outcome": "the first job ended before the second started (not measured)", "refused": False}
    thread.join(timeout=900)
    model = first.get("model")
    kept, _, _ = committed_rows(store, traces, run_id)
    full = collections.Counter(range(TRAIN_ROWS))
    skipped = sum(sum((full - kept.get(e, collections.Counter())).values()) for e in range(EPOCHS))
    repeated = sum(sum((kept.get(e, collections.Counter()) - full).values()) for e in range(EPOCHS))
    done = model is not None and len(model.history) == EPOCHS
    val = model.history[-1]["val_loss"] if done else float("nan")
    row.update({"row": "two jobs on one runId", "silent_hang": thread.is_alive(),
                "lost": not (done and row["refused"]) or skipped > 0 or repeated > 0,
                "model": f"first: {len(model.history) if model else 0}/{EPOCHS} epochs, rows skipped {skipped}, "
                         f"repeated {repeated}, val_loss {val:.4f} (clean {clean_val:.4f})"})
    return row


def _two_preprocess_one_output(spark, raw: str, base: Path) -> Dict[str, Any]:
    """Two real preprocess jobs on one output.path: the second is refused, the first commits a readable dataset."""
    from sparktrain.config import parse_config
    from sparktrain.data.lease import lease_path
    from sparktrain.data.manifest import read_manifest
    from sparktrain.job import run_preprocess

    out = base / "shared_output"
    cfg = parse_config({"name": "shared", "data": {"source": raw, "label": "label"},
                        "features": [{"name": "a", "type": "numeric"}, {"name": "b", "type": "numeric"}],
                        "output": {"path": str(out)}})
    first: Dict[str, Any] = {}

    def first_job() -> None:
        try:
            first["result"] = run_preprocess(spark, cfg)
        except Exception as exc:  # reported in the row
            first["error"] = exc

    thread = threading.Thread(target=first_job, daemon=True)
    thread.start()
    started = _wait_until(lambda: os.path.exists(lease_path(str(out))) or not thread.is_alive())
    row = _second_job_refused(lambda: run_preprocess(spark, cfg), str(out), "output.path") \
        if started and thread.is_alive() else \
        {"outcome": "the first job ended before the second started (not measured)", "refused": False}
    thread.join(timeout=900)
    result = first.get("result")
    readable = False
    if result is not None:
        manifests = {s: read_manifest(str(out / s)) for s in ("train", "validation", "test")}
        readable = all(m is not None and m["num_rows"] == result.row_counts[s] for s, m in manifests.items())
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    clean = result is not None and left == sorted(["_manifest.json", Path(result.generation).name])
    row.update({"row": "two preprocess, one output", "silent_hang": thread.is_alive(),
                "lost": not (readable and clean and row["refused"]),
                "model": f"first: {sum(result.row_counts.values()) if result else 0} rows committed, "
                         f"{'readable' if readable else 'NOT readable'}; output holds {left}"})
    return row


def _progress_clients(ranks: int = 300, cut_s: float = 9.0, timeout: float = 8.0) -> Dict[str, Any]:
    """``ranks`` simulated ranks against one progress server, every connection cut for ``cut_s`` > ``timeout``."""
    import io

    from sparktrain.train.progress import ProgressServer
    from sparktrain.train.watchdog import StallWatchdog
    from tests.train._ranks import start

    stalls: List[Dict[str, Any]] = []
    epochs: collections.Counter = collections.Counter()
    with ProgressServer("127.0.0.1", stream=io.StringIO(), ranks=ranks) as server:
        server.listeners.append(lambda e: epochs.update([e["rank"]]) if e.get("type") == "epoch" else None)
        dog = StallWatchdog(ranks, timeout, on_stall=stalls.append, poll=0.2, task_state=lambda rank: "RUNNING")
        server.listeners.append(dog)
        procs = start(server.address, server.token, ranks, seconds=cut_s + 25.0)
        try:
            deadline = time.monotonic() + 120
            while len(dog.ranks) < ranks and time.monotonic() < deadline:
                time.sleep(0.1)
            server.drop_connections(refuse_s=cut_s)
            cut = time.time()
            while time.monotonic() < deadline and not all(s.get("seen", 0) > cut + cut_s
                                                          for s in list(dog.ranks.values())):
                time.sleep(0.1)
            back_s = time.time() - cut - cut_s
            done = [json.loads(line) for p in procs for line in p.communicate(timeout=120)[0].splitlines()]
        finally:
            for p in procs:
                p.kill()
            dog.close()
    sent = {d["rank"]: d["epochs"] for d in done}
    missing = sum(max(0, n - epochs.get(r, 0)) for r, n in sent.items()) + ranks - len(sent)
    false_stall = bool(stalls) or dog.stalled is not None
    return {"row": "300 progress clients", "fault_to_training_s": round(back_s, 1), "goal_s": timeout,
            "outcome": (f"a {cut_s:g} s cut of {ranks} ranks (stallTimeout {timeout:g} s): "
                        + ("FALSE STALL" if false_stall else "no false stall")
                        + f", {missing} epoch events lost, {sum(d['reconnects'] for d in done)} reconnects"),
            "silent_hang": False, "lost": missing > 0 or false_stall, "model": ""}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stall-timeout", type=float, default=20.0)
    parser.add_argument("--no-flights", action="store_true", help="skip the checkpoint-overhead row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    from sparktrain.session import get_or_create_session

    base = Path(tempfile.mkdtemp(prefix="sparktrain-faults-"))
    s3 = _s3_server()  # before Spark starts: its Python workers inherit AWS_ENDPOINT_URL
    spark = get_or_create_session("local[2,2]", conf={"spark.driver.maxResultSize": "1m"})
    spark.sparkContext.setLogLevel("ERROR")
    raw = str(base / "raw")
    spark.range(8000).select((F.rand(1) * 2 - 1).alias("a"), (F.rand(2) * 2 - 1).alias("b")) \
        .withColumn("label", F.col("a") + F.col("b") > 0).write.parquet(raw)
    path = _dataset(spark, base / "ds")
    store, traces = base / "store", base / "traces"
    t0 = time.perf_counter()
    clean, _ = _fit(path, str(store), "clean", 2, str(traces))
    clean_s = time.perf_counter() - t0
    clean_val = clean.history[-1]["val_loss"]
    # The order noise of this job: the same clean fit with another seed (init and data order).
    other, _ = _fit(path, str(store), "clean-seed4", 2, str(traces), seed=4)
    noise = abs(other.history[-1]["val_loss"] - clean_val) / clean_val
    rows: List[Dict[str, Any]] = [_foreign_output(spark, raw, base), _stall(path, str(store), args.stall_timeout),
                                  _outage(spark, raw, base), _oversized(spark, raw, base)]
    killed, _ = _fit(path, str(store), "killed", 2, str(traces), fault="1:1:22:exit")
    rows.append(_resume_row("kill -9 mid-epoch", store, traces, "killed", clean_val, killed.history[-1]["val_loss"]))
    _, err = _fit(path, str(store), "shrink", 2, str(traces), fault="1:1:22:raise")
    shrunk, _ = _fit(path, str(store), "shrink", 1, str(traces))
    rows.append(_resume_row("shrink 2 to 1", store, traces, "shrink", clean_val, shrunk.history[-1]["val_loss"]))
    rows.append(_s3_kill(s3, path, traces, clean_val))
    rows.append(_torn_checkpoint(path, store, traces, clean_val))
    rows.append(_disk_full(base))
    rows.append(_two_fits_one_run(path, store, traces, clean_val))
    rows.append(_two_preprocess_one_output(spark, raw, base))
    rows.append(_progress_clients())
    overhead = None if args.no_flights else _overhead(spark, base, args.repeats)

    print(f"\nclean fit: {clean_s:.1f} s, val_loss {clean_val:.4f}; the same fit with seed 4: "
          f"{other.history[-1]['val_loss']:.4f} ({100 * noise:.2f}% apart: the job's order noise)\n")
    print(f"{'fault':<24} {'seconds':>8}  {'goal':>6}  {'lost':<5} outcome / model")
    for r in rows:
        secs = r.get("fault_to_error_s", r.get("fault_to_training_s", r.get("job_s")))
        goal = r.get("goal_s", 5.0 if "steps_redone" in r else "")
        print(f"{r['row']:<24} {secs!s:>8}  {goal!s:>6}  {str(r['lost']):<5} {r.get('outcome', '')} "
              f"{r.get('model', '')}")
    for r in rows:
        if "steps_redone" in r:
            print(f"resume {r['row']}: rows skipped {r['rows_skipped']}, rows repeated {r['rows_repeated']}, "
                  f"steps redone {r['steps_redone']} (interval {r['interval']}), back in {r['fault_to_training_s']} s"
                  f"; val_loss {r['val_loss']:.4f} vs clean {r['clean_val_loss']:.4f} "
                  f"({100 * r['val_loss_rel']:.2f}%)")
    if overhead:
        med = overhead["median"]
        print(f"checkpoint overhead (flights, median of {args.repeats}): samples/s none {med['none']:,.0f}, "
              f"default {med['default (30 s)']:,.0f} (ratio {overhead['ratio_default']:.3f}), every 50 steps "
              f"{med['every 50 steps']:,.0f} (ratio {overhead['ratio_every_50']:.3f}); goal >= 0.95")
    lost = sum(1 for r in rows if r.get("lost"))
    hangs = sum(1 for r in rows if r.get("silent_hang"))
    out = REPO / "work" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "faults.json").write_text(json.dumps({"clean_s": clean_s, "rows": rows, "overhead": overhead,
                                                 "order_noise_rel": noise},
                                                indent=1, default=str))
    print(f"faults: {len(rows)} scenarios, {lost} lost, {hangs} silent hangs")
    shutil.rmtree(base, ignore_errors=True)
    if s3 is not None:
        s3.stop()
    return 0 if lost == 0 and hangs == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
