"""Everything that differs between classic Spark and Spark Connect, and between Spark versions, in one place.

Classic sessions expose a SparkContext (slots, conf, job groups); Connect
sessions do not.  Callers use these helpers and never touch ``sparkContext``.

sparktrain supports pyspark >= 3.5 and < 5 (``make test-compat`` runs 3.5.9,
4.0.5, 4.1.4 and 4.3.0), Python 3.10 to 3.12, and the Java each Spark line runs
on.  What differs between those lines, and where it is handled:

==========================  ============================  ==============================================
what                        Spark 3.5                     Spark 4.x
==========================  ============================  ==============================================
Scala of the JVM            2.12 (PyPI's build)           2.13: :func:`scala_binary_version`, the jar
                                                          ``sparktrain.jvm`` loads
Java                        8, 11, 17                     17, 21: :func:`check_java`
``mapInArrow(profile=)``    no (whole-app resources)      yes: :func:`map_in_arrow_barrier`
Connect server jar          a separate package            in ``jars/``: :func:`connect_server_bundled`
``spark.sql.ansi.enabled``  false by default              true by default (casts use ``try_cast``: the same)
inheritable_thread_target   of a function only            of the session (tags too): :func:`inheritable_target`
JVM ``ImputerModel(...)``   ``(uid, surrogateDF)``        4.0 too; from 4.1 ``(uid, cols, values)``:
                                                          :func:`java_imputer_model`
``getMetadataToSave(...)``  ``(stage, SparkContext...)``  ``(stage, SparkSession...)``: :func:`java_params_metadata`
``Column.try_cast``         SQL ``try_cast`` only         yes: :func:`try_cast`
==========================  ============================  ==============================================
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

log = logging.getLogger(__name__)


_PY4J_WRAPPER = re.compile(r"^An error occurred while calling [\w.]+\.?$")
_JAVA_CLASS = re.compile(r"^:?\s*(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error)):\s*")


def error_summary(exc: object, limit: int = 400, typed: bool = False) -> str:
    """The line of an error that says what went wrong, at most ``limit`` characters: the one helper every
    message that quotes an exception uses.

    That is the first non-empty line, except for a Spark error: py4j's own
    first line (``An error occurred while calling o54.load.``) names only a JVM
    object; Spark's reason is the Java exception's message on the next line.
    That line is returned instead, with the Java package cut from the class name
    (``SparkException: [FAILED_READ_FILE...] ...``).  ``exc`` may be an
    exception or its text; ``typed`` puts the exception's type before the line
    (``ValueError: ...``; an exception without a message is its type alone).
    """
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__ if isinstance(exc, BaseException) else ""
    line = lines[0]
    if _PY4J_WRAPPER.match(line) and len(lines) > 1:
        line = _JAVA_CLASS.sub(lambda m: m.group(1) + ": ", lines[1])
    line = line.rstrip(". ")
    line = line if len(line) <= limit else line[:limit] + "..."
    return f"{type(exc).__name__}: {line}" if typed and isinstance(exc, BaseException) else line


#: how Spark (Hadoop) says it has no filesystem for a URI's scheme, and the connector each scheme needs
_NO_FILESYSTEM = re.compile(r'No FileSystem for scheme "?([\w+.-]+)"?|UnsupportedFileSystemException'
                            r'|ClassNotFoundException:?\s*(?:Class\s+)?[\w.$]*(?:S3AFileSystem|GoogleHadoopFileSystem'
                            r'|AzureBlobFileSystem|SecureAzureBlobFileSystem|NativeAzureFileSystem)')
_CONNECTORS = {
    "s3a": "hadoop-aws and its AWS SDK bundle (spark.jars.packages=org.apache.hadoop:hadoop-aws:<the Hadoop "
           "version of your Spark>)",
    "s3": "hadoop-aws (spark.jars.packages=org.apache.hadoop:hadoop-aws:<the Hadoop version of your Spark>) "
          "with spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem, or write the URI as s3a:// "
          "(sparktrain's own files read either)",
    "gs": "the GCS connector (gcs-connector-hadoop3)",
    "abfs": "hadoop-azure", "abfss": "hadoop-azure", "wasbs": "hadoop-azure",
}


def filesystem_fix(error: object, path: str) -> Optional[str]:
    """What to do when ``error`` says Spark has no Hadoop filesystem for ``path``'s scheme; None for another error.

    Spark reads and writes through Hadoop filesystems: ``s3a://`` needs
    hadoop-aws on the classpath, ``gs://`` the GCS connector, and so on.
    Without one, Spark's error (``No FileSystem for scheme "s3"``, or a
    ``ClassNotFoundException`` for the connector's class) says nothing about
    the fix, and the data format is not the problem.
    """
    text = str(error)
    match = _NO_FILESYSTEM.search(text)
    if match is None:
        return None
    scheme = match.group(1) or (path.split("://", 1)[0] if "://" in path else "")
    connector = _CONNECTORS.get(scheme.lower(), "the Hadoop connector for that scheme")
    return (f"Spark has no Hadoop filesystem for {scheme}:// URIs ({error_summary(text, 200)}). Fix: add "
            f"{connector} to the Spark session (spark.conf in the job config, or --packages), or keep this data "
            f"on a path Spark reads already (a shared mount, hdfs://)")


def check_spark_path(spark, path: str, key: str, what: str) -> None:
    """Refuse ``path`` (the value of ``key``) when Spark has no Hadoop filesystem for its scheme.

    Classic Spark only (asks the JVM for the path's filesystem, which lists
    nothing and writes nothing); under Connect the first read or write says
    it.  Call it before work whose result would then be lost: a scoring job
    whose output Spark cannot write.
    """
    from sparktrain.errors import ConfigError

    if "://" not in path or path.startswith("file:") or is_connect(spark):
        return
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.hadoop.fs.Path(path).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    except Exception as exc:  # noqa: BLE001 - py4j: the Java exception's text says what is missing
        fix = filesystem_fix(exc, path)
        if fix is None:
            raise ConfigError(key, path, f"Spark cannot open {what}: {error_summary(exc, 300)}. Fix the URI, "
                                         f"or the filesystem's settings in spark.conf") from exc
        raise ConfigError(key, path, f"Spark cannot open {what}. {fix}") from exc


def check_spark_reads(spark, paths: "list[str]", key: str, what: str, value: Optional[str] = None) -> None:
    """Refuse a Parquet dataset Spark cannot read (no connector for its scheme, no access), before work needs it.

    Reads the files' schema only: a listing and one footer.  The error names
    ``key`` with ``value`` (default: the first path).
    """
    from sparktrain.errors import ConfigError

    try:
        _ = spark.read.parquet(*paths).schema  # resolving it lists the files and reads a footer
    except Exception as exc:  # noqa: BLE001 - py4j / Connect errors
        fix = filesystem_fix(exc, paths[0])
        text = fix if fix is not None else (f"{error_summary(exc, 300)}. Fix the path, or Spark's access to it "
                                            f"(credentials and endpoint in spark.conf)")
        raise ConfigError(key, value or paths[0], f"Spark cannot read {what}: {text}") from exc


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


#: How long a Spark Connect client retries a lost server during a fit before the fit fails (PySpark's default
#: policy waits at least 10 minutes, silently, in a collect that never returns)
CONNECT_RETRY_S = 60


@contextmanager
def bounded_connect_retries(spark) -> Iterator[None]:
    """Within the block, a Spark Connect client gives up on an unreachable server after about
    :data:`CONNECT_RETRY_S` seconds (8 retries, backoff 0.5 s doubling up to 15 s) instead of PySpark's 10+
    minutes; its own policies come back after, unless the server was lost (:func:`fail_fast`).  Blocks may
    nest and run in several threads at once (a search's trials).  A classic session is left alone."""
    client = getattr(spark, "client", None) if is_connect(spark) else None
    if client is None or not hasattr(client, "set_retry_policies") or getattr(client, _FAILS_FAST, False):
        yield
        return
    from pyspark.sql.connect.client.retries import DefaultPolicy

    with _RETRY_LOCK:  # the first block in saves the client's policies, the last one out restores them
        depth = getattr(client, _BOUNDED, None)
        if depth is None:
            setattr(client, _BOUNDED, [0, client.get_retry_policies()])
            client.set_retry_policies([DefaultPolicy(max_retries=8, backoff_multiplier=2.0, initial_backoff=500,
                                                     max_backoff=15000,
                                                     max_server_retry_delay=CONNECT_RETRY_S * 1000)])
        getattr(client, _BOUNDED)[0] += 1
    try:
        yield
    except BaseException as exc:
        if connect_loss(spark, exc) is not None:
            fail_fast(spark)
        raise
    finally:
        with _RETRY_LOCK:
            state = getattr(client, _BOUNDED)
            state[0] -= 1
            if not state[0]:
                delattr(client, _BOUNDED)
                if not getattr(client, _FAILS_FAST, False):  # a lost server stays lost for this session
                    client.set_retry_policies(state[1])


_RETRY_LOCK = threading.Lock()
_BOUNDED = "_sparktrain_bounded_retries"  # [blocks open, the policies before the first]
_FAILS_FAST = "_sparktrain_fails_fast"


def fail_fast(spark) -> None:
    """After a lost Connect server: every later call of this session (the user's, the session's own at exit, a
    search's other trials and their cancels) fails at once instead of waiting 10+ minutes more."""
    client = getattr(spark, "client", None) if is_connect(spark) else None
    if client is None or not hasattr(client, "set_retry_policies") or getattr(client, _FAILS_FAST, False):
        return
    from pyspark.sql.connect.client.retries import DefaultPolicy

    client.set_retry_policies([DefaultPolicy(max_retries=1, initial_backoff=200, max_backoff=1000)])
    setattr(client, _FAILS_FAST, True)
    log.warning("the Spark Connect server did not answer for %d s: this session's calls now fail at once "
                "instead of retrying for 10 minutes; start a new session once the server is back", CONNECT_RETRY_S)


def lost_connect_server(spark, exc: BaseException) -> bool:
    """Whether ``exc`` says a Spark Connect client could not reach its server (retries spent, UNAVAILABLE)."""
    if not is_connect(spark):
        return False
    text = f"{type(exc).__name__}: {exc}"
    return "RetriesExceeded" in text or "UNAVAILABLE" in text


def connect_loss(spark, exc: BaseException) -> Optional[BaseException]:
    """The error in ``exc``'s chain (itself, its causes and contexts) that says the Connect server was lost."""
    seen = set()
    cause: Optional[BaseException] = exc
    while cause is not None and id(cause) not in seen:
        if lost_connect_server(spark, cause):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def conf_get(spark, key: str, default: Optional[str] = None) -> Optional[str]:
    try:
        value = spark.conf.get(key, default)
    except Exception:
        value = default
    if value is None and not is_connect(spark):
        try:
            value = spark.sparkContext.getConf().get(key, default)
        except Exception:
            pass
    return value


def master(spark) -> str:
    """The master URL; under Spark Connect the server's (``connect`` when it does not say)."""
    if is_connect(spark):
        return conf_get(spark, "spark.master") or "connect"
    return spark.sparkContext.master


def driver_host(spark) -> Optional[str]:
    """Address executors can reach the driver on (None under Connect: no progress channel)."""
    if is_connect(spark):
        return None
    return conf_get(spark, "spark.driver.host") or "127.0.0.1"


def max_concurrent_tasks(spark) -> Optional[int]:
    """How many tasks the cluster can run at once right now (barrier mode needs >= num_workers).

    Under Spark Connect there is no SparkContext: the number comes from the
    server's settings (``local[N]``, ``spark.cores.max``, ``spark.executor.instances``
    x ``spark.executor.cores``, each over ``spark.task.cpus``, or
    ``spark.default.parallelism``), and is ``None`` when they do not say.
    """
    if is_connect(spark):
        return _connect_slots(spark)
    sc = spark.sparkContext
    try:
        jsc = sc._jsc.sc()
        rp = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(rp))
    except Exception as exc:  # private API; fall back on the master URL
        log.debug("maxNumConcurrentTasks unavailable: %s", exc)
    m = re.match(r"local\[(\d+|\*)(?:,\s*\d+)?\]", sc.master)
    if m:
        import os
        return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))
    if sc.master == "local":
        return 1
    return int(sc.defaultParallelism)


def free_slots(spark) -> Optional[int]:
    """Task slots free right now: :func:`max_concurrent_tasks` less the tasks other jobs are running."""
    total = max_concurrent_tasks(spark)
    if total is None or is_connect(spark):
        return total
    tracker = spark.sparkContext.statusTracker()
    running = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        running += info.numActiveTasks if info is not None else 0
    return max(0, total - running)


def waiting_retry(spark, group: str) -> bool:
    """True when ``group``'s first stage is a retry (attempt >= 1) with no task running (classic Spark).

    A retried barrier stage waits, without a timeout, until all its tasks can
    start at once: after a lost executor that may be never.
    """
    if is_connect(spark):
        return False
    tracker = spark.sparkContext.statusTracker()
    active = set(tracker.getActiveStageIds())
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        if job is None or job.status != "RUNNING" or not job.stageIds:
            continue
        first = min(job.stageIds)
        stage = tracker.getStageInfo(first) if first in active else None
        if stage is not None and stage.currentAttemptId >= 1 and stage.numActiveTasks == 0 \
                and stage.numCompletedTasks == 0:
            return True
    return False


def _connect_slots(spark) -> Optional[int]:
    def number(key: str) -> Optional[int]:
        value = conf_get(spark, key)
        try:
            return int(value) if value not in (None, "") else None
        except (TypeError, ValueError):
            return None

    cpus = max(1, number("spark.task.cpus") or 1)
    m = re.match(r"local(?:\[(\d+)(?:,\s*\d+)?\])?$", master(spark))
    if m:
        return int(m.group(1) or 1) // cpus
    cores_max = number("spark.cores.max")
    if cores_max:
        return cores_max // cpus
    instances, cores = number("spark.executor.instances"), number("spark.executor.cores")
    if instances and cores:
        return instances * cores // cpus
    return number("spark.default.parallelism")


def task_max_failures(spark) -> int:
    """Attempts a barrier stage gets (local[N,F] sets F; clusters use spark.task.maxFailures)."""
    m = master(spark)
    lm = re.match(r"local\[(?:\d+|\*),\s*(\d+)\]", m)
    if lm:
        return int(lm.group(1))
    if m.startswith("local"):
        return 1
    return int(conf_get(spark, "spark.task.maxFailures", "4") or 4)


@contextmanager
def job_group(spark, group: str, description: str = "") -> Iterator[None]:
    """Put the Spark jobs started by this thread in ``group`` (cancellable with :func:`cancel_group`)."""
    if is_connect(spark):
        spark.addTag(group)
        try:
            yield
        finally:
            spark.removeTag(group)
        return
    sc = spark.sparkContext
    sc.setJobGroup(group, description or group, interruptOnCancel=True)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def current_group(spark) -> Optional[str]:
    """The job group this thread's Spark jobs run in (classic Spark), or None."""
    if is_connect(spark):
        return None
    return spark.sparkContext.getLocalProperty("spark.jobGroup.id")


def cancel_group(spark, group: str) -> None:
    """Cancel every running job of ``group``."""
    if is_connect(spark):
        spark.interruptTag(group)
    else:
        spark.sparkContext.cancelJobGroup(group)


def wait_group_ended(spark, group: str, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Wait until no job or task of ``group`` runs (after :func:`cancel_group`); False when one still ran at
    ``timeout_s``.

    Under Connect there is no status tracker on the client: True at once (``interruptTag`` is the server's).
    """
    if is_connect(spark):
        return True
    import time

    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
        running = [j for j in jobs if getattr(j, "status", None) == "RUNNING"]
        stages = [tracker.getStageInfo(s) for j in jobs if j is not None for s in j.stageIds]
        # a cancelled job ends at once; its tasks run until their executors report them killed
        if not running and not any(s is not None and s.numActiveTasks > 0 for s in stages):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


class TaskStates:
    """What Spark's status tracker says about a rank's task: ``states(partition)``, for every rank of ``group``'s
    newest stage of ``num_tasks`` tasks, from one pass over its task list per ``max_age_s``.

    ``RUNNING``, ``SUCCESS``, ``FAILED``, ``KILLED``, ... of the task's newest
    attempt in the stage's current attempt; ``PENDING`` when the stage is a
    retry that has not started that task yet (a barrier retry waits for all
    its slots at once); ``None`` when Spark cannot say (under Connect there is
    no status tracker on the client).

    The stall watchdog asks about each silent rank; after a network cut that is every rank at once, and asking
    Spark once per rank read the whole task list once per rank (hundreds of ranks: about ranks^2 py4j calls, minutes
    on the driver).  ``snapshots`` counts the passes.
    """

    def __init__(self, spark, group: str, num_tasks: int, max_age_s: float = 1.0) -> None:
        self.spark, self.group, self.num_tasks, self.max_age_s = spark, group, int(num_tasks), float(max_age_s)
        self.snapshots = 0
        self._lock = threading.Lock()
        self._at: Optional[float] = None
        self._stages: list = []  # newest stage first: ({partition: status}, is a retry)

    def __call__(self, partition: int) -> Optional[str]:
        with self._lock:
            now = time.monotonic()
            if self._at is None or now - self._at >= self.max_age_s:
                self._stages = []
                try:  # (py4j errors reach the caller: the watchdog logs them and counts the state unknown)
                    self._stages = self._read()
                finally:  # once per max_age_s even when Spark does not answer: not once per rank
                    self._at = time.monotonic()
                    self.snapshots += 1
            for statuses, retry in self._stages:
                if partition in statuses:
                    return statuses[partition]
                if retry:
                    return "PENDING"
            return None

    def _read(self) -> list:
        if is_connect(self.spark):
            return []
        sc = self.spark.sparkContext
        tracker = sc.statusTracker()
        store = sc._jsc.sc().statusStore()  # AppStatusStore: per-task status (fed with or without the UI)
        out = []
        for stage in sorted(_group_stages(tracker, self.group), reverse=True):
            sinfo = tracker.getStageInfo(stage)
            if sinfo is None or sinfo.numTasks != self.num_tasks:
                continue
            tasks = store.taskList(stage, sinfo.currentAttemptId, 1 << 20)
            newest: Dict[int, tuple] = {}  # partition -> (attempt, status) of its newest task attempt
            for i in range(tasks.size()):
                t = tasks.apply(i)
                index, attempt = int(t.index()), int(t.attempt())
                if index not in newest or attempt >= newest[index][0]:
                    newest[index] = (attempt, str(t.status()))
            out.append(({k: v[1] for k, v in newest.items()}, sinfo.currentAttemptId >= 1))
            if out[-1][1] or len(newest) >= self.num_tasks:  # older stages answer for no rank (__call__)
                break
        return out


def _group_stages(tracker, group: str) -> set:
    """The ids of every stage of ``group``'s jobs."""
    stages: set = set()
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        if info is not None:
            stages.update(info.stageIds)
    return stages


def failed_tasks(spark, group: str, num_tasks: int) -> Dict[int, Dict[str, str]]:
    """Spark's reason for each failed task of ``group``'s stages of ``num_tasks`` tasks, every stage attempt.

    ``{partition: {"message": ..., "host": ...}}``, the earliest failure of each
    partition (a retried barrier stage's later attempts often fail only because
    of the first).  Empty when Spark cannot say (under Connect there is no status
    store on the client).  Read after the job ended: the status store is fed
    asynchronously, so a failure in the job's very last moment may be missing.
    """
    if is_connect(spark):
        return {}
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    stages = _group_stages(tracker, group)
    store = sc._jsc.sc().statusStore()
    found: Dict[int, Dict[str, str]] = {}
    for stage in sorted(stages):
        sinfo = tracker.getStageInfo(stage)
        if sinfo is None or sinfo.numTasks != num_tasks:
            continue
        for attempt in range(sinfo.currentAttemptId + 1):
            try:
                tasks = store.taskList(stage, attempt, 1 << 20)
            except Exception:  # noqa: BLE001 - an attempt the store no longer holds
                continue
            for i in range(tasks.size()):
                t = tasks.apply(i)
                error = t.errorMessage()
                if t.index() in found or str(t.status()) != "FAILED" or not error.isDefined():
                    continue
                found[int(t.index())] = {"message": str(error.get()), "host": str(t.host())}
    return found

# -- versions: the pyspark, Python and Java sparktrain runs on, and what differs between Spark lines ---------

#: pyspark releases sparktrain supports: at least SPARK_MIN, below SPARK_BELOW.
SPARK_MIN, SPARK_BELOW = (3, 5), (5, 0)
#: the releases ``make test-compat`` runs the core scenario on (tests/compat/).
SPARK_TESTED = ("3.5.9", "4.0.5", "4.1.4", "4.3.0")
#: Python versions sparktrain supports: at least PYTHON_MIN, below PYTHON_BELOW.
PYTHON_MIN, PYTHON_BELOW = (3, 10), (3, 13)
#: Java major versions each Spark major line runs on (Spark's documentation).
JAVA_MAJORS = {3: (8, 11, 17), 4: (17, 21)}
#: Set to 1 to turn the version refusals into warnings (an untested combination, at your own risk).
ALLOW_UNSUPPORTED_ENV = "SPARKTRAIN_ALLOW_UNSUPPORTED"

_SPARK_RANGE = f"pyspark >= {'.'.join(map(str, SPARK_MIN))} and < {SPARK_BELOW[0]} (tested: {', '.join(SPARK_TESTED)})"
_java_checked: dict = {}


def version_tuple(version: str) -> tuple:
    """The leading numbers of a version string: ``"4.1.0.dev1"`` -> ``(4, 1, 0)``, ``"1.8.0_392"`` -> ``(1, 8, 0)``."""
    out = []
    for part in re.split(r"[.\-_+]", str(version).strip()):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(out)


def _refuse(what: str, found: str, supported: str, fix: str) -> None:
    from sparktrain.errors import UnsupportedVersionError

    err = UnsupportedVersionError(what, found, supported, fix)
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "").strip().lower() in ("1", "true", "yes"):
        log.warning("%s (going on: %s is set)", err, ALLOW_UNSUPPORTED_ENV)
        return
    raise err


def check_python(version_info: Optional[tuple] = None) -> None:
    """Refuse a Python outside 3.10 to 3.12 (:class:`~sparktrain.errors.UnsupportedVersionError`)."""
    found = tuple(version_info or sys.version_info[:3])
    if not PYTHON_MIN <= found[:2] < PYTHON_BELOW:
        last = (PYTHON_BELOW[0], PYTHON_BELOW[1] - 1)
        _refuse("Python", ".".join(map(str, found)), f"Python {PYTHON_MIN[0]}.{PYTHON_MIN[1]} to {last[0]}.{last[1]}",
                f"run sparktrain under Python {PYTHON_MIN[0]}.{PYTHON_MIN[1]}-{last[0]}.{last[1]} (for example a "
                f"venv: python3.11 -m venv .venv), and set PYSPARK_PYTHON to that interpreter on a cluster")


def installed_pyspark_version() -> Optional[str]:
    """The pyspark version pip installed, read from its metadata without importing pyspark; None when absent."""
    from importlib import metadata

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:  # not installed, or a Spark's own python/ on PYTHONPATH
        return None


def check_pyspark(version: Optional[str] = None) -> Optional[str]:
    """Refuse a pyspark outside >= 3.5, < 5; ``version`` defaults to the installed one.  Returns it.

    Nothing is refused when pyspark is absent (the Spark-free scoring path needs none).
    """
    version = version or installed_pyspark_version()
    if version is None:
        return None
    if not SPARK_MIN <= version_tuple(version)[:2] < SPARK_BELOW:
        _refuse("pyspark", version, _SPARK_RANGE,
                "pip install 'pyspark>=3.5,<5' into this environment, or run on a Spark 3.5 or 4.x cluster "
                "(EMR 7, Dataproc 2.2+, Databricks 15.4 LTS or newer)")
    return version


def spark_jars_dir() -> Optional[str]:
    """The ``jars/`` folder the JVM of a new session will load: ``$SPARK_HOME/jars``, else pyspark's own."""
    home = os.environ.get("SPARK_HOME")
    if home and os.path.isdir(os.path.join(home, "jars")):
        return os.path.join(home, "jars")
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        if os.path.isdir(os.path.join(root, "jars")):
            return os.path.join(root, "jars")
    return None


def scala_binary_version(spark=None, spark_version: Optional[str] = None) -> Optional[str]:
    """The Scala binary version (``"2.12"``, ``"2.13"``) of ``spark``'s JVM, or of the JVM a new session will start.

    From the running JVM when a classic session is given; otherwise from the
    ``scala-library-X.Y.Z.jar`` in :func:`spark_jars_dir`; otherwise from the
    Spark version (Spark 3.5 on PyPI is built for 2.12, Spark 4 only for 2.13).
    """
    if spark is not None and not is_connect(spark):
        try:
            full = str(spark.sparkContext._jvm.scala.util.Properties.versionNumberString())
            return ".".join(full.split(".")[:2])
        except Exception as exc:  # a stopped gateway: fall back on the files
            log.debug("Scala version of the running JVM unavailable: %s", exc)
    jars = spark_jars_dir()
    if jars:
        for name in sorted(os.listdir(jars)):
            m = re.match(r"scala-library-(\d+\.\d+)\.\d+.*\.jar$", name)
            if m:
                return m.group(1)
    if spark_version is None:
        spark_version = installed_pyspark_version()
        if spark_version is None and "pyspark" in sys.modules:
            spark_version = getattr(sys.modules["pyspark"], "__version__", None)
    if spark_version:
        return "2.12" if version_tuple(spark_version)[:1] < (4,) else "2.13"
    return None


def _java_binary() -> Optional[str]:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.isfile(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    import shutil

    return shutil.which("java")


def java_version(java: Optional[str] = None) -> Optional[str]:
    """``java -version`` of ``java`` (default: ``$JAVA_HOME/bin/java``, else ``java`` on PATH); None if unknown."""
    import subprocess

    java = java or _java_binary()
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("java -version failed: %s", exc)
        return None
    m = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    return m.group(1) if m else None


def java_major(version: str) -> Optional[int]:
    """``"17.0.15"`` -> 17, ``"1.8.0_392"`` -> 8."""
    parts = version_tuple(version)
    if not parts:
        return None
    return parts[1] if parts[0] == 1 and len(parts) > 1 else parts[0]


def check_java(spark_version: str, java: Optional[str] = None) -> Optional[int]:
    """Refuse, before a new session starts its JVM, a Java that ``spark_version`` does not run on.  Returns its major.

    Spark 3.5 runs on Java 8, 11 and 17, Spark 4 on 17 and 21.  Nothing is
    refused when no Java is found (Spark then says so itself) or when
    ``spark-env.sh`` may pick another one.
    """
    java = java or _java_binary()
    if java is None:
        return None
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(os.environ.get("SPARK_HOME", ""), "conf")
    env_sh = os.path.join(conf_dir, "spark-env.sh")
    if os.path.isfile(env_sh):
        try:
            if "JAVA_HOME" in open(env_sh, encoding="utf-8", errors="replace").read():
                return None  # the launcher may use another Java than ours
        except OSError:
            pass
    key = (java, spark_version)
    if key not in _java_checked:
        _java_checked[key] = java_version(java)
    found = _java_checked[key]
    major = java_major(found) if found else None
    line = version_tuple(spark_version)[:1] or (4,)
    wanted = JAVA_MAJORS.get(line[0], JAVA_MAJORS[4])
    if major is not None and major not in wanted:
        listed = ", ".join(map(str, wanted[:-1])) + f" or {wanted[-1]}"
        _refuse("Java", f"{found} ({java})", f"Java {listed} for Spark {spark_version}",
                f"install a Java {listed} (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to it "
                f"or put its bin/ first on PATH")
    return major


def inheritable_target(spark):
    """A decorator that runs a function in another thread with this thread's Spark job group and tags.

    ``pyspark.inheritable_thread_target(spark)`` from pyspark 4 (local properties and the session's tags; under
    Connect, the session itself).  pyspark 3.5 takes only the function: its wrapper copies the local properties
    (the job group :func:`job_group` sets) when it wraps, and carries no Connect tags.
    """
    from pyspark import inheritable_thread_target

    if _pyspark_major() >= 4:
        return inheritable_thread_target(spark)
    return inheritable_thread_target


def java_imputer_model(spark, uid: str, inputs: list, surrogates: list):
    """The JVM ``ImputerModel`` that ``Imputer.fit`` builds for these surrogates (one per input column), with no job.

    Spark >= 4.1: ``ImputerModel(uid, inputCols, surrogates)``.  Spark 3.5 and 4.0:
    ``ImputerModel(uid, surrogateDF)``, a one-row DataFrame of the surrogates (non-null doubles, a column per
    input), as their ``Imputer.fit`` makes it.
    """
    gateway = spark.sparkContext._gateway
    jvm_model = gateway.jvm.org.apache.spark.ml.feature.ImputerModel
    if version_tuple(spark.version)[:2] >= (4, 1):
        names = gateway.new_array(gateway.jvm.java.lang.String, len(inputs))
        values = gateway.new_array(gateway.jvm.double, len(inputs))
        for i, (c, v) in enumerate(zip(inputs, surrogates, strict=True)):
            names[i], values[i] = c, float(v)
        return jvm_model(uid, names, values)
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(c, T.DoubleType(), False) for c in inputs])
    frame = spark.createDataFrame([tuple(float(v) for v in surrogates)], schema)
    return jvm_model(uid, frame._jdf)


def java_params_metadata(spark, java_stage) -> str:
    """``DefaultParamsWriter.getMetadataToSave(stage, ...)``: the ``metadata/`` JSON a JVM stage's writer saves.

    It takes the SparkSession from Spark 4.0, the SparkContext before (Spark 4 keeps that form, deprecated).
    """
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    owner = spark._jsparkSession if version_tuple(spark.version)[:1] >= (4,) else spark.sparkContext._jsc.sc()
    return str(jvm.org.apache.spark.ml.util.DefaultParamsWriter.getMetadataToSave(java_stage, owner, none, none))


def try_cast(name: str, spark_type: str):
    """Top-level column ``name`` (a dot or a space in it is part of the name) cast to ``spark_type``: null where
    the value does not cast, instead of an error.

    ``Column.try_cast`` is pyspark >= 4.0; Spark 3.5 has ``try_cast`` in SQL only, so the same column reference
    goes through ``F.expr``.
    """
    from pyspark.sql import functions as F

    ref = "`" + name.replace("`", "``") + "`"
    col = F.col(ref)
    if hasattr(type(col), "try_cast"):  # an instance would answer any name (a struct field)
        return col.try_cast(spark_type)
    return F.expr(f"try_cast({ref} AS {spark_type})")


def arrow_array_udf(fn, return_type: str):
    """A scalar UDF over whole Arrow arrays: ``fn(pyarrow.Array) -> pyarrow.Array``.

    ``arrow_udf`` is pyspark >= 4.1; before it, a ``pandas_udf`` converts each
    batch's Series to Arrow and back around the same ``fn``.
    """
    from pyspark.sql import functions as F

    if hasattr(F, "arrow_udf"):
        import warnings

        from pyspark.sql.functions import ArrowUDFType

        with warnings.catch_warnings():  # "prefer type hints": fn's hints are strings under future annotations
            warnings.simplefilter("ignore", UserWarning)
            return F.arrow_udf(fn, return_type, ArrowUDFType.SCALAR)

    def via_pandas(series):  # pragma: no cover - pyspark < 4.1
        import pyarrow as pa

        return fn(pa.array(series)).to_pandas()

    return F.pandas_udf(via_pandas, return_type)  # type: ignore[call-overload]


def _pyspark_major() -> int:
    import pyspark

    return (version_tuple(pyspark.__version__) or (4,))[0]


def connect_server_bundled(jars_dir: Optional[str] = None) -> bool:
    """Whether this Spark ships the Spark Connect server (``spark-connect_*.jar``; pyspark 4 does, 3.5 does not)."""
    jars = jars_dir or spark_jars_dir()
    return bool(jars) and any(n.startswith("spark-connect_") for n in os.listdir(jars))


# -- resources and stage-level scheduling -------------------------------------------------------------------

def supports_stage_profiles(spark) -> bool:
    """Whether this master schedules a stage with its own ``ResourceProfile`` (standalone, YARN, Kubernetes).

    ``local[N]`` cannot (one JVM, no executors to size); ``local-cluster`` is a standalone cluster.  Under
    Spark Connect the server's master decides.
    """
    m = master(spark)
    return m.startswith(("spark://", "yarn", "k8s://", "local-cluster"))


def map_in_arrow_barrier(df, fn, schema: str, profile=None):
    """``df.mapInArrow(fn, schema, barrier=True[, profile=...])``; ``profile`` needs pyspark >= 4.0."""
    import inspect

    if profile is None:
        return df.mapInArrow(fn, schema, barrier=True)
    if "profile" not in inspect.signature(df.mapInArrow).parameters:
        from sparktrain.errors import PreflightError
        raise PreflightError("gpusPerWorker needs stage-level scheduling of the training stage, which "
                             "DataFrame.mapInArrow supports from pyspark 4.0; on Spark 3.5 set "
                             "spark.task.resource.gpu.amount for the whole application instead")
    return df.mapInArrow(fn, schema, barrier=True, profile=profile)


def executor_resources(spark, name: str) -> Optional[list]:
    """Per executor (driver excluded), how many addresses of resource ``name`` it holds; None when unknown.

    Read from the application's status store (classic Spark only).
    """
    if is_connect(spark):
        return None
    try:
        summaries = spark.sparkContext._jsc.sc().statusStore().executorList(True)
        out = []
        it = summaries.iterator()
        while it.hasNext():
            ex = it.next()
            if ex.id() == "driver":
                continue
            res = ex.resources()
            info = res.get(name)
            out.append(len(list(info.get().addresses())) if info.isDefined() else 0)
        return out
    except Exception as exc:  # private API
        log.debug("executor resources unavailable: %s", exc)
        return None
