"""Streaming Parquet reader: sharded, shuffled, resumable batches of numpy arrays.

Executor-side module: imports only pyarrow, numpy and :mod:`sparktrain.data`
helpers, never pyspark.  The shard/shuffle arithmetic lives in
:mod:`sparktrain.data.sharding`, the Arrow-to-numpy rules in
:mod:`sparktrain.data.arrays`; ``docs/reader.md`` is the user guide.

Threads and memory: a background thread permutes windows of rows and puts
them, cut into batches, into a queue of ``prefetch`` batches (rounded up to
whole windows); a read-ahead worker decodes the next row group
(``ParquetFile.read_row_group``, on Arrow's thread pool) meanwhile.  At most
three decoded row groups and three windows are alive, so memory stays bounded
whatever the dataset size; both threads stop on :meth:`Reader.close` (and so
on leaving the ``with`` block).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparktrain.data import arrays, sharding
from sparktrain.data.source import Dataset, PieceSource, load_dataset
from sparktrain.errors import ConfigError, DataError, MissingColumnError

log = logging.getLogger(__name__)

_END = object()
_MIN_WINDOW_ROWS = 8192


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Position of a reader: the next batch it will yield.

    ``Cursor(epoch=2, batch_index=10)`` means batches 0..9 of epoch 2 (and all
    earlier epochs) were handed out.  Save :meth:`to_dict` in a checkpoint and
    pass it back as ``make_reader(..., cursor=...)`` to continue without
    repeating or skipping a row; the other arguments (seed, world size, batch
    size, shuffle settings) must be the same.
    """

    epoch: int = 0
    batch_index: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch", "batch_index"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"cursor.{name}", value, "must be an integer >= 0")

    def to_dict(self) -> dict[str, int]:
        """``{"epoch": ..., "batch_index": ...}``, JSON-serialisable."""
        return {"epoch": int(self.epoch), "batch_index": int(self.batch_index)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cursor:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(d, Mapping) or set(d) != {"epoch", "batch_index"}:
            raise ConfigError("cursor", d, "must be a Cursor or a dict with exactly the keys epoch, batch_index")
        return cls(int(d["epoch"]), int(d["batch_index"]))


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, value, f"must be an integer >= {minimum}" + (" or None" if allow_none else ""))


class Reader:
    """Iterable over batches (dicts of numpy arrays) of one shard of a Parquet dataset.

    Build it with :func:`make_reader`, which documents the arguments.
    Iterating yields every remaining batch of every remaining epoch;
    :meth:`iter_epoch` yields only the rest of the current epoch.  Use it as a
    context manager, or call :meth:`close`, to stop the background thread.
    """

    def __init__(self, path: str, columns: Sequence[str] | None = None, batch_size: int = 1024, *,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
                 shuffle_buffer: int = 8192, num_epochs: int | None = 1, remainder: str = "wrap",
                 drop_last: bool = False, cursor: Cursor | Mapping[str, int] | None = None,
                 prefetch: int = 4, filesystem: pafs.FileSystem | None = None,
                 require_manifest: bool = False, fill_null: Mapping[str, Any] | None = None) -> None:
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ConfigError("rank", rank, f"must be < world_size ({world_size}): ranks are 0..{world_size - 1}")
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        _check_int("shuffle_buffer", shuffle_buffer, 0)
        _check_int("num_epochs", num_epochs, 1, allow_none=True)
        _check_int("prefetch", prefetch, 1)
        if remainder not in sharding.REMAINDERS:
            raise ConfigError("remainder", remainder, "must be 'wrap' (pad shards by wrapping around) or 'drop' "
                                                      "(drop the rows that do not divide evenly)")
        self._ds = load_dataset(path, filesystem, require_manifest)
        names = self._ds.schema.names
        if isinstance(columns, str):
            columns = [columns]
        self._columns = list(columns) if columns is not None else list(names)
        if not self._columns:
            raise ConfigError("columns", columns, "select at least one column, or pass None for all")
        for c in list(self._columns) + list(fill_null or {}):
            if c not in names:
                raise MissingColumnError(c, names, where=f"the dataset '{path}'")
        for c in self._columns:
            arrays.check_supported(c, self._ds.schema.field(c).type)
        self.path = path
        self._fill = dict(fill_null or {})
        self._batch, self._rank, self._world = int(batch_size), int(rank), int(world_size)
        self._shuffle, self._seed = bool(shuffle), int(seed)
        self._num_epochs = num_epochs
        n = self.num_rows
        self._shard = sharding.shard_rows(n, self._world, remainder)
        self._steps = sharding.steps_per_epoch(n, self._world, self._batch, remainder, drop_last)
        if self._steps == 0:
            raise DataError(
                f"dataset '{path}' has {n} rows: with world_size={world_size}, remainder='{remainder}', "
                f"batch_size={batch_size}, drop_last={drop_last} a rank gets 0 batches per epoch. Use "
                f"remainder='wrap', drop_last=False, a smaller batch_size or fewer workers.")
        self._rows_used = min(self._shard, self._steps * self._batch)
        self._permute = self._shuffle and shuffle_buffer > 0
        # Rows are handed over a window at a time; without a permutation the window size does not change
        # the order, so it is just big enough to make per-window costs negligible.
        self._window = sharding.window_rows(self._batch, shuffle_buffer, self._shuffle) if self._permute else \
            -(-_MIN_WINDOW_ROWS // self._batch) * self._batch
        if cursor is None:
            cursor = Cursor()
        elif not isinstance(cursor, Cursor):
            cursor = Cursor.from_dict(cursor)
        if cursor.batch_index >= self._steps:
            raise ConfigError("cursor.batch_index", cursor.batch_index,
                              f"must be < steps_per_epoch ({self._steps}); the cursor comes from a reader with "
                              f"other arguments (batch size, world size, data)")
        self._start = self._cursor = cursor
        # the queue holds whole windows: `prefetch` batches, rounded up to windows
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, -(-int(prefetch) * self._batch // self._window)))
        self._pending: collections.deque[tuple[int, int, dict[str, np.ndarray]]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = self._closed = False

    # ------------------------------------------------------------------ properties
    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch; identical on every rank."""
        return self._steps

    @property
    def cursor(self) -> Cursor:
        """The next batch this reader will yield (see :class:`Cursor`)."""
        return self._cursor

    @property
    def num_rows(self) -> int:
        """Rows in the whole dataset (all shards)."""
        return int(self._ds.piece_rows.sum())

    @property
    def shard_rows(self) -> int:
        """Rows this rank yields per epoch (padding included, ``drop_last`` applied)."""
        return self._rows_used

    @property
    def schema(self) -> pa.Schema:
        """Arrow schema of the selected columns."""
        return pa.schema([self._ds.schema.field(c) for c in self._columns])

    @property
    def columns(self) -> list[str]:
        """Selected columns, in batch order."""
        return list(self._columns)

    @property
    def manifest(self) -> dict[str, Any] | None:
        """The dataset's manifest, or None."""
        return self._ds.manifest

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._closed or self._done:
            raise StopIteration
        if self._thread is None:
            self._thread = self._start_thread()
        while not self._pending:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._closed:
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    raise DataError("the reader's background thread ended without a result") from None
                continue
            if item is _END:
                self._done = True
                raise StopIteration
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self._pending.extend(item)
        epoch, k, batch = self._pending.popleft()
        self._cursor = Cursor(epoch + 1, 0) if k + 1 == self._steps else Cursor(epoch, k + 1)
        return batch

    def iter_epoch(self) -> Iterator[dict[str, np.ndarray]]:
        """Yield the remaining batches of the current epoch (all of it when at batch 0)."""
        epoch = self._cursor.epoch
        while self._cursor.epoch == epoch:
            try:
                yield next(self)
            except StopIteration:
                return

    def peek_spec(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """``{column: (numpy dtype, shape of one row)}`` of the batches, from the first rows.

        Reads up to 1024 rows of the first row group (list lengths are not in
        the schema).
        """
        f, rg = int(self._ds.piece_file[0]), int(self._ds.piece_rg[0])
        with self._ds.fs.open_input_file(self._ds.files[f]) as handle:
            it = pq.ParquetFile(handle).iter_batches(batch_size=1024, row_groups=[rg], columns=self._columns)
            table = pa.Table.from_batches([next(it)])
        return arrays.spec_of(arrays.table_to_numpy(table, self._fill))

    def close(self) -> None:
        """Stop the background thread and release files (idempotent)."""
        self._closed = True
        self._stop.set()
        thread = self._thread
        while thread is not None and thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.1)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Reader(path={self.path!r}, rank={self._rank}, world_size={self._world}, batch_size={self._batch}, "
                f"steps_per_epoch={self._steps}, cursor={self._cursor})")

    # ------------------------------------------------------------------ background thread
    def _start_thread(self) -> threading.Thread:
        # The thread gets plain values, not `self`: a reader dropped without close() is then
        # garbage-collected, and its finalizer stops the thread.
        job = _Job(self._ds, self._columns, self._fill, self._start, self._num_epochs, self._batch, self._window,
                   self._rows_used, self._shard, self._seed, self._shuffle, self._permute, self._rank, self._world)
        thread = threading.Thread(target=_run, args=(job, self._queue, self._stop),
                                  name=f"sparktrain-reader-{self._rank}", daemon=True)
        weakref.finalize(self, self._stop.set)
        thread.start()
        return thread


@dataclasses.dataclass(frozen=True)
class _Job:
    """Everything the background thread needs (plain values, no reader)."""

    ds: Dataset
    columns: list[str]
    fill: Mapping[str, Any]
    start: Cursor
    num_epochs: int | None
    batch: int
    window: int
    rows_used: int
    shard: int
    seed: int
    shuffle: bool
    permute: bool
    rank: int
    world: int


def _put(q: queue.Queue[Any], stop: threading.Event, item: Any) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _run(job: _Job, q: queue.Queue[Any], stop: threading.Event) -> None:
    source = PieceSource(job.ds, job.columns, job.fill)
    try:
        _produce(job, source, q, stop)
        _put(q, stop, _END)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, re-raised there
        _put(q, stop, e)
    finally:
        source.close()


def _produce(job: _Job, source: PieceSource, q: queue.Queue[Any], stop: threading.Event) -> None:
    epoch, k0 = job.start.epoch, job.start.batch_index
    stop_epoch = None if job.num_epochs is None else epoch + job.num_epochs
    B, W, used = job.batch, job.window, job.rows_used
    while stop_epoch is None or epoch < stop_epoch:
        order = sharding.piece_order(len(job.ds.piece_rows), job.seed, epoch, job.shuffle)
        plan = sharding.EpochPlan(job.ds.piece_rows, order, job.rank, job.world, job.shard, used)
        first = (k0 * B) // W
        source.schedule([seg[0] for seg in plan.segments(first * W, used)])
        for win in range(first, -(-used // W)):
            lo, hi = win * W, min(win * W + W, used)
            perm = sharding.window_permutation(hi - lo, job.seed, epoch, job.world, job.rank, win) \
                if job.permute else None
            window = source.gather(plan.segments(lo, hi), perm)
            batches = [(epoch, (lo + off) // B, {c: a[off:off + B] for c, a in window.items()})
                       for off in range(0, hi - lo, B) if (lo + off) // B >= k0]
            if not _put(q, stop, batches):
                return
        epoch, k0 = epoch + 1, 0


def make_reader(path: str, columns: Sequence[str] | None = None, batch_size: int = 1024, *, rank: int = 0,
                world_size: int = 1, shuffle: bool = True, seed: int = 0, shuffle_buffer: int = 8192,
                num_epochs: int | None = 1, remainder: str = "wrap", drop_last: bool = False,
                cursor: Cursor | Mapping[str, int] | None = None, prefetch: int = 4,
                filesystem: pafs.FileSystem | None = None, require_manifest: bool = False,
                fill_null: Mapping[str, Any] | None = None) -> Reader:
    """Open a streaming reader over one shard of a Parquet dataset.

    Parameters
    ----------
    path : str
        Dataset directory or single Parquet file (local path or pyarrow URI).
    columns : list of str, optional
        Columns to read, in batch order (default: all).
    batch_size : int
        Rows per batch (the last batch of an epoch may be smaller).
    rank, world_size : int
        This worker's shard: ``0 <= rank < world_size``.
    shuffle : bool
        Shuffle row-group order per epoch and rows within windows of
        ``shuffle_buffer`` rows.  False gives the exact file order.
    seed : int
        Shuffle seed; the order is a function of ``(seed, epoch, world_size)``.
    shuffle_buffer : int
        Rows per shuffle window (rounded up to whole batches); 0 shuffles only
        the row-group order.
    num_epochs : int or None
        Epochs to yield, counted from the cursor's epoch; None = forever.
    remainder : {"wrap", "drop"}
        Equalise shards by wrapping around (some rows read twice per epoch)
        or by dropping the ``< world_size`` extra rows.
    drop_last : bool
        Drop the partial last batch of each epoch.
    cursor : Cursor or dict, optional
        Where to start (see :class:`Cursor`).
    prefetch : int
        Batches the background thread may hold ready (rounded up to whole windows).
    filesystem : pyarrow.fs.FileSystem, optional
        Filesystem of ``path``; inferred from the URI by default.
    require_manifest : bool
        Refuse a dataset without ``_manifest.json`` (default: warn and read).
    fill_null : dict, optional
        ``{column: value}`` replacing nulls (required for nulls in integer,
        boolean, decimal or temporal columns).

    Returns
    -------
    Reader

    Examples
    --------
    >>> with make_reader("/data/train", ["x", "y"], 256, rank=1, world_size=4) as reader:  # doctest: +SKIP
    ...     for batch in reader:
    ...         step(batch["x"], batch["y"])
    """
    return Reader(path, columns, batch_size, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed,
                  shuffle_buffer=shuffle_buffer, num_epochs=num_epochs, remainder=remainder, drop_last=drop_last,
                  cursor=cursor, prefetch=prefetch, filesystem=filesystem, require_manifest=require_manifest,
                  fill_null=fill_null)
