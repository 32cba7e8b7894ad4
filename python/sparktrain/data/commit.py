"""Commits without directory renames: a generation per write, and a commit record written last.

Object stores (S3, GCS, ABFS through :mod:`pyarrow.fs`) cannot move a
directory, so no output of sparktrain is committed by a rename.  A writer puts
everything it writes under a folder of its own, named for this write only,
inside the final path, and commits by writing one small object last::

    <path>/_manifest.json                  the commit record (format sparktrain.commit/1): names the generation
    <path>/_gen-<id>/_generation.json      written first: marks the folder as sparktrain's
    <path>/_gen-<id>/...                   the generation's content: a dataset (part files + _manifest.json),
                                           or a preprocess output (features.json, pipeline_model/, train/...)

* **Readers trust only the record.**  :func:`resolve` maps ``<path>`` to the
  committed ``<path>/_gen-<id>``, and ``<path>/<name>`` to
  ``<path>/_gen-<id>/<name>``; a folder without a record (a dataset written by
  sparktrain before this layout, or by anyone else) resolves to itself.  The
  ``_gen-`` folders start with ``_`` and hold no ``=``, so Spark and Hive never
  list them when given ``<path>`` (``_gen=<id>`` would be read as a partition
  column, mixing every generation); a write that did not commit is invisible.
  Spark reads a committed dataset with
  ``spark.read.parquet(*sparktrain.data.committed_files(path))``.
* **The record is written last, in one piece.**  Locally it is written to a
  new temporary file (``O_EXCL``), flushed, fsynced and renamed over the old
  record (a file rename, atomic on POSIX); on an object store it is one PUT of
  a new object version, which is atomic.  Each generation's content lives under
  new object names, so the record is the small pointer that switches between them.
* **A crash at any point** leaves the previous record, so the previous
  generation stays readable; or the new record, so the new one is.
  Never a mix, never nothing.
* **Cleanup.**  :class:`Generation` removes, on entry, the ``_gen-`` folders
  that no record names (a write that crashed before its commit), and, after
  its commit, the previous generation and what an earlier layout left at the
  top level (only in a folder that carried sparktrain's marker, checked by
  :func:`sparktrain.data.guard.check_replaceable`).
* **Readers keep what they read.**  A job that reads a committed output for a
  while (a fit, a search) does so inside :func:`reading`, which pins the
  generation it resolved (:class:`sparktrain.data.lease.Pin`).  A commit keeps
  a pinned generation, and the first write after its readers end removes it;
  the record already names the new one, so new readers never see the old.

Executor-safe: pyarrow only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import posixpath
import socket
import uuid
from types import TracebackType
from typing import Any, Dict, Iterator, List, Mapping, Optional, Type

import pyarrow.fs as pafs

from sparktrain.data import _fs, guard
from sparktrain.data._fs import write_atomic
from sparktrain.errors import DataError, DatasetExistsError

log = logging.getLogger(__name__)

RECORD_NAME = "_manifest.json"
RECORD_FORMAT = guard.COMMIT_FORMAT
GEN_PREFIX = guard.GEN_PREFIX
GEN_MARKER = guard.GEN_MARKER
GEN_FORMAT = guard.GEN_FORMAT


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def read_record(path: str, filesystem: Optional[pafs.FileSystem] = None) -> Optional[Dict[str, Any]]:
    """The commit record at ``<path>/_manifest.json``, or None when there is none (or it is a dataset manifest).

    Raises :class:`DataError` when the record is not valid JSON.
    """
    fs, inner = _fs.resolve(path, filesystem)
    body = _fs.read_json(fs, _join(inner, RECORD_NAME), "commit record",
                         f"Write the output again (its previous generation, if any, is still under "
                         f"{path}/{GEN_PREFIX}*).")
    if isinstance(body, dict) and body.get("format") == RECORD_FORMAT:
        return body
    return None


def resolve(path: str, filesystem: Optional[pafs.FileSystem] = None) -> str:
    """Where the committed content of ``path`` is: ``path`` itself, or inside its committed generation.

    ``<out>`` with a commit record resolves to ``<out>/_gen-<id>``;
    ``<out>/train`` (no record of its own, a record in ``<out>``) resolves to
    ``<out>/_gen-<id>/train``; anything else resolves to itself (earlier
    layouts and other writers' data stay readable).  The result has the form
    ``path`` was given in (local path, URI, or a path inside ``filesystem``).
    """
    path = os.fspath(path)
    given = path.rstrip("/") or path
    record = read_record(given, filesystem)
    if record is not None:
        return _join(given, str(record["path"]))
    parent, name = posixpath.split(given)
    if parent and name and not name.startswith(GEN_PREFIX) and not parent.endswith(":/"):
        try:
            record = read_record(parent, filesystem)
        except DataError:
            record = None
        if record is not None:
            return _join(parent, str(record["path"]), name)
    return path


def exists(path: str, filesystem: Optional[pafs.FileSystem] = None) -> bool:
    """Whether ``path``'s committed content (see :func:`resolve`) exists."""
    fs, inner = _fs.resolve(resolve(path, filesystem), filesystem)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def _delete(fs: pafs.FileSystem, inner: str) -> None:
    try:
        kind = fs.get_file_info(inner).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(inner)
        elif kind == pafs.FileType.File:
            fs.delete_file(inner)
    except OSError as e:  # cleanup must not hide the original error
        log.warning("could not delete '%s': %s", inner, e)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Generation:
    """Write an output as a new generation inside its final path; commit it with the record (module docstring).

    Use as a context manager.  On entry: the folder's owner is checked
    (:func:`sparktrain.data.guard.check_replaceable`), the ``_gen-`` folders no
    record names are removed, and ``<path>/_gen-<id>/`` is created with its
    marker.  The body writes under :attr:`uri` (Spark writes straight there)
    and calls :meth:`commit`; leaving the block without an exception commits
    when the body did not.  An exception before the commit removes the new
    generation and leaves the previous one committed and readable.

    Parameters
    ----------
    path : str
        The output's final path (local path or URI).
    what : str
        The setting that named it, for messages (``output.path``, ``--output``).
    overwrite : bool
        Replace a committed output.  When False and ``path`` holds a committed
        output (or an earlier layout's dataset), :class:`~sparktrain.errors.DatasetExistsError`.
    filesystem : pyarrow.fs.FileSystem, optional
        When given, ``path`` is a path inside it.
    check_owner : bool
        Check that ``path`` is new, empty or sparktrain's (False only for a
        folder whose name only sparktrain makes).

    Examples
    --------
    >>> with Generation("/data/scored", "--output") as gen:        # doctest: +SKIP
    ...     df.write.parquet(gen.uri + "/data")
    ...     gen.commit({"rows": n})
    """

    def __init__(self, path: str, what: str = "output.path", *, overwrite: bool = True,
                 filesystem: Optional[pafs.FileSystem] = None, check_owner: bool = True) -> None:
        self.path = os.fspath(path).rstrip("/")
        self.what = what
        self.overwrite = overwrite
        self.check_owner = check_owner
        self.fs, self.inner = _fs.resolve(self.path, filesystem)
        self._filesystem = filesystem  # pins are found by path: none for a path inside a given filesystem
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        self.id = f"{stamp}-{uuid.uuid4().hex[:8]}"
        self.name = f"{GEN_PREFIX}{self.id}"
        #: Where the body writes: ``<path>/_gen-<id>`` in the form ``path`` was given in.
        self.uri = _join(self.path, self.name)
        self.committed = False
        self._previous: Optional[Dict[str, Any]] = None
        self._created_root = False
        self._old_entries: List[str] = []

    def __enter__(self) -> "Generation":
        if self.check_owner:
            guard.check_replaceable(self.inner, self.what, overwrite=True, filesystem=self.fs, shown_as=self.path)
        self._previous = read_record(self.inner, self.fs)
        if not self.overwrite and self._holds_dataset():
            raise DatasetExistsError(f"{self.what} '{self.path}' already holds a committed output and overwrite is "
                                     f"off. Fix: choose a new path, delete '{self.path}' yourself, or allow "
                                     f"overwriting.")
        self._created_root = self.fs.get_file_info(self.inner).type == pafs.FileType.NotFound
        self._old_entries = self._snapshot()
        self.clean_uncommitted()
        self.fs.create_dir(_join(self.inner, self.name), recursive=True)
        marker = {"format": GEN_FORMAT, "id": self.id, "created_at": _now(), "host": socket.gethostname(),
                  "pid": os.getpid()}
        with self.fs.open_output_stream(_join(self.inner, self.name, GEN_MARKER)) as out:
            out.write(json.dumps(marker).encode())
        return self

    def _holds_dataset(self) -> bool:
        if self._previous is not None:
            return True
        for e in self._entries():
            if not e.base_name.startswith((GEN_PREFIX, ".")):
                return True
        return False

    def _entries(self) -> List[pafs.FileInfo]:
        info = self.fs.get_file_info(self.inner)
        if info.type != pafs.FileType.Directory:
            return []
        return list(self.fs.get_file_info(pafs.FileSelector(self.inner, recursive=False)))

    def _snapshot(self) -> List[str]:
        """Top-level names of an earlier layout's output, removed after the commit (never the record itself).

        Only names that layout wrote (:func:`_earlier_layout_name`), and none once a commit record exists (the
        output is all in its generation then).  Anything else at the top level, a user's notes beside the output,
        is kept and named in a warning: a commit replaces only what sparktrain wrote.
        """
        names = [e.base_name + ("/" if e.type == pafs.FileType.Directory else "") for e in self._entries()
                 if not e.base_name.startswith(GEN_PREFIX) and e.base_name != RECORD_NAME]
        ours = [] if self._previous is not None else [n for n in names if _earlier_layout_name(n)]
        kept = sorted(n for n in names if n not in ours and not n.startswith("."))
        if kept:
            log.warning("%s '%s': keeping %s beside the output (sparktrain did not write %s; a commit replaces only "
                        "its own generation)", self.what, self.path, ", ".join(kept[:10]) + (" ..." * (len(kept) > 10)),
                        "it" if len(kept) == 1 else "them")
        return sorted(n.rstrip("/") for n in ours)

    def clean_uncommitted(self) -> List[str]:
        """Remove the ``_gen-`` folders that no commit record names and no reader pins; returns their names.

        Only folders sparktrain wrote: its ``_generation.json`` marker inside, or nothing at all (a generation
        whose marker was never written).  Any other ``_gen-`` folder is kept, with a warning.
        """
        keep = {str(self._previous["path"])} if self._previous else set()
        pinned = self._pinned()
        removed = []
        for e in self._entries():
            if not e.base_name.startswith(GEN_PREFIX) or e.base_name in keep or e.base_name == self.name:
                continue
            if e.base_name in pinned:
                log.info("keeping '%s': a job still reads it (host %s, pid %s)", _join(self.path, e.base_name),
                         pinned[e.base_name].get("host", "?"), pinned[e.base_name].get("pid", "?"))
                continue
            if not self._ours(e):
                log.warning("%s '%s': keeping '%s': its name looks like a generation's, but it holds no "
                            "sparktrain %s marker, so sparktrain did not write it. Move it out of the output to "
                            "silence this", self.what, self.path, e.base_name, GEN_MARKER)
                continue
            log.info("removing '%s': no commit record names it and no job reads it", _join(self.path, e.base_name))
            _delete(self.fs, e.path)
            removed.append(e.base_name)
        return removed

    def _ours(self, entry: pafs.FileInfo) -> bool:
        """Whether a ``_gen-`` entry is a generation sparktrain wrote: a folder with its marker, or empty."""
        if entry.type != pafs.FileType.Directory:
            return False
        try:
            with self.fs.open_input_stream(_join(entry.path, GEN_MARKER)) as fh:
                return json.loads(fh.read().decode()).get("format") == GEN_FORMAT
        except (OSError, ValueError, AttributeError):
            pass
        return not list(self.fs.get_file_info(pafs.FileSelector(entry.path, recursive=True)))

    def _pinned(self) -> Dict[str, Dict[str, Any]]:
        """``{generation: reader}`` of the live pins on this output (:func:`sparktrain.data.lease.live_pins`)."""
        from sparktrain.data.lease import live_pins

        return live_pins(self.path) if self._filesystem is None else {}

    def commit(self, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Write the commit record (the output is now this generation), then remove what it replaced."""
        if self.committed:
            raise DataError(f"generation {self.id} of '{self.path}' is already committed")
        record: Dict[str, Any] = {"format": RECORD_FORMAT, "generation": self.id, "path": self.name,
                                  "committed_at": _now()}
        record.update(extra or {})
        _write_record(self.fs, _join(self.inner, RECORD_NAME), json.dumps(record, indent=1).encode())
        self.committed = True
        log.info("committed %s: generation %s", self.path, self.id)
        if self._previous is not None and self._previous.get("path") != self.name:
            old = str(self._previous["path"])
            readers = self._pinned().get(old)  # listed after the record: a reader pinning later sees the new one
            if readers is None:
                _delete(self.fs, _join(self.inner, old))
            else:
                log.warning("%s '%s': keeping the previous generation %s while a job reads it (host %s, pid %s); "
                            "the next write after that job ends removes it", self.what, self.path, old,
                            readers.get("host", "?"), readers.get("pid", "?"))
        for name in self._old_entries:
            _delete(self.fs, _join(self.inner, name))
        return record

    def abort(self) -> None:
        """Remove this generation (not committed); the previous one stays as it was.

        A folder this generation created (``path`` did not exist) goes too when nothing else is in it.
        """
        if not self.committed:
            _delete(self.fs, _join(self.inner, self.name))
            if self._created_root and not self._entries():
                _delete(self.fs, self.inner)

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is not None:
            self.abort()
            return
        if not self.committed:
            self.commit()


#: what an output written before generations held at its top level (a preprocess output, a dataset, scores)
_EARLIER_LAYOUT = ("train/", "validation/", "test/", "pipeline_model/", "features.json", "_SUCCESS")


def _earlier_layout_name(name: str) -> bool:
    """Whether top-level entry ``name`` (a folder's with a trailing ``/``) is one an earlier layout wrote."""
    if name.startswith(".") and name.endswith(".crc"):  # a local Hadoop writer's checksum of such a file
        name = name[1:-len(".crc")]
    return name in _EARLIER_LAYOUT or (name.startswith("part-") and not name.endswith("/"))


@contextlib.contextmanager
def reading(path: str, what: str = "dataset", generation: Optional[str] = None) -> Iterator[str]:
    """Resolve ``path`` to its committed generation and keep that generation until the block ends.

    A writer that commits a new generation meanwhile leaves this one in place
    (module docstring), so a long job reads one generation from start to end.
    A path without a commit record (an older layout, a generation's own path,
    anyone's Parquet) is yielded as it is, unpinned.  ``generation``: the one to
    read (e.g. the one this job's preprocess just committed), even when another
    job committed since; :class:`~sparktrain.errors.DataError` if it is gone.

    Examples
    --------
    >>> with reading("/data/ds") as ds:                # doctest: +SKIP
    ...     train_on(ds + "/train")                   # /data/ds/_gen-<id>/train, whatever commits meanwhile
    """
    from sparktrain.data.lease import Pin

    root = os.fspath(path).rstrip("/")
    if generation:
        with Pin(path, generation, what):
            fs, inner = _fs.resolve(_join(root, generation, GEN_MARKER))
            if fs.get_file_info(inner).type == pafs.FileType.NotFound:
                raise DataError(f"{what} '{path}': generation {generation}, which this job wrote, is gone: another "
                                f"job committed '{path}' and removed it before this job could pin it. Run this job "
                                f"again (or give each job its own {what})")
            yield _join(root, generation)
        return
    record = read_record(path)
    for _ in range(5):
        if record is None:
            yield path
            return
        pin = Pin(path, str(record["path"]), what).acquire()
        try:
            again = read_record(path)  # a commit between the read and the pin: pin the new generation instead
            if again is not None and again.get("path") == record.get("path"):
                yield _join(root, str(record["path"]))
                return
        finally:
            pin.release()
        record = again
    raise DataError(f"{what} '{path}' was committed again 5 times while this job tried to read it; retry when "
                    f"its writers are done")


def _write_record(fs: pafs.FileSystem, target: str, data: bytes) -> None:
    """The commit point (a seam for the crash tests)."""
    write_atomic(fs, target, data)


__all__ = ["GEN_MARKER", "GEN_PREFIX", "Generation", "RECORD_FORMAT", "RECORD_NAME", "exists", "read_record",
           "reading", "resolve", "write_atomic"]
