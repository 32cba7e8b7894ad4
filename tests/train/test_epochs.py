"""Mid-epoch and elastic resume arithmetic: every row of an epoch exactly once (no Spark needed)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparktrain.train._executor.epochs import Layer, ReadSettings, continue_layers, epoch_batches
from sparktrain.train._executor.spec import InputSpec

INPUTS = InputSpec(numeric=("x",), categorical=(), label="y", task="binary")


@pytest.fixture(scope="module")
def rows_path(tmp_path_factory):
    """3,000 rows in 7 row groups of uneven size, with a row id."""
    root = tmp_path_factory.mktemp("elastic") / "train"
    root.mkdir()
    ids = np.arange(3000)
    table = pa.table({"row_id": ids, "x": (ids % 17).astype(np.float32), "y": (ids % 2).astype(np.float32)})
    pq.write_table(table, str(root / "part-0.parquet"), row_group_size=450)
    from sparktrain.data.manifest import build_manifest, write_manifest
    write_manifest(str(root), build_manifest(str(root)))
    return str(root)


def _ids(path, layers, rank, epoch, settings):
    steps, first, it = epoch_batches(path, INPUTS, layers, rank, epoch, settings, extra=["row_id"])
    out = [ids for _, ids in it]
    assert len(out) == steps - first
    return out


def _clean(path, world, batch, epoch, settings):
    return [_ids(path, [Layer(world, batch, 0)], r, epoch, settings) for r in range(world)]


@pytest.mark.parametrize("shuffle_buffer", [0, 256])
def test_same_world_resume_replays_the_clean_run(rows_path, shuffle_buffer):
    s = ReadSettings(seed=5, shuffle=True, shuffle_buffer=shuffle_buffer)
    clean = _clean(rows_path, 2, 64, 1, s)
    for rank in range(2):
        rest = _ids(rows_path, [Layer(2, 64, 9)], rank, 1, s)
        assert all(np.array_equal(a, b) for a, b in zip(rest, clean[rank][9:]))


@pytest.mark.parametrize("new_world,new_batch", [(1, 128), (3, 43), (4, 64)])
def test_elastic_resume_trains_every_remaining_row_once(rows_path, new_world, new_batch):
    s = ReadSettings(seed=3, shuffle=True, shuffle_buffer=256)
    clean = _clean(rows_path, 2, 64, 2, s)
    done = 10
    trained = [i for r in range(2) for b in clean[r][:done] for i in b]
    layers = continue_layers([Layer(2, 64, done)], new_world, new_batch)
    assert layers == [Layer(2, 64, done), Layer(new_world, new_batch, 0)]
    per_rank = [_ids(rows_path, layers, r, 2, s) for r in range(new_world)]
    assert len({len(p) for p in per_rank}) == 1  # equal steps on every rank
    sizes = [len(b) for p in per_rank for b in p]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= new_batch
    trained += [i for p in per_rank for b in p for i in b]
    full = collections.Counter(i for r in range(2) for b in clean[r] for i in b)
    assert collections.Counter(trained) == full  # nothing skipped, nothing repeated (3,000 rows, no wrap)
    assert len(trained) == 3000


def test_two_changes_in_one_epoch(rows_path):
    s = ReadSettings(seed=8, shuffle=True, shuffle_buffer=128)
    clean = _clean(rows_path, 2, 50, 0, s)
    trained = [i for r in range(2) for b in clean[r][:7] for i in b]
    first = continue_layers([Layer(2, 50, 7)], 3, 40)
    mid = [_ids(rows_path, first, r, 0, s) for r in range(3)]
    trained += [i for p in mid for b in p[:5] for i in b]
    second = continue_layers([Layer(2, 50, 7), Layer(3, 40, 5)], 1, 100)
    trained += [i for b in _ids(rows_path, second, 0, 0, s) for i in b]
    assert sorted(trained) == list(range(3000))


def test_resume_within_an_elastic_pass(rows_path):
    s = ReadSettings(seed=2, shuffle=True, shuffle_buffer=256)
    layers = [Layer(2, 64, 4), Layer(3, 64, 0)]
    whole = [_ids(rows_path, layers, r, 0, s) for r in range(3)]
    later = [_ids(rows_path, [Layer(2, 64, 4), Layer(3, 64, 2)], r, 0, s) for r in range(3)]
    for r in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(later[r], whole[r][2:]))
