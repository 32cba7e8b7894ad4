"""Score raw rows with a model from the registry, in Spark, and write Parquet.

``sparktrain score --model models:/churn@champion --input raw.parquet --output scored.parquet``
runs :func:`score_path`: check the model URI against the registry, read the
input as ``data:`` reads it (any of Spark's file formats with its reader
options, a catalog table, or a query), check it has every column of the
model's signature, cast them to the signature's types, apply
``mlflow.pyfunc.spark_udf`` and write the input columns plus ``prediction``
(and ``probability``), atomically, with a ``_manifest.json``.  ``--output``
must be new, empty or an earlier scored output (:mod:`sparktrain.data.guard`).

The reader: ``--format`` and ``--option`` when given; else the format and
options the model was trained with (``data.format``, ``data.options``,
recorded in the model's metadata by
:func:`sparktrain.features.reader_options.reader_record`); else the input's
extension.  A file Spark cannot read in that format is refused naming the
file, the format and where the format came from, not with a Java trace.
"""

from __future__ import annotations

import logging
import os
import shutil
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from sparktrain._internal.secrets import mask_value
from sparktrain.track.lookup import (DEFAULT_TRACKING_URI, missing_db, resolve_model,  # noqa: F401 - API
                                     resolve_tracking_uri, use_store)
from sparktrain.errors import (ColumnClashError, ConfigError, DatasetNotFoundError, DuplicateColumnError,
                               MissingColumnError, TrackingError)

log = logging.getLogger(__name__)

#: The file formats ``score`` reads (``data.format``'s).
FORMATS = ("parquet", "csv", "json", "orc")
_EXTENSIONS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".orc": "orc", ".parquet": "parquet"}


def _refuse_store_bundle(model_uri: str) -> None:
    """A model folder of ``train.store`` (``bundle.json``, no ``MLmodel``) is not an MLflow model: say what to do."""
    from sparktrain.track.bundle import BUNDLE_FILE

    path = model_uri[len("file://"):] if model_uri.startswith("file://") else model_uri
    if "://" in path or ":" in path.split("/", 1)[0] or not os.path.isdir(path):
        return
    if os.path.isfile(os.path.join(path, BUNDLE_FILE)) and not os.path.isfile(os.path.join(path, "MLmodel")):
        run = os.path.dirname(os.path.abspath(path).rstrip("/")) if os.path.basename(path.rstrip("/")) == "model" \
            else path
        raise ConfigError("--model", model_uri,
                          f"this is a model folder of the training store ({BUNDLE_FILE}), not an MLflow model; "
                          f"register it with `sparktrain register --from-store {run}`, then score "
                          "models:/NAME@champion (or pass an MLflow model's path or runs:/ URI)")


def trained_reader(model_uri: str) -> Optional[Dict[str, Any]]:
    """The ``data`` record of the model at ``model_uri`` (:func:`~sparktrain.features.reader_options.reader_record`),
    or None for an older model."""
    from mlflow.models import get_model_info

    meta = get_model_info(model_uri).metadata or {}
    record = (meta.get("sparktrain") or {}).get("data")
    return record if isinstance(record, dict) else None


def input_format(path: str, fmt: Optional[str] = None) -> str:
    """``fmt`` when given, else by extension (a folder of ``.csv`` files is CSV; default Parquet)."""
    if fmt:
        if fmt not in FORMATS:
            raise ConfigError("--format", fmt, f"use one of {', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(path.rstrip("/").lower())[1]
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if os.path.isdir(path):
        names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
        exts = {os.path.splitext(n.lower())[1] for n in names}
        if names and len(exts) == 1 and exts <= set(_EXTENSIONS):
            return _EXTENSIONS[exts.pop()]
    return "parquet"


def choose_reader(path: str, fmt: Optional[str], options: Optional[Mapping[str, str]],
                  trained: Optional[Mapping[str, Any]]) -> Tuple[str, Dict[str, str], str]:
    """``(format, reader options, where the format came from)`` for a scoring input (module docstring).

    The model's recorded options apply when its format is used; ``options`` win over them.
    """
    from sparktrain.features.reader_options import check_reader_options, reader_options

    source = trained if trained and trained.get("input") == "source" and trained.get("format") else None
    if fmt:
        chosen, why = input_format(path, fmt), "--format"
    elif source is not None:
        chosen, why = str(source["format"]), "the format the model was trained with (data.format)"
    else:
        chosen, why = input_format(path), "the input's extension"
    base = dict(source.get("options") or {}) if source is not None and source["format"] == chosen else {}
    given = dict(options or {})
    try:
        check_reader_options(chosen, given)
    except ConfigError as exc:
        key = exc.path.rsplit(".", 1)[-1]
        raise ConfigError(f"--option {key}", exc.value, exc.fix) from exc
    if base:  # the model's options (their defaults included), then the ones given
        return chosen, {**base, **{k: v for k, v in reader_options(chosen, given).items() if k in given}}, why
    return chosen, reader_options(chosen, given), why


def read_input(spark: Any, path: str, fmt: Optional[str] = None, options: Optional[Dict[str, str]] = None,
               why: str = "--format"):
    """The raw rows at ``path`` as a DataFrame, read as ``fmt`` with ``options``.

    Raises :class:`DatasetNotFoundError` for a path that does not exist and a
    :class:`ConfigError` on ``--format`` naming the file and the format for a
    file Spark cannot read in it.
    """
    from sparktrain.features.load import load_input
    from sparktrain.features.sections import DataConfig

    if "://" not in path and not os.path.exists(path):
        raise DatasetNotFoundError(f"scoring input '{path}' does not exist; pass a file or folder Spark reads "
                                   f"({', '.join(FORMATS)}), or --table / --query for data in the catalog")
    chosen = input_format(path, fmt)
    try:
        df = load_input(spark, DataConfig(source=path, format=chosen,  # type: ignore[arg-type]
                                          options=dict(options or {})))
    except DatasetNotFoundError as exc:
        raise DatasetNotFoundError(f"scoring input '{path}' does not exist ({exc})") from exc
    except ConfigError as exc:
        raise unreadable(path, chosen, why, exc.__cause__ or exc) from exc
    corrupt = (options or {}).get("columnNameOfCorruptRecord", "_corrupt_record")
    if chosen in ("json", "csv") and df.columns == [corrupt]:
        raise unreadable(path, chosen, why, f"every record is malformed {chosen} (only '{corrupt}' was read)")
    return df


def unreadable(path: str, fmt: str, why: str, cause: Any) -> ConfigError:
    """The error for a scoring input Spark cannot read as ``fmt``: the file, the format and the fix."""
    from sparktrain._internal.spark_compat import error_summary, filesystem_fix

    no_connector = filesystem_fix(cause, path)
    if no_connector is not None:
        return ConfigError("--input", path, no_connector)
    first = error_summary(cause, limit=300) or type(cause).__name__
    return ConfigError("--format", fmt, f"Spark cannot read the scoring input '{path}' as {fmt} (chosen by {why}): "
                                        f"{first}. Fix: pass --format with the file's own format "
                                        f"({', '.join(f for f in FORMATS if f != fmt)}), and --option for its "
                                        f"reader options")


def read_catalog(spark: Any, table: Optional[str] = None, query: Optional[str] = None):
    """A catalog table or view (``--table``), or Spark SQL (``--query``), as ``data.table``/``data.query`` read them."""
    from sparktrain.features.load import load_input
    from sparktrain.features.sections import DataConfig

    try:
        return load_input(spark, DataConfig(table=table, query=query))
    except ConfigError as exc:
        raise ConfigError("--table" if table is not None else "--query", exc.value, exc.fix) from exc


def signature_columns(model_uri: str) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """``(inputs, outputs)`` of the model's signature as ``[(name, MLflow type string)]``."""
    from mlflow.models import get_model_info

    sig = get_model_info(model_uri).signature
    if sig is None or sig.inputs is None:
        raise TrackingError(f"model {model_uri} has no signature; log it with sparktrain (it records the raw "
                            f"input columns)")

    from mlflow.types import DataType

    def cols(schema: Any) -> List[Tuple[str, str]]:
        return [(c.name, c.type.name if isinstance(c.type, DataType) else str(c.type)) for c in schema.inputs]

    return cols(sig.inputs), (cols(sig.outputs) if sig.outputs is not None else [("prediction", "double")])


def _spark_type(mlflow_type: str) -> str:
    from sparktrain.serve.pyfunc import spark_type

    return spark_type(mlflow_type)


def score_dataframe(spark: Any, df: Any, model_uri: str, where: str = "the DataFrame to score",
                    missing_fix: str = "Add the column, or rename the one that holds it.",
                    tracking_uri: Optional[str] = None):
    """``df`` with the model's outputs added, via ``mlflow.pyfunc.spark_udf`` (lazy); ``missing_fix`` ends the
    error for a column the model reads that ``df`` lacks.  A ``models:/NAME@alias`` is read at the version the
    alias names now (:func:`~sparktrain.track.registry.pin_model_uri`), by the driver and every worker alike.
    ``tracking_uri``: the MLflow store, as :func:`use_store` chooses it (by default the one ``sparktrain score``
    reads)."""
    pinned = resolve_model(model_uri, use_store(model_uri, tracking_uri))
    return _score(spark, df, pinned, signature_columns(pinned), where=where, missing_fix=missing_fix,
                  named=model_uri)


def _score(spark: Any, df: Any, model_uri: str, signature: Tuple[List[Tuple[str, str]], List[Tuple[str, str]]],
           where: str, missing_fix: str, named: str):
    """:func:`score_dataframe` with the model at one version (``model_uri``) and its ``signature``; ``named``:
    the URI as the user gave it, for messages."""
    import mlflow.pyfunc
    from pyspark.sql import functions as F

    from sparktrain._internal.spark_compat import is_connect, try_cast
    from sparktrain.serve.spark_model import read_as

    inputs, outputs = signature
    DuplicateColumnError.check(df.columns, where)
    for name, _ in inputs:
        if name not in df.columns:
            raise MissingColumnError(name, df.columns, where=f"{where} (model {named} reads it)",
                                     fix=missing_fix)
    clashes = [n for n, _ in outputs if n in df.columns]
    if clashes:
        raise ColumnClashError(clashes, where, "scoring")
    spark_model = spark_pipeline_if_needed(model_uri)
    if spark_model is not None:
        return score_with_pipeline(spark_model, df, [(n, _spark_type(t)) for n, t in outputs])
    given = dict(df.dtypes)
    model = f"model {named}"
    # Connect's UDF reloads the model from its URI on the server: no temporary copy there (the text path needs one)
    as_text = not is_connect(spark)

    def arg(name: str, mlflow_type: str):
        trained = _spark_type(mlflow_type)
        if trained == "bigint" and as_text:  # an integer categorical as its text: MLflow's pandas long has no null
            return read_as(name, given[name], trained, model).cast("string").alias(name)
        if trained == "bigint":
            return read_as(name, given[name], trained, model).alias(name)
        if trained == "string":
            read_as(name, given[name], trained, model)  # refuses a number where the model read text
        return try_cast(name, trained).alias(name)  # "NA" -> null

    args = F.struct(*[arg(n, t) for n, t in inputs])
    result_type = ", ".join(f"`{n}` {_spark_type(t)}" for n, t in outputs)
    with _integers_as_text(model_uri, inputs if as_text else []) as uri, _quiet_env_manager():
        udf = mlflow.pyfunc.spark_udf(spark, uri, result_type=result_type, env_manager="local")
    tmp = "__sparktrain_scores"
    while tmp in df.columns:  # a column of the user's by that name is kept, not overwritten
        tmp += "_"
    return df.withColumn(tmp, udf(args)).select("*", *[F.col(f"{tmp}.{n}").alias(n) for n, _ in outputs]).drop(tmp)


class _EnvManagerAdvice(logging.Filter):
    """Drops MLflow's advice to use ``env_manager="conda"``: sparktrain scores in the executors' own environment
    on purpose (the model's dependencies are the pinned ones the cluster runs), so it only alarms."""

    def filter(self, record: logging.LogRecord) -> bool:
        return 'env_manager="local"' not in record.getMessage()


@contextmanager
def _quiet_env_manager() -> Iterator[None]:
    logger, advice = logging.getLogger("mlflow.pyfunc"), _EnvManagerAdvice()
    logger.addFilter(advice)
    try:
        yield
    finally:
        logger.removeFilter(advice)


@contextmanager
def _integers_as_text(model_uri: str, inputs: List[Tuple[str, str]]) -> Iterator[str]:
    """``model_uri``, or, when its signature has a ``long`` column, a copy whose signature reads it as text.

    MLflow's schema enforcement has no missing value for a ``long`` column (pandas holds a null integer as a
    float, which it refuses), so one null in an integer categorical failed the whole scoring job.  The
    model reads such a column as its text anyway (Spark's ``CAST(x AS STRING)``), so the copy takes the
    text, null included.  ``spark_udf`` ships the copy to the executors when it is made; it is then removed.
    Not under Spark Connect, whose UDF loads the model from its URI on the server: there a null in an integer
    categorical is still MLflow's error (documented).
    """
    if not any(t == "long" for _, t in inputs):
        yield model_uri
        return
    import tempfile

    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model
    from mlflow.types import ColSpec, DataType, Schema

    tmp = tempfile.mkdtemp(prefix="sparktrain-score-")
    try:
        local = download_artifacts(artifact_uri=model_uri, dst_path=tmp)
        meta = Model.load(os.path.join(local, "MLmodel"))
        sig = meta.signature
        sig.inputs = Schema([ColSpec(DataType.string, c.name, required=c.required)
                             if isinstance(c.type, DataType) and c.type == DataType.long else c
                             for c in sig.inputs.inputs])
        meta.signature = sig
        meta.save(os.path.join(local, "MLmodel"))
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spark_pipeline_if_needed(model_uri: str):
    """The model as a Spark ``PipelineModel`` when a feature needs Spark to apply (a vector, text or set feature,
    a datetime format: :data:`sparktrain.serve.local.SPARK_ONLY`), else None (the pyfunc scores it)."""
    import json

    from mlflow.artifacts import download_artifacts

    from sparktrain.serve.local import needs_spark
    from sparktrain.serve.pyfunc import FEATURES, spark_model_from

    local = download_artifacts(artifact_uri=model_uri)
    path = os.path.join(local, "artifacts", FEATURES, "features.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        if not needs_spark(json.load(fh)):
            return None
    return spark_model_from(local, model_uri)


def score_with_pipeline(model: Any, df: Any, outputs: List[Tuple[str, str]]):
    """``df`` plus ``outputs`` from the fitted feature pipeline and the network, in Spark.

    ``model`` is :func:`~sparktrain.serve.pyfunc.spark_model_from`'s raw-in,
    raw-out ``PipelineModel`` (:mod:`sparktrain.serve.spark_model`): every
    column of ``df`` comes back with its raw value, even where a feature's
    output has the same name as its source, and each input is read as the
    model was trained on it (:func:`~sparktrain.serve.spark_model.read_as`);
    this keeps ``outputs`` (the signature's), cast to their types.
    """
    from pyspark.sql import functions as F

    from sparktrain.features._sql import quote

    out = model.transform(df)
    return out.select(*[F.col(quote(c)) for c in df.columns], *[F.col(n).cast(t).alias(n) for n, t in outputs])


def score_path(spark: Any, model_uri: str, input_path: Optional[str], output_path: str, fmt: Optional[str] = None,
               tracking_uri: Optional[str] = None, options: Optional[Dict[str, str]] = None,
               table: Optional[str] = None, query: Optional[str] = None) -> int:
    """Score raw rows with ``model_uri`` and write Parquet to ``output_path``.

    Parameters
    ----------
    spark : SparkSession or callable
        The session, or a function that returns one, called once the
        arguments, ``output_path`` and the model are checked (``sparktrain
        score`` starts Spark only then: a refused request costs no Spark start).
    model_uri : str
        ``models:/NAME@champion``, ``models:/NAME/3``, ``runs:/...`` or a path.
    input_path : str or None
        Raw rows: a file or folder in any format ``data.format`` takes
        (``parquet``, ``csv``, ``json``, ``orc``).  Exactly one of
        ``input_path``, ``table`` and ``query``.
    output_path : str
        Parquet folder.  Written as a new generation inside it and committed
        by a record written last (module docstring), with a ``_manifest.json``
        (files, rows, schema, the model and input); it replaces only an
        earlier scored output or an empty folder.
    fmt : str, optional
        Input format; default: the format the model was trained with, else by extension.
    options : dict, optional
        Spark reader options (``nullValue``, ``sep``...), over the model's recorded ones.
    tracking_uri : str, optional
        Where the registry is (see :func:`resolve_tracking_uri`).
    table, query : str, optional
        A catalog table or view, or Spark SQL, instead of ``input_path``.

    Returns
    -------
    int
        Rows written.

    Raises
    ------
    ConfigError
        Not exactly one input; an unknown reader option; an input Spark cannot
        read in the chosen format (naming the file, the format and where it came from).
    ModelNotFoundError
        The model name (or alias/version) is not in the registry; the message
        lists the registered models.
    MissingColumnError
        The input lacks a column the model reads.
    OutputNotOwnedError
        ``output_path`` holds files sparktrain did not write (before any Spark job).
    OutputOverlapError
        ``output_path`` is ``/``, the current or home directory, the input or
        around it, or the MLflow store's folder (before any Spark job).
    LeaseHeldError
        Another job is writing ``output_path`` (before any Spark job).
    """
    from sparktrain._internal.spark_compat import check_spark_path
    from sparktrain.data.lease import claim

    raw_uri = _check_arguments(model_uri, input_path, output_path, fmt, tracking_uri, options, table, query)
    with claim(output_path, "--output"):
        pinned = _check_registered(model_uri, raw_uri, given_by=_uri_source(tracking_uri))
        session = spark if hasattr(spark, "read") else spark()  # a factory: Spark starts once all that is checked
        check_spark_path(session, output_path, "--output", "the scoring output")  # Spark writes it: before scoring
        return _score_claimed(session, model_uri, pinned, input_path, output_path, fmt, options, table, query)


def check_request(model_uri: str, input_path: Optional[str], output_path: str, fmt: Optional[str] = None,
                  tracking_uri: Optional[str] = None, options: Optional[Dict[str, str]] = None,
                  table: Optional[str] = None, query: Optional[str] = None) -> str:
    """What :func:`score_path` checks before it needs Spark: the arguments, ``output_path`` (new, empty or an
    earlier scored output, apart from the input and the MLflow store), then the model in the registry, without
    Spark or any write (no lease).  Configures MLflow for the tracking URI and returns the
    model URI pinned to the version it names now (:func:`~sparktrain.track.registry.pin_model_uri`).

    Raises
    ------
    ConfigError, OutputNotOwnedError, OutputOverlapError, ModelNotFoundError, TrackingError
        As :func:`score_path` documents them.
    """
    raw_uri = _check_arguments(model_uri, input_path, output_path, fmt, tracking_uri, options, table, query)
    return _check_registered(model_uri, raw_uri, given_by=_uri_source(tracking_uri))


def _check_arguments(model_uri: str, input_path: Optional[str], output_path: str, fmt: Optional[str],
                     tracking_uri: Optional[str], options: Optional[Dict[str, str]], table: Optional[str],
                     query: Optional[str]) -> str:
    """The arguments and ``output_path``, before the registry is opened; returns the tracking URI as given."""
    from sparktrain.data.guard import check_output_location, check_replaceable, mlflow_paths

    given = {k: v for k, v in (("--input", input_path), ("--table", table), ("--query", query)) if v is not None}
    if len(given) != 1:
        raise ConfigError("--input", input_path, "give exactly one of --input (a file or folder), --table (a "
                                                 "catalog table or view) or --query (Spark SQL)")
    if input_path is None and (fmt or options):
        raise ConfigError("--format" if fmt else "--option", fmt or options,
                          "reader options apply to files read with --input; a table or query is read as the "
                          "catalog defines it")
    _refuse_store_bundle(model_uri)
    raw_uri = resolve_tracking_uri(tracking_uri)
    apart, keep_out = mlflow_paths(raw_uri)
    check_output_location(output_path, "--output", inputs=[("--input", input_path)] if input_path else [],
                          keep_apart=apart, keep_out=keep_out)
    check_replaceable(output_path, "--output")  # before the registry, the model and any Spark job
    return raw_uri


def _uri_source(tracking_uri: Optional[str]) -> str:
    if tracking_uri:
        return "--tracking-uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "MLFLOW_TRACKING_URI"
    return "the default, as neither --tracking-uri nor MLFLOW_TRACKING_URI is set"


def _check_registered(model_uri: str, raw_uri: str, given_by: str) -> str:
    """Configure MLflow for ``raw_uri``, check that ``model_uri`` names a registered model there and return it
    pinned to its version (:func:`resolve_model`)."""
    from sparktrain.track import store

    fix = ("" if given_by == "--tracking-uri" else
           f". This store is {given_by}: if the model was registered in another one (the job config's "
           "tracking.uri), pass that with --tracking-uri URI or set MLFLOW_TRACKING_URI")
    missing_db(model_uri, raw_uri, fix or ". Fix --tracking-uri")
    uri = store.preflight(raw_uri)
    store.configure(uri)
    pinned = resolve_model(model_uri, uri, fix=fix)
    if pinned != model_uri:
        log.info("score: %s is %s now; the whole job reads that version", model_uri, pinned)
    return pinned


def _score_claimed(spark: Any, model_uri: str, pinned: str, input_path: Optional[str], output_path: str,
                   fmt: Optional[str], options: Optional[Dict[str, str]], table: Optional[str],
                   query: Optional[str]) -> int:
    """:func:`score_path` once ``--output`` is checked and claimed; ``pinned``: ``model_uri`` at its version."""
    from sparktrain.data.commit import Generation
    from sparktrain.data.manifest import build_manifest, write_manifest

    if input_path is not None:
        chosen, reader, why = choose_reader(input_path, fmt, options, trained_reader(pinned))
        log.info("score: reading %s as %s (%s)", mask_value(input_path), chosen, why)
        df = read_input(spark, input_path, chosen, reader, why=why)
        where, described = f"the scoring input '{input_path}' (read as {chosen})", input_path
    else:
        df = read_catalog(spark, table=table, query=query)
        where = f"the table '{table}'" if table is not None else "the query's result"
        described = f"table {table}" if table is not None else f"query {query}"
    inputs, outputs = signature_columns(pinned)
    df, casts = _observe_casts(df, inputs)
    fix = "Add the column to the input, or rename the one that holds it."
    if input_path is not None and fmt is None and os.path.splitext(input_path.rstrip("/").lower())[1] in _EXTENSIONS \
            and input_format(input_path) != chosen:
        fix = (f"The input's extension says {input_format(input_path)}, but it was read as {chosen} ({why}); "
               f"if it is {input_format(input_path)}, add --format {input_format(input_path)}. Otherwise: " + fix)
    scored = _score(spark, df, pinned, (inputs, outputs), where=where, missing_fix=fix, named=model_uri)
    try:
        with Generation(output_path, "--output") as gen:  # a failed job leaves the previous output committed
            scored.write.mode("append").parquet(gen.uri)  # a new folder (it holds only its marker)
            manifest = build_manifest(gen.uri, extra={"written_by": "sparktrain score", "model": model_uri,
                                                      "model_version": pinned,
                                                      "input": described}, compute_digest=False)
            write_manifest(gen.uri, manifest)
            gen.commit({"kind": "score", "rows": int(manifest["num_rows"])})
    except Exception as exc:
        if input_path is not None and _cannot_read(exc):  # a file found bad only when the job reads it
            raise unreadable(input_path, chosen, why, _read_failure(exc)) from exc
        raise
    n = int(manifest["num_rows"])
    log.info("scored %d rows of %s with %s -> %s", n, mask_value(described), model_uri, mask_value(output_path))
    _warn_casts(casts, n, where)
    return n


_NUMERIC = ("double", "float", "long", "integer")


def _observe_casts(df: Any, inputs: List[Tuple[str, str]]) -> Tuple[Any, Any]:
    """``df`` counting, as the write reads it (``DataFrame.observe``: no extra pass), the values of text columns
    the model reads as numbers that do not cast: scoring takes them as missing. ``(df, (observation, names))``."""
    from pyspark.sql import functions as F

    from sparktrain._internal.spark_compat import try_cast
    from sparktrain.features._sql import quote

    types = dict(df.dtypes)
    names = [n for n, t in inputs if t.lower() in _NUMERIC and types.get(n) == "string"]
    if not names:
        return df, None
    try:
        from pyspark.sql import Observation

        obs = Observation("sparktrain-score-casts")
        exprs = []
        for i, name in enumerate(names):
            raw = F.col(quote(name))
            bad = raw.isNotNull() & (F.trim(raw) != "") & try_cast(name, "double").isNull()
            exprs += [F.sum(F.when(bad, 1).otherwise(0)).alias(f"bad{i}"), F.min(F.when(bad, raw)).alias(f"ex{i}")]
        return df.observe(obs, *exprs), (obs, names)
    except Exception as exc:  # an engine without observe (some Connect servers): score without the count
        log.debug("score: no cast count (%s)", exc)
        return df, None


def _warn_casts(casts: Any, rows: int, where: str) -> None:
    """One warning per column with values that did not cast (scored as missing): the count and one of them."""
    if casts is None:
        return
    obs, names = casts
    try:
        got = obs.get
    except Exception as exc:
        log.debug("score: no cast count (%s)", exc)
        return
    for i, name in enumerate(names):
        bad = int(got.get(f"bad{i}") or 0)
        if bad:
            log.warning("score: column '%s' of %s has %d of %d values that are not numbers (e.g. %r); they were "
                        "scored as missing. If they mean missing, set the reader's nullValue (--option "
                        "nullValue=...); otherwise clean them before scoring (training refuses such values)",
                        name, where, bad, rows, got.get(f"ex{i}"))


_READ_FAILURES = ("FAILED_READ_FILE", "is not a Parquet file", "Malformed records are detected",
                  "Malformed ORC file", "CANNOT_READ_FILE_FOOTER")


def _cannot_read(exc: BaseException) -> bool:
    text = str(exc)
    return any(m in text for m in _READ_FAILURES)


def _read_failure(exc: BaseException) -> str:
    """The line of a Spark job's failure that names the file and what is wrong with it."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for marker in _READ_FAILURES[1:] + _READ_FAILURES[:1]:
        for ln in lines:
            if marker in ln:
                return ln
    return lines[0] if lines else type(exc).__name__
