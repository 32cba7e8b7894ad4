"""``RunStore`` owns the ``<store>/<run>/`` layout the driver (plan, bundle) and the executors (Checkpointer) share.

No Spark: plain pyarrow filesystems.
"""

from __future__ import annotations

import ast
import errno
import json
from pathlib import Path

import numpy as np
import pytest

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
        ck.save(seq, {"seq": seq, "rng": [1, 2.5, None]}, f"state {seq}".encode())
    Store(store).write_bytes("r/checkpoints/.tmp-dying", b"half")  # a killed writer's leftover: never listed
    ck.log_event("started", epoch=0)
    ck.log_event("epoch_finished", epoch=0)
    ck.record_failure(0, 1, {"message": "boom", "rank": 1})
    ck.write_model(b"net", {"launch": "L1"})
    run = RunStore(store, "r")
    assert [seq for seq, _ in run.checkpoints()] == [1, 2, 3] == [seq for seq, _ in ck.checkpoints()]
    assert ck.load(ck.latest()[1]) == ({"seq": 3, "rng": [1, 2.5, None]}, b"state 3")
    assert ck.load_latest() == (3, {"seq": 3, "rng": [1, 2.5, None]}, b"state 3") and ck.skipped == []
    assert ck.prune(keep=1, best=1) == [2] and [s for s, _ in run.checkpoints()] == [1, 3]
    assert [e["event"] for e in run.read_events()] == ["started", "epoch_finished"]
    assert ck.events(this_launch=True)[0]["epoch"] == 0
    assert [f["message"] for f in run.read_failures("L1-")] == ["boom"] and ck.failures()[0]["attempt"] == 0
    assert Checkpointer(store, "r", launch_id="L2").failures() == []  # failures of another fit() call
    assert run.read_network() == (b"net", {"launch": "L1"}) == ck.read_model()
    files = sorted(p.relative_to(tmp_path / "store" / "r").as_posix() for p in (tmp_path / "store" / "r").rglob("*")
                   if p.is_file() and not p.name.startswith(".tmp") and "/events/" not in p.as_posix())
    assert files == ["checkpoints/ckpt-000001.ckpt", "checkpoints/ckpt-000003.ckpt",
                     "failures/L1-attempt-0000-rank-0001.json", "model/network.ckpt"]
    assert len(list((tmp_path / "store" / "r" / "checkpoints" / "events").glob("*.json"))) == 2


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    from sparktrain.errors import CorruptObjectError
    from sparktrain.train._executor.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path), "r")
    for seq in (4, 5):
        ck.save(seq, {"epoch": seq}, bytes(range(200)) * 10)
    newest = tmp_path / "r" / "checkpoints" / "ckpt-000005.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a torn write
    with caplog.at_level("WARNING", logger="sparktrain.train._executor.checkpoint"):
        seq, meta, state = ck.load_latest()
    assert (seq, meta, state) == (4, {"epoch": 4}, bytes(range(200)) * 10) and ck.skipped == [5]
    assert "checkpoint 5 is unreadable" in caplog.text and "ckpt-000005.ckpt" in caplog.text
    flipped = bytearray((tmp_path / "r" / "checkpoints" / "ckpt-000004.ckpt").read_bytes())
    flipped[-40] ^= 1  # one bit of the state altered: the digest says so
    (tmp_path / "r" / "checkpoints" / "ckpt-000004.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(CorruptObjectError, match=r"none of its 2 checkpoints .* SHA-256 .* new runId"):
        ck.load_latest()  # never a silent fresh start over a run that has checkpoints


def test_pruning_after_a_fallback_keeps_the_checkpoint_resumed_from(tmp_path):
    """Resumed from 5 after 6 was torn: saving 6 again (on a disk that fills up) never prunes 5 for the torn 6."""
    from pyarrow import fs as pafs

    from sparktrain.errors import StoreWriteError
    from sparktrain.train._executor.checkpoint import Checkpointer
    from tests._faultfs import FullDisk

    disk = FullDisk(pafs.LocalFileSystem(), room=10 ** 6)
    ck = Checkpointer(Store(str(tmp_path), filesystem=disk), "r")
    for seq in (5, 6):
        ck.save(seq, {"seq": seq}, b"s" * 100, keep=2)
    torn = tmp_path / "r" / "checkpoints" / "ckpt-000006.ckpt"
    torn.write_bytes(torn.read_bytes()[:50])
    assert ck.load_latest()[0] == 5 and ck.skipped == [6]
    disk.room = 10
    with pytest.raises(StoreWriteError):
        ck.save(6, {"seq": 6}, b"t" * 100, keep=2)
    assert ck.load_latest()[0] == 5  # still there to resume from
    disk.room = 10 ** 6
    ck.save(6, {"seq": 6}, b"t" * 100, keep=2)
    ck.save(7, {"seq": 7}, b"u" * 100, keep=2)
    assert [s for s, _ in ck.checkpoints()] == [6, 7] and ck.load_latest()[0] == 7


def test_a_full_disk_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    from pyarrow import fs as pafs

    from sparktrain.errors import StoreWriteError
    from sparktrain.train._executor.checkpoint import Checkpointer

    from tests._faultfs import FullDisk

    disk = FullDisk(pafs.LocalFileSystem(), room=10 ** 6)
    ck = Checkpointer(Store(str(tmp_path), filesystem=disk), "r")
    ck.save(1, {"epoch": 0}, b"a" * 1000, keep=2)
    ck.save(2, {"epoch": 1}, b"b" * 1000, keep=2)
    disk.room = 500  # the next checkpoint does not fit
    with pytest.raises(StoreWriteError) as err:
        ck.save(3, {"epoch": 2}, b"c" * 1000, keep=2)
    assert f"{tmp_path}/r/checkpoints/ckpt-000003.ckpt" in str(err.value) and "No space left" in str(err.value)
    assert err.value.errno_ == errno.ENOSPC and isinstance(err.value, OSError)
    names = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    assert names == ["ckpt-000002.ckpt"]  # pruned before the save; no temporary file left behind
    assert ck.load_latest() == (2, {"epoch": 1}, b"b" * 1000)


def test_a_local_write_is_fsynced_and_leaves_no_temporary_file_on_failure(tmp_path):
    from sparktrain.errors import StoreWriteError

    store = Store(str(tmp_path))
    store.write_bytes("a/b.json", b"{}")
    (tmp_path / "a" / "c.json").mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(StoreWriteError, match=r"could not write '.*a/c\.json'"):
        store.write_bytes("a/c.json", b"{}")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.json", "c.json"]
    assert (tmp_path / "a" / "b.json").read_bytes() == b"{}"


def test_the_event_log_keeps_every_writer_s_events(tmp_path):
    """Two writers (an overlapping re-run, say) each add their own objects: neither rewrites the other's."""
    a, b = RunStore(str(tmp_path), "r"), RunStore(str(tmp_path), "r")
    for i in range(5):
        a.append_event({"event": "a", "i": i})
        b.append_event({"event": "b", "i": i})
    events = a.read_events()
    assert len(events) == 10 and [e["i"] for e in events if e["event"] == "a"] == list(range(5))
    assert [e["i"] for e in events if e["event"] == "b"] == list(range(5))


def test_sealed_objects_are_checked_and_hold_json_only():
    from sparktrain.data.sealed import seal, unseal
    from sparktrain.errors import CorruptObjectError

    blob = seal({"epoch": 1, "np": np.float32(0.5), "arr": np.arange(3)}, b"\x00payload")
    assert unseal(blob) == ({"epoch": 1, "np": 0.5, "arr": [0, 1, 2]}, b"\x00payload")
    with pytest.raises(CorruptObjectError, match="'x.ckpt' is truncated"):
        unseal(blob[:-1], "x.ckpt")
    with pytest.raises(CorruptObjectError, match="not a sealed sparktrain object"):
        unseal(b"\x80\x04pickle", "old.ckpt")  # an older sparktrain's pickled checkpoint is never unpickled


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
