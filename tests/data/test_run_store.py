"""``RunStore`` owns the ``<store>/<run>/`` layout the driver (plan, bundle) and the executors (Checkpointer) share.

No Spark: plain pyarrow filesystems.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from sparktrain.data.run_store import RUN_FILE, RunStore, Store

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sparktrain"


def test_names_of_a_run_for_a_local_path_and_a_uri(tmp_path):
    run = RunStore(str(tmp_path / "store"), "r1")
    assert run.uri() == f"{tmp_path}/store/r1"
    assert run.data_uri() == f"{tmp_path}/store/r1/data" and run.data_uri("train") == f"{tmp_path}/store/r1/data/train"
    assert run.model_uri() == f"{tmp_path}/store/r1/model"
    assert run.checkpoint_rel(7) == "r1/checkpoints/ckpt-000007.ckpt"
    remote = RunStore("s3://bucket/prefix/", "r2")  # naming paths resolves no filesystem (no credentials needed)
    assert remote.uri("data", "train") == "s3://bucket/prefix/r2/data/train"
    assert remote.model_uri() == "s3://bucket/prefix/r2/model"


def test_the_run_record_and_discarding_an_unrecorded_run(tmp_path):
    store = str(tmp_path / "store")
    run = RunStore(store, "new")
    assert not run.exists() and run.read_run() is None
    run.store.write_bytes(run.rel("data", "train", "part-0.parquet"), b"x")
    assert run.exists() and not run.is_recorded()
    run.discard_unrecorded()  # what a failed fit(df) wrote before run.json: gone, with the run's folder
    assert not (tmp_path / "store" / "new").exists()

    kept = RunStore(store, "kept")
    kept.store.write_bytes(kept.rel("data", "train", "part-0.parquet"), b"x")
    kept.write_run({"run_id": "kept", "fingerprint": {"version": 1}})
    assert kept.is_recorded() and kept.read_run()["fingerprint"] == {"version": 1}
    kept.discard_unrecorded()  # a recorded run is never touched
    assert (tmp_path / "store" / "kept" / "data" / "train" / "part-0.parquet").is_file()
    assert json.loads((tmp_path / "store" / "kept" / RUN_FILE).read_text())["run_id"] == "kept"


def test_checkpointer_writes_where_run_store_reads(tmp_path):
    from sparktrain.train._executor.checkpoint import Checkpointer

    store = str(tmp_path / "store")
    ck = Checkpointer(store, "r", launch_id="L1")
    for seq in (1, 2, 3):
        ck.save(seq, f"state {seq}".encode())
    Store(store).write_bytes("r/checkpoints/.tmp-dying", b"half")  # a killed writer's leftover: never listed
    ck.log_event("started", epoch=0)
    ck.record_failure(0, 1, {"message": "boom", "rank": 1})
    ck.write_model(b"net", {"launch": "L1"})
    run = RunStore(store, "r")
    assert [seq for seq, _ in run.checkpoints()] == [1, 2, 3] == [seq for seq, _ in ck.checkpoints()]
    assert ck.load(ck.latest()[1]) == b"state 3"
    assert ck.prune(keep=1, best=1) == [2] and [s for s, _ in run.checkpoints()] == [1, 3]
    assert [e["event"] for e in run.read_events()] == ["started"] and ck.events(this_launch=True)[0]["epoch"] == 0
    assert [f["message"] for f in run.read_failures("L1-")] == ["boom"] and ck.failures()[0]["attempt"] == 0
    assert Checkpointer(store, "r", launch_id="L2").failures() == []  # failures of another fit() call
    assert run.read_network() == (b"net", {"launch": "L1"}) == ck.read_model()
    files = sorted(p.relative_to(tmp_path / "store" / "r").as_posix() for p in (tmp_path / "store" / "r").rglob("*")
                   if p.is_file() and not p.name.startswith(".tmp"))
    assert files == ["checkpoints/ckpt-000001.ckpt", "checkpoints/ckpt-000003.ckpt", "checkpoints/log.jsonl",
                     "failures/L1-attempt-0000-rank-0001.json", "model/network/model.bin", "model/network/spec.json"]


def test_driver_code_does_not_import_the_store_from_the_executor_package():
    """``Store`` lives in the data layer (``sparktrain.data.run_store``): nothing takes it from the executor package."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "sparktrain.train._executor.checkpoint" \
                    and any(a.name == "Store" for a in node.names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
