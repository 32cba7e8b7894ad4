"""The JVM part of sparktrain: its jar and the data-lineage listener.

``src/main/scala/io/sparktrain/lineage/LineageListener.scala`` is a Spark
``QueryExecutionListener``: while a :class:`LineageRecorder` is open, for every
successful action it records the file sources and tables the query read
(format, root paths, file count, bytes and a digest of the listing Spark
already made) and the files it wrote.  It reads the analyzed plan only, never
the data, lists nothing, and never fails a query.  ``make jar`` builds it into
``build/libs/sparktrain-listener.jar``; the wheel ``make dist`` builds carries
one jar per Scala binary version (``sparktrain/jars/sparktrain-listener_2.12.jar``
for Spark 3.5, ``_2.13.jar`` for Spark 4), and :func:`listener_jar` picks the
one for the running Spark's Scala (``$SPARKTRAIN_JAR`` overrides; a jar built
for another Scala version is never loaded).  ``python -m sparktrain.jvm``
prints its path, for ``spark-submit --jars``.

:func:`sparktrain.session.get_or_create_session` puts that jar on a new
session's ``spark.jars`` and registers the listener; :class:`LineageRecorder`
reads the events of one piece of work, and :func:`source_inputs` keeps the
ones a job started from (not the files it wrote itself).
:func:`sparktrain.features.materialize.materialize` stores them in
``features.json`` (``dataset.sources``) and every MLflow run that logs the
dataset logs them as inputs with the context ``source``.

On Spark Connect, or with no jar for this Spark, there is no listener: lineage
of the sources is skipped with one log line saying why, nothing fails.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from sparktrain._internal.spark_compat import is_connect
from sparktrain.errors import MissingDependencyError

log = logging.getLogger(__name__)

JAR_ENV = "SPARKTRAIN_JAR"
JAR_NAME = "sparktrain-listener.jar"
LISTENER_CLASS = "io.sparktrain.lineage.LineageListener"
#: The jars the wheel carries (``make dist``), one per Scala binary version: ``sparktrain-listener_2.13.jar``...
PACKAGE_JARS = Path(__file__).resolve().parent / "jars"
_DEFAULT_JAR = Path(__file__).resolve().parents[2] / "build" / "libs" / JAR_NAME
_FLUSH_MS = 10_000
#: Class-file references that only one Scala binary line's standard library has (jars with no manifest entry).
_SCALA_MARKERS = {"2.13": (b"scala/collection/IterableOnce", b"scala/runtime/ModuleSerializationProxy"),
                  "2.12": (b"scala/collection/TraversableOnce", b"scala/collection/GenTraversableOnce",
                           b"scala/collection/TraversableLike")}
_off_reason: Optional[str] = None  # why the last lookup found no jar: enable_lineage's one log line
_logged: set = set()


def package_jar(scala: str) -> Path:
    """Where the installed package keeps its listener jar for Scala ``scala`` (``"2.12"``, ``"2.13"``)."""
    return PACKAGE_JARS / f"sparktrain-listener_{scala}.jar"


def jar_scala_version(path: str) -> Optional[str]:
    """The Scala binary version a listener jar was built for; ``None`` when nothing in it says.

    Read from its manifest (``Scala-Binary-Version``, written by ``make jar`` and
    ``make dist``), else its file name (``..._2.13.jar``), else the Scala
    library classes its class files reference.
    """
    import re
    import zipfile

    try:
        with zipfile.ZipFile(path) as jar:
            names = jar.namelist()
            if "META-INF/MANIFEST.MF" in names:
                manifest = jar.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
                m = re.search(r"^Scala-Binary-Version:\s*(\S+)", manifest, re.M)
                if m:
                    return m.group(1)
            m = re.search(r"_(2\.1[0-9]|3)\.jar$", os.path.basename(path))
            if m:
                return m.group(1)
            for name in names:
                if name.endswith(".class"):
                    data = jar.read(name)
                    for scala, markers in _SCALA_MARKERS.items():
                        if any(mark in data for mark in markers):
                            return scala
    except (OSError, zipfile.BadZipFile) as exc:
        log.debug("cannot read %s: %s", path, exc)
    return None


def find_listener_jar(scala: Optional[str] = None) -> Tuple[Optional[str], str]:
    """The listener jar for Spark's Scala version ``scala`` (default: the JVM a new session starts), and why.

    ``$SPARKTRAIN_JAR`` when set (the user's choice: nothing else is tried), else
    the installed package's ``jars/sparktrain-listener_<scala>.jar``, else the
    checkout's ``build/libs/sparktrain-listener.jar`` (``make jar``).  A jar built
    for another Scala version is never returned: the reason then names the jar
    found, its Scala version and the one needed.

    Returns
    -------
    (path or None, reason)
        ``reason`` says where the jar came from, or why there is none.
    """
    from sparktrain._internal.spark_compat import scala_binary_version

    needed = scala or scala_binary_version()
    wrong: List[str] = []

    def fits(path: str, where: str) -> bool:
        built = jar_scala_version(path)
        if built is None or needed is None or built == needed:
            return True
        wrong.append(f"{path} ({where}) is built for Scala {built}, and this Spark runs Scala {needed}")
        return False

    explicit = os.environ.get(JAR_ENV)
    if explicit:
        if not os.path.isfile(explicit):
            return None, f"no file at {explicit!r}, from {JAR_ENV}"
        if fits(explicit, JAR_ENV):
            return os.path.abspath(explicit), f"from {JAR_ENV}"
        return None, (f"{wrong[0]}; a jar for another Scala version is never loaded. Fix: set {JAR_ENV} to a "
                      f"jar built for Scala {needed}" + _available(needed) + f", or unset {JAR_ENV}")
    packaged = sorted(PACKAGE_JARS.glob("sparktrain-listener_*.jar"), key=lambda p: needed is None or
                      p != package_jar(needed))  # this Scala's first; the others only to name them
    candidates = [(str(p), "the installed package") for p in packaged]
    candidates.append((str(_DEFAULT_JAR), "the checkout's build/libs"))
    for path, where in candidates:
        if os.path.isfile(path) and fits(path, where):
            return os.path.abspath(path), f"from {where}"
    if wrong:
        return None, ("; ".join(wrong) + "; a jar for another Scala version is never loaded. Fix: install a "
                      f"sparktrain wheel that carries sparktrain-listener_{needed}.jar (`make dist` builds one), or "
                      f"build it against this Spark (`make jar`) and set {JAR_ENV} to it")
    return None, (f"no listener jar for Scala {needed or '(unknown)'}: not in the installed package "
                  f"({package_jar(needed or 'X.Y')}) nor at {_DEFAULT_JAR}. Fix: `make jar` in a checkout, or "
                  f"install the wheel `make dist` builds, or set {JAR_ENV} to a built jar")


def _available(needed: Optional[str]) -> str:
    if needed and package_jar(needed).is_file():
        return f" (the installed package has one: {package_jar(needed)})"
    return ""


def listener_jar(required: bool = False, scala: Optional[str] = None) -> Optional[str]:
    """Path of the lineage listener's jar for this Spark's Scala version (see :func:`find_listener_jar`).

    Parameters
    ----------
    required : bool
        Raise instead of returning ``None`` when there is no fitting jar.
    scala : str, optional
        The Scala binary version to fit (default: that of the JVM a new session starts).

    Raises
    ------
    MissingDependencyError
        ``required`` and no fitting jar; the message names the path, where it
        came from, the Scala versions, and how to get the right jar.
    """
    global _off_reason
    path, reason = find_listener_jar(scala)
    _off_reason = None if path else reason
    if path is None and required:
        raise MissingDependencyError(
            JAR_NAME, f"`make jar` (it writes {_DEFAULT_JAR}), or set {JAR_ENV} to the path of a built {JAR_NAME}",
            why=reason)
    return path


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
        _say_why_off()
        return False
    try:
        if cls.register(spark._jsparkSession):
            log.info("data lineage: %s registered on this session", LISTENER_CLASS)
    except Exception as exc:
        log.warning("data lineage of sources is off: registering %s failed: %s", LISTENER_CLASS, exc)
        return False
    return True


def _say_why_off() -> None:
    """The one log line that says why the listener is not on this driver, with how to add it."""
    if _off_reason is not None:  # the jar lookup of this session said why: that is the one line
        _log_once(logging.WARNING if "never loaded" in _off_reason else logging.INFO,
                  f"data lineage of sources is off: {_off_reason}")
    else:
        _log_once(logging.INFO, f"data lineage of sources is off: {LISTENER_CLASS} is not on the driver's class "
                                f"path (a session you build: .config('spark.jars', <the path `python -m "
                                f"sparktrain.jvm` prints>); on spark-submit pass --jars \"$(python -m "
                                f"sparktrain.jvm)\"; in a checkout build it with `make jar`)")


def _log_once(level: int, message: str) -> None:
    """Log ``message`` the first time only: a process that starts many sessions says why lineage is off once."""
    if message not in _logged:
        _logged.add(message)
        log.log(level, message)


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
        if self._cls is None and not is_connect(spark):  # a session sparktrain did not start: say it once here
            _say_why_off()
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m sparktrain.jvm [--scala 2.12] [--entry]``: print the path of the listener jar for this Spark
    (for ``spark-submit --jars``); exit 1, with the reason on stderr, when there is none.  ``--entry`` prints
    the script ``spark-submit`` runs instead: the installed package's ``__main__.py``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m sparktrain.jvm", description=main.__doc__)
    parser.add_argument("--scala", help="the Scala binary version to fit (default: this pyspark's)")
    parser.add_argument("--entry", action="store_true",
                        help="print the installed package's __main__.py, the script spark-submit runs")
    args = parser.parse_args(argv)
    if args.entry:
        print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py"))
        return 0
    path, reason = find_listener_jar(args.scala)
    if path is None:
        print(f"sparktrain: {reason}", file=sys.stderr)
        return 1
    print(path)
    return 0


__all__ = ["JAR_ENV", "LISTENER_CLASS", "LineageRecorder", "enable_lineage", "find_listener_jar", "jar_scala_version",
           "listener_jar", "local_path", "package_jar", "source_inputs"]

if __name__ == "__main__":
    raise SystemExit(main())
