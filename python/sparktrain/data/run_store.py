"""The training store: a folder per run, laid out in one place for the driver and the executors.

Layout under ``<store>/<run_id>/`` (a local path or any :mod:`pyarrow.fs` URI)::

    run.json                        the run's fingerprint (driver, sparktrain.train.plan; the store's
                                    marker that sparktrain owns the folder)
    data/_manifest.json             a DataFrame passed to fit(), materialized (driver) as a committed
    data/_gen-<id>/train/ ...       generation (sparktrain.data.commit; no directory is renamed)
    checkpoints/ckpt-000007.ckpt    checkpoints, numbered, each one sealed object (sparktrain.data.sealed);
                                    the newest keep_checkpoints and the best stay
    checkpoints/events/*.json       the event log, one object per event (started / resumed / epoch finished
                                    ...): nothing is read and rewritten, so it works on object stores too
    failures/                       one JSON file per failed rank and attempt
    model/network.ckpt              the trained network and its spec in one sealed object, written by rank 0
                                    (the driver reads it back)
    model/...                       the bundle (sparktrain.track.bundle; bundle.json is written last)
    control/verdict-000002.json     a search's verdict on a trial after epoch 2 (driver; rank 0 reads it)
    control/stop.json               the search pruned the trial: rank 0 stops it after its epoch

:class:`Store` is a directory on a pyarrow filesystem with atomic file writes
(a temporary name, then a rename of that one file: never of a directory), so a
process killed halfway never leaves a file that looks complete.  On a local
disk the file and its folder are fsynced; a failed write (a full disk)
removes its temporary file and raises
:class:`~sparktrain.errors.StoreWriteError` naming the path, leaving what
was there before untouched.  :class:`RunStore` names every path of one run, and
:meth:`RunStore.claim` leases it to one job (``<store>/.<run_id>.lease``,
:mod:`sparktrain.data.lease`).
Plain Python on pyarrow: executors import it, and it imports nothing of
pyspark or of the driver.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from sparktrain.data.sealed import seal, unseal
from sparktrain.errors import StoreWriteError

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
DATA_DIR = "data"
CHECKPOINTS_DIR = "checkpoints"
EVENT_LOG = "log.jsonl"  # the event log of sparktrain < 0.9 (read, never written)
EVENTS_DIR = "events"
FAILURES_DIR = "failures"
MODEL_DIR = "model"
NETWORK_OBJECT = "network.ckpt"
CONTROL_DIR = "control"
STOP_FILE = "stop.json"

_CKPT = re.compile(r"ckpt-(\d+)\.ckpt$")


class Store:
    """A directory on a pyarrow filesystem, addressed by URI or local path.

    Parameters
    ----------
    root : str
        A local path (made absolute) or a URI such as ``s3://bucket/prefix``.
    filesystem : pyarrow.fs.FileSystem, optional
        When given, ``root`` is a path inside it (e.g. an ``S3FileSystem`` with ``endpoint_override``).
    """

    def __init__(self, root: str, filesystem: Any = None) -> None:
        from sparktrain.data._fs import resolve

        # the one place that turns a URI into a filesystem: an s3:// URI honours AWS_ENDPOINT_URL
        self.fs, self.root = resolve(root, filesystem)
        self.uri = root

    def path(self, *parts: str) -> str:
        """The path inside :attr:`fs` of ``parts`` (joined with ``/``) under the root."""
        return "/".join([self.root.rstrip("/"), *parts])

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def exists(self, *parts: str) -> bool:
        from pyarrow import fs as pafs
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` atomically (a temporary file, fsynced on a local disk, then renamed).

        Raises
        ------
        StoreWriteError
            Naming the path, when the write failed; the temporary file is gone and ``rel`` is unchanged.
        """
        from pyarrow import fs as pafs

        final = self.path(rel)
        parent = final.rsplit("/", 1)[0]
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(parent, recursive=True)
            if isinstance(self.fs, pafs.LocalFileSystem):
                _write_local(tmp, final, data)
            else:  # an object store: the temporary object is complete when the (server-side) move starts
                with self.fs.open_output_stream(tmp) as out:
                    out.write(data)
                self.fs.move(tmp, final)
        except OSError as exc:
            self._discard(tmp)
            raise StoreWriteError(final, exc) from exc

    def _discard(self, path: str) -> None:
        from pyarrow import fs as pafs
        try:
            if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
                self.fs.delete_file(path)
        except OSError as exc:  # logged: the write's own error is what the caller must see
            log.warning("could not remove the temporary file '%s': %s", path, exc)

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as src:
            return src.read()

    def listdir(self, rel: str) -> List[str]:
        """Names in the folder ``rel``, sorted (``[]`` when it does not exist)."""
        from pyarrow import fs as pafs
        if not self.exists(rel):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel)))
        return sorted(i.base_name for i in infos)

    def delete(self, rel: str) -> None:
        """Delete the file or folder ``rel`` when it exists; an error is logged, never raised."""
        from pyarrow import fs as pafs

        path = self.path(rel)
        try:
            kind = self.fs.get_file_info(path).type
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(path)
            elif kind == pafs.FileType.File:
                self.fs.delete_file(path)
        except OSError as exc:  # cleanup must not hide the original error
            log.warning("could not delete '%s': %s", path, exc)


def _write_local(tmp: str, final: str, data: bytes) -> None:
    """``data`` into ``tmp`` (fsynced), renamed to ``final``, and the folder fsynced: durable once it returns."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    folder = os.open(os.path.dirname(final), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


class RunStore:
    """The folder ``<store>/<run_id>/`` of one training run (see the module docstring for its layout).

    Parameters
    ----------
    store : str or Store
        The training store (local path or URI), or an open :class:`Store`.
    run_id : str
        The run's id.

    Examples
    --------
    >>> run = RunStore("/tmp/store", "a1b2c3")
    >>> run.uri("data", "train")
    '/tmp/store/a1b2c3/data/train'
    >>> run.checkpoint_rel(7)
    'a1b2c3/checkpoints/ckpt-000007.ckpt'
    """

    def __init__(self, store: "str | Store", run_id: str) -> None:
        self._store = store if isinstance(store, Store) else None
        self.store_uri = store.uri if isinstance(store, Store) else store
        self.run_id = run_id

    @property
    def store(self) -> Store:
        """The store's :class:`Store` (its filesystem is resolved on first use: naming paths needs none)."""
        if self._store is None:
            self._store = Store(self.store_uri)
        return self._store

    # -- names ------------------------------------------------------------------------------------------------

    def rel(self, *parts: str) -> str:
        """``<run_id>/<parts...>``: a path relative to the store's root (what :class:`Store` methods take)."""
        return "/".join([self.run_id, *parts])

    def uri(self, *parts: str) -> str:
        """``<store>/<run_id>/<parts...>`` as the store was given (local path or URI), for Spark and pyarrow."""
        return "/".join([self.store_uri.rstrip("/"), self.run_id, *parts])

    def data_uri(self, split: Optional[str] = None) -> str:
        """Where a DataFrame passed to ``fit()`` is materialized: ``data/`` or ``data/<split>``."""
        return self.uri(DATA_DIR, split) if split else self.uri(DATA_DIR)

    def model_uri(self) -> str:
        """``<store>/<run_id>/model``: the trained network, then the whole bundle."""
        return self.uri(MODEL_DIR)

    def checkpoint_rel(self, seq: int) -> str:
        """The relative path of checkpoint number ``seq``."""
        return self.rel(CHECKPOINTS_DIR, f"ckpt-{seq:06d}.ckpt")

    def claim(self, what: str = "runId") -> Any:
        """A :class:`~sparktrain.data.lease.Lease` on this run (``with run.claim(): ...``): one job per run."""
        from sparktrain.data.lease import claim

        return claim(self.uri(), what)

    # -- the run record (driver) ------------------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether anything of this run is in the store."""
        return self.store.exists(self.run_id)

    def is_recorded(self) -> bool:
        """Whether the run has its ``run.json`` (sparktrain owns the folder)."""
        return self.store.exists(self.rel(RUN_FILE))

    def read_run(self) -> Optional[Dict[str, Any]]:
        """The run's ``run.json``, or None when it has none."""
        rel = self.rel(RUN_FILE)
        return json.loads(self.store.read_bytes(rel)) if self.store.exists(rel) else None

    def write_run(self, body: Dict[str, Any]) -> None:
        """Write ``run.json`` (atomically)."""
        self.store.write_bytes(self.rel(RUN_FILE), json.dumps(body, indent=1, default=str).encode())

    def discard_unrecorded(self) -> None:
        """Remove what a run wrote before it was recorded (``data/``); never touch a recorded run."""
        if not self.exists() or self.is_recorded():
            return
        self.store.delete(self.rel(DATA_DIR))
        try:
            if not self.store.listdir(self.run_id):
                self.store.fs.delete_dir(self.store.path(self.run_id))
        except OSError:
            pass

    # -- checkpoints (rank 0 writes; every rank reads on resume) ---------------------------------------------

    def checkpoints(self) -> List[Tuple[int, str]]:
        """``[(sequence number, relative path)]`` of the complete checkpoints, oldest first."""
        found = []
        for name in self.store.listdir(self.rel(CHECKPOINTS_DIR)):
            m = _CKPT.match(name)  # a half-written checkpoint is a '.tmp-*' file: never listed
            if m:
                found.append((int(m.group(1)), self.rel(CHECKPOINTS_DIR, name)))
        return sorted(found)

    def read_events(self) -> List[Dict[str, Any]]:
        """Every event of the run, oldest first (``[]`` without any).

        Events are ``checkpoints/events/<time ns>-<writer>.json`` objects; an
        older sparktrain's ``checkpoints/log.jsonl`` is read first.
        """
        out: List[Dict[str, Any]] = []
        legacy = self.rel(CHECKPOINTS_DIR, EVENT_LOG)
        if self.store.exists(legacy):
            out = [json.loads(x) for x in self.store.read_bytes(legacy).decode().splitlines() if x.strip()]
        folder = self.rel(CHECKPOINTS_DIR, EVENTS_DIR)
        for name in self.store.listdir(folder):
            if name.endswith(".json") and not name.startswith("."):
                out.append(json.loads(self.store.read_bytes(f"{folder}/{name}")))
        return out

    def append_event(self, body: Dict[str, Any]) -> None:
        """Add one event: its own object, named by time and writer, so no writer reads or rewrites another's."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.json"
        self.store.write_bytes(self.rel(CHECKPOINTS_DIR, EVENTS_DIR, name), json.dumps(body, default=str).encode())

    # -- the trained network ----------------------------------------------------------------------------------

    def write_network(self, model_bytes: bytes, spec: Dict[str, Any]) -> str:
        """Write ``model/network.ckpt``: the network and its spec in one sealed object; returns ``model/``'s path."""
        self.store.write_bytes(self.rel(MODEL_DIR, NETWORK_OBJECT), seal(spec, model_bytes))
        return self.store.path(self.rel(MODEL_DIR))

    def read_network(self) -> Tuple[bytes, Dict[str, Any]]:
        """``(network bytes, spec)`` written by :meth:`write_network` (checked: one writer's, complete)."""
        rel = self.rel(MODEL_DIR, NETWORK_OBJECT)
        spec, model_bytes = unseal(self.store.read_bytes(rel), self.store.path(rel))
        return model_bytes, spec

    # -- control: a search's verdicts on a trial (driver writes, rank 0 reads) ---------------------------------

    def verdict_rel(self, epoch: int) -> str:
        """The relative path of the verdict after ``epoch`` (0-based)."""
        return self.rel(CONTROL_DIR, f"verdict-{epoch:06d}.json")

    def write_verdict(self, epoch: int, stop: bool, reason: str = "") -> None:
        """Record the search's verdict after ``epoch``; a stop also writes ``control/stop.json`` (first)."""
        body = json.dumps({"epoch": epoch, "stop": bool(stop), "reason": reason}).encode()
        if stop:
            self.store.write_bytes(self.rel(CONTROL_DIR, STOP_FILE), body)
        self.store.write_bytes(self.verdict_rel(epoch), body)

    def has_verdict(self, epoch: int) -> bool:
        """Whether the verdict after ``epoch`` is written."""
        return self.store.exists(self.verdict_rel(epoch))

    def stop_requested(self) -> Optional[Dict[str, Any]]:
        """``control/stop.json`` (the epoch and the reason) when the search asked this run to stop, else None."""
        rel = self.rel(CONTROL_DIR, STOP_FILE)
        return json.loads(self.store.read_bytes(rel)) if self.store.exists(rel) else None

    # -- failures ---------------------------------------------------------------------------------------------

    def write_failure(self, name: str, body: Dict[str, Any]) -> None:
        """Keep one failure record as ``failures/<name>`` (one file per writer: no races)."""
        self.store.write_bytes(self.rel(FAILURES_DIR, name), json.dumps(body, default=str).encode())

    def read_failures(self, prefix: str = "") -> List[Dict[str, Any]]:
        """The failure records whose file name starts with ``prefix``, in file-name order."""
        return [json.loads(self.store.read_bytes(self.rel(FAILURES_DIR, n)))
                for n in self.store.listdir(self.rel(FAILURES_DIR)) if n.endswith(".json") and n.startswith(prefix)]


__all__ = ["RUN_FILE", "RunStore", "Store"]
