"""The Spark job of a single-task trial, planned once per search, with the trial's resources.

A single-task trial (``tune.mode: single``, or a custom objective) is one
Spark task: ``spark.range(1, numPartitions=1).mapInArrow(task, ...)``.
Building that DataFrame for every trial (pickling the function, creating its
UDF, analysing and planning the query) cost the driver about as much as the
rest of the trial's overhead together (``bench/tune_profile.py``).  On
classic Spark a :class:`TrialStage` therefore builds the DataFrame once per
search thread (one per trial that runs at once: a Dataset's plan is not
shared between threads) around a fixed task function, and runs it again for
every trial; the trial's callable travels in a local property of the job
(:data:`~sparktrain.tune._trial.CALL_PROPERTY`), set in the running thread
only, like its job group, and sealed with a key of the stage's that only the
planned function carries (Spark logs local properties unredacted).  Under Spark Connect (no local properties) each
trial plans its own DataFrame, as before.

Resources: the trial's task asks for the estimator's GPUs
(``train.gpus_per_worker``) through the same stage-level scheduling as a
fit's barrier stage and a reused gang
(:func:`~sparktrain.train.resources.training_profile`): a ``ResourceProfile``
on the ``mapInArrow`` stage.  On a master without stage-level scheduling the
session's task resources apply, and that is logged once.  The task reports the
GPU addresses Spark gave it; the trial's rank takes its device from them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from sparktrain._internal import spark_compat
from sparktrain._internal.seal import new_key
from sparktrain.tune._loop import TrialOutcome
from sparktrain.tune._trial import CALL_PROPERTY, RESULT_SCHEMA, encode_call, make_planned_task, make_trial_task

log = logging.getLogger(__name__)

#: reuse one planned job per search thread (False: a new DataFrame per trial; bench/tune_profile.py's baseline)
PLAN_ONCE = True


class TrialStage:
    """Runs a trial's callable in one Spark task and returns its :class:`TrialOutcome`.

    Parameters
    ----------
    spark : SparkSession
        Classic or Connect.
    metric : str
        The name a bare number returned by the callable is reported as.
    gpus : int
        GPUs the trial's task asks for (``train.gpus_per_worker``; 0: none).
    """

    def __init__(self, spark, metric: str = "loss", gpus: int = 0) -> None:
        from sparktrain.train.resources import training_profile

        self.spark, self.metric, self.gpus = spark, metric, int(gpus)
        self.profile = training_profile(spark, self.gpus)  # None: the session's task resources (logged once)
        self.planned = PLAN_ONCE and not spark_compat.is_connect(spark)
        self._key = new_key()  # seals each trial's callable; travels only inside the planned function
        self._local = threading.local()  # this thread's planned DataFrame

    def _frame(self, task: Callable[..., Any]):
        df = self.spark.range(0, 1, 1, numPartitions=1)
        if self.profile is None:
            return df.mapInArrow(task, RESULT_SCHEMA)
        return df.mapInArrow(task, RESULT_SCHEMA, profile=self.profile)

    def run(self, call: Callable[[], Any]) -> TrialOutcome:
        """Run ``call()`` in one Spark task on an executor; its failure comes back as ``error``."""
        t0 = time.perf_counter()
        if not self.planned:
            rows = self._frame(make_trial_task(call, self.metric)).collect()
        else:
            frame = getattr(self._local, "frame", None)
            if frame is None:
                frame = self._local.frame = self._frame(make_planned_task(self.metric, self._key))
            sc = self.spark.sparkContext
            sc.setLocalProperty(CALL_PROPERTY, encode_call(call, self._key))
            try:
                rows = frame.collect()
            finally:
                sc.setLocalProperty(CALL_PROPERTY, None)  # type: ignore[arg-type]  # None removes it
        row = rows[0]
        log.debug("trial task on %s (pid %s): %.3f s in the objective, %.3f s in all", row["host"], row["pid"],
                  row["seconds"], time.perf_counter() - t0)
        return TrialOutcome(metrics=json.loads(row["metrics"]), history=json.loads(row["history"]),
                            model=bytes(row["model"]) if row["model"] is not None else None,
                            objective_seconds=row["seconds"], error=row["error"] if not row["ok"] else None,
                            traceback=row["traceback"], gpus=tuple(json.loads(row["gpus"] or "[]")))


def run_task(spark, call: Callable[[], Any], metric: str = "loss", stage: Optional[TrialStage] = None
             ) -> TrialOutcome:
    """Run ``call()`` in one Spark task (on ``stage``, or a new one without GPUs)."""
    return (stage or TrialStage(spark, metric)).run(call)
