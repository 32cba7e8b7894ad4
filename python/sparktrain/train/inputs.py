"""Work out a model's inputs from a materialized dataset, without scanning the data.

Float columns become numeric inputs and integer columns categorical indices;
the cardinality of each index comes from ``features.json`` when the dataset was
written by :mod:`sparktrain.features`, else from the Parquet row-group
statistics (``max + 1``), so any Parquet that Spark writes works.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional, Sequence

from sparktrain.errors import DatasetNotFoundError, MissingColumnError, SchemaError
from sparktrain.train._executor.spec import InputSpec

log = logging.getLogger(__name__)

FEATURES_JSON = "features.json"
#: An inferred categorical input with more embedding rows than this is refused as a likely id column.
MAX_INFERRED_CARDINALITY = 1_000_000


def exists(path: str) -> bool:
    """Whether ``path`` (local path or pyarrow filesystem URI) exists."""
    import pyarrow.fs as pafs

    from sparktrain.data import _fs
    fs, inner = _fs.resolve(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def _parquet_files(path: str):
    """``(filesystem, [paths])`` of the Parquet data files under ``path``."""
    from sparktrain.data import _fs
    fs, inner = _fs.resolve(path)
    if not exists(path):
        return fs, []
    return fs, [f.path for f in _fs.list_data_files(fs, inner) if f.path.endswith(".parquet")]


def column_stats(path: str) -> Dict[str, Dict[str, Any]]:
    """``{column: {"type": arrow type, "min": .., "max": ..}}`` from Parquet footers only."""
    import pyarrow.parquet as pq

    fs, files = _parquet_files(path)
    if not files:
        raise DatasetNotFoundError(f"no Parquet files under '{path}'; materialize the dataset first "
                                   "(sparktrain preprocess CONFIG) or pass a DataFrame to fit()")
    stats: Dict[str, Dict[str, Any]] = {}
    for f in files:
        pf = pq.ParquetFile(f, filesystem=fs)
        schema = pf.schema_arrow
        for name in schema.names:
            entry = stats.setdefault(name, {"type": schema.field(name).type, "min": None, "max": None})
            idx = schema.get_field_index(name)
            for g in range(pf.metadata.num_row_groups):
                col = pf.metadata.row_group(g).column(idx)
                st = col.statistics
                if st is None or not st.has_min_max:
                    continue
                entry["min"] = st.min if entry["min"] is None else min(entry["min"], st.min)
                entry["max"] = st.max if entry["max"] is None else max(entry["max"], st.max)
    return stats


def read_features_json(dataset_root: str) -> Optional[Dict[str, Any]]:
    """The dataset's ``features.json`` (local path or URI), or None."""
    from sparktrain.data import _fs
    p = _fs.join(dataset_root, FEATURES_JSON)
    if not exists(p):
        return None
    fs, inner = _fs.resolve(p)
    with fs.open_input_stream(inner) as fh:
        return json.loads(fh.read())


def _cardinalities_from_features(meta: Optional[Dict[str, Any]]) -> Dict[str, int]:
    """Output column -> embedding rows, from features.json (tolerant of its layout)."""
    out: Dict[str, int] = {}
    if not meta:
        return out
    for col in meta.get("columns", []) or []:
        if isinstance(col, dict) and col.get("cardinality") is not None:
            out[col["name"]] = int(col["cardinality"])
    for feat in meta.get("features", []) or []:
        for col in feat.get("outputs", []) or []:
            if isinstance(col, dict) and col.get("cardinality") is not None:
                out[col["name"]] = int(col["cardinality"])
    return out


def infer_inputs(train_path: str, label: str, numeric: Optional[Sequence[str]] = None,
                 categorical: Optional[Sequence[str]] = None, task: str = "auto",
                 exclude: Sequence[str] = (), meta: Optional[Dict[str, Any]] = None,
                 stats: Optional[Dict[str, Dict[str, Any]]] = None) -> InputSpec:
    """Build the :class:`InputSpec` for ``train_path``.

    Parameters
    ----------
    train_path : str
        Directory of the training split.
    label : str
        Label column; ``task='auto'`` picks binary for booleans or 0/1 integers,
        multiclass for other integers, regression for floats.
    numeric, categorical : sequence of str, optional
        Explicit input columns; inferred from the schema when not given.
    exclude : sequence of str
        Columns never used as inputs (keys, ids).
    meta : dict, optional
        A parsed ``features.json`` giving index cardinalities.
    """
    import pyarrow as pa

    stats = stats if stats is not None else column_stats(train_path)
    if label not in stats:
        raise MissingColumnError(label, list(stats), where=f"the training data at '{train_path}' (labelCol)")
    for col in [*(numeric or []), *(categorical or [])]:
        if col not in stats:
            raise MissingColumnError(col, list(stats), where=f"the training data at '{train_path}'")
    ltype = stats[label]["type"]
    if not (pa.types.is_boolean(ltype) or pa.types.is_integer(ltype) or pa.types.is_floating(ltype)
            or pa.types.is_decimal(ltype)):
        raise SchemaError(
            f"label column '{label}' in '{train_path}' has type {ltype}; the model learns a boolean, integer "
            f"(classes) or floating-point (regression) label. Fix: pass the data to fit() as a DataFrame, or "
            f"preprocess it (sparktrain preprocess with a features: spec): both index a string label; a nested "
            f"label cannot be learned")
    skip = {label, *exclude}
    if numeric is None:
        numeric = [c for c, s in stats.items() if c not in skip and pa.types.is_floating(s["type"])]
    inferred_cat = categorical is None
    if categorical is None:
        categorical = [c for c, s in stats.items() if c not in skip and pa.types.is_integer(s["type"])]
    cards = _cardinalities_from_features(meta)
    cat: List[tuple] = []
    for c in categorical:
        if c in cards:
            cat.append((c, cards[c]))
            continue
        mx = stats[c]["max"]
        if mx is None:
            raise SchemaError(f"categorical column '{c}' has no statistics to size its embedding; "
                              "pass categoricalCols with data written by Spark (which records min/max)")
        if stats[c]["min"] is not None and stats[c]["min"] < 0:
            raise SchemaError(f"categorical column '{c}' has negative index {stats[c]['min']}; "
                              "indices must be >= 0 (use StringIndexer or a categorical feature spec)")
        if inferred_cat and int(mx) + 1 > MAX_INFERRED_CARDINALITY:
            raise SchemaError(f"integer column '{c}' would be a categorical input with {int(mx) + 1:,} embedding "
                              f"rows (its max is {mx}); it looks like an id. Fix: add it to excludeCols, or pass "
                              f"numericCols/categoricalCols explicitly")
        cat.append((c, int(mx) + 1))
    lmeta = (meta or {}).get("label")
    lmeta = lmeta if isinstance(lmeta, dict) else {}
    decided = lmeta.get("task") or (meta or {}).get("task")  # features.json: what preprocess decided
    if task == "auto" and decided in ("binary", "multiclass", "regression"):
        task = decided
    if task == "auto":
        if pa.types.is_boolean(ltype):
            task = "binary"
        elif pa.types.is_integer(ltype):
            task = "binary" if (stats[label]["max"] or 0) <= 1 else "multiclass"
        else:
            task = "regression"
    if task in ("binary", "multiclass") and stats[label]["min"] is not None and not pa.types.is_boolean(ltype) \
            and stats[label]["min"] < 0:
        raise SchemaError(f"label column '{label}' has class {stats[label]['min']}; class labels must be "
                          f"0..K-1. Fix: index the label (StringIndexer), or set task='regression'")
    classes = tuple(lmeta.get("vocabulary") or ()) if task != "regression" else ()
    num_classes = 1
    if task == "multiclass":
        known = lmeta.get("num_classes") or len(classes)
        if not known and stats[label]["max"] is None:
            raise SchemaError(f"label column '{label}' has no statistics to count its classes; write the data "
                              f"with Spark (which records min/max) or sparktrain preprocess")
        num_classes = int(known) if known else int(stats[label]["max"]) + 1
    if not numeric and not cat:
        raise SchemaError(f"no input columns found in '{train_path}': need float (numeric) or integer "
                          f"(categorical index) columns besides the label '{label}'")
    return InputSpec(numeric=tuple(numeric), categorical=tuple(cat), label=label, task=task,
                     num_classes=num_classes, classes=classes)
