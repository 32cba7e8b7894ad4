"""Tracking URIs: normalize them, check them before any compute, open the experiment.

Supported stores: ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` (the
default, ``sqlite:///work/mlflow.db``), a ``file:`` directory, and an
``http(s)://`` tracking server.  With a local store, artifacts go to
``tracking.artifact_location`` (made absolute); with a server, they go where
the server puts them (its ``--artifacts-destination``) unless
``artifact_location`` is itself a URI such as ``s3://bucket/path``.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from sparktrain._internal.secrets import mask_value
from sparktrain.errors import TrackingError

log = logging.getLogger(__name__)

_FIX = ("start a server with `sparktrain mlflow-server` (in a checkout: `make mlflow-server`), point tracking.uri at "
        "a reachable one, use the local default sqlite:///work/mlflow.db, or set tracking.enabled: false")


def normalize_uri(uri: str) -> str:
    """Make a local store URI absolute (``sqlite:///work/mlflow.db`` -> ``sqlite:////abs/work/mlflow.db``)."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:":
            return "sqlite:///" + os.path.abspath(path)
        return uri
    if uri.startswith("file:"):
        return Path(urllib.parse.urlparse(uri).path).resolve().as_uri()
    if "://" not in uri:  # a bare directory means a file store
        return Path(uri).resolve().as_uri()
    return uri


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is a tracking server reached over HTTP."""
    return uri.startswith(("http://", "https://"))


def preflight(uri: str, timeout: float = 5.0) -> str:
    """Check that the tracking store at ``uri`` can be used; return the normalized URI.

    Runs before any Spark work.  A server must answer ``GET /health`` within
    ``timeout`` seconds; a sqlite file's folder must be creatable and writable.

    Raises
    ------
    TrackingError
        Naming the URI, the reason and the fix.
    """
    uri = normalize_uri(uri)
    if is_remote(uri):
        try:
            with urllib.request.urlopen(_health_request(uri), timeout=timeout) as resp:
                if resp.status != 200:
                    raise TrackingError(f"MLflow tracking server {mask_value(uri)} answered {resp.status} on "
                                        f"/health; {_FIX}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingError(f"MLflow tracking server {mask_value(uri)} is unreachable ({reason}); {_FIX}") from exc
        return uri
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        db = Path(uri[len("sqlite:///"):])
        _writable_dir(db.parent, uri)
        _sqlite_file(db, uri)
    elif uri.startswith("file:"):
        _writable_dir(Path(urllib.parse.urlparse(uri).path), uri)
    return uri


def _health_request(uri: str) -> urllib.request.Request:
    """``GET <uri>/health``; a password in the URI (``https://user:pw@host``, as MLflow's client takes it) goes
    into a Basic ``Authorization`` header, since urllib does not read a URL's userinfo."""
    import base64

    parts = urllib.parse.urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    request = urllib.request.Request(urllib.parse.urlunsplit(
        (parts.scheme, host, f"{parts.path.rstrip('/')}/health", "", "")))
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    return request


def _writable_dir(folder: Path, uri: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: cannot create folder {folder} ({exc}); "
                            f"{_FIX}") from exc
    if not os.access(folder, os.W_OK):
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: folder {folder} is not writable; {_FIX}")


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _sqlite_file(db: Path, uri: str) -> None:
    """A sqlite store's file, when it exists, must be a readable, writable SQLite database (MLflow makes a
    missing one)."""
    fix = ("Fix: point tracking.uri (--tracking-uri, MLFLOW_TRACKING_URI) at an MLflow sqlite file or a new path, "
           "or move this one away")
    if db.is_dir():
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: {db} is a folder, not a sqlite file. {fix}")
    if not db.exists():
        return
    try:
        with open(db, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: cannot read {db} ({exc}). {fix}") from exc
    if head and head != _SQLITE_MAGIC:  # an empty file is a new database to sqlite
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: {db} is not a SQLite database (it starts "
                            f"with {head[:8]!r}). {fix}")
    if not os.access(db, os.W_OK):
        raise TrackingError(f"MLflow tracking store {mask_value(uri)}: {db} is not writable by this process. {fix}")


def artifact_root(uri: str, artifact_location: Optional[str]) -> Optional[str]:
    """The artifact location for a new experiment (``None``: the server decides)."""
    if not artifact_location:
        return None
    if "://" in artifact_location:
        return artifact_location
    if is_remote(uri):
        return None  # a server stores what it receives in its --artifacts-destination
    path = Path(artifact_location).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def unusable_store(uri: str, exc: BaseException) -> TrackingError:
    """The error for a tracking store MLflow refuses to open: the store, what MLflow said, and the fix."""
    text = str(exc)
    found = re.search(r"found version (\w+), but expected (\w+)", text)
    if found:
        fix = (f"its schema is revision {found.group(1)}, and this MLflow (the pinned one) expects "
               f"{found.group(2)}: if the store is older, back it up and run `mlflow db upgrade {mask_value(uri)}`; if "
               f"a newer MLflow wrote it, use that MLflow's store with a sparktrain that pins it, or point "
               f"tracking.uri at another store")
    else:
        fix = "point tracking.uri at a store this MLflow can open, or repair this one"
    return TrackingError(f"MLflow cannot open the tracking store {mask_value(uri)} ({type(exc).__name__}: "
                         f"{mask_value(text.splitlines()[0][:300] if text else '')}); {fix}")


def get_or_create_experiment(client, name: str, artifact_location: Optional[str]) -> str:
    """The id of experiment ``name``, created (with ``artifact_location``) when new; a deleted one is refused."""
    from mlflow.entities import LifecycleStage

    try:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            return client.create_experiment(name, artifact_location=artifact_location)
    except Exception as exc:
        raise TrackingError(f"MLflow tracking store {mask_value(client.tracking_uri)}: cannot open experiment "
                            f"'{name}' ({type(exc).__name__}: {mask_value(str(exc))}); {_FIX}") from exc
    def plain(location: Optional[str]) -> str:
        return str(location or "").replace("file://", "").rstrip("/")

    if artifact_location and plain(artifact_location) != plain(exp.artifact_location):
        log.warning("MLflow experiment '%s' keeps the artifact location it was created with (%s); "
                    "tracking.artifact_location (%s) applies to a new experiment only: name a new "
                    "tracking.experiment to use it", name, mask_value(str(exp.artifact_location)),
                    mask_value(artifact_location))
    if exp.lifecycle_stage == LifecycleStage.DELETED:  # someone deleted it: restoring would undo that, runs and all
        from sparktrain.errors import ConfigError

        raise ConfigError("tracking.experiment", name,
                          f"MLflow experiment '{name}' (id {exp.experiment_id}) in {mask_value(client.tracking_uri)} "
                          f"is deleted, and this job will not undo that (restoring it brings its deleted runs back). "
                          f"Fix: name another experiment (tracking.experiment), or restore it yourself (the UI, or "
                          f"MlflowClient().restore_experiment('{exp.experiment_id}')), or delete it for good "
                          f"(`mlflow gc`) so that the name can be used again")
    return exp.experiment_id


#: Bounds on each MLflow HTTP call (about 10 s worst case against a dead server), unless set by the user.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def configure(uri: str) -> None:
    """Point MLflow's process-wide tracking and registry URIs at ``uri``.

    Model logging, ``models:/`` resolution and ``spark_udf`` read the
    process-wide URI, so a job sets it once; runs are still addressed by id.
    A URI with a password turns off MLflow's run links on stdout
    (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``): they would print it.
    """
    import mlflow

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file otherwise
    # MLflow's HTTP client retries 7 times with a backoff factor of 2 by default: minutes per call while a
    # server is down. sparktrain bounds each call (a user's own settings of these variables win).
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if mask_value(uri) != uri:
        # MLflow prints "View run <name> at: <tracking URI>/#/..." on stdout when a run ends, password and
        # all; sparktrain's own summary prints the link masked.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
