"""The JVM part of sparktrain: its jar and the data-lineage listener.

``src/main/scala/io/sparktrain/lineage/LineageListener.scala`` is a Spark
``QueryExecutionListener``: while a :class:`LineageRecorder` is open, for every
successful action it records the file sources and tables the query read
(format, root paths, file count, bytes and a digest of the listing Spark
already made) and the files it wrote.  It reads the analyzed plan only, never
the data, lists nothing, and never fails a query.  ``make jar`` builds it into
``build/libs/sparktrain-listener.jar``.

:func:`sparktrain.session.get_or_create_session` puts that jar on a new
session's ``spark.jars`` and registers the listener; :class:`LineageRecorder`
reads the events of one piece of work, and :func:`source_inputs` keeps the
ones a job started from (not the files it wrote itself).
:func:`sparktrain.features.materialize.materialize` stores them in
``features.json`` (``dataset.sources``) and every MLflow run that logs the
dataset logs them as inputs with the context ``source``.

On Spark Connect, or with the jar absent, there is no listener: lineage of the
sources is skipped with a log line, nothing fails.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from sparktrain._internal.spark_compat import is_connect
from sparktrain.errors import MissingDependencyError

log = logging.getLogger(__name__)

JAR_ENV = "SPARKTRAIN_JAR"
JAR_NAME = "sparktrain-listener.jar"
LISTENER_CLASS = "io.sparktrain.lineage.LineageListener"
_DEFAULT_JAR = Path(__file__).resolve().parents[2] / "build" / "libs" / JAR_NAME
_FLUSH_MS = 10_000


def listener_jar(required: bool = False) -> Optional[str]:
    """Path of ``sparktrain-listener.jar``: ``$SPARKTRAIN_JAR``, else ``build/libs/`` of the checkout.

    Parameters
    ----------
    required : bool
        Raise instead of returning ``None`` when the file does not exist.

    Raises
    ------
    MissingDependencyError
        ``required`` and no jar at that path; the message names the path, where
        it came from and how to build it.
    """
    source = JAR_ENV if os.environ.get(JAR_ENV) else "the default location"
    path = os.environ.get(JAR_ENV) or str(_DEFAULT_JAR)
    if os.path.isfile(path):
        return os.path.abspath(path)
    if required:
        raise MissingDependencyError(
            JAR_NAME, f"`make jar` (it writes {_DEFAULT_JAR}), or set {JAR_ENV} to the path of a built {JAR_NAME}",
            why=f"no file at {path!r}, from {source}")
    return None


def _listener_class(spark: Any) -> Any:
    """The JVM ``LineageListener`` object, or ``None`` (Spark Connect, or the jar not on the driver)."""
    try:
        jvm = spark.sparkContext._jvm
    except Exception:  # Spark Connect: no JVM on this side
        return None
    from py4j.java_gateway import JavaClass

    try:
        cls = jvm.io.sparktrain.lineage.LineageListener
    except Exception as exc:  # a stopped gateway...: lineage never fails the job
        log.warning("data lineage of sources is off: %s", exc)
        return None
    return cls if isinstance(cls, JavaClass) else None


def enable_lineage(spark: Any) -> bool:
    """Register the lineage listener on ``spark`` (once); whether it is active.

    The jar must be on the driver's class path when the JVM starts (``spark.jars``
    or ``--jars``); :func:`sparktrain.session.get_or_create_session` does that
    when it creates the session.  Never raises: without the listener the job
    runs the same, without the lineage of its sources.
    """
    if is_connect(spark):
        log.info("data lineage of sources is off on Spark Connect (the listener needs the driver's JVM)")
        return False
    cls = _listener_class(spark)
    if cls is None:
        log.info("data lineage of sources is off: %s is not on the driver's class path (build it with "
                 "`make jar`, or set %s; on spark-submit pass --jars %s)", LISTENER_CLASS, JAR_ENV, JAR_NAME)
        return False
    try:
        if cls.register(spark._jsparkSession):
            log.info("data lineage: %s registered on this session", LISTENER_CLASS)
    except Exception as exc:
        log.warning("data lineage of sources is off: registering %s failed: %s", LISTENER_CLASS, exc)
        return False
    return True


class LineageRecorder:
    """The lineage events of this session's work done inside a ``with`` block.

    The listener records only while a recorder is open, and each recorder sees
    the events of its own session (all threads) between its start and its end.
    Every JVM call is guarded: a failure logs a warning and the recorder
    returns ``None``, it never fails the work it observes.

    Examples
    --------
    >>> with LineageRecorder(spark) as rec:                   # doctest: +SKIP
    ...     spark.read.parquet("raw/").write.parquet("out/")
    >>> rec.sources()                                         # doctest: +SKIP
    [{'kind': 'files', 'format': 'parquet', 'paths': ['file:/.../raw'], 'files': 2, ...}]
    """

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._cls = None if is_connect(spark) else _listener_class(spark)
        self._session: Optional[str] = None
        self._start: Optional[int] = None
        self._end: Optional[int] = None
        self._open = False

    @property
    def active(self) -> bool:
        """Whether the listener is on this session's driver."""
        return self._cls is not None

    def __enter__(self) -> "LineageRecorder":
        if self._cls is not None:
            try:
                self._cls.register(self.spark._jsparkSession)
                self._session = str(self._cls.sessionId(self.spark._jsparkSession))
                self._flush()  # events of earlier work are not this block's
                self._start = int(self._cls.begin())
                self._open = True
            except Exception as exc:
                log.warning("data lineage: could not start recording: %s", exc)
                self._cls = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._open and self._cls is not None:
            self._open = False
            try:
                self._flush()
                self._end = int(self._cls.end())
            except Exception as exc:
                log.warning("data lineage: could not end recording: %s", exc)
                self._cls = None

    def _flush(self) -> None:
        """Wait (up to 10 s) for Spark's listener bus to deliver the events of finished queries."""
        try:
            self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(_FLUSH_MS)
        except Exception as exc:  # a busy bus: go on with what has arrived
            log.warning("lineage: Spark's listener bus did not drain in %d ms (%s); events may be missing",
                        _FLUSH_MS, exc)

    def events(self) -> Optional[List[Dict[str, Any]]]:
        """This session's events from the block's start to its end (to now while it is open), oldest first.

        ``None`` when the listener is not active or reading failed.
        """
        if self._cls is None or self._start is None:
            return None
        try:
            if self._open:
                self._flush()
            end = self._end if self._end is not None else int(self._cls.lastId())
            if int(self._cls.firstId()) > self._start + 1:
                log.warning("data lineage: the listener's buffer dropped events of this block (more than %s "
                            "queries); the sources may be incomplete", self._cls.capacity())
            return json.loads(str(self._cls.eventsBetween(self._start, end, self._session)))
        except Exception as exc:
            log.warning("data lineage: could not read the events: %s", exc)
            return None

    def sources(self, exclude: Sequence[str] = ()) -> Optional[List[Dict[str, Any]]]:
        """:func:`source_inputs` of :meth:`events`; ``None`` when the listener is not active."""
        events = self.events()
        return None if events is None else source_inputs(events, exclude)


def local_path(uri: str) -> str:
    """``file:/x``, ``file:///x`` -> ``/x``; other URIs and plain paths unchanged."""
    if uri.startswith("file://"):
        return "/" + uri[len("file://"):].lstrip("/")
    if uri.startswith("file:"):
        return "/" + uri[len("file:"):].lstrip("/")
    return uri


def _normal(path: str) -> str:
    p = local_path(path)
    return os.path.abspath(p) if "://" not in p else p.rstrip("/")


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def source_inputs(events: Iterable[Dict[str, Any]], exclude: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The inputs of ``events`` that the work started from, each once.

    An input is dropped when every one of its paths lies under a path that the
    same events wrote, or under one of ``exclude`` (a staging folder...); paths
    compare after ``file:`` URIs become local paths.  A ``text`` input is also
    dropped when its paths lie under another input's: Spark's CSV and JSON
    readers read the files as text (header, schema inference) before the real read.
    """
    events = list(events)
    skip = [_normal(o["path"]) for e in events for o in e.get("outputs", []) if o.get("path")]
    skip += [_normal(p) for p in exclude]
    out: List[Dict[str, Any]] = []
    seen = set()
    for e in events:
        for item in e.get("inputs", []):
            paths = [_normal(p) for p in item.get("paths") or []]
            if paths and all(_under(p, skip) for p in paths):
                continue
            key = (item.get("kind"), item.get("format"), item.get("table"), tuple(paths), item.get("digest"))
            if key not in seen:
                seen.add(key)
                out.append(dict(item))
    real = [[_normal(p) for p in i.get("paths") or []] for i in out if i.get("format") != "text"]

    def inferred(item: Dict[str, Any]) -> bool:
        paths = [_normal(p) for p in item.get("paths") or []]
        return item.get("format") == "text" and bool(paths) and any(
            all(_under(p, roots) for p in paths) for roots in real if roots)

    return [i for i in out if not inferred(i)]


__all__ = ["JAR_ENV", "LISTENER_CLASS", "LineageRecorder", "enable_lineage", "listener_jar", "local_path",
           "source_inputs"]
