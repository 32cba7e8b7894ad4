"""A fit on a multi-JVM standalone cluster whose Worker (and its executor) is killed mid-run.

Spark's retry of the barrier stage then waits for two slots, and only one is left: the wait is bounded
by stallTimeout and the error names the rank whose executor was lost, not its peer's echo of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.cluster]  # ~2 min: a cluster of its own

_SCRIPT = r'''
import json, sys
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.errors import SlotsUnavailableError
from sparktrain.session import get_or_create_session
from sparktrain.train.estimator import TorchEstimator

spark = get_or_create_session({master!r}, conf=json.loads({conf!r}))
df = spark.range(20000).select((F.rand(3) * 2 - 1).cast("float").alias("x1"),
                               (F.rand(4) * 2 - 1).cast("float").alias("x2"))
df = df.withColumn("label", (F.col("x1") + 0.5 * F.col("x2")) > 0.1)
est = TorchEstimator(numWorkers=2, epochs=400, batchSize=256, labelCol="label", store={store!r}, runId="lost",
                     stallTimeout=20.0, checkpointEverySteps=20, validationFraction=0.1)
est.show_progress = False
try:
    est.fit(df)
    out = {{"error": None}}
except SlotsUnavailableError as exc:
    out = {{"error": type(exc).__name__, "message": str(exc), "needed": exc.needed, "free": exc.free}}
except Exception as exc:
    out = {{"error": type(exc).__name__, "message": str(exc)}}
print("RESULT", json.dumps(out), flush=True)
'''


def test_a_fit_that_loses_a_worker_names_the_lost_executor_and_ends_at_stall_timeout(tmp_path):
    """Probe G: the error led with the surviving rank's gloo "connection closed by peer" and never said that
    an executor was lost.  Now it names the lost rank's executor and Spark's reason, then the slots wait."""
    from sparktrain.data.run_store import RunStore
    from tests.test_cluster import kill_a_worker_mid_run

    store = tmp_path / "store"

    def trained() -> bool:
        return (store / "lost").exists() and any(e["event"] == "epoch_finished"
                                                 for e in RunStore(str(store), "lost").read_events())

    result, err, ended = kill_a_worker_mid_run(
        tmp_path, lambda master, conf: _SCRIPT.format(python=str(REPO / "python"), master=master, conf=conf,
                                                      store=str(store)), trained)
    assert result["error"] == "SlotsUnavailableError", (result, err[-6000:])
    assert (result["needed"], result["free"]) == (2, 1)
    message = result["message"]
    # the lost rank first, not its peer's echo
    assert message.startswith("training failed: the executor of rank "), message
    assert " was lost: " in message and "ExecutorLostFailure" in message, message
    assert "connection closed" not in message.lower().split(" -- then ")[0], message
    for words in ("stallTimeout", "elastic=True", "runId='lost'"):
        assert words in message, (words, message)
    assert ended < 300
    assert any((store / "lost" / "checkpoints").rglob("*")), "the run's checkpoint is kept to resume from"
