"""Filesystem helpers shared by the manifest, the reader and the converter.

A dataset path is either a local path or a URI that :mod:`pyarrow.fs` knows
(``file:///``, ``s3://``, ``gs://``, ``hdfs://``...).  Everything here works on
``(filesystem, path)`` pairs as pyarrow does; the public functions of
:mod:`sparktrain.data` accept ``(path, filesystem=None)`` and resolve them once.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from sparktrain.errors import ConfigError, DataError, DatasetNotFoundError

#: Files Spark, Hadoop and we write next to the data that are not data.
_HIDDEN_PREFIXES = ("_", ".")


def resolve(path: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path inside it)`` for a local path or a URI.

    Parameters
    ----------
    path : str
        Local path or URI.
    filesystem : pyarrow.fs.FileSystem, optional
        When given, ``path`` is taken as a path inside it.
    """
    path = os.fspath(path)
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        try:
            fs, inner = pafs.FileSystem.from_uri(pyarrow_uri(path))
        except pa.ArrowInvalid as exc:
            if "Unrecognized filesystem type" not in str(exc):
                raise
            raise ConfigError("URI", path, f"sparktrain reads and writes its own files (markers, manifests, the "
                                           f"store) with pyarrow, which has no filesystem for "
                                           f"{path.split('://', 1)[0]}://. Use a local path, file://, s3:// (or "
                                           f"s3a://), gs://, abfs(s):// or hdfs://, or a mount of the "
                                           f"storage") from None
        return _bounded_retries(fs), inner
    return pafs.LocalFileSystem(), os.path.abspath(path)


#: Hadoop's names for S3 (its S3A and old native connectors): the same buckets and keys as pyarrow's s3://
_HADOOP_S3 = ("s3a://", "s3n://")


def pyarrow_uri(path: str) -> str:
    """``path`` as pyarrow names it: Hadoop's ``s3a://`` (and ``s3n://``) is ``s3://``, the same object.

    Spark writes an output to ``s3a://bucket/key`` through hadoop-aws; its
    marker, commit and manifest are read and written by pyarrow, which knows
    that object as ``s3://bucket/key``.
    """
    for scheme in _HADOOP_S3:
        if path.startswith(scheme):
            return "s3://" + path[len(scheme):]
    return path


def _bounded_retries(fs: pafs.FileSystem) -> pafs.FileSystem:
    """An S3 filesystem from a URI again, with the AWS standard retry mode's attempts.

    ``FileSystem.from_uri`` leaves the C++ default retry policy: against a store
    that accepts connections but stopped answering (a frozen server, a black-holed
    route) one request takes about 100 s to fail, so a checkpoint or a lease
    heartbeat hangs for minutes before anything names the store.  The standard
    mode's 3 attempts (``AWS_MAX_ATTEMPTS`` changes it, as for the AWS SDKs and
    ``S3FileSystem()``) fail such a request in about 10 s, and still ride out a
    throttled or briefly lost request.  Every other option of the URI is kept.
    """
    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    options = fs.__reduce__()[1][0]  # the URI's options, as pyarrow pickles them
    return pafs.S3FileSystem._reconstruct(
        dict(options, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s3_attempts())))


def s3_attempts() -> int:
    """Attempts per S3 request: ``AWS_MAX_ATTEMPTS``, else the AWS standard retry mode's 3."""
    raw = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    try:
        return max(1, int(raw)) if raw else 3
    except ValueError:
        raise ConfigError("AWS_MAX_ATTEMPTS (environment variable)", raw,
                          "it must be a whole number of attempts for an S3 request (3 is the AWS standard "
                          "mode's); set it to an integer such as 3, or unset it") from None


def info(fs: pafs.FileSystem, path: str) -> pafs.FileInfo:
    """``FileInfo`` of one path (type ``NotFound`` when absent)."""
    return fs.get_file_info(path)


def require(fs: pafs.FileSystem, path: str, what: str = "dataset") -> pafs.FileInfo:
    """Return the ``FileInfo`` of ``path`` or raise :class:`DatasetNotFoundError`."""
    fi = info(fs, path)
    if fi.type == pafs.FileType.NotFound:
        raise DatasetNotFoundError(
            f"{what} path '{path}' does not exist. Check the path (and the filesystem/URI scheme), "
            f"or write the data first: `sparktrain preprocess CONFIG` for a job's output.path, or "
            f"sparktrain.data.write_parquet(df, path) from Python."
        )
    return fi


def list_data_files(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """List the data files under a dataset directory, sorted by relative path.

    Files and folders whose name starts with ``_`` or ``.`` (``_SUCCESS``,
    ``_manifest.json``, Hadoop ``.crc`` files, staging folders) are skipped at
    every level, as Spark and Hive do.
    """
    selector = pafs.FileSelector(path, recursive=True)
    base = path.rstrip("/")
    out = []
    for fi in fs.get_file_info(selector):
        if fi.type != pafs.FileType.File:
            continue
        rel = relpath(fi.path, base)
        if any(part.startswith(_HIDDEN_PREFIXES) for part in rel.split("/")):
            continue
        out.append(fi)
    out.sort(key=lambda f: relpath(f.path, base))
    return out


def relpath(full: str, base: str) -> str:
    """POSIX path of ``full`` relative to ``base`` (both inside one filesystem)."""
    full = full.replace(os.sep, "/")
    base = base.replace(os.sep, "/").rstrip("/")
    if full.startswith(base + "/"):
        return full[len(base) + 1:]
    return posixpath.basename(full)


def join(base: str, rel: str) -> str:
    """Join a base path and a relative POSIX path."""
    return base.rstrip("/") + "/" + rel


def kind(path: str) -> pafs.FileType:
    """The ``FileType`` of ``path`` (local path or URI): ``File``, ``Directory`` or ``NotFound``."""
    fs, inner = resolve(path)
    return info(fs, inner).type


def read_bytes(path: str, what: str = "file") -> bytes:
    """The content of the file at ``path`` (local path or URI); :class:`DatasetNotFoundError` naming it when absent."""
    fs, inner = resolve(path)
    require(fs, inner, what)
    with fs.open_input_stream(inner) as f:
        return f.read()


def read_json(fs: pafs.FileSystem, path: str, what: str, fix: str) -> Any:
    """The parsed JSON file at ``path`` in ``fs``, or None when there is no file there.

    Raises :class:`DataError` naming ``what``, the path and ``fix`` when the file is not valid JSON
    (a torn write, or another tool's file under a name sparktrain uses).
    """
    if info(fs, path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        raw = f.read()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise DataError(f"{what} '{path}' is not valid JSON ({e}). {fix}") from e


def copy_to_local(path: str, local: str) -> None:
    """Copy the folder ``path`` (local path or URI) to the new local folder ``local``."""
    fs, inner = resolve(path)
    os.makedirs(local)
    pafs.copy_files(inner, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def display(path: str) -> str:
    """``path`` as a record shows it: a URI unchanged, a local path absolute."""
    return path if "://" in path else os.path.abspath(path)


def write_atomic(fs: pafs.FileSystem, target: str, data: bytes) -> None:
    """Write one small object so that readers see the old or the new content, never a part.

    Local: a new temporary file (``O_EXCL``), fsynced, renamed over ``target``
    (a file rename), then the folder fsynced.  Elsewhere: one ``PUT``.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        folder = os.path.dirname(target)
        tmp = os.path.join(folder, f".{os.path.basename(target)}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(folder)
        return
    with fs.open_output_stream(target) as out:
        out.write(data)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
