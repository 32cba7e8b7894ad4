"""Leases: one job at a time per training run and per output path.

A run (``<store>/<run_id>``) and an output (``output.path``, ``score --output``)
are claimed before anything is written to them, with a small lease file
beside the target: ``<parent>/.<name>.lease`` (so claiming creates nothing
inside the target, and a run that does not exist yet still does not)::

    {"format": "sparktrain.lease/1", "target": "...", "what": "runId",
     "holder": {"host": "...", "pid": 123, "started_at": "2026-12-02T13:00:00+00:00", "token": "..."},
     "heartbeat_at": 1764680400.0, "heartbeat_s": 10.0, "stale_after_s": 60.0}

* **Exclusive create.**  Locally the file is created with ``O_CREAT | O_EXCL``.
  On S3 (``s3://``) with boto3 importable it is a conditional put
  (``If-None-Match: *``), which S3 and S3-compatible stores refuse when the
  object exists.  Elsewhere (GCS, ABFS, HDFS through pyarrow, or S3 without
  boto3) it is check-then-put: two jobs starting within the same instant can
  both win, so keep such stores to one scheduler per run id and output, or
  install boto3 for S3.
* **Heartbeat.**  A daemon thread rewrites ``heartbeat_at`` every
  ``heartbeat_s`` seconds (10 by default, ``SPARKTRAIN_LEASE_HEARTBEAT_S``).
* **Refusal.**  A second job raises :class:`~sparktrain.errors.LeaseHeldError`
  naming the holder (host, pid, start time), the lease file, and how to take
  over.  A refused job leaves nothing behind: folders its claim created are removed.
* **Takeover.**  A lease whose heartbeat is older than ``stale_after_s``
  (6 intervals by default) belongs to a job that is gone (killed, its host
  lost): the next claim deletes it and takes over, with a warning naming the old
  holder.  So does a lease held by a process of this host that no longer
  exists (a driver killed with ``kill -9`` and started again at once).
  Deleting the lease file by hand does the same at once.
* **Release** at the end of the job (the ``with`` block, also on an error)
  deletes the file when it is still this job's.
* **Pins.**  A job that reads a committed output (training and tuning read a
  dataset for minutes or hours) pins the generation it reads with a
  :class:`Pin`, ``<parent>/.<name>.pin-<token>.lease``: the same body plus
  ``"generation"``, one file per reader, heartbeated the same way.  A writer
  that commits a new generation keeps a pinned one until its readers end
  (:func:`live_pins`; :class:`~sparktrain.data.commit.Generation`); a pin whose
  heartbeat is stale, or whose process is gone, no longer counts and is removed.

Executor-safe: pyarrow (and boto3 when present) only.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import posixpath
import socket
import threading
import time
import urllib.parse
import uuid
from types import TracebackType
from typing import Any, Dict, List, Optional, Type

import pyarrow.fs as pafs

from sparktrain.data import _fs
from sparktrain.errors import ConfigError, LeaseHeldError, SparktrainError

log = logging.getLogger(__name__)

LEASE_FORMAT = "sparktrain.lease/1"
LEASE_SUFFIX = ".lease"
#: Seconds between heartbeats (``SPARKTRAIN_LEASE_HEARTBEAT_S`` overrides).
HEARTBEAT_S = 10.0
#: Heartbeats a lease may miss before another job takes it over.
STALE_INTERVALS = 6


def lease_path(target: str) -> str:
    """``<parent>/.<name>.lease`` for ``target`` (same form: local path or URI)."""
    target = os.fspath(target).rstrip("/")
    parent, name = posixpath.split(target)
    if not name:
        raise ConfigError("lease target", target, "give a folder with a final name, e.g. /data/out")
    return posixpath.join(parent, f".{name}{LEASE_SUFFIX}") if parent else f".{name}{LEASE_SUFFIX}"


def _default_heartbeat() -> float:
    raw = os.environ.get("SPARKTRAIN_LEASE_HEARTBEAT_S")
    if not raw:
        return HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigError("SPARKTRAIN_LEASE_HEARTBEAT_S", raw, "must be a number of seconds > 0, e.g. 10")
    return value


class Lease:
    """An exclusive claim on ``target`` (see the module docstring); use :func:`claim`.

    Parameters
    ----------
    target : str
        The run's folder or the output path (local path or URI).
    what : str
        What names it, for messages (``runId``, ``output.path``, ``--output``).
    heartbeat_s : float, optional
        Seconds between heartbeats (default :data:`HEARTBEAT_S`).
    stale_after_s : float, optional
        Age of the last heartbeat after which the lease is taken over
        (default ``STALE_INTERVALS * heartbeat_s``).
    """

    def __init__(self, target: str, what: str = "output.path", *, heartbeat_s: Optional[float] = None,
                 stale_after_s: Optional[float] = None) -> None:
        self.target = os.fspath(target).rstrip("/")
        self.what = what
        self.heartbeat_s = float(heartbeat_s) if heartbeat_s is not None else _default_heartbeat()
        self.stale_after_s = float(stale_after_s) if stale_after_s is not None else \
            STALE_INTERVALS * self.heartbeat_s
        if self.heartbeat_s <= 0 or self.stale_after_s <= self.heartbeat_s:
            raise ConfigError("lease", {"heartbeat_s": heartbeat_s, "stale_after_s": stale_after_s},
                              "heartbeat_s must be > 0 and stale_after_s larger than heartbeat_s")
        self.path = lease_path(self.target)
        self.fs, self.inner = _fs.resolve(self.path)
        self.token = uuid.uuid4().hex
        self.started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.held = False
        #: Set when another job took the lease over while this one held it (its heartbeat was too old).
        self.lost = False
        #: Set when the lease file was deleted under this job (it wrote it again, with a warning).
        self.vanished = False
        self._created: List[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- the file -----------------------------------------------------------------------------------------------

    def body(self) -> Dict[str, Any]:
        """The lease file's content for this holder, with a fresh heartbeat."""
        return {"format": LEASE_FORMAT, "target": _masked(self.target), "what": self.what,
                "holder": {"host": socket.gethostname(), "pid": os.getpid(), "started_at": self.started_at,
                           "token": self.token},
                "heartbeat_at": time.time(), "heartbeat_s": self.heartbeat_s, "stale_after_s": self.stale_after_s}

    def read(self) -> Optional[Dict[str, Any]]:
        """The lease file as it is now: None when absent, ``{}`` when unreadable (being written, or damaged)."""
        try:
            with self.fs.open_input_stream(self.inner) as f:
                raw = f.read()
        except (FileNotFoundError, OSError):
            return None if self.fs.get_file_info(self.inner).type == pafs.FileType.NotFound else {}
        try:
            body = json.loads(raw)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _age(self, current: Dict[str, Any]) -> float:
        beat = current.get("heartbeat_at")
        if isinstance(beat, (int, float)) and not isinstance(beat, bool):
            return time.time() - float(beat)
        info = self.fs.get_file_info(self.inner)  # unreadable: its modification time
        mtime = info.mtime.timestamp() if info.mtime is not None else time.time()
        return time.time() - mtime

    # -- claim, heartbeat, release ------------------------------------------------------------------------------

    def acquire(self) -> "Lease":
        """Claim the target or raise :class:`~sparktrain.errors.LeaseHeldError` (a stale lease is taken over)."""
        self._make_parent()
        try:
            for _ in range(3):
                if _create_exclusive(self.fs, self.inner, self.path, json.dumps(self.body()).encode()):
                    self.held = True
                    break
                current = self.read()
                if current is None:
                    continue  # released meanwhile: try again
                age = self._age(current)
                holder = current.get("holder") or {}
                gone = _gone(holder)
                if age <= self.stale_after_s and not gone:
                    raise LeaseHeldError(self.what, self.target, self.path, holder, age, self.stale_after_s)
                why = "its process no longer exists on this host" if gone else \
                    f"it sent no heartbeat for {age:.0f} s (more than {self.stale_after_s:.0f} s)"
                log.warning("taking over the lease on %s '%s': its holder (host %s, pid %s, started %s): %s",
                            self.what, _masked(self.target), holder.get("host", "?"), holder.get("pid", "?"),
                            holder.get("started_at", "?"), why)
                _delete_file(self.fs, self.inner)
            if not self.held:
                current = self.read() or {}
                raise LeaseHeldError(self.what, self.target, self.path, current.get("holder") or {},
                                     self._age(current) if current else 0.0, self.stale_after_s)
        except (SparktrainError, KeyboardInterrupt, SystemExit):
            self._remove_created()
            raise
        except Exception as exc:  # the store refused the write (no bucket, no permission): name the file
            self._remove_created()
            where = "the store (store / train.store)" if self.what in ("runId", "store", "train.store") \
                else self.what
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            # a run's lease (what = runId) fails on its store, which the user set, not on the run id
            run_lease = self.what == "runId"
            raise ConfigError("store" if run_lease else self.what, _masked(self.target),
                              f"could not write its lease file '{_masked(self.path)}' ({type(exc).__name__}: "
                              f"{first}); nothing was written. Fix: check that the location exists and this "
                              f"process may write there (the bucket, the credentials, the permissions), or point "
                              f"{where} elsewhere", kind="parameter" if run_lease else None) from exc
        self._thread = threading.Thread(target=self._beat, name=f"sparktrain-lease-{self.what}", daemon=True)
        self._thread.start()
        return self

    def _make_parent(self) -> None:
        """Create the lease's folder (and its missing parents), remembering which were new."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            return  # object stores have no folders to create or leave behind
        missing = []
        folder = os.path.dirname(self.inner)
        while folder and not os.path.exists(folder):
            missing.append(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        if missing:
            os.makedirs(missing[0], exist_ok=True)
            self._created = missing  # deepest first

    def _remove_created(self) -> None:
        for folder in self._created:
            try:
                os.rmdir(folder)  # only when empty
            except OSError:
                break
        self._created = []

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.heartbeat()
            except Exception as exc:  # a store hiccup: the next beat tries again
                log.warning("lease heartbeat on '%s' failed: %s", self.path, exc)

    def heartbeat(self) -> bool:
        """Refresh ``heartbeat_at``; False (and :attr:`lost` set) when the lease is no longer this job's."""
        current = self.read()
        if current is not None and current and (current.get("holder") or {}).get("token") != self.token:
            if not self.lost:
                log.error("the lease on %s '%s' was taken over by host %s pid %s: this job's heartbeat was too "
                          "old", self.what, _masked(self.target), (current.get("holder") or {}).get("host", "?"),
                          (current.get("holder") or {}).get("pid", "?"))
            self.lost = True
            self._stop.set()
            return False
        if current is None and not self.vanished:  # deleted under a live job: say so, then hold it again
            self.vanished = True
            log.warning("the lease file '%s' of %s '%s' was deleted while this job held it (its folder deleted or "
                        "cleaned up by someone else?); this job holds it again", _masked(self.path), self.what,
                        _masked(self.target))
        _fs.write_atomic(self.fs, self.inner, json.dumps(self.body()).encode())
        return True

    def release(self) -> None:
        """Stop the heartbeat and delete the lease file when it is still this job's.

        Never raises for the store: when it cannot be reached the lease file is
        left (with a warning) and goes stale, so the error that ended the job,
        not the release's, is what the caller sees.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.heartbeat_s))
            self._thread = None
        if self.held:
            self.held = False
            try:
                current = self.read()
                if current is not None and (current.get("holder") or {}).get("token") == self.token:
                    _delete_file(self.fs, self.inner)
            except OSError as exc:  # the store is unreachable: the job's own outcome (or error) must come through
                log.warning("could not release the lease '%s' (%s: %s); it is left behind and counts as stale "
                            "%.0f s after its last heartbeat, when the next job that writes '%s' takes it over (or "
                            "delete it then)", _masked(self.path), type(exc).__name__, exc, self.stale_after_s,
                            _masked(self.target))
        self._remove_created()

    def __enter__(self) -> "Lease":
        return self.acquire() if not self.held else self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.release()


PIN_INFIX = ".pin-"


def _pin_prefix(target: str) -> str:
    """``<parent>/.<name>.pin-`` for ``target``."""
    return lease_path(target)[:-len(LEASE_SUFFIX)] + PIN_INFIX


class Pin(Lease):
    """A reader's claim on ``generation`` of ``target``: writers keep that generation while this is held.

    Shared, not exclusive: each reader has its own file (module docstring).
    """

    def __init__(self, target: str, generation: str, what: str = "dataset", *,
                 heartbeat_s: Optional[float] = None, stale_after_s: Optional[float] = None) -> None:
        super().__init__(target, what, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)
        self.generation = generation
        self.path = f"{_pin_prefix(self.target)}{self.token}{LEASE_SUFFIX}"
        self.fs, self.inner = _fs.resolve(self.path)

    def body(self) -> Dict[str, Any]:
        return {**super().body(), "generation": self.generation}


def live_pins(target: str) -> Dict[str, Dict[str, Any]]:
    """``{generation: holder}`` of the live :class:`Pin` files of ``target``; stale or orphaned ones are deleted.

    Never raises for the store: a listing it refuses counts as no pins (the writer then replaces as before).
    """
    prefix = _pin_prefix(os.fspath(target).rstrip("/"))
    fs, inner = _fs.resolve(prefix)
    folder, start = posixpath.split(inner)
    try:
        entries = fs.get_file_info(pafs.FileSelector(folder or ".", recursive=False))
    except (FileNotFoundError, OSError) as exc:
        log.debug("no pins listed for '%s': %s", _masked(target), exc)
        return {}
    live: Dict[str, Dict[str, Any]] = {}
    for e in entries:
        if not (e.base_name.startswith(start) and e.base_name.endswith(LEASE_SUFFIX)):
            continue
        try:
            with fs.open_input_stream(e.path) as f:
                body = json.loads(f.read())
        except (OSError, ValueError):
            continue  # being written, or gone meanwhile
        if not isinstance(body, dict):
            continue
        beat, stale = body.get("heartbeat_at"), body.get("stale_after_s")
        holder = body.get("holder") or {}
        fresh = isinstance(beat, (int, float)) and isinstance(stale, (int, float)) and time.time() - beat <= stale
        if fresh and not _gone(holder) and isinstance(body.get("generation"), str):
            live.setdefault(body["generation"], holder)
        else:
            log.info("removing the stale pin '%s' (host %s, pid %s)", _masked(e.path), holder.get("host", "?"),
                     holder.get("pid", "?"))
            _delete_file(fs, e.path)
    return live


def claim(target: str, what: str = "output.path", *, heartbeat_s: Optional[float] = None,
          stale_after_s: Optional[float] = None) -> Lease:
    """A :class:`Lease` on ``target``, claimed on entering the ``with`` block.

    Examples
    --------
    >>> with claim("/data/out", "output.path"):          # doctest: +SKIP
    ...     write_the_output()
    """
    return Lease(target, what, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)


def _gone(holder: Dict[str, Any]) -> bool:
    """Whether ``holder`` was a process of this host that has exited (never guessed for another host)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by another user
        return False
    return False


def _masked(text: str) -> str:
    from sparktrain._internal.secrets import mask_value

    return mask_value(text)


def _delete_file(fs: pafs.FileSystem, inner: str) -> None:
    try:
        fs.delete_file(inner)
    except (FileNotFoundError, OSError) as exc:
        if fs.get_file_info(inner).type != pafs.FileType.NotFound:
            log.warning("could not delete the lease '%s': %s", inner, exc)


def _create_exclusive(fs: pafs.FileSystem, inner: str, given: str, data: bytes) -> bool:
    """Create ``inner`` with ``data`` only when it does not exist; False when it does."""
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            fd = os.open(inner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return True
    if _fs.pyarrow_uri(given).startswith("s3://"):
        made = _s3_put_if_absent(_fs.pyarrow_uri(given), data)
        if made is not None:
            return made
    if fs.get_file_info(inner).type != pafs.FileType.NotFound:  # check-then-put (module docstring)
        return False
    with fs.open_output_stream(inner) as out:
        out.write(data)
    return True


def _s3_put_if_absent(uri: str, data: bytes) -> Optional[bool]:
    """``PUT`` with ``If-None-Match: *`` through boto3: True made, False exists, None when boto3 is missing."""
    try:
        import boto3
        from botocore.exceptions import ClientError
    except ImportError:
        return None
    url = urllib.parse.urlparse(uri)
    query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items() if v}
    endpoint = query.get("endpoint_override")
    if endpoint and "://" not in endpoint:
        endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
    from botocore.config import Config

    from sparktrain.data._fs import s3_attempts

    # the pyarrow side's bounds (sparktrain.data._fs): botocore's defaults (60 s reads, 5 legacy attempts) held
    # a lease claim on a frozen store for over 3 minutes before it named the store
    bounds = Config(connect_timeout=10, read_timeout=15,
                    retries={"mode": "standard", "total_max_attempts": s3_attempts()})
    client = boto3.client("s3", endpoint_url=endpoint, region_name=query.get("region"), config=bounds)
    try:
        client.put_object(Bucket=url.netloc, Key=url.path.lstrip("/"), Body=data, IfNoneMatch="*")
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return False
        raise
    return True


__all__ = ["HEARTBEAT_S", "LEASE_FORMAT", "Lease", "Pin", "claim", "lease_path", "live_pins"]
