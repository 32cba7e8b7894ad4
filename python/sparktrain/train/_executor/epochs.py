"""One epoch's batches for one rank, resumable mid-epoch and on another number of workers.

An epoch's progress is a list of :class:`Layer` s.  Layer 0 is the reader's
normal sharding (:mod:`sparktrain.data.sharding`) for ``world`` ranks with
``batch`` rows per step; ``done`` batches of it were trained by every rank.
When a run resumes on the same world size and batch, the reader continues at
``Cursor(epoch, done)``: exactly the batches, in the order, of an
uninterrupted run.

When it resumes on a different world size (elastic), the rows not yet trained
form one sequence: old rank 0's remaining rows in the order it would have
trained them, then old rank 1's, and so on.  A new layer shards that sequence
into equal contiguous parts, one per new rank, each cut into the same number
of steps (batch sizes differ by at most one row), so nothing is skipped or
repeated.  A further change inside that pass adds another layer on top.
Later epochs use the new world size's normal sharding.

Except when the new world size divides the run's and the global batch is
kept (:class:`~sparktrain.train._executor.loop.Loop`): then each new rank
trains, step by step, the batches of several of the run's ranks
(``epoch_batches`` for each of them, concatenated), the layers stay those of
the run's world size, and every global batch holds the rows it had before.

Everything is computed from the dataset's row-group sizes and the seed, never
from the data; rows are read a shuffle window at a time (bounded memory).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from sparktrain.train._executor.batches import Arrays, to_arrays
from sparktrain.train._executor.spec import InputSpec

_MIN_WINDOW_ROWS = 8192  # the reader's window without a row shuffle (sparktrain.data.reader)


@dataclass(frozen=True)
class Layer:
    """One pass over (the rest of) an epoch: ``world`` ranks, ``batch`` rows per step, ``done`` steps trained."""

    world: int
    batch: int
    done: int = 0

    def to_dict(self) -> Dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Layer":
        return cls(int(d["world"]), int(d["batch"]), int(d.get("done", 0)))


@dataclass(frozen=True)
class ReadSettings:
    """How the reader shuffles and shards (the same for every layer of a run)."""

    seed: int
    shuffle: bool = True
    shuffle_buffer: int = 8192
    remainder: str = "wrap"


def continue_layers(layers: Sequence[Layer], world: int, batch: int) -> List[Layer]:
    """The layers a launch of ``world`` ranks with ``batch`` rows continues from (a new layer on a change)."""
    layers = list(layers)
    if not layers:
        return [Layer(world, batch, 0)]
    if layers[-1].world == world and layers[-1].batch == batch:
        return layers
    return [*layers, Layer(world, batch, 0)]


def _split(total: int, parts: int, index: int) -> Tuple[int, int]:
    """``[start, stop)`` of part ``index`` when ``total`` items are cut into ``parts`` near-equal parts."""
    return total * index // parts, total * (index + 1) // parts


def layer_steps(rows: int, world: int, batch: int) -> int:
    """Steps of a re-sharding layer over ``rows`` rows: the same on every rank."""
    return max(1, math.ceil((rows // world) / batch))


def _batch_sizes(part: int, steps: int) -> np.ndarray:
    return np.array([len(a) for a in np.array_split(np.arange(part), steps)], dtype=np.int64)


class _Units:
    """The remaining rows of layer 0 as units: (old rank, window, first row, last row) in training order."""

    def __init__(self, ds: Any, layer: Layer, epoch: int, settings: ReadSettings) -> None:
        from sparktrain.data import sharding

        self.ds, self.layer, self.epoch, self.settings = ds, layer, epoch, settings
        n = int(ds.piece_rows.sum())
        self.shard = sharding.shard_rows(n, layer.world, settings.remainder)
        steps = sharding.steps_per_epoch(n, layer.world, layer.batch, settings.remainder, False)
        self.used = min(self.shard, steps * layer.batch)
        self.permute = settings.shuffle and settings.shuffle_buffer > 0
        self.window = sharding.window_rows(layer.batch, settings.shuffle_buffer, settings.shuffle) \
            if self.permute else -(-_MIN_WINDOW_ROWS // layer.batch) * layer.batch
        self.order = sharding.piece_order(len(ds.piece_rows), settings.seed, epoch, settings.shuffle)
        consumed = min(layer.done * layer.batch, self.used)
        self.units: List[Tuple[int, int, int, int]] = []
        for rank in range(layer.world):
            for win in range(consumed // self.window, -(-self.used // self.window)):
                lo, hi = win * self.window, min(win * self.window + self.window, self.used)
                first = max(consumed - lo, 0)
                if hi - lo > first:
                    self.units.append((rank, win, first, hi - lo))
        self.lengths = np.array([b - a for _, _, a, b in self.units], dtype=np.int64)

    @property
    def total(self) -> int:
        return int(self.lengths.sum())

    def rows(self, source: Any, unit: int) -> Dict[str, np.ndarray]:
        """The rows of ``unit`` in the order its old rank would have trained them."""
        from sparktrain.data import sharding

        rank, win, first, last = self.units[unit]
        plan = sharding.EpochPlan(self.ds.piece_rows, self.order, rank, self.layer.world, self.shard, self.used)
        lo, hi = win * self.window, min(win * self.window + self.window, self.used)
        perm = sharding.window_permutation(hi - lo, self.settings.seed, self.epoch, self.layer.world, rank, win) \
            if self.permute else None
        window = source.gather(plan.segments(lo, hi), perm)
        return {c: a[first:last] for c, a in window.items()}


def _remaining_slices(layers: Sequence[Layer], total: int) -> List[Tuple[int, int]]:
    """Slices ``[a, b)`` of layer 1's input sequence not yet trained after ``layers[1:]`` (in order)."""
    seq: List[Tuple[int, int]] = [(0, total)]
    for layer in layers[1:]:
        rows = sum(b - a for a, b in seq)
        steps = layer_steps(rows, layer.world, layer.batch)
        nxt: List[Tuple[int, int]] = []
        for r in range(layer.world):
            start, stop = _split(rows, layer.world, r)
            done_rows = int(_batch_sizes(stop - start, steps)[:layer.done].sum())
            nxt += _take(seq, start + done_rows, stop)
        seq = nxt
    return seq


def _take(seq: Sequence[Tuple[int, int]], start: int, stop: int) -> List[Tuple[int, int]]:
    """The sub-slices of the concatenation of ``seq`` between flat positions ``start`` and ``stop``."""
    out, pos = [], 0
    for a, b in seq:
        n = b - a
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if hi > lo:
            out.append((a + lo, a + hi))
        pos += n
    return out


def epoch_batches(path: str, inputs: InputSpec, layers: Sequence[Layer], rank: int, epoch: int,
                  settings: ReadSettings, extra: Sequence[str] = ()
                  ) -> Tuple[int, int, Iterator[Tuple[Arrays, Optional[np.ndarray]]]]:
    """``(steps, first step, iterator)`` of this rank's rest of ``epoch`` under ``layers``.

    The iterator yields ``((x_num, x_cat, y), extra)``: ``extra`` holds the
    first of ``extra`` columns (row ids for tests), or None.
    """
    last = layers[-1]
    columns = [*inputs.columns, inputs.label, *[c for c in extra if c not in inputs.columns]]
    if len(layers) == 1:
        return _normal(path, inputs, columns, last, rank, epoch, settings, extra)
    from sparktrain.data.source import PieceSource, load_dataset

    ds = load_dataset(path, None, False)
    units = _Units(ds, layers[0], epoch, settings)
    seq = _remaining_slices(layers[:-1], units.total)
    rows = sum(b - a for a, b in seq)
    steps = layer_steps(rows, last.world, last.batch)
    start, stop = _split(rows, last.world, rank)
    sizes = _batch_sizes(stop - start, steps)
    mine = _take(seq, start + int(sizes[:last.done].sum()), stop)
    ends = np.cumsum(units.lengths)

    def gen() -> Iterator[Tuple[Arrays, Optional[np.ndarray]]]:
        source = PieceSource(ds, columns, {})
        pending: List[Dict[str, np.ndarray]] = []
        have = 0
        k = last.done
        cached: Tuple[int, Dict[str, np.ndarray]] = (-1, {})
        try:
            for a, b in mine:  # positions in the flat sequence of units
                pos = a
                while pos < b:
                    u = int(np.searchsorted(ends, pos, side="right"))
                    base = int(ends[u] - units.lengths[u])
                    hi = min(b, int(ends[u]))
                    if cached[0] != u:
                        cached = (u, units.rows(source, u))
                    got = cached[1]
                    pending.append({c: v[pos - base:hi - base] for c, v in got.items()})
                    have += hi - pos
                    pos = hi
                    while k < steps and have >= sizes[k] and sizes[k] > 0:
                        batch, pending, have = _cut(pending, int(sizes[k]), have)
                        yield _emit(batch, inputs, extra)
                        k += 1
            while k < steps:  # a rank with fewer rows than steps (tiny tails): empty batches keep ranks in step
                batch, pending, have = _cut(pending, min(int(sizes[k]), have), have)
                yield _emit(batch, inputs, extra)
                k += 1
        finally:
            source.close()

    return steps, last.done, gen()


def _cut(pending: List[Dict[str, np.ndarray]], n: int, have: int
         ) -> Tuple[Dict[str, np.ndarray], List[Dict[str, np.ndarray]], int]:
    if not pending:
        return {}, pending, have
    joined = {c: np.concatenate([p[c] for p in pending]) for c in pending[0]}
    batch = {c: v[:n] for c, v in joined.items()}
    rest = {c: v[n:] for c, v in joined.items()}
    return batch, ([rest] if have - n > 0 else []), have - n


def _emit(batch: Dict[str, np.ndarray], inputs: InputSpec, extra: Sequence[str]
          ) -> Tuple[Arrays, Optional[np.ndarray]]:
    if not batch:
        return empty_arrays(inputs), (np.zeros(0, dtype=np.int64) if extra else None)
    return to_arrays(batch, inputs), (np.asarray(batch[extra[0]]) if extra else None)


def empty_arrays(inputs: InputSpec) -> Arrays:
    """A batch of zero rows (a rank with nothing left still takes part in the step's collectives)."""
    y = np.zeros(0, dtype=np.int64 if inputs.task == "multiclass" else np.float32)
    return (np.zeros((0, inputs.numeric_width), dtype=np.float32),
            np.zeros((0, inputs.cat_width), dtype=np.int64), y)


def dummy_row(x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray) -> Arrays:
    """One all-zero row in the batch's dtypes (trained with weight 0 when a rank has no rows left)."""
    return (np.zeros((1, x_num.shape[1]), dtype=x_num.dtype), np.zeros((1, x_cat.shape[1]), dtype=x_cat.dtype),
            np.zeros(1, dtype=y.dtype))


def _normal(path: str, inputs: InputSpec, columns: List[str], layer: Layer, rank: int, epoch: int,
            settings: ReadSettings, extra: Sequence[str]
            ) -> Tuple[int, int, Iterator[Tuple[Arrays, Optional[np.ndarray]]]]:
    from sparktrain.data.reader import Cursor, make_reader

    reader = make_reader(path, columns=columns, batch_size=layer.batch, rank=rank, world_size=layer.world,
                         shuffle=settings.shuffle, seed=settings.seed, shuffle_buffer=settings.shuffle_buffer,
                         num_epochs=1, remainder=settings.remainder,
                         cursor=Cursor(epoch=epoch, batch_index=layer.done))
    steps = reader.steps_per_epoch

    def gen() -> Iterator[Tuple[Arrays, Optional[np.ndarray]]]:
        with reader:
            for batch in reader:
                yield to_arrays(batch, inputs), (np.asarray(batch[extra[0]]) if extra else None)

    return steps, layer.done, gen()
