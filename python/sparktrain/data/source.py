"""Where a reader's rows come from: dataset layout and row-group reads.

:func:`load_dataset` plans from the manifest (or the footers when there is
none) without reading data; :class:`PieceSource` reads and converts row
groups for the reader's background thread.  Executor-side: no pyspark.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparktrain.data import _fs, arrays, commit
from sparktrain.data.manifest import MANIFEST_NAME, check_same_schema, read_manifest
from sparktrain.errors import DataError, SchemaError

_OPEN_FILES = 16


@dataclasses.dataclass
class Dataset:
    """What the reader needs to know about the files: planned without reading data."""

    fs: pafs.FileSystem
    files: list[str]            # full paths inside fs
    rel: list[str]              # paths relative to the dataset, for messages
    piece_file: np.ndarray      # per piece (row group with rows > 0): file index
    piece_rg: np.ndarray        # row group index inside the file
    piece_rows: np.ndarray      # rows
    schema: pa.Schema
    manifest: dict[str, Any] | None


def load_dataset(path: str, filesystem: pafs.FileSystem | None, require_manifest: bool) -> Dataset:
    path = commit.resolve(path, filesystem)  # a committed output: only the files its record's generation lists
    fs, base = _fs.resolve(path, filesystem)
    fi = _fs.require(fs, base)
    manifest = read_manifest(path, filesystem) if fi.type == pafs.FileType.Directory else None
    layout: list[tuple[str, str, list[int]]] = []  # (full, rel, row groups)
    schema: pa.Schema | None = None
    if manifest is not None:
        entries = manifest["files"]
        full = [_fs.join(base, e["path"]) for e in entries]
        for e, info in zip(entries, fs.get_file_info(full) if full else []):
            if info.type == pafs.FileType.NotFound or info.size != e["size_bytes"]:
                state = "is missing" if info.type == pafs.FileType.NotFound else \
                    f"has {info.size} bytes, not {e['size_bytes']}"
                raise DataError(
                    f"the manifest of '{path}' lists file '{e['path']}', which {state}: the dataset is incomplete "
                    f"or was modified after it was written. Rewrite it, or rebuild the manifest with "
                    f"sparktrain.data.write_manifest(path, build_manifest(path)).")
            layout.append((_fs.join(base, e["path"]), e["path"], list(e["row_groups"])))
        if layout:
            with fs.open_input_file(layout[0][0]) as f:
                schema = pq.ParquetFile(f).schema_arrow
    else:
        if require_manifest:
            raise DataError(f"dataset '{path}' has no {MANIFEST_NAME} and require_manifest=True. Write it with "
                            f"sparktrain.data.write_parquet (or make_spark_converter), or build one with "
                            f"sparktrain.data.write_manifest(path, build_manifest(path)).")
        warnings.warn(f"dataset '{path}' has no _manifest.json, so it cannot be told from a half-written one; "
                      f"reading it anyway. Write datasets with sparktrain.data.write_parquet, or build a manifest "
                      f"with sparktrain.data.write_manifest(path, build_manifest(path)); pass "
                      f"require_manifest=True to make this an error.", UserWarning, stacklevel=4)
        files = [fi] if fi.type == pafs.FileType.File else _fs.list_data_files(fs, base)
        first_rel = ""
        for f in files:
            rel = _fs.relpath(f.path, base) if fi.type == pafs.FileType.Directory else f.path
            with fs.open_input_file(f.path) as handle:
                try:
                    pf = pq.ParquetFile(handle)
                except (pa.ArrowInvalid, OSError) as e:
                    raise DataError(f"file '{rel}' of dataset '{path}' is not a readable Parquet file ({e}). "
                                    f"Remove it or rewrite the dataset.") from e
                meta = pf.metadata
                fschema = pf.schema_arrow
            if schema is None:
                schema, first_rel = fschema, rel
            else:
                check_same_schema(schema, first_rel, fschema, rel)
            layout.append((f.path, rel, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]))
    pieces = [(fi_, rg, rows) for fi_, (_, _, rgs) in enumerate(layout) for rg, rows in enumerate(rgs) if rows > 0]
    if schema is None or not pieces:
        raise DataError(f"dataset '{path}' has 0 rows. Check the path, or the filter that produced the data.")
    p = np.array(pieces, dtype=np.int64)
    return Dataset(fs, [x[0] for x in layout], [x[1] for x in layout], p[:, 0], p[:, 1], p[:, 2], schema,
                    manifest)


class PieceSource:
    """Reads and converts row groups for the background thread.

    Reads run on one read-ahead worker: while the reader permutes and queues
    the rows of one row group, the next scheduled one is being decoded.  At
    most two converted row groups are cached plus the one read ahead.
    """

    def __init__(self, ds: Dataset, columns: list[str], fill: Mapping[str, Any]) -> None:
        self.ds, self.columns, self.fill = ds, columns, fill
        self.files: collections.OrderedDict[int, tuple[Any, pq.ParquetFile]] = collections.OrderedDict()
        self.pieces: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self.expected = pa.schema([ds.schema.field(c) for c in columns])
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparktrain-readahead")
        self._ahead: dict[int, Future] = {}
        self._schedule: list[int] = []
        self._pos = 0

    def schedule(self, pieces: Sequence[int]) -> None:
        """Tell the source the order pieces will be asked for (enables read-ahead)."""
        self._schedule = [p for i, p in enumerate(pieces) if i == 0 or pieces[i - 1] != p]
        self._pos = 0

    def _file(self, i: int) -> pq.ParquetFile:
        if i in self.files:
            self.files.move_to_end(i)
            return self.files[i][1]
        handle = self.ds.fs.open_input_file(self.ds.files[i])
        pf = pq.ParquetFile(handle)
        actual = pf.schema_arrow
        missing = [c for c in self.columns if c not in actual.names]
        if missing:
            raise SchemaError(f"file '{self.ds.rel[i]}' has no column '{missing[0]}', unlike the rest of the "
                              f"dataset (or its manifest). Rewrite the dataset with one schema.")
        check_same_schema(self.expected, "the dataset's first file",
                          pa.schema([actual.field(c) for c in self.columns]), self.ds.rel[i])
        self.files[i] = (handle, pf)
        if len(self.files) > _OPEN_FILES:
            self.files.popitem(last=False)[1][0].close()
        return pf

    def _load(self, p: int) -> dict[str, np.ndarray]:
        pf = self._file(int(self.ds.piece_file[p]))
        table = pf.read_row_group(int(self.ds.piece_rg[p]), columns=self.columns, use_threads=True)
        return arrays.table_to_numpy(table, self.fill)

    def piece(self, p: int) -> dict[str, np.ndarray]:
        """Converted arrays of piece ``p``; starts reading the next scheduled piece."""
        if p not in self.pieces:
            future = self._ahead.pop(p, None) or self._pool.submit(self._load, p)
            self.pieces[p] = future.result()
            if len(self.pieces) > 2:
                self.pieces.popitem(last=False)
        sched = self._schedule
        while self._pos < len(sched) and sched[self._pos] != p:
            self._pos += 1
        nxt = sched[self._pos + 1] if self._pos + 1 < len(sched) else None
        if nxt is not None and nxt not in self.pieces and nxt not in self._ahead:
            self._ahead = {nxt: self._pool.submit(self._load, nxt)}  # an unused read-ahead is dropped
        return self.pieces[p]

    def gather(self, segments: list[tuple[int, int, int]], perm: np.ndarray | None) -> dict[str, np.ndarray]:
        """Rows of ``segments`` (in order), permuted by ``perm``; arrays own their memory."""
        parts = [(self.piece(p), lo, hi) for p, lo, hi in segments]
        out = {}
        for c in self.columns:
            if len(parts) == 1:
                arr, lo, hi = parts[0][0][c], parts[0][1], parts[0][2]
                out[c] = np.take(arr, perm + lo, axis=0) if perm is not None else np.array(arr[lo:hi])
            else:
                joined = np.concatenate([a[c][lo:hi] for a, lo, hi in parts])
                out[c] = np.take(joined, perm, axis=0) if perm is not None else joined
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ahead.clear()
        for handle, _ in self.files.values():
            handle.close()
        self.files.clear()
        self.pieces.clear()
