"""What each job stage records in its MLflow run.

=============  ================================================================
run            holds
=============  ================================================================
job (parent)   params (flattened config, secrets masked), system tags,
               ``config/job.yaml``, ``<stage>_seconds``, ``job_seconds``, the
               test metrics, dataset inputs, tag ``sparktrain.model_version``
profile        ``rows``, ``label_rate``, ``null_<column>``, ``profile.txt``
preprocess     ``rows_<split>``, ``features/features.json``,
               ``manifests/<split>/_manifest.json``
train          per-epoch metrics (step = epoch), ``test_*``, ``baseline_test_*``,
               ``history.json``, ``plots/learning_curve.png``, and for
               classification ``plots/roc_curve.png``,
               ``plots/confusion_matrix.png``; dataset inputs
               (training/validation/testing); the logged model
=============  ================================================================
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import pyarrow.fs as pafs

from sparktrain._internal.spark_compat import error_summary
from sparktrain.data import _fs
from sparktrain.features.load import Embedded
from sparktrain.track.tracker import JobTracker, MlflowCallback, StageRun

log = logging.getLogger(__name__)


def log_profile(run: StageRun, profile: Any) -> None:
    """Rows, label rate and null counts of the profile stage."""
    metrics = {"rows": profile.rows}
    if profile.label_rate is not None:
        metrics["label_rate"] = profile.label_rate
    metrics.update({f"null_{c}": n for c, n in (profile.nulls or {}).items()})
    run.log_metrics(metrics)
    run.log_text(profile.format(), "profile.txt")


def log_preprocess(run: StageRun, dataset_root: str) -> None:
    """``features.json``, the split manifests, the split row counts, and the sources as dataset inputs."""
    from sparktrain.data.commit import resolve
    from sparktrain.track.lineage import log_source_inputs, manifest_files, read_split_manifest

    dataset_root = resolve(dataset_root)  # a committed output: its generation
    features = _fs.join(dataset_root, "features.json")
    if _fs.kind(features) == pafs.FileType.File:  # the dataset may be a URI (s3://...)
        run.log_text(_fs.read_bytes(features).decode("utf-8"), "features/features.json")
    rows = {}
    for split, path in manifest_files(dataset_root).items():
        run.log_artifact(path, f"manifests/{split}")
        rows[f"rows_{split}"] = (read_split_manifest(dataset_root, split) or {}).get("num_rows", 0)
    run.log_metrics(rows)
    run.set_tags({"sparktrain.dataset": _fs.display(dataset_root)})
    log_source_inputs(run.client, [run.run_id], dataset_root)


def raw_input_example(spark: Any, cfg: Any, dataset_root: str, rows: int = 5, embedded: Optional[Embedded] = None):
    """A few raw rows (the model's signature columns) for the model's input example; ``None`` on failure.

    The rows come from ``cfg.data`` at scale 1; ``embedded`` names the datasets
    ``data.source`` may give instead of a path (:func:`sparktrain.features.load.load_input`).
    """
    import json

    from dataclasses import replace

    from sparktrain._internal.spark_compat import try_cast
    from sparktrain.features.load import load_input
    from sparktrain.serve.pyfunc import raw_columns, spark_type

    from sparktrain.data.commit import resolve

    try:
        cols = raw_columns(json.loads(_fs.read_bytes(_fs.join(resolve(dataset_root), "features.json"))))
        df = load_input(spark, replace(cfg.data, scale=1), embedded)
        return df.select([_as_signature_type(df, c, spark_type(t), try_cast) for c, t in cols]).limit(rows).toPandas()
    except Exception as exc:  # the example is a convenience: never fail the job on it
        log.warning("the model is logged without an input example: its raw rows could not be read as its "
                    "signature's types (%s)", error_summary(exc, 300, typed=True))
        return None


def _as_signature_type(df: Any, column: str, trained: str, try_cast: Any) -> Any:
    """``column`` as the signature's type: a Spark ML vector through ``vector_to_array`` (no cast takes a
    vector, and Spark logs the refused one as an ERROR with its stack), anything else ``try_cast``."""
    from pyspark.ml.linalg import VectorUDT

    if column in df.columns and isinstance(df.schema[column].dataType, VectorUDT):
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F

        from sparktrain.features._sql import quote

        return vector_to_array(F.col(quote(column)), "float64").cast(trained).alias(column)
    return try_cast(column, trained).alias(column)


def log_training(tracker: JobTracker, run: StageRun, spark: Any, cfg: Any, result: Any, dataset_root: str,
                 callback: Optional[MlflowCallback] = None, embedded: Optional[Embedded] = None):
    """Everything the train stage records; returns the :class:`~sparktrain.track.registry.RegisteredVersion`.

    Parameters
    ----------
    result : TrainResult
        From :func:`sparktrain.job.train_stage` (:class:`sparktrain.train.result.TrainResult`).
    callback : MlflowCallback, optional
        The live callback; epochs it missed (a resumed run) are logged from the history.
    embedded : mapping, optional
        The datasets ``data.source`` may name, for the input example (:func:`raw_input_example`).
    """
    from sparktrain.track import plots
    from sparktrain.track.lineage import log_dataset_inputs
    from sparktrain.track.registry import log_model_and_register

    model = result.model
    (callback or run.callback()).log_missing(result.history)
    run.log_metrics({**result.test, **{f"baseline_{k}": v for k, v in result.baseline.items()},
                     "train_seconds": result.seconds})
    run.log_dict(result.history, "history.json")
    run.set_tags({"sparktrain.train.run_id": model.run_id, "sparktrain.task": model.inputs.task})
    title = f"{cfg.name}: {model.framework}, {len(result.history)} epochs"
    run.log_figure(plots.learning_curve_figure(result.history, f"Learning curve, {title}"),
                   "plots/learning_curve.png")
    from sparktrain.data.commit import resolve
    from sparktrain.data.manifest import committed_files

    test_path = _fs.join(dataset_root, "test")
    if _fs.kind(resolve(test_path)) == pafs.FileType.Directory:  # a committed output: its generation's test split
        summary = plots.test_score_summary(model, spark.read.parquet(*committed_files(test_path)))
        if summary is not None:
            if summary.task == "binary":
                run.log_figure(plots.roc_figure(summary, f"ROC curve, test split ({cfg.name})"),
                               "plots/roc_curve.png")
            run.log_figure(plots.confusion_figure(summary, "Confusion matrix, test split", model.getLabelCol()),
                           "plots/confusion_matrix.png")
    targets: List[str] = [run.run_id] + ([tracker.parent.run_id] if tracker.parent else [])
    log_dataset_inputs(tracker.client, targets, dataset_root, name=cfg.name)
    if tracker.parent is not None:
        tracker.parent.log_metrics(result.test)
    example = raw_input_example(spark, cfg, dataset_root, embedded=embedded)
    metrics = dict(result.test)
    if result.history and "val_loss" in result.history[-1]:
        metrics.setdefault("val_loss", result.history[-1]["val_loss"])
    registered = log_model_and_register(model, dataset_root, cfg, metrics, run_id=run.run_id,
                                        input_example=example, client=tracker.client)
    tags: Dict[str, Any] = {"sparktrain.model_uri": registered.model_uri}
    if registered.version is not None:
        tags.update({"sparktrain.model_name": registered.name, "sparktrain.model_version": registered.version})
    run.set_tags(tags)
    if tracker.parent is not None:
        tracker.parent.set_tags(tags)
    return registered
