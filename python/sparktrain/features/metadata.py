"""``features.json``: everything a trainer or a non-Spark scorer needs about the features.

It is built from the fitted ``PipelineModel`` and the spec, and it is enough
to re-apply every transform without Spark (:mod:`sparktrain.serve.local`).
Layout (``format: sparktrain.features/1``)::

    {
      "format": "sparktrain.features/1",
      "key": "id",                                   # data.key; null when the split hashed every column
      "label": {"column": "label", "source_dtype": "string",  # the raw Spark type
                "dtype": "int32",                    # written as: int32 (classes) or float32
                "task": "multiclass",                # binary | multiclass | regression (train.task wins)
                "inferred_task": "multiclass",       # what the data alone says
                "num_classes": 3,                    # null for regression
                "vocabulary": ["high", "low", "mid"],  # class of index i; null: values kept as they are
                "order": "text",                     # vocabulary sorted by "value" (numbers) or "text"
                "class_counts": [10, 52, 38],        # rows per class index, all splits (null: regression)
                "stats": {"mean": .., "std": .., "min": .., "max": ..}},  # regression only
      "task": "multiclass",                          # == label.task (kept for older readers)
      "timezone": "UTC",
      "float_columns": ["price", ...],              # float32 outputs, in Parquet order
      "int_columns": ["city", ...],                 # int32 outputs, in Parquet order
      "columns": [{"name": "city", "dtype": "int32", "feature": "city", "role": "index",
                   "cardinality": 17}, ...],         # cardinality: embedding rows (int32 only)
      "features": [
        {"name": "price", "type": "numeric", "source": "price", "on_invalid": "impute",
         "impute": {"strategy": "median", "value": -0.69},   # value in the clipped/log1p space;
                                                             # constant: in raw units, applied before clip
         "clip": [-60.0, 600.0], "log1p": true,
         "scale": {"method": "standard", "offset": 1.2, "scale": 2.3, "mean": 1.2, "std": 2.3},
         "buckets": {"column": "price_bucket", "splits": [-inf, ..., inf], "num_buckets": 4},
         "outputs": ["price"]},
        {"name": "city", "type": "categorical", "source": "city", "encoding": "vocabulary",
         "vocabulary": ["Lima", "Oslo", ...], "vocab_size": 16, "reserved_index": 16, "num_indices": 17,
         "min_frequency": 1, "max_vocab": null, "outputs": ["city"]},
        {"name": "street", "type": "categorical", "encoding": "hash",
         "hash": {"function": "crc32", "buckets": 1024, "null_as": ""}, "num_indices": 1024, ...},
        {"name": "city_x_street", "type": "crossed", "columns": ["city", "street"],
         "hash": {"function": "crc32", "buckets": 64, "null_as": "", "separator": "\\u0001"}, ...},
        {"name": "sold_at", "type": "datetime", "source": "sold_at", "cyclical": true,
         "parts": [{"part": "hour", "column": "sold_at_hour", "period": 24, "null_index": 24,
                    "sin": "sold_at_hour_sin", "cos": "sold_at_hour_cos"}, ...]},
        {"name": "x", "type": "boolean", "source": "x", "outputs": ["x"]},
        {"name": "emb", "type": "vector", "source": "emb", "width": 64, "on_invalid": "impute",
         "scale": {"method": "standard", "mean": [..], "std": [..]}},        # or {"method": "none"}
        {"name": "title", "type": "text", "source": "title", "pattern": "\\W+", "lowercase": true,
         "length": 32, "encoding": "vocabulary", "vocabulary": ["the", ...], "vocab_size": 5000,
         "padding_index": 0, "unknown_index": 1, "num_indices": 5002, "pooling": "mean"},
        {"name": "tags", "type": "set", "source": "tags", "delimiter": "|", "length": 16,
         "encoding": "hash", "hash": {"function": "crc32", "buckets": 256, "offset": 2}, ...}
      ]

Array outputs appear in ``columns`` too: a vector as ``{"dtype": "array<float>",
"width": 64}``, text and set ids as ``{"dtype": "array<int>", "length": 32,
"cardinality": 5002, "pooling": "mean"}``.
    }

A label written from the data as it is (no :mod:`sparktrain.features.label`
entry given to :func:`build_metadata`) gets ``column``, ``source_dtype``,
``dtype`` and ``task`` only.

Non-finite floats (the outer bucket splits) are written as JSON ``-Infinity`` /
``Infinity``, which Python's ``json`` reads back.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional

from sparktrain.errors import DataError
from sparktrain.features.compile import CROSS_SEPARATOR, DATETIME_PERIODS, FeaturePlan
from sparktrain.features.spec import (
    BooleanFeature,
    CategoricalFeature,
    CrossedFeature,
    DatetimeFeature,
    NumericFeature,
    SetFeature,
    TextFeature,
    VectorFeature,
)

FORMAT = "sparktrain.features/1"
FILE_NAME = "features.json"


def fitted_values(model: Any) -> Dict[str, Dict[str, Any]]:
    """Read what each fitted stage learned, keyed by its input column.

    Returns ``{"impute": {col: value}, "splits": {col: [...]}, "labels": {col: [...]},
    "scale": {col: (method, offset, scale)}}``.  Only small per-column
    statistics reach the driver.
    """
    from pyspark.ml.feature import Bucketizer, ImputerModel, StringIndexerModel

    from sparktrain.features.stages import ColumnScalerModel, VocabularyIndexerModel

    from sparktrain.features.array_stages import TokenIndexerModel, VectorEncoderModel

    out: Dict[str, Dict[str, Any]] = {"impute": {}, "splits": {}, "labels": {}, "scale": {}, "vectors": {},
                                      "tokens": {}}
    for stage in model.stages:
        if isinstance(stage, VectorEncoderModel):
            for c, w, mean, sd in zip(stage.getInputCols(), stage.getWidths(), stage.getMeans(), stage.getStds()):
                out["vectors"][c] = {"width": int(w), "mean": list(mean), "std": list(sd)}
            continue
        if isinstance(stage, TokenIndexerModel):
            for c, v, rows in zip(stage.getInputCols(), stage.getVocabularies(), stage.numIds()):
                out["tokens"][c] = {"vocabulary": list(v), "num_indices": int(rows)}
            continue
        if isinstance(stage, ImputerModel):
            row = stage.surrogateDF.first()  # one row: a surrogate per column
            for c in stage.getInputCols():
                out["impute"][c] = float(row[c]) if row is not None else float("nan")
        elif isinstance(stage, Bucketizer):
            for c, splits in zip(stage.getInputCols(), stage.getSplitsArray()):
                out["splits"][c] = [float(s) for s in splits]
        elif isinstance(stage, StringIndexerModel):
            for c, labels in zip(stage.getInputCols(), stage.labelsArray):
                out["labels"][c] = list(labels)
        elif isinstance(stage, VocabularyIndexerModel):
            for c, labels in zip(stage.getInputCols(), stage.getLabelsArray()):
                out["labels"][c] = list(labels)
        elif isinstance(stage, ColumnScalerModel):
            for c, m, o, s in zip(stage.getInputCols(), stage.getMethods(), stage.getOffsets(), stage.getScales()):
                out["scale"][c] = (m, float(o), float(s))
    return out


def build_metadata(plan: FeaturePlan, fitted: Mapping[str, Mapping[str, Any]],
                   schema: Optional[Mapping[str, str]] = None, timezone: str = "UTC",
                   extra: Optional[Mapping[str, Any]] = None,
                   label: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Assemble the ``features.json`` dict.

    Parameters
    ----------
    plan : FeaturePlan
        From :func:`sparktrain.features.compile.plan_features`.
    fitted : mapping
        From :func:`fitted_values`.
    schema : mapping, optional
        Raw column name -> Spark type name (``simpleString``), recorded as ``source_dtype``.
    timezone : str
        The session time zone (string timestamps without an offset are read in it).
    extra : mapping, optional
        More top-level keys (the split, row counts...).
    label : mapping, optional
        The label entry decided from the data (:class:`sparktrain.features.label.LabelEncoding`'s
        ``entry``); without it the entry is read from the label's type alone.
    """
    schema = dict(schema or {})
    features: List[Dict[str, Any]] = []
    cardinality: Dict[str, int] = {}
    width: Dict[str, int] = {}
    pooling: Dict[str, str] = {}
    for spec in plan.specs:
        n = spec.name
        outputs = [o.name for o in plan.outputs_of(n)]
        entry: Dict[str, Any] = {"name": n, "type": spec.type}
        if not isinstance(spec, CrossedFeature):
            entry["source"] = spec.source
            entry["source_dtype"] = schema.get(spec.source)
        if isinstance(spec, NumericFeature):
            prep = plan.internal(n, "prep")
            value_col = plan.internal(n, "imp") if spec.impute in ("mean", "median") else prep
            impute: Dict[str, Any] = {"strategy": spec.impute}
            impute["value"] = (float(spec.impute_value) if spec.impute == "constant"
                               else fitted["impute"][prep])
            entry.update(on_invalid=spec.on_invalid, impute=impute,
                         clip=list(spec.clip) if spec.clip is not None else None, log1p=spec.log1p)
            if spec.scale == "none":
                entry["scale"] = {"method": "none"}
            else:
                method, offset, scale = fitted["scale"][value_col]
                names = ("mean", "std") if method == "standard" else ("min", "range")
                entry["scale"] = {"method": method, "offset": offset, "scale": scale,
                                  names[0]: offset, names[1]: scale}
            if spec.buckets is not None:
                splits = fitted["splits"][value_col]
                entry["buckets"] = {"column": f"{n}_bucket", "requested": spec.buckets, "splits": splits,
                                    "num_buckets": len(splits) - 1}
                # handleInvalid="keep" reserves one more index (NaN); imputed values never use it
                cardinality[f"{n}_bucket"] = len(splits)
        elif isinstance(spec, CategoricalFeature):
            if spec.hash_buckets is not None:
                entry.update(encoding="hash", hash={"function": "crc32", "buckets": spec.hash_buckets,
                                                    "null_as": ""}, num_indices=spec.hash_buckets)
            else:
                vocab = fitted["labels"][plan.internal(n, "str")]
                entry.update(encoding="vocabulary", vocabulary=vocab, vocab_size=len(vocab),
                             reserved_index=len(vocab), num_indices=len(vocab) + 1,
                             min_frequency=spec.min_frequency, max_vocab=spec.max_vocab,
                             vocab_limit=spec.vocab_limit)
            cardinality[n] = entry["num_indices"]
        elif isinstance(spec, CrossedFeature):
            entry.update(columns=list(spec.columns), source_dtypes=[schema.get(c) for c in spec.columns],
                         hash={"function": "crc32", "buckets": spec.hash_buckets, "null_as": "",
                               "separator": CROSS_SEPARATOR}, num_indices=spec.hash_buckets)
            cardinality[n] = spec.hash_buckets
        elif isinstance(spec, DatetimeFeature):
            parts = []
            for part in spec.parts:
                period = DATETIME_PERIODS[part]
                item: Dict[str, Any] = {"part": part, "column": f"{n}_{part}", "period": period,
                                        "null_index": period}
                if spec.cyclical:
                    item.update(sin=f"{n}_{part}_sin", cos=f"{n}_{part}_cos")
                parts.append(item)
                cardinality[f"{n}_{part}"] = period + 1
            entry.update(cyclical=spec.cyclical, parts=parts, format=spec.format)
        elif isinstance(spec, BooleanFeature):
            pass
        elif isinstance(spec, VectorFeature):
            vec = fitted["vectors"][spec.source]
            width[n] = vec["width"]
            entry.update(width=vec["width"], on_invalid=spec.on_invalid,
                         scale=({"method": "standard", "mean": vec["mean"], "std": vec["std"]} if spec.scale
                                else {"method": "none"}))
        elif isinstance(spec, (TextFeature, SetFeature)):
            tok = fitted["tokens"][plan.internal(n, "tok")]
            if isinstance(spec, TextFeature):
                entry.update(pattern=spec.pattern, lowercase=True, length=spec.max_tokens)
            else:
                entry.update(delimiter=spec.delimiter, length=spec.max_items)
            if spec.hash_buckets is not None:
                entry.update(encoding="hash", hash={"function": "crc32", "buckets": spec.hash_buckets, "offset": 2})
            else:
                entry.update(encoding="vocabulary", vocabulary=tok["vocabulary"], vocab_size=len(tok["vocabulary"]),
                             min_frequency=spec.min_frequency, max_vocab=spec.max_vocab, vocab_limit=spec.vocab_limit)
            entry.update(padding_index=0, unknown_index=1, num_indices=tok["num_indices"], pooling=spec.pooling)
            cardinality[n] = tok["num_indices"]
            pooling[n] = spec.pooling
        entry["outputs"] = outputs
        features.append(entry)
    columns = []
    for o in plan.outputs:
        col: Dict[str, Any] = {"name": o.name, "dtype": o.dtype, "feature": o.feature, "role": o.role}
        if o.dtype == "int32":
            col["cardinality"] = cardinality[o.name]
        elif o.dtype == "array<float>":
            col["width"] = width[o.name]
        elif o.dtype == "array<int>":
            col.update(length=o.length, cardinality=cardinality[o.name], pooling=pooling[o.name])
        columns.append(col)
    label_entry: Optional[Dict[str, Any]] = None
    if label is not None:
        label_entry = dict(label)
    elif plan.label:
        src = schema.get(plan.label)
        # a boolean label is written as float32 0/1; the trainer cannot tell that from the Parquet alone
        label_entry = {"column": plan.label, "source_dtype": src, "dtype": _label_dtype(src),
                       "task": {"boolean": "binary", "float": "regression", "double": "regression"}.get(src or "")}
    meta: Dict[str, Any] = {
        "format": FORMAT,
        "key": plan.key,
        "label": label_entry,
        "task": label_entry.get("task") if label_entry else None,
        "timezone": timezone,
        "float_columns": [o.name for o in plan.outputs if o.dtype == "float32"],
        "int_columns": [o.name for o in plan.outputs if o.dtype == "int32"],
        "columns": columns,
        "features": features,
    }
    meta.update(extra or {})
    return meta


def _label_dtype(spark_type: Optional[str]) -> Optional[str]:
    if spark_type is None:
        return None
    if spark_type in ("boolean", "float", "double") or spark_type.startswith("decimal"):
        return "float32"
    if spark_type in ("tinyint", "smallint", "int", "bigint"):
        return "int32"
    return "int32"  # any other label type is indexed (sparktrain.features.label_stage)


def check_vocabularies(meta: Mapping[str, Any]) -> None:
    """Raise :class:`DataError` when a fitted vocabulary is larger than its ``vocab_limit``."""
    for f in meta["features"]:
        if f.get("encoding") == "vocabulary" and f["max_vocab"] is None and f["vocab_size"] > f["vocab_limit"]:
            raise DataError(
                f"column '{f['source']}' (feature '{f['name']}') has {f['vocab_size']} distinct values, over its "
                f"vocab_limit={f['vocab_limit']}. Set max_vocab to keep the most frequent ones, raise min_frequency "
                f"or vocab_limit, or use hash_buckets: N.")


def dumps(meta: Mapping[str, Any]) -> str:
    """JSON text of ``features.json`` (infinite floats as ``Infinity``)."""
    return json.dumps(meta, indent=1, allow_nan=True)


def load(path_or_text: str) -> Dict[str, Any]:
    """Read ``features.json`` from a path (or parse JSON text starting with ``{``)."""
    if path_or_text.lstrip().startswith("{"):
        text = path_or_text
    else:
        with open(path_or_text) as fh:
            text = fh.read()
    meta = json.loads(text)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"not a {FORMAT} file (format={meta.get('format') if isinstance(meta, dict) else None!r}); "
                        f"regenerate it with sparktrain preprocess")
    return meta


__all__ = ["FILE_NAME", "FORMAT", "build_metadata", "check_vocabularies", "dumps", "fitted_values", "load"]
