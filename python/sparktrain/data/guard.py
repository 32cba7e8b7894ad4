"""Guarded outputs: sparktrain replaces only folders it wrote, never a user's files.

Every writer that replaces a folder (``output.path`` of ``sparktrain
preprocess``, ``sparktrain score --output``, :class:`~sparktrain.data.commit.Generation`)
checks two things before any Spark job:

1. **What the folder holds** (:func:`check_replaceable`): nothing (absent or
   empty), or sparktrain's own marker at its top level (:data:`MARKERS`: the
   ``features.json`` of a materialized dataset, the ``_manifest.json`` of a
   split, a :func:`~sparktrain.data.write_parquet` dataset, a scored output or
   a commit record of :mod:`sparktrain.data.commit`), or only generations a
   crashed write left (``_gen-<id>/`` folders holding their ``_generation.json``).
   A marker counts by its **content**, not its name (:func:`is_marker`): it must
   parse as JSON and carry sparktrain's format name and a version this
   sparktrain knows, so a user's own ``features.json`` does not make a folder
   replaceable.  Anything else raises :class:`~sparktrain.errors.OutputNotOwnedError`,
   naming the folder, a few of its entries and the fix.
2. **Where the folder is** (:func:`check_output_location`): never ``/``, the
   current directory, the home directory or a folder holding either; never
   equal to, inside or around the input, the training store or the MLflow
   store.  Raises :class:`~sparktrain.errors.OutputOverlapError`.

:func:`check_job_paths` applies both to a job config (``output.path`` against
``data.source``, ``train.store``, ``tracking.uri`` and
``tracking.artifact_location``; ``train.store`` against the current and home
directory, ``/``, the output and the source).

Paths are local paths or URIs :mod:`pyarrow.fs` knows.  Local paths (and
``file:`` URIs) are compared after :func:`os.path.realpath`, so ``.``,
``..`` and symlinks cannot hide an overlap; other URIs compare by scheme,
host and normalized path.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import urllib.parse
from dataclasses import dataclass
from typing import Collection, Iterable, List, Optional, Protocol, Sequence, Tuple

import pyarrow.fs as pafs

from sparktrain._internal.secrets import mask_value
from sparktrain.data import _fs
from sparktrain.errors import (ConfigError, DatasetExistsError, OutputNotOwnedError, OutputOverlapError,
                               PathNotWritableError)

log = logging.getLogger(__name__)

#: Files whose presence at a folder's top level marks it as written by sparktrain (checked by content).
MARKERS: Tuple[str, ...] = ("features.json", "_manifest.json")
#: ``format`` of a commit record (:mod:`sparktrain.data.commit`).
COMMIT_FORMAT = "sparktrain.commit/1"
#: ``format`` of a generation's marker, and the names of both.
GEN_FORMAT = "sparktrain.generation/1"
GEN_PREFIX = "_gen-"
GEN_MARKER = "_generation.json"
#: ``format`` of ``features.json`` (:data:`sparktrain.features.metadata.FORMAT`; that module sits above this layer).
FEATURES_FORMAT = "sparktrain.features/1"
#: Highest ``format_version`` of a dataset ``_manifest.json`` (:data:`sparktrain.data.manifest.FORMAT_VERSION`).
MANIFEST_VERSION = 1
#: Bytes of a marker read at most (a marker is small; a huge file of that name is not ours).
_MARKER_MAX_BYTES = 64 << 20
#: Entries of a refused folder that its error names.
SHOWN_ENTRIES = 5
_GLOB = "*?[{"


@dataclass(frozen=True)
class Location:
    """A path reduced to what overlap checks compare.

    Attributes
    ----------
    space : str
        ``""`` for the local filesystem, else ``scheme://host``.
    path : str
        Absolute, normalized POSIX path inside ``space`` (``realpath`` when local).
    given : str
        The path as the user wrote it (for messages).
    """

    space: str
    path: str
    given: str

    def within(self, other: "Location") -> bool:
        """Whether this location is ``other`` or lies inside it."""
        if self.space != other.space:
            return False
        base = other.path.rstrip("/")
        return self.path == other.path or self.path.startswith(base + "/")


def locate(path: str) -> Location:
    """The :class:`Location` of a local path, ``file:`` URI or other URI (a glob stops at its first pattern)."""
    given = os.fspath(path)
    text = _before_glob(given)
    if text.startswith("file:"):
        return Location("", os.path.realpath(urllib.parse.unquote(urllib.parse.urlparse(text).path) or "/"), given)
    if "://" in text:
        url = urllib.parse.urlparse(text)
        return Location(f"{url.scheme.lower()}://{url.netloc}", posixpath.normpath("/" + url.path.lstrip("/")), given)
    return Location("", os.path.realpath(text or "."), given)


def _before_glob(path: str) -> str:
    """``data/2024-*/x.csv`` -> ``data``: the part of a path that names real folders."""
    if not any(c in path for c in _GLOB):
        return path
    parts = path.split("/")
    kept = []
    for part in parts:
        if any(c in part for c in _GLOB):
            break
        kept.append(part)
    return "/".join(kept) or "."


def _entries(fs: pafs.FileSystem, inner: str) -> List[pafs.FileInfo]:
    return sorted(fs.get_file_info(pafs.FileSelector(inner, recursive=False)), key=lambda f: f.base_name)


def is_marker(name: str, body: object) -> bool:
    """Whether parsed JSON ``body`` of a file called ``name`` is sparktrain's marker (format and known version).

    ``features.json``: ``format`` is ``sparktrain.features/1``.  ``_manifest.json``:
    a commit record (``format`` ``sparktrain.commit/1``) or a dataset manifest
    (an integer ``format_version`` from 1 to the newest known, and a ``files`` list).
    ``_generation.json``: ``format`` ``sparktrain.generation/1``.
    """
    if not isinstance(body, dict):
        return False
    if name == "features.json":
        return body.get("format") == FEATURES_FORMAT
    if name == "_manifest.json":
        if body.get("format") == COMMIT_FORMAT:
            return isinstance(body.get("path"), str) and body["path"].startswith(GEN_PREFIX)
        version = body.get("format_version")
        return (isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= MANIFEST_VERSION
                and isinstance(body.get("files"), list))
    if name == GEN_MARKER:
        return body.get("format") == GEN_FORMAT
    return False


def _read_marker(fs: pafs.FileSystem, path: str, name: str, size: Optional[int]) -> bool:
    if size is not None and size > _MARKER_MAX_BYTES:
        return False
    try:
        with fs.open_input_stream(path) as f:
            body = json.loads(f.read())
    except (OSError, ValueError):
        return False
    return is_marker(name, body)


def _owned_generation(fs: pafs.FileSystem, entry: pafs.FileInfo) -> bool:
    """A ``_gen-<id>/`` folder holding its generation marker (what a write that did not commit leaves)."""
    if entry.type != pafs.FileType.Directory or not entry.base_name.startswith(GEN_PREFIX):
        return False
    marker = entry.path.rstrip("/") + "/" + GEN_MARKER
    info = fs.get_file_info(marker)
    return info.type == pafs.FileType.File and _read_marker(fs, marker, GEN_MARKER, info.size)


def check_replaceable(path: str, what: str = "output.path", *, markers: Optional[Sequence[str]] = MARKERS,
                      overwrite: bool = True, filesystem: Optional[pafs.FileSystem] = None,
                      shown_as: Optional[str] = None) -> None:
    """Refuse to replace a folder that sparktrain did not write.

    Accepted: ``path`` does not exist, is an empty folder, or (with
    ``overwrite``) is a folder with one of ``markers`` at its top level whose
    content is sparktrain's (:func:`is_marker`), or that holds only
    generations a write left before its commit (``_gen-<id>/`` with its marker).

    Parameters
    ----------
    path : str
        The folder to be replaced (local path or URI).
    what : str
        The setting that named it, for the message (``output.path``, ``--output``).
    markers : sequence of str, optional
        Marker file names; None accepts any folder (for a name only sparktrain
        makes, such as the converter's ``sparktrain-<hash>`` cache folders).
    overwrite : bool
        When False, any existing folder (even sparktrain's) raises
        :class:`~sparktrain.errors.DatasetExistsError`.
    filesystem : pyarrow.fs.FileSystem, optional
        When given, ``path`` is a path inside it.
    shown_as : str, optional
        How to name ``path`` in messages (default: ``path``).

    Raises
    ------
    OutputNotOwnedError
        ``path`` is a file, or a folder with other content and no valid marker
        (a file named like a marker whose content is not sparktrain's is no marker).
    DatasetExistsError
        ``path`` exists and ``overwrite`` is False.

    Examples
    --------
    >>> check_replaceable("reports")          # doctest: +SKIP
    OutputNotOwnedError: output.path 'reports' holds notes/ and report.pdf, and no sparktrain marker ...
    """
    fs, inner = _fs.resolve(path, filesystem)
    info = _fs.info(fs, inner)
    if info.type == pafs.FileType.NotFound:
        return
    path = shown_as or path
    if not overwrite:
        raise DatasetExistsError(f"{what} '{path}' already exists and overwrite is off (output.overwrite: false). "
                                 f"Fix: choose a new folder, delete '{path}' yourself, or set output.overwrite: true")
    if info.type != pafs.FileType.Directory:
        raise OutputNotOwnedError(path, what, [f"a file ({info.size} bytes), not a folder"], 1, markers or MARKERS)
    if markers is None:
        return
    entries = _entries(fs, inner)
    if not entries:
        return
    for e in entries:
        if e.base_name in markers and e.type == pafs.FileType.File and _read_marker(fs, e.path, e.base_name, e.size):
            return
    if all(_owned_generation(fs, e) for e in entries):
        return
    names = [e.base_name + ("/" if e.type == pafs.FileType.Directory else "") for e in entries]
    fakes = [n for n in names if n in markers]
    raise OutputNotOwnedError(path, what, names[:SHOWN_ENTRIES], len(names), markers, not_ours=fakes)


def _overlap(what: str, value: str, problem: str, fix: str) -> OutputOverlapError:
    return OutputOverlapError(what, value, f"{problem}; replacing it would delete or change that, so nothing "
                                           f"was written. Fix: {fix}")


def _nearest_existing(path: str) -> str:
    """``path`` or the nearest folder above it that exists (where a new folder would be made)."""
    probe = path
    while probe and not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def check_writable(path: str, what: str) -> None:
    """Refuse a local folder this process cannot write: ``path``, or where it would be made.

    Checked before any Spark job, so that a read-only (or immutable) store or
    output gives an error naming the setting instead of the first write's
    ``PermissionError``.  Remote stores (``s3://``, ``hdfs://``) are not
    checked for permissions (those show only on a write), but a bucket that
    does not exist is refused here, not by the first write deep inside a fit.

    Raises
    ------
    PathNotWritableError
    ConfigError
        An ``s3://`` (``s3a://``) or ``gs://`` bucket that does not exist.
    """
    loc = locate(path)
    if loc.space:
        _check_bucket(path, what)
        return
    probe = _nearest_existing(loc.path)
    if probe and os.path.isdir(probe) and not os.access(probe, os.W_OK | os.X_OK):
        raise PathNotWritableError(what, path, path if probe == loc.path else probe)


def _check_bucket(path: str, what: str) -> None:
    """Refuse an object-store URI whose bucket does not exist (where the store can say so; else the writes will)."""
    try:
        fs, inner = _fs.resolve(path)
        if not isinstance(fs, (pafs.S3FileSystem, pafs.GcsFileSystem)):
            return
        bucket = inner.strip("/").split("/", 1)[0]
        missing = bool(bucket) and fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except (OSError, ValueError) as exc:  # unreachable or no permission to look: the first write says it
        log.debug("bucket check of %s: %s", mask_value(path), exc)
        return
    if missing:
        raise ConfigError(what, mask_value(path), f"its bucket '{bucket}' does not exist (or these credentials "
                                                  f"cannot see it), so nothing can be written there. Fix: create "
                                                  f"the bucket, or point {what} at an existing one")


def check_output_location(path: str, what: str = "output.path", *,
                          inputs: Iterable[Tuple[str, str]] = (),
                          keep_apart: Iterable[Tuple[str, str]] = (),
                          keep_out: Iterable[Tuple[str, str]] = ()) -> None:
    """Refuse an output folder whose replacement would delete something that is not its own.

    Always refused: ``/`` (or the root of a bucket), and a folder that is or
    holds the current directory or the home directory.

    Parameters
    ----------
    path : str
        The output folder.
    what : str
        Its setting, for the message.
    inputs : iterable of (str, str)
        ``(name, path)`` of what the job reads: the output may be neither
        inside it nor around it.
    keep_apart : iterable of (str, str)
        ``(name, path)`` of other folders the output may neither be in nor
        hold (the training store, an MLflow file store or artifact folder).
    keep_out : iterable of (str, str)
        ``(name, path)`` of files or folders the output must not hold, though
        it may lie beside or below them (an MLflow sqlite database file: the
        output may sit in the database's folder, not be that folder).

    Raises
    ------
    OutputOverlapError
        Naming the setting, the value, what it overlaps and the fix.
    PathNotWritableError
        When the folder (or where it would be made) cannot be written.
    """
    out = locate(path)
    new = "point it at a folder of its own, e.g. work/<job name>/dataset"
    if out.path == "/":
        raise _overlap(what, path, "it is the root of the filesystem" if not out.space else
                       f"it is the root of {out.space}", new)
    if not out.space:
        for name, place in (("the current directory", os.getcwd()), ("the home directory", os.path.expanduser("~"))):
            here = locate(place)
            if here.within(out):
                where = "is" if here.path == out.path else "holds"
                raise _overlap(what, path, f"it {where} {name} ({here.path})", new)
    for name, other in inputs:
        _apart(out, what, path, name, other, f"{new}, beside the input")
    for name, other in keep_apart:
        _apart(out, what, path, name, other, f"{new}, beside {name}")
    for name, other in keep_out:
        if locate(other).within(out):
            raise _overlap(what, path, f"it holds {name} '{other}'", f"{new}, not a folder that holds {name}")
    check_writable(path, what)


def _apart(out: Location, what: str, path: str, name: str, other: str, fix: str) -> None:
    place = locate(other)
    if out.path == place.path and out.space == place.space:
        raise _overlap(what, path, f"it is {name} '{other}'", fix)
    if out.within(place):
        raise _overlap(what, path, f"it lies inside {name} '{other}'", fix)
    if place.within(out):
        raise _overlap(what, path, f"it holds {name} '{other}'", fix)


def mlflow_paths(tracking_uri: Optional[str], artifact_location: Optional[str] = None
                 ) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """``(keep_apart, keep_out)`` for :func:`check_output_location` from MLflow's store and artifact folder.

    A ``sqlite:///`` store is its database file (keep out); a ``file:`` or
    bare-path store and a local ``artifact_location`` are folders (keep apart);
    a server (``http(s)://``) or a remote artifact URI has nothing local to protect.
    """
    apart: List[Tuple[str, str]] = []
    out: List[Tuple[str, str]] = []
    uri = tracking_uri or ""
    if uri.startswith("sqlite:///"):
        db = uri[len("sqlite:///"):]
        if db and db != ":memory:":
            out.append((f"the MLflow store ({uri})", db))
    elif uri.startswith("file:") or (uri and "://" not in uri):
        apart.append((f"the MLflow store ({uri})", uri))
    if artifact_location and (artifact_location.startswith("file:") or "://" not in artifact_location):
        apart.append(("the MLflow artifact folder (tracking.artifact_location)", artifact_location))
    return apart, out


class _Data(Protocol):
    @property
    def source(self) -> Optional[str]: ...


class _Output(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def overwrite(self) -> bool: ...


class _Train(Protocol):
    @property
    def store(self) -> str: ...


class TrackingPaths(Protocol):
    """What the output checks read of a ``tracking:`` section (:class:`sparktrain.config.TrackingConfig`)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def uri(self) -> str: ...

    @property
    def artifact_location(self) -> str: ...


class JobPaths(Protocol):
    """The paths of a job config :func:`check_job_paths` reads (:class:`sparktrain.config.JobConfig` is one)."""

    @property
    def data(self) -> _Data: ...

    @property
    def output(self) -> _Output: ...

    @property
    def train(self) -> Optional[_Train]: ...

    @property
    def tracking(self) -> TrackingPaths: ...


def _source_path(cfg: JobPaths, embedded: Collection[str]) -> Optional[str]:
    source = cfg.data.source
    return source if source and source not in embedded else None


def check_store_location(store: str, what: str = "train.store", *, dataset: Optional[str] = None,
                         source: Optional[str] = None) -> None:
    """Refuse a training store at ``/``, the current or home directory, inside the dataset or the source,
    at (or under) a local path that is a file, or in a local folder this process cannot write.

    Raises
    ------
    OutputOverlapError
    PathNotWritableError
    """
    loc = locate(store)
    fix = "point it at a folder of its own, e.g. work/store"
    if loc.path == "/":
        raise OutputOverlapError(what, store, f"it is the root of {loc.space or 'the filesystem'}; {fix}")
    if not loc.space:
        probe = _nearest_existing(loc.path)  # the nearest part of the path that exists must be a folder
        if probe and os.path.exists(probe) and not os.path.isdir(probe):
            raise OutputOverlapError(what, store, f"'{probe}' is a file, not a folder, so no run folder can be "
                                                  f"made there. Fix: {fix}")
        for name, place in (("the current directory", os.getcwd()), ("the home directory", os.path.expanduser("~"))):
            if locate(place).path == loc.path:
                raise OutputOverlapError(what, store, f"it is {name}; every run would write its folders there. "
                                                      f"Fix: {fix}")
    for name, other in (("output.path (the materialized dataset)", dataset), ("data.source", source)):
        if other and loc.within(locate(other)):
            raise OutputOverlapError(what, store, f"it lies inside {name} '{other}', which preprocess replaces or "
                                                  f"reads whole. Fix: {fix}, outside it")
    check_writable(store, what)


def check_job_paths(cfg: JobPaths, stages: Sequence[str] = ("preprocess", "train"), *, with_source: bool = True,
                    check_content: bool = True, embedded: Collection[str] = ()) -> None:
    """Check a job config's output folder and training store before any Spark work.

    Parameters
    ----------
    cfg : JobPaths
        A :class:`~sparktrain.config.JobConfig`.
    stages : sequence of str
        With ``preprocess``: ``output.path``'s location (against
        ``data.source``, ``train.store``, the MLflow store and artifact folder
        when ``tracking.enabled``, ``/``, the current and home directory) and, with ``check_content``,
        what it holds (:func:`check_replaceable`, honouring ``output.overwrite``).
        With ``train`` or ``tune``: ``train.store``'s location.
    with_source : bool
        Compare with ``data.source`` (False when the input is a DataFrame).
    check_content : bool
        Also list ``output.path``'s top level.
    embedded : collection of str
        Names ``data.source`` may give instead of a path (embedded datasets:
        the job passes :data:`sparktrain.datasets.EMBEDDED`); such a source
        has no folder to compare with.

    Raises
    ------
    OutputOverlapError, OutputNotOwnedError, DatasetExistsError
    """
    source = _source_path(cfg, embedded) if with_source else None
    store = cfg.train.store if cfg.train is not None else None
    if "preprocess" in stages:
        apart: List[Tuple[str, str]] = []
        keep_out: List[Tuple[str, str]] = []
        if store:
            apart.append(("train.store", store))
        if cfg.tracking.enabled:
            apart_ml, keep_out = mlflow_paths(cfg.tracking.uri, cfg.tracking.artifact_location)
            apart += apart_ml
        check_output_location(cfg.output.path, "output.path", inputs=[("data.source", source)] if source else [],
                              keep_apart=apart, keep_out=keep_out)
        if check_content:
            check_replaceable(cfg.output.path, "output.path", overwrite=cfg.output.overwrite)
    if store and ("train" in stages or "tune" in stages):
        check_store_location(store, "train.store", dataset=cfg.output.path, source=source)


__all__ = ["COMMIT_FORMAT", "GEN_FORMAT", "GEN_MARKER", "GEN_PREFIX", "MARKERS", "JobPaths", "is_marker",
           "Location", "check_job_paths", "check_output_location", "check_replaceable",
           "check_store_location", "check_writable", "locate", "mlflow_paths"]
