"""Everything that differs between classic Spark and Spark Connect, in one place.

Classic sessions expose a SparkContext (slots, conf, job groups); Connect
sessions do not.  Callers use these helpers and never touch ``sparkContext``.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Iterator, Optional

log = logging.getLogger(__name__)


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


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
