"""The single-task trial's Spark job, planned once per search, and the gc freeze of reused Python workers.

Real local[2] Spark; values, not timings (bench/tune_profile.py measures the time).
"""

from __future__ import annotations

import base64
import functools
import gc
import json
import sys

import pytest

from sparktrain._internal import daemon
from sparktrain._internal.seal import new_key, seal, unseal
from sparktrain.tune import _stage, _trial
from sparktrain.tune._stage import TrialStage
from sparktrain.tune._trial import CALL_PROPERTY, RESULT_SCHEMA, encode_call, make_planned_task


def _square(x: float) -> dict:
    return {"loss": x * x, "history": [{"epoch": 0, "loss": x}]}


def _fails(x: float) -> float:
    raise ValueError(f"bad x = {x}")


def test_trials_reuse_one_planned_job_and_each_gets_its_own_callable(spark):
    stage = TrialStage(spark, "loss")
    assert stage.planned and stage.profile is None  # classic Spark, no GPU asked
    first = stage.run(functools.partial(_square, 2.0))
    frame = stage._local.frame
    second = stage.run(functools.partial(_square, 3.0))
    failed = stage.run(functools.partial(_fails, 5.0))
    assert stage._local.frame is frame  # one planned DataFrame for this thread's trials
    assert first.metrics == {"loss": 4.0} and first.history == [{"epoch": 0, "loss": 2.0}]
    assert second.metrics == {"loss": 9.0} and second.error is None
    assert failed.error == "ValueError: bad x = 5.0" and "_fails" in failed.traceback
    assert first.gpus == () and second.gpus == ()  # local[2] gives tasks no GPU
    assert spark.sparkContext.getLocalProperty(CALL_PROPERTY) is None  # not left on the thread's later jobs


def test_trials_plan_their_own_job_when_plan_once_is_off(spark, monkeypatch):
    monkeypatch.setattr(_stage, "PLAN_ONCE", False)
    stage = TrialStage(spark, "val_loss")
    out = stage.run(lambda: 0.25)  # a bare number is the metric
    assert not stage.planned and getattr(stage._local, "frame", None) is None
    assert out.metrics == {"val_loss": 0.25}


def test_the_planned_task_without_its_property_fails_with_the_property_named(spark):
    task = make_planned_task("loss", new_key())
    row = spark.range(0, 1, 1, numPartitions=1).mapInArrow(task, RESULT_SCHEMA).collect()[0]
    assert not row["ok"]
    assert CALL_PROPERTY in row["error"] and "outside sparktrain's search" in row["error"]


def test_the_planned_task_opens_only_what_its_key_sealed(spark):
    """The callable in the job's property is sealed (Spark logs local properties as they are)."""
    key, other = new_key(), new_key()
    sc = spark.sparkContext
    df = spark.range(0, 1, 1, numPartitions=1).mapInArrow(make_planned_task("loss", key), RESULT_SCHEMA)
    try:
        sc.setLocalProperty(CALL_PROPERTY, encode_call(functools.partial(_square, 4.0), other))
        wrong = df.collect()[0]
        sealed = encode_call(functools.partial(_square, 4.0), key)
        sc.setLocalProperty(CALL_PROPERTY, sealed)
        right = df.collect()[0]
    finally:
        sc.setLocalProperty(CALL_PROPERTY, None)
    assert not wrong["ok"] and "failed its authentication check" in wrong["error"]
    assert right["ok"] and json.loads(right["metrics"]) == {"loss": 16.0}
    assert b"_square" not in base64.b64decode(sealed)  # the pickled function's names are not readable


def test_seal_round_trips_and_refuses_a_wrong_key_or_an_altered_text():
    key = new_key()
    for body in (b"", b"x", bytes(range(256)) * 40):
        text = seal(body, key)
        assert unseal(text, key) == body
        assert seal(body, key) != text  # a fresh nonce each time
    text = seal(b"payload", key)
    with pytest.raises(ValueError, match="authentication check"):
        unseal(text, new_key())
    raw = bytearray(base64.b64decode(text))
    raw[-1] ^= 1
    with pytest.raises(ValueError, match="authentication check"):
        unseal(base64.b64encode(bytes(raw)).decode(), key)
    with pytest.raises(ValueError, match="shorter than its nonce"):
        unseal(base64.b64encode(b"short").decode(), key)


def test_reused_python_workers_have_the_daemons_imports_frozen(spark):
    """The daemon froze torch before forking: PySpark's gc.collect() after each task skips those objects."""

    def frozen(batches):
        import gc as _gc
        import sys as _sys

        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"frozen": _gc.get_freeze_count(), "torch": "torch" in _sys.modules}])

    row = spark.range(0, 1, 1, numPartitions=1).mapInArrow(frozen, "frozen long, torch boolean").collect()[0]
    assert row["torch"]  # preimported by sparktrain._internal.daemon (conf/spark-defaults.conf)
    assert row["frozen"] > 100_000, row  # torch's objects, out of every collection's walk


def test_freeze_imports_freezes_once_per_new_imports(monkeypatch):
    monkeypatch.delenv("SPARKTRAIN_GC_FREEZE", raising=False)
    monkeypatch.setattr(_trial, "_frozen_modules", [len(sys.modules)])
    before = gc.get_freeze_count()
    try:
        assert _trial.freeze_imports() is False  # nothing imported since: nothing frozen
        assert gc.get_freeze_count() == before
        _trial._frozen_modules[0] = len(sys.modules) - 1  # as if one module had been imported since
        assert _trial.freeze_imports() is True
        assert gc.get_freeze_count() > before
        assert _trial._frozen_modules[0] == len(sys.modules)
        assert _trial.freeze_imports() is False
        _trial._frozen_modules[0] = 0
        monkeypatch.setenv("SPARKTRAIN_GC_FREEZE", "0")
        assert _trial.freeze_imports() is False  # turned off
    finally:
        gc.unfreeze()  # this test process collects as usual again


@pytest.mark.parametrize("value, frozen", [("0", False), ("off", False), ("1", True), (None, True)])
def test_the_daemon_freeze_can_be_turned_off(monkeypatch, value, frozen):
    if value is None:
        monkeypatch.delenv("SPARKTRAIN_GC_FREEZE", raising=False)
    else:
        monkeypatch.setenv("SPARKTRAIN_GC_FREEZE", value)
    before = gc.get_freeze_count()
    try:
        assert daemon.freeze() is frozen
        assert (gc.get_freeze_count() > before) is frozen
    finally:
        gc.unfreeze()
