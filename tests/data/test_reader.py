"""sparktrain.data.reader: sharding, shuffling, cursor, conversion and bad input (issue 4 §8, §9)."""

from __future__ import annotations

import gc
import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktrain.data import Cursor, build_manifest, make_reader, write_manifest
from sparktrain.errors import (
    ConfigError,
    DataError,
    DatasetNotFoundError,
    MissingColumnError,
    SchemaError,
    SparktrainError,
)

N_ROWS = 1003  # divides by none of 2, 3, 4, 5, 6, 7, 8


def _write_dataset(path, n, files=2, row_group=100, manifest=True, extra_cols=True):
    """Rows id=0..n-1 over `files` files in order, with a manifest."""
    path.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, files + 1).astype(int)
    for i in range(files):
        ids = np.arange(bounds[i], bounds[i + 1])
        cols = {"id": ids}
        if extra_cols:
            cols["x"] = (ids * 0.5).astype(np.float32)
            cols["v"] = pa.array(np.repeat(ids, 3).reshape(-1, 3).astype(np.float32).tolist(),
                                 pa.list_(pa.float32()))
        pq.write_table(pa.table(cols), path / f"part-{i:05d}.parquet", row_group_size=row_group)
    if manifest:
        write_manifest(str(path), build_manifest(str(path)))
    return str(path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("reader") / "ds", N_ROWS)


def _first(path, columns, **kw):
    with make_reader(path, columns, **kw) as r:
        return next(r)


def _ids(path, **kw):
    with make_reader(path, ["id"], **kw) as r:
        return [b["id"] for b in r], r


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_cover_the_dataset_once(dataset, world_size, shuffle):
    shards, steps = [], set()
    for rank in range(world_size):
        batches, r = _ids(dataset, batch_size=64, rank=rank, world_size=world_size, shuffle=shuffle,
                          shuffle_buffer=200, remainder="drop", seed=7)
        assert len(batches) == r.steps_per_epoch
        steps.add(len(batches))
        shards.append(np.concatenate(batches))
    assert len(steps) == 1
    union = np.concatenate(shards)
    per_rank = N_ROWS // world_size
    assert all(len(s) == per_rank for s in shards)
    assert len(np.unique(union)) == len(union) == per_rank * world_size  # no duplicates
    assert set(union) <= set(range(N_ROWS))
    # "wrap" reads every row, padding with exactly world_size*ceil(N/ws) - N repeats
    wrapped = np.concatenate([np.concatenate(_ids(dataset, batch_size=64, rank=k, world_size=world_size,
                                                  shuffle=shuffle, seed=7)[0]) for k in range(world_size)])
    assert set(wrapped) == set(range(N_ROWS))
    assert len(wrapped) - N_ROWS == world_size * -(-N_ROWS // world_size) - N_ROWS


@pytest.mark.parametrize("remainder", ["wrap", "drop"])
def test_equal_steps_up_to_8_ranks_with_fewer_row_groups(tmp_path, remainder):
    tiny = _write_dataset(tmp_path / "tiny", 13, files=1, row_group=100)  # one row group, 13 rows
    for ws in range(1, 9):
        counts, sizes = [], []
        for rank in range(ws):
            batches, r = _ids(tiny, batch_size=2, rank=rank, world_size=ws, remainder=remainder, shuffle=True)
            counts.append(len(batches))
            sizes.append([len(b) for b in batches])
            assert r.steps_per_epoch == len(batches) > 0
        assert len(set(counts)) == 1, (ws, counts)
        assert all(s == sizes[0] for s in sizes), (ws, sizes)  # same batch sizes too, last one included
        rows = 13 // ws if remainder == "drop" else -(-13 // ws)
        assert sum(sizes[0]) == rows


def test_equal_steps_with_drop_last(dataset):
    for ws in (3, 7):
        lens = {len(_ids(dataset, batch_size=50, rank=k, world_size=ws, drop_last=True)[0]) for k in range(ws)}
        assert lens == {-(-N_ROWS // ws) // 50}


def test_shuffle_false_gives_exact_order(dataset):
    batches, _ = _ids(dataset, batch_size=100, shuffle=False)
    assert np.array_equal(np.concatenate(batches), np.arange(N_ROWS))
    assert [len(b) for b in batches] == [100] * 10 + [3]
    r0 = np.concatenate(_ids(dataset, batch_size=100, shuffle=False, rank=0, world_size=2)[0])
    r1 = np.concatenate(_ids(dataset, batch_size=100, shuffle=False, rank=1, world_size=2)[0])
    assert np.array_equal(r0, np.arange(502))
    assert np.array_equal(r1, np.r_[np.arange(502, N_ROWS), 0])  # wrapped around by one row


def test_shuffle_is_deterministic_and_mixes(dataset):
    a = np.concatenate(_ids(dataset, batch_size=64, seed=3, num_epochs=2, world_size=2, rank=1)[0])
    b = np.concatenate(_ids(dataset, batch_size=64, seed=3, num_epochs=2, world_size=2, rank=1)[0])
    c = np.concatenate(_ids(dataset, batch_size=64, seed=4, num_epochs=2, world_size=2, rank=1)[0])
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    half = len(a) // 2
    epoch0, epoch1 = a[:half], a[half:]
    assert not np.array_equal(epoch0, epoch1)  # a new order every epoch
    assert not np.array_equal(np.sort(epoch0), epoch0)  # rows are mixed, not just row groups moved
    first = np.concatenate(_ids(dataset, batch_size=1000, seed=3)[0])
    assert sorted(first) == list(range(N_ROWS))
    # a 300-row buffer draws the first batch from more than one 100-row row group
    first_batch = _ids(dataset, batch_size=32, seed=3, shuffle_buffer=300)[0][0]
    assert len(set(first_batch // 100)) > 1


@pytest.mark.parametrize("stop_at", [0, 5, 6, 11])
def test_resume_from_cursor_neither_repeats_nor_skips(dataset, stop_at):
    kw = {"batch_size": 64, "world_size": 3, "rank": 2, "seed": 11, "shuffle_buffer": 200, "num_epochs": 2}
    full, r = _ids(dataset, **kw)
    steps = r.steps_per_epoch  # 6 per epoch on 3 ranks of 1003 rows
    with make_reader(dataset, ["id"], **kw) as r1:
        head = [next(r1)["id"] for _ in range(stop_at)]
        saved = json.loads(json.dumps(r1.cursor.to_dict()))
    assert Cursor.from_dict(saved) == Cursor(stop_at // steps, stop_at % steps)
    remaining = kw["num_epochs"] - saved["epoch"]
    tail, _ = _ids(dataset, **{**kw, "num_epochs": remaining}, cursor=saved)
    assert len(head) + len(tail) == len(full)
    for got, want in zip(head + tail, full):
        assert np.array_equal(got, want)


def test_cursor_counts_epochs_and_iter_epoch(dataset):
    with make_reader(dataset, ["id"], batch_size=500, num_epochs=None, shuffle=False) as r:
        assert r.steps_per_epoch == 3 and r.cursor == Cursor(0, 0)
        for epoch in range(3):
            got = list(r.iter_epoch())
            assert [len(b["id"]) for b in got] == [500, 500, 3]
            assert r.cursor == Cursor(epoch + 1, 0)
        next(r)
        assert r.cursor == Cursor(3, 1)
        assert list(r.iter_epoch())[-1]["id"].tolist() == [1000, 1001, 1002]


def test_close_stops_the_thread(dataset):
    before = {t.ident for t in threading.enumerate()}
    r = make_reader(dataset, batch_size=10, num_epochs=None, prefetch=2)
    next(r)
    ours = [t.name for t in threading.enumerate() if t.ident not in before]
    assert ours and all(n.startswith("sparktrain-") for n in ours)  # the reader and its read-ahead worker
    r.close()
    assert {t.ident for t in threading.enumerate()} - before == set()
    assert list(r) == []
    with make_reader(dataset, batch_size=10, num_epochs=None) as r2:
        next(r2)
    assert {t.ident for t in threading.enumerate()} - before == set()
    # a reader dropped without close(): its finalizer stops the thread
    r3 = make_reader(dataset, batch_size=10, num_epochs=None, prefetch=1)
    next(r3)
    threads = [t for t in threading.enumerate() if t.ident not in before]
    del r3
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


def test_columns_array_and_dtypes(dataset):
    with make_reader(dataset, ["v", "x"], batch_size=7, shuffle=False) as r:
        b = next(r)
        assert list(b) == ["v", "x"] and r.columns == ["v", "x"]
        assert b["v"].shape == (7, 3) and b["v"].dtype == np.float32
        assert b["x"].dtype == np.float32
        np.testing.assert_array_equal(b["v"][:, 1], np.arange(7))
        np.testing.assert_array_equal(b["x"], np.arange(7) * 0.5)
        assert all(a.flags.writeable for a in b.values())
        assert r.num_rows == N_ROWS and r.schema.names == ["v", "x"]
        assert r.peek_spec() == {"v": (np.dtype("float32"), (3,)), "x": (np.dtype("float32"), ())}


def test_nulls(tmp_path):
    t = pa.table({
        "f": pa.array([1.0, None, 3.0], pa.float64()),
        "i": pa.array([1, None, 3], pa.int64()),
        "s": pa.array(["a", None, "c"]),
        "lst": pa.array([[1.0, 2.0], None, [None, 6.0]], pa.list_(pa.float32())),
        "ilst": pa.array([[1, 2], [3, None], [5, 6]], pa.list_(pa.int32())),
        "nested": pa.array([[[1, 2]], [[3, 4]], [[5, 6]]], pa.list_(pa.list_(pa.int16()))),
    })
    (tmp_path / "n").mkdir()
    pq.write_table(t, tmp_path / "n" / "a.parquet")
    p = str(tmp_path / "n")
    write_manifest(p, build_manifest(p))
    b = _first(p, ["f", "s", "lst", "nested"], batch_size=3, shuffle=False)
    np.testing.assert_array_equal(b["f"], [1.0, np.nan, 3.0])
    assert b["s"].tolist() == ["a", None, "c"]
    np.testing.assert_array_equal(b["lst"], [[1, 2], [np.nan, np.nan], [np.nan, 6]])
    assert b["nested"].shape == (3, 1, 2) and b["nested"].dtype == np.int16
    with pytest.raises(DataError, match="column 'i'.*fill_null"):
        _first(p, ["i"], batch_size=3)
    with pytest.raises(DataError, match="column 'ilst'"):
        _first(p, ["ilst"], batch_size=3)
    b = _first(p, ["i", "ilst"], batch_size=3, shuffle=False, fill_null={"i": -1, "ilst": 0})
    assert b["i"].tolist() == [1, -1, 3] and b["i"].dtype == np.int64
    assert b["ilst"].tolist() == [[1, 2], [3, 0], [5, 6]]


def test_ragged_lists_and_ml_vectors(tmp_path):
    vec_type = pa.struct([("type", pa.int8()), ("size", pa.int32()), ("indices", pa.list_(pa.int32())),
                          ("values", pa.list_(pa.float64()))])
    vectors = pa.array([
        {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
        {"type": 0, "size": 3, "indices": [2], "values": [9.0]},
        None,
        {"type": 0, "size": 3, "indices": [0, 1], "values": [4.0, 5.0]},
    ], vec_type)
    t = pa.table({"vec": vectors, "rag": pa.array([[1.0], [1.0, 2.0], [3.0], [4.0]])})
    (tmp_path / "v").mkdir()
    pq.write_table(t, tmp_path / "v" / "a.parquet")
    p = str(tmp_path / "v")
    write_manifest(p, build_manifest(p))
    b = _first(p, ["vec"], batch_size=4, shuffle=False)
    np.testing.assert_array_equal(b["vec"], [[1, 2, 3], [0, 0, 9], [np.nan] * 3, [4, 5, 0]])
    with pytest.raises(DataError, match=r"'rag'.*different lengths \(1..2\)"):
        _first(p, ["rag"], batch_size=4)


# ----------------------------------------------------------------------------- bad input (§9)
def test_missing_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        make_reader(str(tmp_path / "nope"))


def test_no_manifest_warns_or_errors(tmp_path):
    p = _write_dataset(tmp_path / "nm", 50, manifest=False)
    with pytest.warns(UserWarning, match="no _manifest.json"):
        assert sum(len(b["id"]) for b in make_reader(p, ["id"], batch_size=8)) == 50
    with pytest.raises(DataError, match="require_manifest=True"):
        make_reader(p, require_manifest=True)


def test_manifest_with_missing_file(tmp_path):
    p = _write_dataset(tmp_path / "mf", 50)
    (tmp_path / "mf" / "part-00001.parquet").unlink()
    with pytest.raises(DataError, match="part-00001.parquet.*is missing"):
        make_reader(p)


def test_schemas_differ_between_files(tmp_path):
    d = tmp_path / "sd"
    d.mkdir()
    pq.write_table(pa.table({"a": pa.array([1, 2]), "b": pa.array([1.0, 2.0])}), d / "p0.parquet")
    pq.write_table(pa.table({"a": pa.array([1.5, 2.5]), "b": pa.array([1.0, 2.0])}), d / "p1.parquet")
    with pytest.warns(UserWarning), pytest.raises(SchemaError, match="column 'a' has type double in file 'p1"):
        make_reader(str(d))
    with pytest.raises(SchemaError, match="column 'a'"):
        build_manifest(str(d))


def test_absent_column(dataset):
    with pytest.raises(MissingColumnError, match="column 'idd' is not in .* Did you mean 'id'") as e:
        make_reader(dataset, ["idd"])
    assert isinstance(e.value, KeyError) and e.value.column == "idd"


@pytest.mark.parametrize("kwargs, key", [
    ({"world_size": 0}, "world_size"),
    ({"world_size": 2, "rank": 2}, "rank"),
    ({"rank": -1}, "rank"),
    ({"batch_size": 0}, "batch_size"),
    ({"remainder": "pad"}, "remainder"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"cursor": {"epoch": 0, "batch_index": 99}}, "cursor.batch_index"),
    ({"cursor": {"epoch": -1, "batch_index": 0}}, "cursor.epoch"),
])
def test_bad_arguments(dataset, kwargs, key):
    with pytest.raises(ConfigError) as e:
        make_reader(dataset, batch_size=kwargs.pop("batch_size", 100), **kwargs)
    assert e.value.path == key and isinstance(e.value, (SparktrainError, ValueError))


def test_too_few_rows_for_drop(tmp_path):
    p = _write_dataset(tmp_path / "few", 3, files=1)
    with pytest.raises(DataError, match="0 batches per epoch"):
        make_reader(p, world_size=4, rank=0, remainder="drop")
    assert len(_ids(p, world_size=4, rank=3, batch_size=1)[0]) == 1  # wrap works with fewer rows than ranks


def test_executor_side_imports_stay_light():
    import subprocess
    import sys

    code = ("import sys, sparktrain.data as d, sparktrain.data.reader; d.make_reader; d.Cursor; "
            "print(sorted(m for m in ('pyspark', 'tensorflow', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
