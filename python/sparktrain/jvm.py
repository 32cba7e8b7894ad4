"""The JVM part of sparktrain: its jar and the data-lineage listener.

``src/main/scala/io/sparktrain/lineage/LineageListener.scala`` is a Spark
``QueryExecutionListener``: for every successful action it records the file
sources and tables the query read (format, root paths, file count, bytes and a
digest of the listing) and the files it wrote.  It reads the analyzed plan
only, never the data.  ``make jar`` builds it into
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

    cls = jvm.io.sparktrain.lineage.LineageListener
    return cls if isinstance(cls, JavaClass) else None


def enable_lineage(spark: Any) -> bool:
    """Register the lineage listener on ``spark`` (once); whether it is active.

    The jar must be on the driver's class path when the JVM starts (``spark.jars``
    or ``--jars``); :func:`sparktrain.session.get_or_create_session` does that.
    """
    cls = _listener_class(spark)
    if cls is None:
        log.info("data lineage of sources is off: %s is not on the driver's class path (build it with "
                 "`make jar`; on spark-submit pass --jars %s)", LISTENER_CLASS, JAR_NAME)
        return False
    if cls.register(spark._jsparkSession):
        log.info("data lineage: %s registered on this session", LISTENER_CLASS)
    return True


class LineageRecorder:
    """The lineage events of the work done inside a ``with`` block.

    Examples
    --------
    >>> with LineageRecorder(spark) as rec:                   # doctest: +SKIP
    ...     spark.read.parquet("raw/").write.parquet("out/")
    >>> rec.sources()                                         # doctest: +SKIP
    [{'kind': 'files', 'format': 'parquet', 'paths': ['file:/.../raw'], 'files': 2, ...}]
    """

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._cls = _listener_class(spark)
        self._mark: Optional[int] = None

    @property
    def active(self) -> bool:
        """Whether the listener is on this session's driver."""
        return self._cls is not None

    def __enter__(self) -> "LineageRecorder":
        if self._cls is not None:
            self._cls.register(self.spark._jsparkSession)
            self._mark = int(self._cls.lastId())
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def events(self) -> Optional[List[Dict[str, Any]]]:
        """Events since the block started, oldest first; ``None`` when the listener is not active.

        Listener events are delivered asynchronously: this waits (up to 10 s)
        for Spark's listener bus to drain first.
        """
        if self._cls is None or self._mark is None:
            return None
        try:
            self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(_FLUSH_MS)
        except Exception as exc:  # a busy bus: return what has arrived
            log.warning("lineage: Spark's listener bus did not drain in %d ms (%s); events may be missing",
                        _FLUSH_MS, exc)
        return json.loads(str(self._cls.eventsSince(self._mark)))

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


def source_inputs(events: Iterable[Dict[str, Any]], exclude: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The inputs of ``events`` that the work started from, each once.

    An input is dropped when every one of its paths lies under a path that the
    same events wrote, or under one of ``exclude`` (a staging folder...), and
    when it is the ``text`` read with which Spark's CSV and JSON readers
    infer a schema before the real read of the same files.
    """
    events = list(events)
    written = [local_path(o["path"]) for e in events for o in e.get("outputs", []) if o.get("path")]
    skip = [os.path.abspath(local_path(p)) if "://" not in p else p for p in (*written, *exclude)]

    def under(path: str) -> bool:
        p = local_path(path)
        p = os.path.abspath(p) if "://" not in p else p
        return any(p == s or p.startswith(s.rstrip("/") + "/") for s in skip)

    out: List[Dict[str, Any]] = []
    seen = set()
    for e in events:
        for item in e.get("inputs", []):
            paths = item.get("paths") or []
            if paths and all(under(p) for p in paths):
                continue
            key = (item.get("kind"), item.get("format"), item.get("table"), tuple(paths), item.get("digest"))
            if key not in seen:
                seen.add(key)
                out.append(dict(item))
    # CSV and JSON readers first read the files as text (header, schema inference): keep the real format
    other = {(i.get("table"), tuple(i.get("paths") or []), i.get("digest")) for i in out if i.get("format") != "text"}
    return [i for i in out
            if i.get("format") != "text" or (i.get("table"), tuple(i.get("paths") or []), i.get("digest")) not in other]


__all__ = ["JAR_ENV", "LISTENER_CLASS", "LineageRecorder", "enable_lineage", "listener_jar", "local_path",
           "source_inputs"]
