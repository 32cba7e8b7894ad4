"""Dataset manifests, atomic materialization and the Spark Parquet writer.

A *dataset* is a directory of Parquet files with one schema.  Next to the data,
``_manifest.json`` records what a complete write produced, so a reader can tell
a finished dataset from a half-written or modified one and can plan shards
without opening every footer::

    {
      "format_version": 1,
      "files": [{"path": "part-00000-....parquet", "size_bytes": 1234,
                 "num_rows": 1000, "row_groups": [600, 400], "sha256": "..."}],
      "num_rows": 1000,
      "schema": [{"name": "x", "type": "float", "nullable": true}],
      "digest": "sha256 of every file's path, size and sha256",
      "created_at": "2026-11-02T10:00:00+00:00",
      ...extra keys given by the caller...
    }

``files[].path`` is relative to the dataset directory, in POSIX form.  The
``digest`` identifies the content (for lineage in MLflow); it changes when any
byte of any file changes.

Outputs are committed without renaming a directory
(:class:`sparktrain.data.commit.Generation`): each write goes to a new
``<path>/_gen-<id>/`` folder and a commit record, written last, names it;
:func:`read_manifest` follows that record (:func:`sparktrain.data.commit.resolve`).
:func:`atomic_dir` (a staging folder renamed into place) is left only for the
converter's local cache folders.  :func:`write_parquet` is the Spark side; it is
the only function here that touches Spark, and it imports pyspark lazily.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import posixpath
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparktrain.data import _fs, commit, guard
from sparktrain.errors import ConfigError, DataError, DatasetExistsError, SchemaError

log = logging.getLogger(__name__)

MANIFEST_NAME = "_manifest.json"
FORMAT_VERSION = 1
_HASH_CHUNK = 8 << 20
_COMPRESSIONS = ("none", "uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd", "brotli")
#: Bytes per row assumed for a column whose width the schema does not tell.
_GUESS_STRING_BYTES = 32
_GUESS_ARRAY_LEN = 16


def type_key(t: pa.DataType) -> str:
    """A string for an Arrow type that ignores list field names (``item`` vs ``element``)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{type_key(t.value_type)}>"
    if pa.types.is_fixed_size_list(t):
        return f"fixed_size_list<{type_key(t.value_type)}>[{t.list_size}]"
    if pa.types.is_struct(t):
        inner = ", ".join(f"{t.field(i).name}: {type_key(t.field(i).type)}" for i in range(t.num_fields))
        return f"struct<{inner}>"
    return str(t)


def schema_entries(schema: pa.Schema) -> list[dict[str, Any]]:
    """The manifest's ``schema`` list for an Arrow schema."""
    return [{"name": f.name, "type": type_key(f.type), "nullable": f.nullable} for f in schema]


def check_same_schema(reference: pa.Schema, ref_name: str, other: pa.Schema, other_name: str) -> None:
    """Raise :class:`SchemaError` when two files of one dataset disagree on columns or types."""
    ref = {f.name: type_key(f.type) for f in reference}
    oth = {f.name: type_key(f.type) for f in other}
    fix = ("All files of a dataset need one schema: rewrite it with one schema (cast the column in Spark "
           "before writing) or read the files as separate datasets.")
    for name, t in ref.items():
        if name not in oth:
            raise SchemaError(f"file '{other_name}' has no column '{name}', which '{ref_name}' has. {fix}")
        if oth[name] != t:
            raise SchemaError(f"column '{name}' has type {oth[name]} in file '{other_name}' but {t} in "
                              f"file '{ref_name}'. {fix}")
    for name in oth:
        if name not in ref:
            raise SchemaError(f"file '{other_name}' has column '{name}', which '{ref_name}' lacks. {fix}")


def _sha256(fs: pafs.FileSystem, path: str) -> str:
    h = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while True:
            chunk = f.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def build_manifest(path: str, filesystem: pafs.FileSystem | None = None,
                   extra: Mapping[str, Any] | None = None, *, compute_digest: bool = True) -> dict[str, Any]:
    """Scan the Parquet files under ``path`` and describe them.

    Reads every footer (row counts, row groups, schema) and, with
    ``compute_digest``, every byte (sha256 per file).  Raises
    :class:`SchemaError` when files disagree on the schema.

    Parameters
    ----------
    path : str
        Dataset directory (local path or URI).
    filesystem : pyarrow.fs.FileSystem, optional
        Filesystem ``path`` lives in; inferred from the URI when omitted.
    extra : mapping, optional
        Extra JSON-serialisable keys stored at the top level (e.g. lineage).
    compute_digest : bool
        Hash file contents.  When False the digest covers only paths, sizes and
        row counts (cheap, but blind to in-place edits).

    Returns
    -------
    dict
        The manifest (see the module docstring).
    """
    fs, base = _fs.resolve(path, filesystem)
    fi = _fs.require(fs, base)
    files = [fi] if fi.type == pafs.FileType.File else _fs.list_data_files(fs, base)
    if not files:
        gens = sorted(e.base_name for e in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
                      if e.base_name.startswith("_gen-")) if fi.type == pafs.FileType.Directory else []
        if gens:
            raise DataError(f"dataset path '{path}' holds generation folder(s) ({', '.join(gens[:3])}) but no commit "
                            f"record (_manifest.json), which says which one is the dataset: a sparktrain dataset "
                            f"copied or uploaded without its _manifest.json, or a preprocess that did not finish. "
                            f"Copy the whole folder again, _manifest.json included, or preprocess again.")
        raise DataError(f"dataset path '{path}' holds no Parquet files (names starting with '_' or '.' are "
                        f"skipped). Write data there first or fix the path.")
    entries: list[dict[str, Any]] = []
    ref_schema: pa.Schema | None = None
    ref_name = ""
    combined = hashlib.sha256()
    for f in files:
        rel = _fs.relpath(f.path, base) if fi.type != pafs.FileType.File else posixpath.basename(f.path)
        with fs.open_input_file(f.path) as handle:
            try:
                meta = pq.ParquetFile(handle).metadata
            except (pa.ArrowInvalid, OSError) as e:
                raise DataError(f"file '{rel}' under '{path}' is not a readable Parquet file ({e}). Remove it "
                                f"or rewrite the dataset.") from e
            schema = meta.schema.to_arrow_schema()
        if ref_schema is None:
            ref_schema, ref_name = schema, rel
        else:
            check_same_schema(ref_schema, ref_name, schema, rel)
        entry: dict[str, Any] = {
            "path": rel,
            "size_bytes": int(f.size),
            "num_rows": int(meta.num_rows),
            "row_groups": [int(meta.row_group(i).num_rows) for i in range(meta.num_row_groups)],
        }
        if compute_digest:
            entry["sha256"] = _sha256(fs, f.path)
        combined.update(f"{rel}\t{entry['size_bytes']}\t{entry['num_rows']}\t{entry.get('sha256', '')}\n"
                        .encode())
        entries.append(entry)
    assert ref_schema is not None  # files is non-empty
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "files": entries,
        "num_rows": sum(e["num_rows"] for e in entries),
        "schema": schema_entries(ref_schema),
        "digest": ("sha256:" if compute_digest else "meta-sha256:") + combined.hexdigest(),
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    for key, value in (extra or {}).items():
        manifest[key] = value
    return manifest


def write_manifest(path: str, manifest: Mapping[str, Any], filesystem: pafs.FileSystem | None = None) -> str:
    """Write ``manifest`` as ``<path>/_manifest.json`` and return that file's path."""
    fs, base = _fs.resolve(path, filesystem)
    target = _fs.join(base, MANIFEST_NAME)
    data = json.dumps(manifest, indent=1, sort_keys=False).encode()
    with fs.open_output_stream(target) as out:
        out.write(data)
    return target


def read_manifest(path: str, filesystem: pafs.FileSystem | None = None) -> dict[str, Any] | None:
    """Return the manifest of the dataset at ``path``, or None when it has none.

    A committed output (:mod:`sparktrain.data.commit`) is read from its
    committed generation: ``<out>`` and ``<out>/<split>`` resolve there.
    Raises :class:`DataError` when the manifest exists but cannot be used
    (corrupt JSON or a newer ``format_version``).
    """
    path = commit.resolve(path, filesystem)
    fs, base = _fs.resolve(path, filesystem)
    target = _fs.join(base, MANIFEST_NAME)
    manifest = _fs.read_json(fs, target, "manifest", "Rebuild it with "
                             "sparktrain.data.write_manifest(path, build_manifest(path)).")
    if manifest is None:
        return None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int) or version > FORMAT_VERSION or "files" not in manifest:
        raise DataError(f"manifest '{target}' has format_version={version!r}; this sparktrain reads versions "
                        f"<= {FORMAT_VERSION}. Upgrade sparktrain or rebuild the manifest.")
    return manifest


def committed_files(path: str, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The data files of the dataset at ``path`` that its committed manifest lists, in the form ``path`` has.

    For Spark: ``spark.read.parquet(*committed_files(path))`` reads exactly the
    committed generation of a sparktrain output (a plain ``spark.read.parquet(path)``
    skips the ``_gen-`` folders, as it skips every name starting with ``_``).
    A dataset without a manifest gives ``[path]`` (its folder, read as Spark reads it).
    """
    resolved = commit.resolve(path, filesystem)
    manifest = read_manifest(resolved, filesystem)
    if manifest is None:
        return [resolved]
    return [_fs.join(resolved.rstrip("/"), e["path"]) for e in manifest["files"]]


@contextlib.contextmanager
def atomic_dir(final_path: str, overwrite: bool = True,
               filesystem: pafs.FileSystem | None = None, *,
               owned: Sequence[str] | None = guard.MARKERS) -> Iterator[str]:
    """Materialize a directory atomically: write into staging, rename on success (local caches only).

    Outputs on any filesystem use :class:`sparktrain.data.commit.Generation`
    instead, which never moves a directory; this is kept for the converter's
    cache folders, which are local.

    Yields a staging path next to ``final_path``
    (``<parent>/.<name>.staging-<uuid>``) that does not exist yet; the body
    creates it (Spark's writer does).  On a clean exit ``final_path`` is
    replaced by the staging folder with renames; on an exception the staging
    folder is deleted and nothing that looks complete is left.

    On the local filesystem and HDFS the rename is atomic.  When
    ``final_path`` already exists and ``overwrite`` is True, it is first
    renamed aside and then deleted, so readers briefly see no folder rather
    than a mixed one.  As a last line of defence it replaces only a folder
    that is empty or carries one of the ``owned`` markers (sparktrain's
    ``features.json`` or ``_manifest.json``), checked on entry and again
    just before the old folder is moved aside: a user's folder raises
    :class:`~sparktrain.errors.OutputNotOwnedError` and is left as it is.
    Callers check earlier, before any Spark job, with
    :func:`sparktrain.data.guard.check_replaceable`.  Object stores (S3,
    GCS) have no rename: ``move`` copies, so there the guarantee is only
    "complete once the manifest is there".

    Parameters
    ----------
    final_path : str
        Where the directory must end up (local path or URI).
    overwrite : bool
        Replace an existing ``final_path``.  When False and it exists (before
        or after the body ran), :class:`~sparktrain.errors.DatasetExistsError`
        is raised and the staging folder is removed.
    filesystem : pyarrow.fs.FileSystem, optional
        Filesystem of ``final_path``; inferred from the URI when omitted.
    owned : sequence of str, optional
        Marker names that make an existing folder replaceable; None replaces
        any folder (only for a name that sparktrain alone makes, such as the
        converter's ``sparktrain-<hash>`` cache folders).
    """
    final_path = final_path.rstrip("/")
    parent, name = posixpath.split(final_path.replace("\\", "/"))
    if not name:
        raise ConfigError("final_path", final_path, "give a directory path with a final name, e.g. /data/train")
    token = uuid.uuid4().hex[:12]
    staging = posixpath.join(parent, f".{name}.staging-{token}") if parent else f".{name}.staging-{token}"
    fs, final_inner = _fs.resolve(final_path, filesystem)
    _, staging_inner = _fs.resolve(staging, filesystem)
    if not overwrite and _fs.info(fs, final_inner).type != pafs.FileType.NotFound:
        raise DatasetExistsError(f"'{final_path}' already exists and overwrite=False. Pass overwrite=True or "
                                 f"choose another path.")
    guard.check_replaceable(final_inner, "the target folder", markers=owned, filesystem=fs)
    fs.create_dir(posixpath.dirname(staging_inner) or "/", recursive=True)
    try:
        yield staging
        if _fs.info(fs, staging_inner).type == pafs.FileType.NotFound:
            raise DataError(f"nothing was written to the staging path '{staging}' inside atomic_dir"
                            f"('{final_path}'). Write the dataset to the yielded path.")
        existing = _fs.info(fs, final_inner).type != pafs.FileType.NotFound
        if existing and not overwrite:
            raise DatasetExistsError(f"'{final_path}' appeared while it was being written and overwrite=False; "
                                     f"keeping the other writer's copy.")
        trash = None
        if existing:
            guard.check_replaceable(final_inner, "the target folder", markers=owned, filesystem=fs)
            trash = posixpath.join(posixpath.dirname(final_inner), f".{name}.old-{token}")
            fs.move(final_inner, trash)
        fs.move(staging_inner, final_inner)
        if trash is not None:
            _delete_quietly(fs, trash)
    except BaseException:
        _delete_quietly(fs, staging_inner)
        raise


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fi = fs.get_file_info(path)
        if fi.type == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif fi.type == pafs.FileType.File:
            fs.delete_file(path)
    except OSError as e:  # cleanup must not hide the original error
        log.warning("could not delete '%s': %s", path, e)


def estimate_row_bytes(schema: Any) -> int:
    """Estimate the width in bytes of one row of a Spark ``StructType``.

    Fixed-width types count their size; strings and binaries count
    32 bytes; arrays, maps and ML vectors count 16 elements.  This is the
    basis of the ``parquet.block.size`` that :func:`write_parquet` sets.
    """
    from pyspark.sql import types as T

    def width(dt: Any) -> int:
        if isinstance(dt, T.UserDefinedType):
            return width(dt.sqlType())
        if isinstance(dt, (T.ByteType, T.BooleanType)):
            return 1
        if isinstance(dt, T.ShortType):
            return 2
        if isinstance(dt, (T.IntegerType, T.FloatType, T.DateType)):
            return 4
        if isinstance(dt, (T.StringType, T.BinaryType)):
            return _GUESS_STRING_BYTES
        if isinstance(dt, T.DecimalType):
            return 16
        if isinstance(dt, T.ArrayType):
            return 4 + _GUESS_ARRAY_LEN * width(dt.elementType)
        if isinstance(dt, T.MapType):
            return 4 + _GUESS_ARRAY_LEN * (width(dt.keyType) + width(dt.valueType))
        if isinstance(dt, T.StructType):
            return sum(width(f.dataType) for f in dt.fields) or 1
        return 8  # long, double, timestamp, others

    return max(1, width(schema))


def parquet_writer(df: Any, row_group_rows: int = 65536, compression: str = "zstd", *,
                   row_bytes: int | None = None) -> Any:
    """``df.write`` with the codec and row-group options of :func:`write_parquet` set (see there).

    For writes :func:`write_parquet` does not cover (``partitionBy``...); the
    caller builds the manifest(s) with :func:`build_manifest`.
    """
    if not isinstance(row_group_rows, int) or isinstance(row_group_rows, bool) or row_group_rows < 1:
        raise ConfigError("row_group_rows", row_group_rows, "must be an integer >= 1 (e.g. 65536)")
    if not isinstance(compression, str) or compression.lower() not in _COMPRESSIONS:
        raise ConfigError("compression", compression, f"must be one of {', '.join(_COMPRESSIONS)}")
    width = row_bytes if row_bytes is not None else estimate_row_bytes(df.schema)
    if not isinstance(width, int) or width < 1:
        raise ConfigError("row_bytes", row_bytes, "must be an integer >= 1 (bytes per row), or None to estimate")
    block = max(64 << 10, row_group_rows * width)
    log.info("Parquet writer: row groups ~%d rows, parquet.block.size=%d, %s", row_group_rows, block, compression)
    return (df.write
              .option("compression", "none" if compression.lower() == "uncompressed" else compression.lower())
              .option("parquet.block.size", str(block))
              .option("parquet.block.row.count.limit", str(row_group_rows)))


def write_parquet(df: Any, path: str, row_group_rows: int = 65536, compression: str = "zstd", *,
                  mode: str = "error", row_bytes: int | None = None,
                  extra: Mapping[str, Any] | None = None, compute_digest: bool = True) -> dict[str, Any]:
    """Write a Spark DataFrame to Parquet at ``path``, then write its manifest.

    Uses only the DataFrame writer (works on Spark Connect).  Row groups are
    sized through the Parquet writer options: ``parquet.block.size`` is set to
    ``row_group_rows * row_bytes``, where ``row_bytes`` is estimated from the
    schema by :func:`estimate_row_bytes` (an estimate: data that compresses
    well gets larger row groups), and ``parquet.block.row.count.limit`` caps a
    row group at ``row_group_rows`` rows.  One file is written per partition
    of ``df``.  Not atomic by itself: wrap it in :func:`atomic_dir`.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Data to write.
    path : str
        Target directory (any URI Spark and pyarrow both understand).
    row_group_rows : int
        Target rows per Parquet row group.
    compression : str
        Parquet codec (``zstd``, ``snappy``, ``none``...).
    mode : str
        Spark save mode; the default (``error``) refuses to overwrite.  ``errorifexists`` means the same
        to a classic session, and is read as ``error`` here: a Spark Connect client accepts only
        ``append``, ``overwrite``, ``error`` and ``ignore``.
    row_bytes : int, optional
        Override the row width estimate.
    extra : mapping, optional
        Extra keys stored in the manifest.
    compute_digest : bool
        See :func:`build_manifest`.

    Returns
    -------
    dict
        The manifest written to ``<path>/_manifest.json``.

    Examples
    --------
    >>> with atomic_dir("/data/train") as staging:          # doctest: +SKIP
    ...     manifest = write_parquet(df, staging)
    """
    mode = "error" if mode.lower() == "errorifexists" else mode
    parquet_writer(df, row_group_rows, compression, row_bytes=row_bytes).mode(mode).parquet(path)
    manifest = build_manifest(path, extra=extra, compute_digest=compute_digest)
    manifest.setdefault("row_group_rows", row_group_rows)
    write_manifest(path, manifest)
    return manifest
