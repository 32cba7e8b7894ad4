"""Materialize a job's features: split, validate, fit, transform, write Parquet, atomically.

:func:`materialize` does, in this order (each step logged with its rows and seconds):

1. **stage input + validate** (a DataFrame, a table, a query or an embedded
   dataset as input): one pass over the source that assigns each row its
   split (``pmod(xxhash64(seed, key), 10000)`` against the split fractions,
   so the same key lands in the same split on every run and every cluster
   size; without ``data.key``, the hash of every column the job reads: see
   :func:`split_expression`), writes the columns the spec reads to
   ``staged_input/`` partitioned by split and, through ``DataFrame.observe``,
   runs every data check of :mod:`sparktrain.features.validate` in the same
   pass; then raises on bad input.  An expensive source is computed once;
   every later pass reads narrow Parquet.  When the source is
   ``data.source``'s own Parquet, which is cheap to re-read, there is no
   staging: the checks run as one job of step 3.
2. **check the label** (:mod:`sparktrain.features.label`): one aggregation
   over all rows (the class counts, or NaN/inf and moments of a regression
   label), refused with an error naming the column, the value and the fix;
   rows with a null label are dropped (``data.drop_null_labels``, the default)
   or refused.  This decides the task and whether the label is indexed.
3. **fit on train** with :func:`sparktrain.features.fit.fit_features`: the
   statistics of every estimator in one wave of concurrent jobs over the train
   rows (with the checks, which raise before any model is built), then the
   models from those statistics.
4. **write splits**: every row transformed once, one Spark job per split
   (a filter on the split column, pruned to that split's partition of the
   staged input), written straight to ``train/``, ``validation/``, ``test/``
   of the new generation (row groups of ``output.row_group_rows``,
   ``output.compression``) with a ``_manifest.json`` each, while
   ``pipeline_model/`` is saved (:func:`sparktrain.features.persist.save_pipeline_model`);
   then ``features.json``.

Nothing is renamed (object stores cannot move a directory): everything goes
to a new generation folder inside ``output.path``, and the commit record,
written last, makes it the dataset (:class:`sparktrain.data.commit.Generation`).
A failed or killed run leaves the previous dataset committed and readable;
the next run removes what it left.  Before step 1,
:func:`sparktrain.data.guard.check_job_paths` refuses an ``output.path``
that holds anything but an earlier dataset (a ``features.json`` or
``_manifest.json`` whose content is sparktrain's) or nothing, or that
overlaps the input, the store or the MLflow store; and the job claims
``output.path`` with a lease (:mod:`sparktrain.data.lease`), so a second
job on it is refused while this one runs.  Layout::

    <output.path>/
      _manifest.json                the commit record: names the generation
      _gen-<id>/
        train/ validation/ test/    Parquet + _manifest.json
        pipeline_model/             the fitted PipelineModel (PipelineModel.load)
        features.json               see sparktrain.features.metadata

Readers resolve ``<output.path>`` and ``<output.path>/train`` to the committed
generation (:func:`sparktrain.data.commit.resolve`); a dataset written in the
earlier layout (the same folders at the top level) is read as it is.

``features.json``'s ``dataset.sources`` lists the files and tables the job
read (format, paths, file count, bytes, a digest of the listing), as the
lineage listener of :mod:`sparktrain.jvm` saw them; absent without it.
"""

from __future__ import annotations

import logging
import posixpath
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from sparktrain._internal.secrets import mask_strings, mask_value
from sparktrain.features import metadata as md
from sparktrain.features._sql import quote
from sparktrain.features.compile import compile_pipeline, plan_features, source_columns
from sparktrain.features.fit import fit_features
from sparktrain.features.load import Embedded
from sparktrain.features.sections import PreprocessConfig, SplitConfig
from sparktrain.features.split import SPLIT_BUCKETS, split_case
from sparktrain.features.label import decide_label, label_kind, max_classes_of, task_override
from sparktrain.features.validate import check_results, check_schema, validation_sql

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
SPLIT_COLUMN = "sparktrain_split"
PIPELINE_DIR = "pipeline_model"
RAW_DIR = "staged_input"  # no leading "_" or ".": Spark ignores such a path given to spark.read


@dataclass(frozen=True)
class PreprocessResult:
    """What :func:`materialize` wrote.

    Attributes
    ----------
    path : str
        The dataset folder (``output.path``).
    row_counts : mapping
        Rows per split (``train``, ``validation``, ``test``).
    manifests : mapping
        The ``_manifest.json`` of each split (files, row groups, schema, digest).
    features_json : str
        Path of ``features.json``.
    pipeline_model : str
        Path of the saved ``PipelineModel``.
    generation : str
        The committed generation's folder (``<path>/_gen-<id>``).
    timings : mapping
        Seconds per step, and ``total``.
    features : mapping
        The content of ``features.json``.
    """

    path: str
    row_counts: Mapping[str, int]
    manifests: Mapping[str, Mapping[str, Any]] = field(repr=False)
    features_json: str
    pipeline_model: str
    timings: Mapping[str, float]
    features: Mapping[str, Any] = field(repr=False, default_factory=dict)
    generation: str = ""

    def split_path(self, split: str) -> str:
        """Folder of one split's Parquet files (inside the committed generation)."""
        return posixpath.join(self.generation or self.path, split)


def split_expression(key: Optional[str], split: SplitConfig, columns: Sequence[str] = ()) -> str:
    """SQL that names the split of a row from its key alone (deterministic everywhere).

    Without a key (``key`` None) the hash covers ``columns``, every column the
    job reads: still deterministic, but identical rows always land in the same
    split.  The expression is :func:`sparktrain.features.split.split_case`,
    the one ``fit(df)`` uses too.
    """
    return split_case(split.seed, [key] if key else list(columns),
                      [("train", split.train), ("validation", split.validation), ("test", split.test)])


@contextmanager
def _step(name: str, timings: Dict[str, float]) -> Iterator[Dict[str, Any]]:
    info: Dict[str, Any] = {}
    log.info("preprocess: %s ...", name)
    t0 = time.perf_counter()
    yield info
    timings[name] = time.perf_counter() - t0
    rows = f", {info['rows']:,} rows" if "rows" in info else ""
    log.info("preprocess: %s done in %.1f s%s", name, timings[name], rows)


def materialize(spark: Any, cfg: PreprocessConfig, df: Any = None, stage_input: Optional[bool] = None, *,
                embedded: Optional[Embedded] = None) -> PreprocessResult:
    """Fit the job's features on its train split and write all splits to Parquet.

    Parameters
    ----------
    spark : SparkSession
    cfg : PreprocessConfig
        A :class:`~sparktrain.config.JobConfig`.  Uses ``data`` (the input,
        key, label, drop_null_labels), ``features``, ``split``, ``output``,
        and ``train.task``/``train.max_classes`` when set.
    df : DataFrame, optional
        The raw input; loaded from ``cfg.data`` when omitted.
    stage_input : bool, optional
        Copy the columns the spec reads to Parquet first (partitioned by split),
        so an expensive source is computed once.  Default: True, except when
        the input is ``cfg.data``'s own Parquet path, which is cheap to re-read.
    embedded : mapping, optional
        Datasets ``data.source`` may name instead of a path
        (:func:`sparktrain.features.load.load_input`);
        :func:`sparktrain.job.run_preprocess` passes :data:`sparktrain.datasets.EMBEDDED`.

    Returns
    -------
    PreprocessResult

    Raises
    ------
    ConfigError, MissingColumnError, SchemaError
        Before any Spark job (a label type no model learns from is a SchemaError).
    OutputOverlapError, OutputNotOwnedError, DatasetExistsError
        Before any Spark job: ``output.path`` is ``/``, the current or home
        directory, overlaps ``data.source``, ``train.store`` or the MLflow
        store, holds files sparktrain did not write, or exists with
        ``output.overwrite: false`` (:func:`sparktrain.data.guard.check_job_paths`).
    DataError
        From the label check: null labels with ``data.drop_null_labels: false``,
        a single class, more than ``train.max_classes`` classes, NaN or infinity.
    DataError
        From the checks of :mod:`sparktrain.features.validate` (after the first
        wave of jobs, before any model is built), or from the fit: a vocabulary
        over its limit, an empty train split, a column with no value to impute
        from in the train split.

    Examples
    --------
    >>> cfg = load_config("conf/job.yaml")               # doctest: +SKIP
    >>> result = materialize(spark, cfg)                 # doctest: +SKIP
    >>> result.row_counts                                # doctest: +SKIP
    {'train': 80012, 'validation': 9985, 'test': 10003}
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from sparktrain.data.commit import Generation
    from sparktrain.data.guard import check_job_paths
    from sparktrain.data.lease import claim
    from sparktrain.jvm import LineageRecorder

    t_start = time.perf_counter()
    timings: Dict[str, float] = {}
    key, label = cfg.data.key, cfg.data.label
    specs = cfg.features
    plan = plan_features(specs, key=key, label=label)  # config errors first
    given = df is not None
    # output.path: where it is and what it holds, before any Spark job (sparktrain.data.guard)
    check_job_paths(cfg, ("preprocess",), with_source=not given, embedded=embedded or ())
    from sparktrain._internal.spark_compat import check_spark_path

    # Spark writes the splits: a scheme it has no filesystem for fails now, not after the fit (probe R)
    check_spark_path(spark, cfg.output.path, "output.path", "the dataset's output")
    source = "<DataFrame>" if given else cfg.data.describe()
    if stage_input is None:
        stage_input = not (not given and cfg.data.source is not None and cfg.data.format == "parquet"
                           and cfg.data.source not in (embedded or ()))
    if df is None:
        from sparktrain.features.load import load_input
        df = load_input(spark, cfg.data, embedded)
    types = check_schema(df.schema, specs, key, label)
    label_kind(label, types[label])  # a type no model learns from: refused before any job
    task, max_classes = task_override(cfg), max_classes_of(cfg)
    plan = plan_features(specs, key=key, label=label, types=types)
    needed = _unique([*source_columns(specs), key, label])
    split_sql = split_expression(key, cfg.split, columns=needed)
    if key is None:
        log.info("preprocess: no data.key: a row's split is a hash of its columns %s (identical rows share a "
                 "split)", ", ".join(needed))
    timezone = spark.conf.get("spark.sql.session.timeZone", "UTC")
    out = cfg.output
    checks = validation_sql(types, specs, key, label, distinct=False)  # the fit counts vocabularies exactly
    checks += [f"count_if({SPLIT_COLUMN} = '{s}' AND {quote(label)} IS NOT NULL) AS split_{s}" for s in SPLITS]
    tagged = df.selectExpr(*[quote(c) for c in needed], f"{split_sql} AS {SPLIT_COLUMN}")
    with claim(out.path, "output.path"), Generation(out.path, "output.path", overwrite=out.overwrite) as gen, \
            LineageRecorder(spark) as lineage:
        staging = gen.uri
        raw = posixpath.join(staging, RAW_DIR)
        counts: Dict[str, int] = {}

        def check(values: Dict[str, Any]) -> None:
            report = check_results(values, specs, label, types)
            counts.update({s: int(values[f"split_{s}"]) for s in SPLITS})
            log.info("preprocess: input checked (%s rows): split %s", f"{report.rows:,}", counts)

        if stage_input:
            with _step("stage input + validate", timings) as info:
                obs = Observation("sparktrain_preprocess")
                tagged.observe(obs, *[F.expr(c) for c in checks]).write.partitionBy(SPLIT_COLUMN).parquet(raw)
                info["rows"] = int(obs.get["rows"])
            check(obs.get)
            data, extra = spark.read.parquet(raw), []
        else:
            data, extra = tagged, checks
        with _step("check label", timings) as info:
            decision = decide_label(data, label, types[label], task, max_classes, cfg.data.drop_null_labels)
            info["rows"] = decision.summary.rows
        dropped, encoding = decision.dropped, decision.encoding
        if dropped:
            data = data.where(f"{quote(label)} IS NOT NULL")
        pipeline = compile_pipeline(specs, key=key, label=label, types=types, label_labels=encoding.labels)
        train = f"{quote(SPLIT_COLUMN)} = 'train'"
        with _step("fit on train" if stage_input else "validate + fit on train", timings) as info:
            fit = fit_features(pipeline, data, plan, train=train, extra=extra,
                               check=None if stage_input else check)
            info["rows"] = counts["train"]
        meta = md.build_metadata(plan, fit.fitted, schema=types, timezone=timezone, label=encoding.entry)
        md.check_vocabularies(meta)
        with _step("write splits", timings) as info:
            manifests = _write_outputs(spark, fit.model, data, staging, out)
            info["rows"] = sum(m["num_rows"] for m in manifests.values())
        meta["dataset"] = {
            "splits": {s: {"path": s, "rows": manifests[s]["num_rows"], "digest": manifests[s]["digest"]}
                       for s in SPLITS},
            "split": {"key": key, "columns": [key] if key else needed, "seed": cfg.split.seed,
                      "buckets": SPLIT_BUCKETS,
                      "fractions": {"train": cfg.split.train, "validation": cfg.split.validation,
                                    "test": cfg.split.test},
                      "expression": split_sql},
            "pipeline_model": PIPELINE_DIR,
            "source": mask_value(source),  # a path or URI as the config gave it, never its credentials
            "scale": cfg.data.scale if not given else None,
            "null_labels_dropped": dropped,
        }
        sources = lineage.sources(exclude=[staging, out.path])
        if sources is not None:  # what the source's files were (the lineage listener: sparktrain.jvm)
            meta["dataset"]["sources"] = mask_strings(sources)
        meta["dataset"]["generation"] = gen.id
        _write_text(posixpath.join(staging, md.FILE_NAME), md.dumps(meta))
        if stage_input:
            _delete_dir(raw)
        gen.commit({"kind": "preprocess", "rows": {s: manifests[s]["num_rows"] for s in SPLITS}})
    timings["total"] = time.perf_counter() - t_start
    result = PreprocessResult(
        path=out.path, row_counts={s: manifests[s]["num_rows"] for s in SPLITS}, manifests=manifests,
        features_json=posixpath.join(staging, md.FILE_NAME),
        pipeline_model=posixpath.join(staging, PIPELINE_DIR), timings=dict(timings), features=meta,
        generation=staging)
    log.info("preprocess: wrote %s in %.1f s", out.path, timings["total"])
    _warn_small_splits(result.row_counts)
    _warn_lookalike_categories(meta.get("features") or [])
    return result


def _warn_lookalike_categories(features: Sequence[Mapping[str, Any]]) -> None:
    """Warn about a categorical feature whose vocabulary holds values that differ only in spaces or letter case
    (``'red'``, ``'red '``, ``'Red'``): each is a category of its own, as for the label (which warns alike)."""
    for f in features:
        vocabulary = f.get("vocabulary") if f.get("type") == "categorical" else None
        if not vocabulary:
            continue
        garbled = [str(v) for v in vocabulary if "\ufffd" in str(v)]
        if garbled:
            log.warning("feature '%s' (column '%s') has %d categor%s holding U+FFFD, the character a decoder puts for "
                        "bytes that are not UTF-8 (%s): the file is probably in another encoding, and categories "
                        "that differ only in those letters became one. Set the reader's encoding (e.g. "
                        "data.options: {encoding: ISO-8859-1} or --option encoding=windows-1252) and preprocess "
                        "again", f.get("name"), f.get("source"), len(garbled), "y" if len(garbled) == 1 else "ies",
                        ", ".join(repr(v) for v in garbled[:3]))
        quoted = [str(v) for v in vocabulary if str(v).startswith('"') and '""' in str(v)]
        if quoted:
            log.warning("feature '%s' (column '%s') has categories that keep a CSV's quoting (%s): the file doubles "
                        "quotes inside quoted fields (RFC 4180, as Excel, pandas and Python's csv write), while "
                        "Spark's CSV reader expects a backslash. Set data.options: {escape: '\"'} (or --option "
                        "escape='\"') and preprocess again", f.get("name"), f.get("source"),
                        ", ".join(repr(v) for v in quoted[:3]))
        groups: Dict[str, List[str]] = {}
        for value in vocabulary:
            groups.setdefault(str(value).strip().casefold(), []).append(str(value))
        clashes = [g for g in groups.values() if len(g) > 1]
        if clashes:
            named = "; ".join(" and ".join(repr(v) for v in g) for g in clashes[:5])
            log.warning("feature '%s' (column '%s') has categories that differ only in spaces or letter case: %s%s; "
                        "each is a category of its own, and at scoring another spelling is unseen. If they are the "
                        "same, clean them before the features (trim/lower in data.query or your ETL; for a CSV, the "
                        "reader's ignoreLeadingWhiteSpace / ignoreTrailingWhiteSpace in data.options)", f.get("name"),
                        f.get("source"), named, f" (and {len(clashes) - 5} more)" if len(clashes) > 5 else "")


#: fewer rows than this in the validation or test split make its metrics noise
SMALL_SPLIT = 30


def _warn_small_splits(rows: Mapping[str, int]) -> None:
    """Warn about a validation or test split too small for its metrics to mean anything (a tiny table)."""
    small = {s: n for s, n in rows.items() if s in ("validation", "test") and 0 < n < SMALL_SPLIT}
    if small:
        named = ", ".join(f"{s} {n} row{'s' if n != 1 else ''}" for s, n in small.items())
        log.warning("preprocess: %s: metrics on so few rows (val_loss, test_auc...) are noise, and the registry "
                    "compares models on them. Raise split.validation / split.test, or use more data", named)


def _write_outputs(spark: Any, model: Any, data: Any, staging: str, out: Any) -> Dict[str, Dict[str, Any]]:
    """Transform the rows and write each split straight to ``<staging>/<split>``, saving the model meanwhile.

    ``staging`` is the new generation's folder; nothing is moved afterwards.
    One Spark job per split (the split column is a partition of the staged
    input, so each job reads only its split's rows, and every row is
    transformed once).  A split with no rows gets an empty file that carries
    the schema.  Then one manifest per split.
    """
    from concurrent.futures import ThreadPoolExecutor

    from sparktrain._internal.spark_compat import inheritable_target

    from sparktrain.data import _fs as dfs
    from sparktrain.data.manifest import build_manifest, estimate_row_bytes, parquet_writer, write_manifest
    from sparktrain.features.persist import save_pipeline_model

    scored = model.transform(data)
    width = estimate_row_bytes(scored.schema)
    inherit = inheritable_target(spark)
    manifests = {}
    with ThreadPoolExecutor(1) as pool:
        saved = pool.submit(inherit(save_pipeline_model), model, posixpath.join(staging, PIPELINE_DIR))
        for split in SPLITS:
            target = posixpath.join(staging, split)
            rows = model.transform(data.where(f"{quote(SPLIT_COLUMN)} = '{split}'"))
            parquet_writer(rows, out.row_group_rows, out.compression, row_bytes=width).parquet(target)
            fs, inner = dfs.resolve(target)
            if not dfs.list_data_files(fs, inner):  # no rows and no file: an empty one carries the schema
                empty = spark.createDataFrame([], scored.schema)
                parquet_writer(empty, out.row_group_rows, out.compression, row_bytes=width) \
                    .mode("overwrite").parquet(target)
            manifest = build_manifest(target, extra={"split": split, "features_json": "../" + md.FILE_NAME})
            manifest.setdefault("row_group_rows", out.row_group_rows)
            write_manifest(target, manifest)
            manifests[split] = manifest
            log.info("preprocess: wrote %s: %s rows", split, f"{manifest['num_rows']:,}")
        saved.result()
    return manifests


def format_summary(result: PreprocessResult) -> str:
    """A short human-readable report of a :class:`PreprocessResult`."""
    meta = result.features
    lines = [f"dataset       {result.path}"]
    total = sum(result.row_counts.values()) or 1
    for s in SPLITS:
        n = result.row_counts.get(s, 0)
        files = len(result.manifests.get(s, {}).get("files", []))
        lines.append(f"  {s:<11} {n:>12,} rows ({n / total:6.1%}), {files} file(s)")
    if meta:
        arrays = [c for c in meta["columns"] if str(c.get("dtype", "")).startswith("array<")]
        shown = "".join(f" + {n} {t} column(s)" for t in ("array<float>", "array<int>")
                        for n in [sum(c["dtype"] == t for c in arrays)] if n)
        lines.append(f"features      {len(meta['features'])} -> {len(meta['float_columns'])} float32 + "
                     f"{len(meta['int_columns'])} int32 columns{shown}")
        cats = [f"{c['name']}={c['cardinality']}" for c in meta["columns"] if c["dtype"] == "int32"]
        if cats:
            lines.append(f"  cardinality {', '.join(cats)}")
        label = meta.get("label") or {}
        if label:
            classes = f", {label['num_classes']} classes" if label.get("num_classes") else ""
            lines.append(f"label         {label['column']} ({label.get('source_dtype')}) -> {label.get('dtype')}, "
                         f"{label.get('task')}{classes}")
    lines.append(f"features.json {result.features_json}")
    lines.append(f"pipeline      {result.pipeline_model}")
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items())
    rows_s = total / result.timings["total"] if result.timings.get("total") else 0.0
    lines.append(f"timings       {steps} ({rows_s:,.0f} rows/s)")
    return "\n".join(lines)


def _unique(items: Sequence[Optional[str]]) -> List[str]:
    out: List[str] = []
    for x in items:
        if x and x not in out:
            out.append(x)
    return out


def _fs(path: str):
    from sparktrain.data import _fs as dfs
    return dfs.resolve(path)


def _write_text(path: str, text: str) -> None:
    fs, inner = _fs(path)
    with fs.open_output_stream(inner) as fh:
        fh.write(text.encode("utf-8"))


def _delete_dir(path: str) -> None:
    fs, inner = _fs(path)
    fs.delete_dir(inner)


__all__ = ["SPLITS", "PreprocessResult", "format_summary", "materialize", "split_expression"]
