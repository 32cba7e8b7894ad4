"""sparktrain.data.sharding: the shard, shuffle and batch arithmetic every rank computes alike."""

from __future__ import annotations

import numpy as np
import pytest

from sparktrain.data.sharding import (EpochPlan, piece_order, shard_rows, steps_per_epoch, window_permutation,
                                      window_rows)


@pytest.mark.parametrize("rows, world, remainder, expected", [
    (10, 3, "wrap", 4), (10, 3, "drop", 3), (9, 3, "wrap", 3), (1, 4, "wrap", 1), (1, 4, "drop", 0)])
def test_shard_rows(rows, world, remainder, expected):
    assert shard_rows(rows, world, remainder) == expected


@pytest.mark.parametrize("rows, world, batch, drop_last, expected", [
    (1000, 2, 128, False, 4), (1000, 2, 128, True, 3), (1024, 2, 128, True, 4), (5, 8, 4, False, 1)])
def test_steps_per_epoch_is_the_same_on_every_rank(rows, world, batch, drop_last, expected):
    assert steps_per_epoch(rows, world, batch, "wrap", drop_last) == expected


def test_window_rows_round_the_buffer_up_to_whole_batches():
    assert window_rows(64, 1000, True) == 1024
    assert window_rows(64, 10, True) == 64  # never less than one batch
    assert window_rows(64, 1000, False) == 64  # no shuffle: one batch at a time


def test_orders_and_permutations_are_seeded():
    assert list(piece_order(5, 1, 0, False)) == [0, 1, 2, 3, 4]
    a, b = piece_order(50, 1, 0, True), piece_order(50, 1, 0, True)
    assert list(a) == list(b) and sorted(a) == list(range(50))
    assert list(piece_order(50, 1, 1, True)) != list(a)  # a new order every epoch
    p = window_permutation(100, 1, 0, 2, 0, 0)
    assert sorted(p) == list(range(100))
    assert list(p) != list(window_permutation(100, 1, 0, 2, 1, 0))  # each rank its own


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_cover_the_stream_once_and_wrap_by_fewer_than_world_rows(world):
    piece_rows = np.array([7, 3, 10, 5])
    order = piece_order(len(piece_rows), 3, 0, True)
    n = int(piece_rows.sum())
    size = shard_rows(n, world, "wrap")
    seen = []
    for rank in range(world):
        plan = EpochPlan(piece_rows, order, rank, world, size, size)
        for piece, lo, hi in plan.segments(0, size):
            assert 0 <= lo < hi <= piece_rows[piece]
            base = int(piece_rows[:piece].sum())
            seen += list(range(base + lo, base + hi))
    assert len(seen) == size * world
    assert set(seen) == set(range(n))  # every row of the epoch
    assert len(seen) - len(set(seen)) == size * world - n < world  # the wrap repeats fewer than world rows
