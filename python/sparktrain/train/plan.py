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
from typing import Any, Dict, List, Optional, Tuple

from sparktrain.errors import MissingColumnError, RunMismatchError, SchemaError
from sparktrain.train._executor.spec import InputSpec, WorkerSpec

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
FINGERPRINT_VERSION = 1
_PARAMS_IN_FINGERPRINT = ("framework", "batch_size", "learning_rate", "seed", "shuffle_buffer")


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


def new_run_id() -> str:
    """A fresh run id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def run_uri(store: str, run_id: str, *parts: str) -> str:
    """``<store>/<run_id>/<parts...>`` for a local path or a URI store."""
    return "/".join([store.rstrip("/"), run_id, *parts])


def read_run(store: str, run_id: str) -> Optional[Dict[str, Any]]:
    """The run's ``run.json``, or None when the run has none."""
    from sparktrain.train._executor.checkpoint import Store

    st = Store(store)
    rel = f"{run_id}/{RUN_FILE}"
    return json.loads(st.read_bytes(rel)) if st.exists(rel) else None


def run_exists(store: str, run_id: str) -> bool:
    """Whether anything of ``run_id`` is in the store."""
    from sparktrain.train._executor.checkpoint import Store
    return Store(store).exists(run_id)


def record_run(plan: TrainingPlan) -> None:
    """Write ``run.json`` for a new run (the store's marker that sparktrain owns the folder)."""
    from sparktrain.train._executor.checkpoint import Store

    if plan.resume:
        return
    body = {"run_id": plan.run_id, "created_at": time.time(), "fingerprint": plan.fingerprint,
            "dataset": plan.dataset, "framework": plan.spec.framework}
    Store(plan.spec.store).write_bytes(f"{plan.run_id}/{RUN_FILE}", json.dumps(body, indent=1, default=str).encode())


def discard(store: str, run_id: str) -> None:
    """Remove what a new run wrote before it was recorded (its materialized DataFrame); never a recorded run."""
    from sparktrain.data.manifest import _delete_quietly
    from sparktrain.train._executor.checkpoint import Store

    st = Store(store)
    if st.exists(run_id) and not st.exists(f"{run_id}/{RUN_FILE}"):
        _delete_quietly(st.fs, st.path(run_id, "data"))
        try:
            if not st.listdir(run_id):
                st.fs.delete_dir(st.path(run_id))
        except OSError:
            pass


def existing_run(store: str, run_id: str, explicit: bool) -> Optional[Dict[str, Any]]:
    """The ``run.json`` of ``run_id`` when the store holds that run, else None.

    Raises :class:`RunMismatchError` when the run's folder exists but cannot be
    resumed: it has no ``run.json`` (not a sparktrain run, or one from before
    fingerprints), or the id was generated (an id collision is never reused).
    """
    if not run_exists(store, run_id):
        return None
    stored = read_run(store, run_id)
    if stored is None:
        raise RunMismatchError(run_id, [f"the store's folder {run_uri(store, run_id)} has no {RUN_FILE}, so "
                                        "sparktrain cannot tell what it was trained on"])
    if not explicit:
        raise RunMismatchError(run_id, ["a generated run id collided with an existing run"])
    return stored


def check_same(run_id: str, stored: Dict[str, Any], fingerprint: Dict[str, Any]) -> None:
    """Raise :class:`RunMismatchError` naming every difference between a run's fingerprint and ``fingerprint``."""
    changes = diff(stored.get("fingerprint", {}), fingerprint)
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
    params = {k: getattr(spec, k) for k in _PARAMS_IN_FINGERPRINT}
    params.update(spec.model.to_dict())
    params.update({f"{k}_factory": v for k, v in factories.items()})
    return {"version": FINGERPRINT_VERSION, "data": data, "label": inputs.label, "task": inputs.task,
            "inputs": {"numeric": list(inputs.numeric), "categorical": {c: n for c, n in inputs.categorical}},
            "params": params}


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

_SUPPORTED_LABEL = ("boolean", "tinyint", "smallint", "int", "bigint", "float", "double")


def check_label(df: Any, label: str) -> str:
    """The label's Spark type name; raise before any Spark job when it is missing or cannot be learned."""
    from pyspark.sql import types as T

    if label not in df.columns:
        raise MissingColumnError(label, df.columns, where="the DataFrame passed to fit() (labelCol)")
    dtype = df.schema[label].dataType
    name = dtype.simpleString()
    if isinstance(dtype, (T.StructType, T.MapType, T.ArrayType, T.BinaryType)) or \
            not (name in _SUPPORTED_LABEL or isinstance(dtype, T.DecimalType)):
        raise SchemaError(
            f"label column '{label}' has type {name}; the model learns a boolean, integer (classes) or "
            f"floating-point (regression) label. Fix: index a string label first "
            f"(pyspark.ml.feature.StringIndexer(inputCol='{label}', outputCol='{label}_index') and "
            f"labelCol='{label}_index'), or preprocess with a features: spec (sparktrain preprocess), which "
            f"indexes string labels; a nested label (struct, map, array) cannot be learned")
    return name


def dataframe_fingerprint(df: Any, label: str) -> Dict[str, Any]:
    """Content hash of a DataFrame (order-independent), in one aggregation job.

    Also counts null labels (dropped with a log line) and non-finite float
    labels (refused, naming the count and the fix).
    """
    from pyspark.sql import functions as F

    y = F.col(f"`{label}`")
    is_float = df.schema[label].dataType.simpleString() in ("float", "double")
    aggs = [F.count(F.lit(1)).alias("rows"),
            F.sum(F.xxhash64(*[F.col(f"`{c}`") for c in df.columns]).cast("decimal(38,0)")).alias("hash"),
            F.sum(y.isNull().cast("long")).alias("null_labels")]
    if is_float:
        aggs.append(F.sum((F.isnan(y) | y.isin(float("inf"), float("-inf"))).cast("long")).alias("bad_labels"))
        aggs.append(F.sum((~y.isin(0.0, 1.0)).cast("long")).alias("not_01"))
    row = df.agg(*aggs).first().asDict()
    rows, nulls = int(row["rows"]), int(row["null_labels"] or 0)
    if int(row.get("bad_labels") or 0):
        raise SchemaError(f"label column '{label}' holds {int(row['bad_labels'])} NaN or infinite value(s) "
                          f"(of {rows:,} rows); a regression label must be finite. Fix: filter them out "
                          f"(df.where(~isnan('{label}'))) or impute them before fit()")
    if rows - nulls <= 0:
        raise SchemaError(f"the DataFrame passed to fit() has no rows with a non-null label '{label}' "
                          f"({rows:,} rows, {nulls:,} null labels); fit needs labelled rows")
    out = {"rows": rows, "null_labels": nulls, "hash": str(row["hash"]), "schema": df.schema.simpleString()}
    if is_float:
        out["label_is_01"] = not int(row["not_01"] or 0)
    return out


def float_label_is_01(spark: Any, train_path: str, label: str) -> bool:
    """Whether a floating-point label holds only 0.0 and 1.0 (Spark ML's binary labels): one column scan."""
    from pyspark.sql import functions as F

    y = F.col(f"`{label}`")
    row = spark.read.parquet(train_path).agg(F.sum((~y.isin(0.0, 1.0)).cast("long")).alias("n")).first()
    return not int(row["n"] or 0)


def materialize_dataframe(df: Any, root: str, label: str, validation_fraction: float,
                          null_labels: int) -> Tuple[str, Optional[str]]:
    """Write ``df`` (labelled rows) as ``<root>/train`` and ``<root>/validation`` through the store's filesystem.

    The split is a hash of every column, so it is deterministic for the same
    rows; identical rows land in the same split.
    """
    from pyspark.sql import functions as F

    from sparktrain.data import _fs
    from sparktrain.data.manifest import atomic_dir, write_parquet

    if null_labels:
        log.warning("fit(): %d row(s) with a null label '%s' left out of training", null_labels, label)
        df = df.where(F.col(f"`{label}`").isNotNull())
    bucket = F.abs(F.xxhash64(*[F.col(f"`{c}`") for c in df.columns])) % 10_000
    cut = int(validation_fraction * 10_000)
    with atomic_dir(root, overwrite=False) as staging:
        write_parquet(df.where(bucket >= cut), _fs.join(staging, "train"))
        if validation_fraction > 0:
            write_parquet(df.where(bucket < cut), _fs.join(staging, "validation"))
    val = _fs.join(root, "validation")
    return _fs.join(root, "train"), (val if validation_fraction > 0 else None)
