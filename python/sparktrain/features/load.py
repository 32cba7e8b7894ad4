"""Load the raw input a job's ``data:`` section names, as a DataFrame.

Exactly one of:

* ``data.source``: the name of an embedded dataset the caller passes in
  ``embedded`` (the job passes :data:`sparktrain.datasets.EMBEDDED`),
  or a path (any URI Spark reads) read with ``data.format`` (``parquet``,
  ``csv``, ``json`` or ``orc``) and ``data.options``, Spark's reader options
  (checked by :mod:`sparktrain.features.reader_options`; CSV defaults to
  ``header`` and ``inferSchema`` true);
* ``data.table``: a table or view of the session's catalog (``db.table`` or a name);
* ``data.query``: Spark SQL over the tables and views the session knows.

Every failure is raised here, before anything is written, and names the
config key: a path that does not exist (:class:`~sparktrain.errors.DatasetNotFoundError`),
a table that does not exist (the message lists the catalog's tables and
views), a query Spark cannot analyze, or a reader that refuses its options
(Spark's message, on ``data.options``).

Examples
--------
>>> from sparktrain.features.sections import DataConfig
>>> df = load_input(spark, DataConfig(source="data/houses.csv", format="csv",
...                                   options={"nullValue": "NA"}, label="price"))   # doctest: +SKIP
>>> df = load_input(spark, DataConfig(table="sales.orders", label="returned"))      # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Mapping, Optional

from sparktrain._internal.spark_compat import error_summary
from sparktrain.errors import ConfigError, DatasetNotFoundError
from sparktrain.features.sections import DataConfig

log = logging.getLogger(__name__)

_NOT_FOUND_PATH = ("PATH_NOT_FOUND",)
_NOT_FOUND_TABLE = ("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")

#: Loads a dataset that ``data.source`` names instead of a path: ``loader(spark, scale) -> DataFrame``.
EmbeddedLoader = Callable[[Any, int], Any]
#: Such datasets by the name ``data.source`` gives them.
Embedded = Mapping[str, EmbeddedLoader]


def load_input(spark: Any, data: DataConfig, embedded: Optional[Embedded] = None) -> Any:
    """The DataFrame ``data`` names (see the module docstring); lazy where Spark allows.

    Parameters
    ----------
    spark : SparkSession
    data : DataConfig
    embedded : mapping of str to loader, optional
        Datasets ``data.source`` may name instead of a path, each loaded as
        ``loader(spark, data.scale)``; any other ``data.source`` is a path.

    Raises
    ------
    ConfigError
        No input set; a table that does not exist; a query or reader options Spark refuses.
    DatasetNotFoundError
        ``data.source`` is a path that does not exist.
    """
    data.require_input()
    if data.table is not None:
        return _read_table(spark, data.table)
    if data.query is not None:
        return _run_query(spark, data.query)
    source = str(data.source)
    if embedded and source in embedded:
        return embedded[source](spark, data.scale)
    return _read_files(spark, source, data)


def catalog_tables(spark: Any) -> List[str]:
    """The tables and views the session's catalog lists (current database and temporary views), sorted."""
    try:
        tables = spark.catalog.listTables()
    except Exception as exc:  # a catalog that cannot list must not hide the real error
        log.debug("cannot list the catalog's tables: %s", exc)
        return []
    names = []
    for t in tables:
        names.append(f"{t.namespace[0]}.{t.name}" if getattr(t, "namespace", None) else t.name)
    return sorted(names)


def check_local_source(data: DataConfig, embedded: Optional[Embedded] = None) -> None:
    """Raise :class:`DatasetNotFoundError` when ``data.source`` is a local path (no scheme, no glob) that does
    not exist: before the MLflow runs and the JVM start (Spark's own error comes after both, with a Java stack
    in its log).  A URI, a glob or an embedded dataset name is left to Spark; the caller checks only for a
    session whose paths are this machine's (:func:`sparktrain.job.run_job`: a local master)."""
    import os
    import re

    source = data.source
    if source is None or (embedded and source in embedded) or re.search(r"[*?\[{]", source):
        return
    if "://" in source or re.match(r"^[A-Za-z][\w+.-]*:", source):
        if not source.startswith("file:"):
            return
        import urllib.parse

        url = urllib.parse.urlparse(source)
        if url.netloc not in ("", "localhost"):
            return
        source = urllib.parse.unquote(url.path)
    if not os.path.exists(source):
        where = "" if os.path.isabs(source) else f" (relative to the working directory {os.getcwd()})"
        raise DatasetNotFoundError(
            f"data.source '{data.source}' does not exist{where}. Fix the path (any URI Spark reads: a folder or "
            f"file, hdfs://, s3a://...), or use data.table / data.query for data in the catalog.")


def _read_files(spark: Any, path: str, data: DataConfig) -> Any:
    from sparktrain.features.reader_options import reader_options

    options = reader_options(data.format, data.options)
    try:
        return spark.read.format(data.format).options(**options).load(path)
    except Exception as exc:
        condition = _condition(exc)
        if condition is None:
            raise
        if condition in _NOT_FOUND_PATH:
            raise DatasetNotFoundError(
                f"data.source '{path}' does not exist. Fix the path (any URI Spark reads: a folder or file, "
                f"hdfs://, s3a://...), or use data.table / data.query for data in the catalog.") from exc
        from sparktrain._internal.spark_compat import filesystem_fix

        no_connector = filesystem_fix(exc, path)
        if no_connector is not None:
            raise ConfigError("data.source", path, no_connector) from exc
        key, value = ("data.options", dict(data.options)) if data.options else ("data.source", path)
        raise ConfigError(key, value, f"Spark cannot read '{path}' as {data.format}: {error_summary(exc)}. "
                                      f"Fix data.format or data.options") from exc


def _read_table(spark: Any, name: str) -> Any:
    try:
        return spark.read.table(name)
    except Exception as exc:
        condition = _condition(exc)
        if condition is None:
            raise
        if condition in _NOT_FOUND_TABLE:
            tables = catalog_tables(spark)
            listing = ", ".join(tables) if tables else "none"
            raise ConfigError("data.table", name,
                              f"no such table or view in the catalog (tables and views: {listing}). Fix the "
                              f"name, save the table first (df.write.saveAsTable), or read files with "
                              f"data.source") from exc
        raise ConfigError("data.table", name, f"Spark cannot read it: {error_summary(exc)}") from exc


def _run_query(spark: Any, query: str) -> Any:
    try:
        return spark.sql(query)
    except Exception as exc:
        if _condition(exc) is None:
            raise
        tables = catalog_tables(spark)
        raise ConfigError("data.query", query,
                          f"Spark cannot run it: {error_summary(exc)}. Tables and views the query can use: "
                          f"{', '.join(tables) if tables else 'none'}") from exc


def _condition(exc: BaseException) -> Any:
    """Spark's error condition of ``exc`` (e.g. ``PATH_NOT_FOUND``); ``""`` for another Spark error,
    None for an error that does not come from Spark."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    if isinstance(exc, PySparkException):
        return exc.getCondition() or ""
    if isinstance(exc, Py4JJavaError):
        return ""
    return None


__all__ = ["Embedded", "EmbeddedLoader", "catalog_tables", "load_input"]
