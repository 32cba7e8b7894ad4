"""The driver-side planning step: (params, dataset) -> :class:`TrainingPlan`.

Every way of training goes through it: :meth:`_DistributedEstimator.fit`,
CrossValidator (through ``fit``), and the tuning trials of :mod:`sparktrain.tune`.

Run ids and resume
------------------
Each ``fit`` is a new run with a generated id, kept on the returned model
(``model.getRunId()``), never on the estimator.  Only a ``runId`` the user
sets resumes, and only the run it names was started on the same data and
params: the run's folder in the store holds ``run.json`` with a
*fingerprint*: the dataset (manifest digests, or the content hash of a
DataFrame), the label and inputs, and the params that change the model.  A
resume whose fingerprint differs is refused with :class:`RunMismatchError`,
naming each difference.  ``epochs`` (continue training longer), ``numWorkers``
and the store are not part of it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sparktrain._internal.secrets import mask_strings
from sparktrain._internal.spark_compat import error_summary
from sparktrain.data.run_store import RUN_FILE, RunStore
from sparktrain.errors import ConfigError, DataError, MissingColumnError, RunMismatchError
from sparktrain.features._sql import quote
from sparktrain.features.label import LabelDecision
from sparktrain.train._executor.spec import InputSpec, WorkerSpec

log = logging.getLogger(__name__)

FINGERPRINT_VERSION = 1
_OPTIM_IN_FINGERPRINT = ("batch_size", "accumulate_steps", "learning_rate", "precision", "seed", "shuffle_buffer")


@dataclass(frozen=True)
class TrainingPlan:
    """What one ``fit`` will do, resolved on the driver before any barrier stage.

    Attributes
    ----------
    run_id : str
        The run's id (generated, or the estimator's ``runId``).
    resume : bool
        True when the run already exists in the store and continues.
    dataset : str
        Root of the materialized dataset (a DataFrame input is written under the run's folder).
    train_path, val_path : str, str or None
        The splits the workers read.
    inputs : InputSpec
        The model's resolved inputs, label and task.
    spec : WorkerSpec
        What each barrier task receives.
    fingerprint : dict
        What defines the run (see the module docstring).
    features : dict or None
        The dataset's ``features.json``, when it has one.
    unused : tuple of str
        Columns of a DataFrame input that are not inputs because the inputs were named
        (:class:`sparktrain.train.frame.FrameInputs`), for the log.
    """

    run_id: str
    resume: bool
    dataset: str
    train_path: str
    val_path: Optional[str]
    inputs: InputSpec
    spec: WorkerSpec = field(repr=False)
    fingerprint: Dict[str, Any] = field(repr=False)
    features: Optional[Dict[str, Any]] = field(default=None, repr=False)
    unused: Tuple[str, ...] = ()


def new_run_id() -> str:
    """A fresh run id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def run_uri(store: str, run_id: str, *parts: str) -> str:
    """``<store>/<run_id>/<parts...>`` for a local path or a URI store (:meth:`RunStore.uri`)."""
    return RunStore(store, run_id).uri(*parts)


def read_run(store: str, run_id: str) -> Optional[Dict[str, Any]]:
    """The run's ``run.json``, or None when the run has none."""
    return RunStore(store, run_id).read_run()


def run_exists(store: str, run_id: str) -> bool:
    """Whether anything of ``run_id`` is in the store."""
    return RunStore(store, run_id).exists()


def record_run(plan: TrainingPlan) -> None:
    """Write ``run.json`` for a new run (the store's marker that sparktrain owns the folder)."""
    if plan.resume:
        return
    _write_run(plan)


def _write_run(plan: TrainingPlan) -> None:
    body = {"run_id": plan.run_id, "created_at": time.time(), "fingerprint": plan.fingerprint,
            "dataset": plan.dataset, "framework": plan.spec.framework}
    RunStore(plan.spec.store, plan.run_id).write_run(mask_strings(body))  # a dataset URI's password stays out


def ensure_recorded(plan: TrainingPlan) -> bool:
    """After a fit: write ``run.json`` again when it vanished during the fit (the run's folder deleted or cleaned
    by someone else), so the run stays resumable from the checkpoints written since; True when it had to."""
    run = RunStore(plan.spec.store, plan.run_id)
    if run.read_run() is not None:
        return False
    _write_run(plan)
    return True


def discard(store: str, run_id: str) -> None:
    """Remove what a new run wrote before it was recorded (its materialized DataFrame); never a recorded run."""
    RunStore(store, run_id).discard_unrecorded()


def existing_run(store: str, run_id: str, explicit: bool) -> Optional[Dict[str, Any]]:
    """The ``run.json`` of ``run_id`` when the store holds that run, else None.

    Raises :class:`RunMismatchError` when the run's folder exists but cannot be
    resumed: it has no ``run.json`` (not a sparktrain run, or one from before
    fingerprints), or the id was generated (an id collision is never reused).
    """
    run = RunStore(store, run_id)
    if not run.exists():
        return None
    stored = run.read_run()
    if stored is None:
        raise RunMismatchError(run_id, [f"the store's folder {run.uri()} has no {RUN_FILE}, so "
                                        "sparktrain cannot tell what it was trained on"])
    if not explicit:
        raise RunMismatchError(run_id, ["a generated run id collided with an existing run"])
    return stored


def check_same(run_id: str, stored: Dict[str, Any], fingerprint: Dict[str, Any]) -> None:
    """Raise :class:`RunMismatchError` naming every difference between a run's fingerprint and ``fingerprint``."""
    changes = diff(stored.get("fingerprint", {}), mask_strings(fingerprint))  # run.json holds it masked
    if changes:
        raise RunMismatchError(run_id, changes)


def diff(old: Dict[str, Any], new: Dict[str, Any], prefix: str = "") -> List[str]:
    """``['key: old -> new', ...]`` for every leaf that differs."""
    out: List[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff(a, b, name + ".")
        elif _norm(a) != _norm(b):
            out.append(f"{name}: {_short(a)} -> {_short(b)}")
    return out


def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def fingerprint(data: Dict[str, Any], inputs: InputSpec, spec: WorkerSpec,
                factories: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """What defines a run: its data, label and inputs, and the params that change the model."""
    params: Dict[str, Any] = {"framework": spec.framework}
    params.update({k: getattr(spec.optim, k) for k in _OPTIM_IN_FINGERPRINT})
    params.update(spec.model.to_dict())
    params.update({f"{k}_factory": v for k, v in factories.items()})
    return {"version": FINGERPRINT_VERSION, "data": data, "label": inputs.label, "task": inputs.task,
            "inputs": _inputs_fingerprint(inputs), "params": params}


def _inputs_fingerprint(inputs: InputSpec) -> Dict[str, Any]:
    out: Dict[str, Any] = {"numeric": list(inputs.numeric), "categorical": {c: n for c, n in inputs.categorical}}
    if inputs.vectors:  # absent without float blocks, so older runs' fingerprints still match
        out["vectors"] = {c: w for c, w in inputs.vectors}
    return out


def path_fingerprint(train_path: str, val_path: Optional[str]) -> Dict[str, Any]:
    """Digest of each split from its ``_manifest.json`` (or its footers when it has none)."""
    from sparktrain.data.manifest import build_manifest, read_manifest

    out: Dict[str, Any] = {}
    for name, path in (("train", train_path), ("validation", val_path)):
        if path is None:
            continue
        manifest = read_manifest(path)
        if manifest is None or not manifest.get("digest"):
            manifest = build_manifest(path, compute_digest=False)
        out[name] = {"digest": manifest["digest"], "rows": manifest.get("num_rows")}
    return out


# ---------------------------------------------------------------------------------------------------------
# DataFrame input: checked, fingerprinted by content, materialized under the run's folder.

def check_label(df: Any, label: str) -> str:
    """The label's Spark type name; raise before any Spark job when it is missing or no model learns it.

    The type rule is preprocess's (:func:`sparktrain.features.label.label_kind`):
    boolean, integer, string (and date...) classes, float regression; a
    nested or binary label raises :class:`SchemaError`.
    """
    from sparktrain.features.label import label_kind

    if not isinstance(label, str) or not label:
        raise ConfigError("labelCol", label, "name the DataFrame's label column, e.g. labelCol='label' "
                                             f"(columns: {', '.join(df.columns[:20])})")
    if label not in df.columns:
        raise MissingColumnError(label, df.columns, where="the DataFrame passed to fit() (labelCol)")
    name = df.schema[label].dataType.simpleString()
    label_kind(label, name)
    return name


def dataframe_label(df: Any, label: str, task: str = "auto") -> LabelDecision:
    """The label policy of preprocess applied to a DataFrame passed to ``fit()``: one aggregation job.

    :func:`sparktrain.features.label.decide_label` counts the classes (or the
    moments of a regression label) over all rows, refuses what cannot be
    trained on with the same errors as preprocess, and decides the encoding
    (a string label is indexed; its classes become ``InputSpec.classes``).
    Rows with a null label are dropped, as preprocess does by default.
    Under ``task`` auto, a label that Spark ML metadata declares nominal (a
    StringIndexer output: :func:`nominal_classes`) is classes, as every Spark
    ML classifier reads it: binary for 2, multiclass for more.
    """
    from sparktrain.features.label import decide_label

    dtype = check_label(df, label)
    chosen = None if task == "auto" else task
    declared = nominal_classes(df, label) if chosen is None else None
    if declared is not None:
        chosen = "binary" if declared == 2 else "multiclass"
        log.info("label '%s' is nominal in its Spark ML metadata (%d values, e.g. from StringIndexer): task %s",
                 label, declared, chosen)
    return decide_label(df, label, dtype, task=chosen, drop_null_labels=True)


def nominal_classes(df: Any, label: str) -> Optional[int]:
    """How many classes the label column's Spark ML attribute (``ml_attr`` metadata) declares, else None.

    StringIndexer writes a ``nominal`` attribute (its ``vals`` or
    ``num_vals`` count the classes), Binarizer a ``binary`` one.
    """
    field = df.schema[label]
    attr = (getattr(field, "metadata", None) or {}).get("ml_attr") or {}
    if attr.get("type") == "binary":
        return 2
    if attr.get("type") != "nominal":
        return None
    # StringIndexer(handleInvalid='keep') adds an index for unseen values; no training row has it
    count = len([v for v in attr["vals"] if v != "__unknown"]) if attr.get("vals") else attr.get("num_vals")
    return int(count) if count else None


def label_meta(decision: LabelDecision) -> Dict[str, Any]:
    """The label's ``features.json``-style entry, for :func:`~sparktrain.train.inputs.infer_inputs`.

    A regression decision leaves its ``task`` out, so an explicit ``task``
    Param or Spark ML's 0.0/1.0 convention (two classes) still decide.
    """
    entry = dict(decision.encoding.entry)
    if entry.get("task") == "regression":
        entry.pop("task")
    return entry


def dataframe_fingerprint(df: Any, label: str, blocks: Sequence[str] = (), numeric: Sequence[str] = (),
                          categorical: Sequence[str] = (), handle_invalid: str = "error") -> Dict[str, Any]:
    """Content hash of a DataFrame (order-independent), in one aggregation job.

    Also counts null labels, and whether a float label holds only 0.0 and 1.0
    (``label_is_01``).  Call it after :func:`dataframe_label`, which refuses a
    label that cannot be trained on.  The same job checks the float blocks
    ``blocks`` (:func:`sparktrain.train.frame.check_blocks`) and the values of
    the ``numeric`` and ``categorical`` inputs
    (:func:`sparktrain.train.frame.check_values`), which raise before anything
    is written; the widths come back under ``widths``, and with
    ``handle_invalid`` ``skip`` or ``keep`` the labelled rows with an invalid
    input under ``invalid_rows`` (per column under ``invalid``).  Inputs far
    from unit scale come back under ``large_inputs`` (their root mean square;
    not content: take it out before fingerprinting).
    """
    from pyspark.sql import functions as F

    from sparktrain.train.frame import (block_aggregates, check_blocks, check_values, large_inputs,
                                        magnitude_aggregates, value_aggregates)

    y = F.col(quote(label))
    is_float = df.schema[label].dataType.simpleString() in ("float", "double")
    aggs = [F.count(F.lit(1)).alias("rows"),
            F.sum(F.xxhash64(*[F.col(quote(c)) for c in df.columns]).cast("decimal(38,0)")).alias("hash"),
            F.sum(y.isNull().cast("long")).alias("null_labels")]
    if is_float:
        aggs.append(F.sum((~y.isin(0.0, 1.0)).cast("long")).alias("not_01"))
    row = df.agg(*aggs, *block_aggregates(blocks), *value_aggregates(numeric, categorical, blocks, label),
                 *magnitude_aggregates(numeric, blocks)).first().asDict()
    out: Dict[str, Any] = {"rows": int(row["rows"]), "null_labels": int(row["null_labels"] or 0),
                           "hash": str(row["hash"]), "schema": df.schema.simpleString()}
    if is_float:
        out["label_is_01"] = not int(row["not_01"] or 0)
    if blocks:
        out["widths"] = check_blocks(row, blocks, out["rows"], handle_invalid)
    invalid = check_values(row, numeric, categorical, out["rows"], handle_invalid)
    if handle_invalid != "error":
        out["invalid_rows"] = int(row.get("__invalid_rows") or 0)
        out["invalid"] = invalid
    large = large_inputs(row, numeric, blocks)
    if large:  # not content: the caller takes it out before the fingerprint
        out["large_inputs"] = large
    usable = out["rows"] - out["null_labels"] - out.get("invalid_rows", 0)
    if usable <= 0:
        worst = sorted(out.get("invalid", {}).items(), key=lambda kv: -kv[1])[:5]
        named = (" The inputs with the most: " + ", ".join(f"'{c}' ({n:,} of {out['rows']:,} rows)" for c, n in worst)
                 + "." if worst else "")
        empty = [c for c, n in worst if n >= out["rows"]]  # no value in any row: nothing to learn from them
        leave = f", or leave out the input(s) without a value in any row (excludeCols={empty!r})" if empty else ""
        raise DataError(f"no row of the DataFrame passed to fit() can be trained on: {out['rows']:,} row(s), "
                        f"{out['null_labels']:,} with a null label '{label}', {out.get('invalid_rows', 0):,} with "
                        f"a null, NaN or infinite input (handleInvalid='{handle_invalid}').{named} Fix: pass "
                        f"labelled rows with values in the input columns{leave}")
    return out


def split_paths(root: str) -> Tuple[str, Optional[str], Optional[dict]]:
    """``(train, validation or None, features.json or None)`` of a materialized dataset or a single split.

    A committed output (:mod:`sparktrain.data.commit`) gives the paths inside its committed generation.
    """
    from sparktrain.data.commit import resolve
    from sparktrain.train.inputs import exists, read_features_json

    root = resolve(root)
    train = f"{root}/train"
    if not exists(train):
        train = root  # a single split given directly
    val = f"{root}/validation"
    meta = read_features_json(root)
    if meta is not None:
        meta.setdefault("exclude", [k for k in (meta.get("key"),) if k])
    return train, (val if exists(val) and train != root else None), meta


def float_01_range(stats: Dict[str, Dict[str, Any]], label: str) -> bool:
    """A floating-point label whose footer statistics say min 0 and max 1 (maybe binary, maybe not)."""
    import pyarrow as pa

    st = stats.get(label)
    return st is not None and pa.types.is_floating(st["type"]) and st["min"] == 0 and st["max"] == 1


def float_label_is_01(spark: Any, train_path: str, label: str) -> bool:
    """Whether a floating-point label holds only 0.0 and 1.0 (Spark ML's binary labels): one column scan.

    Spark scans it; a URI Spark has no connector for (``s3://`` without
    hadoop-aws, say) is scanned here through pyarrow instead, one batch of
    that column at a time.
    """
    from pyspark.sql import functions as F

    from sparktrain._internal.spark_compat import check_spark_path
    from sparktrain.errors import ConfigError

    try:  # asks the JVM for the scheme's filesystem: no Spark read, whose failure Spark logs with a Java stack
        check_spark_path(spark, train_path, "dataset", "the dataset")
    except ConfigError as exc:
        log.info("Spark has no filesystem for %s (%s): scanning label '%s' through pyarrow", train_path,
                 error_summary(exc, 120), label)
        return _label_is_01_arrow(train_path, label)
    y = F.col(f"`{label}`")
    try:
        row = spark.read.parquet(train_path).agg(F.sum((~y.isin(0.0, 1.0)).cast("long")).alias("n")).first()
    except Exception as exc:  # noqa: BLE001 - py4j / analysis errors: no Hadoop filesystem for the scheme
        if "://" not in train_path or train_path.startswith("file:"):
            raise
        log.info("Spark cannot read %s (%s): scanning label '%s' through pyarrow", train_path,
                 type(exc).__name__, label)
        return _label_is_01_arrow(train_path, label)
    return not int(row["n"] or 0)


def _label_is_01_arrow(train_path: str, label: str) -> bool:
    import numpy as np
    import pyarrow.dataset as pads

    from sparktrain.data._fs import list_data_files, resolve

    fs, inner = resolve(train_path)
    files = [f.path for f in list_data_files(fs, inner)]
    for batch in pads.dataset(files, filesystem=fs, format="parquet").to_batches(columns=[label]):
        values = batch.column(0).to_numpy(zero_copy_only=False)
        if not np.isin(values[~np.isnan(values)], (0.0, 1.0)).all():
            return False
    return True


def materialize_dataframe(df: Any, root: str, label: str, validation_fraction: float, null_labels: int,
                          seed: int, labels: Optional[List[str]] = None, invalid: Any = None,
                          invalid_rows: int = 0, invalid_cols: Optional[Dict[str, int]] = None
                          ) -> Tuple[str, Optional[str]]:
    """Write ``df`` (labelled rows) as ``<root>/train`` and ``<root>/validation`` through the store's filesystem.

    Parameters
    ----------
    df : DataFrame
        The input passed to ``fit()``.
    root : str
        The run's ``data/`` folder.
    label : str
        The label column.
    validation_fraction : float
        Share of rows in ``validation`` (none when 0).
    null_labels : int
        Rows with a null label (dropped, with a warning).
    seed : int
        The split's seed (the estimator's ``seed``).
    labels : list of str, optional
        The encoding's ``labels`` (:class:`~sparktrain.features.label.LabelEncoding`): the label is
        indexed (or cast) as preprocess does; None keeps it as it is.
    invalid : Column, optional
        True for a row with a null, NaN or infinite input
        (:func:`sparktrain.train.frame.invalid_row`); those rows are left out
        (``handleInvalid`` ``skip`` or ``keep``), ``invalid_rows`` of them
        (per column: ``invalid_cols``), with a warning.

    Raises :class:`DataError` when the train or validation split comes out
    empty (too few rows for ``validation_fraction``); nothing is committed then.

    The split is :func:`sparktrain.features.split.split_case` over every
    column, the expression preprocess uses: deterministic for the same rows
    and seed, different for another seed; identical rows land in the same split.
    """
    from pyspark.sql import functions as F

    from sparktrain.data import _fs
    from sparktrain.data.commit import Generation
    from sparktrain.data.manifest import write_parquet
    from sparktrain.features._sql import INTERNAL_PREFIX
    from sparktrain.features.label_stage import model_for
    from sparktrain.features.split import split_case

    if null_labels:
        log.warning("fit(): %d row(s) with a null label '%s' left out of training", null_labels, label)
        df = df.where(F.col(quote(label)).isNotNull())
    if invalid is not None and invalid_rows:
        named = ", ".join(f"{c} ({n:,})" for c, n in (invalid_cols or {}).items())
        log.warning("fit(): %d row(s) with a null, NaN or infinite input left out of training (handleInvalid)%s",
                    invalid_rows, f": {named}" if named else "")
        df = df.where(~invalid)
    split_col = f"{INTERNAL_PREFIX}split"
    expr = split_case(seed, df.columns, [("train", 1.0 - validation_fraction), ("validation", validation_fraction)])
    tagged = df.withColumn(split_col, F.expr(expr))
    if labels is not None:
        tagged = model_for(labels, label).transform(tagged)
    with Generation(root, "the run's data folder", overwrite=False) as gen:  # no directory is renamed
        written = {"train": write_parquet(tagged.where(F.col(split_col) == "train").drop(split_col),
                                          _fs.join(gen.uri, "train"))}
        if validation_fraction > 0:
            written["validation"] = write_parquet(tagged.where(F.col(split_col) == "validation").drop(split_col),
                                                  _fs.join(gen.uri, "validation"))
        counts = {k: int(m.get("num_rows", 0)) for k, m in written.items()}
        empty = [k for k, n in counts.items() if n == 0]
        if empty:  # found here, not in the workers after the launch; the generation is never committed
            raise DataError(f"the {' and '.join(empty)} split of the DataFrame passed to fit() came out empty "
                            f"({counts.get('train', 0):,} train / {counts.get('validation', 0):,} validation "
                            f"rows with validationFraction={validation_fraction}). Fix: pass more rows, or set "
                            f"validationFraction=0 to train without a validation split")
        gen.commit({"kind": "fit-dataframe"})
    val = _fs.join(gen.uri, "validation")
    return _fs.join(gen.uri, "train"), (val if validation_fraction > 0 else None)
