"""Get or create the SparkSession a job runs on.

Order of precedence for the master URL: an already active session (notebooks,
``spark-submit``) is reused as is; otherwise ``--master`` / config; otherwise
``local[*]``.  Settings come from ``conf/spark-defaults.conf`` (if present),
then the job config's ``spark.conf``.  A new session gets
the lineage listener's jar for its Scala version (the installed package's, or
``make jar``'s) on ``spark.jars`` and the listener of :mod:`sparktrain.jvm`
registered; an unsupported pyspark or Java is refused before the JVM starts; a new *local* session's
driver JVM runs the parallel collector (:data:`LOCAL_COLLECTOR`) unless
``spark.driver.extraJavaOptions`` picks one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Dict, Mapping, Optional

from sparktrain._internal.secrets import mask_value

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_PROPERTY = re.compile(r"([^\s=:]+)\s*[=:\s]\s*(.*)")


def prepare_environment() -> None:
    """Set ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` when unset.

    Without ``PYSPARK_PYTHON`` executors may start a Python that lacks the
    pinned packages; without ``SPARK_LOCAL_IP`` Spark binds a non-loopback
    address on a laptop.  Values already set by the user are kept.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors import sparktrain by module path; make the package importable there.
    pkg_root = str(Path(__file__).resolve().parents[1])
    current = os.environ.get("PYTHONPATH", "")
    if pkg_root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, current) if p)


#: keys of spark-defaults.conf for a local[*] session only: a cluster keeps Spark's values (shuffle partitions sized
#: for 2 cores, no UI, 2 task attempts, a 2g driver are a laptop's choices)
LOCAL_ONLY = frozenset({"spark.sql.shuffle.partitions", "spark.ui.enabled", "spark.task.maxFailures",
                        "spark.driver.memory"})
#: the defaults an installed wheel carries (``make dist`` copies the checkout's ``conf/spark-defaults.conf``)
_PACKAGE_DEFAULTS = Path(__file__).resolve().parent / "spark-defaults.conf"


def defaults_for(master: str, settings: Mapping[str, str]) -> Dict[str, str]:
    """``settings`` (of spark-defaults.conf) without :data:`LOCAL_ONLY` when ``master`` is not ``local*``."""
    if str(master).startswith("local"):
        return dict(settings)
    return {k: v for k, v in settings.items() if k not in LOCAL_ONLY}


def spark_defaults_path() -> Path:
    """The ``spark-defaults.conf`` sparktrain reads: ``$SPARKTRAIN_SPARK_DEFAULTS`` when set, else the one the
    installed package carries, else the checkout's ``conf/spark-defaults.conf``."""
    if os.environ.get("SPARKTRAIN_SPARK_DEFAULTS"):
        return Path(os.environ["SPARKTRAIN_SPARK_DEFAULTS"])
    return _PACKAGE_DEFAULTS if _PACKAGE_DEFAULTS.is_file() else _REPO_ROOT / "conf" / "spark-defaults.conf"


def read_spark_defaults(path: Optional[Path] = None) -> Dict[str, str]:
    """Parse a ``spark-defaults.conf`` file (``key value`` per line, ``#`` comments); by default
    :func:`spark_defaults_path`'s."""
    path = path or spark_defaults_path()
    out: Dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        # Like java.util.Properties (which Spark uses): "key value", "key=value" or "key: value".
        match = _PROPERTY.match(line)
        if match and match.group(2):
            out[match.group(1)] = match.group(2).strip()
    return out


def get_or_create_session(master: Optional[str] = None, app_name: str = "sparktrain",
                          conf: Optional[Mapping[str, str]] = None):
    """Return the active SparkSession, or build one.

    Parameters
    ----------
    master : str, optional
        Master URL (``local[2]``, ``spark://host:7077``, ``sc://host`` for
        Spark Connect...).  Ignored, with a log line, when a session is active.
    app_name : str
        Spark application name.
    conf : mapping, optional
        Extra Spark settings; they override ``conf/spark-defaults.conf``.

    Returns
    -------
    pyspark.sql.SparkSession
    """
    prepare_environment()
    import pyspark
    from pyspark.sql import SparkSession

    from sparktrain._internal.spark_compat import check_java, check_pyspark

    check_pyspark(pyspark.__version__)  # also a pyspark that pip did not install (a Spark's own python/)
    active = SparkSession.getActiveSession()
    if active is not None:
        if master and not _same_master(active, master):
            log.info("reusing the active SparkSession (master %s); ignoring master=%s", mask_value(_master_of(active)),
                     mask_value(master))
        return active

    settings = read_spark_defaults()
    submitted = launched_by_spark_submit()
    if submitted:
        # spark-submit already started the JVM with its --master/--conf: the defaults
        # file must not override them (only the job config's spark.conf may).
        from pyspark import SparkConf, SparkContext
        SparkContext._ensure_initialized()  # connect to spark-submit's JVM so SparkConf sees its settings
        submitted_conf = dict(SparkConf().getAll())
        settings = {k: v for k, v in settings.items() if k not in submitted_conf}
    remote = master is not None and master.startswith("sc://")
    runs_on = submitted_conf.get("spark.master", "") if submitted else \
        (master or settings.get("spark.master") or DEFAULT_MASTER)
    if not remote:
        settings = defaults_for(runs_on, settings)
    if remote:
        # A Spark Connect client can only set the server session's SQL settings; the rest of the
        # defaults file (driver memory, UI...) belongs to the server's own launch.
        skipped = sorted(k for k in settings if not k.startswith("spark.sql."))
        settings = {k: v for k, v in settings.items() if k.startswith("spark.sql.")}
        if skipped:
            log.info("Spark Connect: not sending %s from spark-defaults.conf (set them on the server)",
                     ", ".join(skipped))
    settings.update(dict(conf or {}))
    if not submitted and not remote:
        check_java(pyspark.__version__)  # before the JVM starts: a wrong Java fails there with a Java stack
        _add_listener_jar(settings)
    default_master = settings.pop("spark.master", DEFAULT_MASTER)
    if not submitted and not remote and (master or default_master).startswith("local"):
        _local_collector(settings)
    builder = SparkSession.builder.appName(app_name)
    if master is not None and remote:
        builder = builder.remote(master)
    elif submitted:
        if master and master != DEFAULT_MASTER:  # the config's default is no choice of the user's to report
            log.info("launched by spark-submit: using its master; ignoring master=%s", mask_value(master))
    else:
        builder = builder.master(master or default_master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    log.info("SparkSession ready: master %s, Spark %s", mask_value(_master_of(spark)), spark.version)
    try:
        spark.sparkContext.setLogLevel("WARN")
    except Exception:  # Spark Connect has no SparkContext
        pass
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not remote:
        from sparktrain.jvm import enable_lineage
        enable_lineage(spark)
        from sparktrain._internal.interrupts import cancel_off_the_main_thread
        cancel_off_the_main_thread(spark.sparkContext)
    return spark


def _add_listener_jar(settings: Dict[str, str]) -> None:
    """Append the listener jar built for this Spark's Scala version (:func:`sparktrain.jvm.listener_jar`), when
    there is one, to ``spark.jars``: the lineage listener's classes.  A jar for another Scala is never added."""
    from sparktrain.jvm import listener_jar

    jar = listener_jar()
    if jar is None:
        return
    jars = [j for j in settings.get("spark.jars", "").split(",") if j.strip()]
    if not any(os.path.basename(j.strip()) == os.path.basename(jar) for j in jars):
        settings["spark.jars"] = ",".join([*jars, jar])


#: A local session's driver JVM is the whole engine: the parallel collector.  G1 (Java 17's default)
#: costs ~10% of a warm local preprocessing job on 2 cores and 0.15-0.2 GB of peak memory
#: (bench/preprocess.py, alternating runs with --conf spark.driver.extraJavaOptions=-XX:+UseG1GC).
LOCAL_COLLECTOR = "-XX:+UseParallelGC"
_COLLECTOR_FLAG = re.compile(r"-XX:\+Use\w*GC\b")


def _local_collector(settings: Dict[str, str]) -> None:
    """Add :data:`LOCAL_COLLECTOR` to ``spark.driver.extraJavaOptions`` unless those options pick a collector."""
    options = settings.get("spark.driver.extraJavaOptions", "")
    if not _COLLECTOR_FLAG.search(options):
        settings["spark.driver.extraJavaOptions"] = f"{options} {LOCAL_COLLECTOR}".strip()


def launched_by_spark_submit() -> bool:
    """Whether this Python driver was started by ``spark-submit`` (or ``pyspark``), whose JVM is already up."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _master_of(spark) -> str:
    try:
        return spark.sparkContext.master
    except Exception:
        return spark.conf.get("spark.master", "connect")


def _same_master(spark, master: str) -> bool:
    return _master_of(spark) == master
