"""The tf.data adapter hands the reader's batches to TensorFlow in chunks: same batches, same order, no copies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktrain.data import build_manifest, make_reader, make_tf_dataset, write_manifest
from sparktrain.data.tf import iter_chunks

N = 5000  # 5000 = 9 full batches of 512 + 392: a partial last batch


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    rng = np.random.default_rng(3)
    d = tmp_path_factory.mktemp("tfchunks") / "t"
    d.mkdir()
    x = rng.normal(size=(N, 3)).astype(np.float32)
    t = pa.table({"id": np.arange(N), "v": rng.random(N), "name": [f"r{i}" for i in range(N)],
                  "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 3).cast(pa.list_(pa.float32()))})
    pq.write_table(t, d / "part-0.parquet", row_group_size=700)
    write_manifest(str(d), build_manifest(str(d)))
    return str(d)


def _batches(path, columns, **kw):
    with make_reader(path, columns, 512, num_epochs=1, seed=7, **kw) as reader:
        return list(reader)


@pytest.mark.parametrize("shuffle_buffer", [0, 512, 2048])
@pytest.mark.parametrize("max_batches", [1, 3, 16])
def test_chunks_are_the_readers_batches_in_order(table_dir, shuffle_buffer, max_batches):
    want = _batches(table_dir, ["id", "v", "x"], shuffle_buffer=shuffle_buffer)
    with make_reader(table_dir, ["id", "v", "x"], 512, num_epochs=1, seed=7, shuffle_buffer=shuffle_buffer) as r:
        chunks = list(iter_chunks(r, max_batches))
        assert r.cursor.epoch == 1
    got = [{c: chunk[c][i] for c in chunk} for chunk in chunks for i in range(len(chunk["id"]))]
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for c in w:
            np.testing.assert_array_equal(g[c], w[c])
    assert all(len(ch["id"]) <= max_batches for ch in chunks)
    assert chunks[-1]["id"].shape == (1, N - 9 * 512)  # the partial batch travels alone
    if max_batches > 1 and shuffle_buffer == 2048:
        # batches cut from one reader window are handed over as a view of it, not a copy
        assert any(len(ch["id"]) > 1 and not ch["id"].flags.owndata and not ch["id"].flags.writeable
                   for ch in chunks)


def test_string_columns_are_stacked(table_dir):
    with make_reader(table_dir, ["id", "name"], 512, num_epochs=1, shuffle=False) as r:
        chunks = list(iter_chunks(r, 4))
    assert [len(c["id"]) for c in chunks] == [4, 4, 1, 1]
    names = np.concatenate([c["name"].reshape(-1) for c in chunks])
    ids = np.concatenate([c["id"].reshape(-1) for c in chunks])
    assert list(names) == [f"r{i}" for i in ids] and list(ids) == list(range(N))


@pytest.mark.tensorflow
def test_tf_dataset_yields_the_readers_batches(table_dir):
    tf = pytest.importorskip("tensorflow")
    want = _batches(table_dir, ["id", "name", "x"])
    with make_tf_dataset(table_dir, ["id", "name", "x"], 512, seed=7) as ds:
        assert ds.element_spec == {"id": tf.TensorSpec((None,), tf.int64, name="id"),
                                   "name": tf.TensorSpec((None,), tf.string, name="name"),
                                   "x": tf.TensorSpec((None, 3), tf.float32, name="x")}
        got = list(ds)
        # in graph, as Keras consumes it: the same rows
        total = ds.reduce(tf.constant(0, tf.int64), lambda a, b: a + tf.reduce_sum(b["id"]))
    assert [int(b["id"].shape[0]) for b in got] == [len(b["id"]) for b in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["id"].numpy(), w["id"])
        np.testing.assert_array_equal(g["x"].numpy(), w["x"])
        assert [s.decode() for s in g["name"].numpy()] == list(w["name"])
    assert int(total) == N * (N - 1) // 2  # second pass: the next epoch, every row once
