"""Work out a model's inputs from a materialized dataset, without scanning the data.

Float columns become numeric inputs and integer columns categorical indices;
the cardinality of each index comes from ``features.json`` when the dataset was
written by :mod:`sparktrain.features`, else from the Parquet row-group
statistics (``max + 1``), so any Parquet that Spark writes works.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sparktrain.errors import DataError, DatasetNotFoundError, MissingColumnError, SchemaError
from sparktrain.train._executor.spec import InputSpec

log = logging.getLogger(__name__)

FEATURES_JSON = "features.json"
#: the prefix of :func:`split_identity`'s values (an identity of another kind is not compared)
SPLIT_ID = "split-v1:"
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
    import pyarrow as pa

    for f in files:
        try:
            pf = pq.ParquetFile(f, filesystem=fs)
        except pa.ArrowInvalid as exc:  # a truncated or foreign file: name it, with the way back
            raise DataError(f"'{f}' under the dataset '{path}' is not a readable Parquet file ({exc}): a copy or "
                            f"upload cut short, or a file that is not Parquet. Copy the dataset again, or "
                            f"preprocess again") from exc
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


def merge_stats(a: Dict[str, Dict[str, Any]], b: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """:func:`column_stats` of two splits as one: the smaller min and larger max of each column in both."""
    out = {k: dict(v) for k, v in a.items()}
    for name, st in b.items():
        entry = out.get(name)
        if entry is None:
            continue  # the splits share a schema; a column of one only is not the other's
        for key, pick in (("min", min), ("max", max)):
            if st[key] is not None:
                entry[key] = st[key] if entry[key] is None else pick(entry[key], st[key])
    return out


def read_features_json(dataset_root: str) -> Optional[Dict[str, Any]]:
    """The dataset's ``features.json`` (local path or URI; a committed output's generation), or None."""
    from sparktrain.data import _fs
    from sparktrain.data.commit import resolve
    fs, inner = _fs.resolve(_fs.join(resolve(dataset_root), FEATURES_JSON))
    meta = _fs.read_json(fs, inner, FEATURES_JSON, "Run the preprocess stage again (sparktrain preprocess), "
                         "which writes a new generation of the dataset.")
    if meta is not None and not isinstance(meta, dict):
        raise DataError(f"{FEATURES_JSON} '{inner}' holds a JSON {type(meta).__name__}, not an object. Run the "
                        "preprocess stage again (sparktrain preprocess), which writes a new generation of the dataset.")
    return meta


def split_identity(dataset_path: Optional[str], split: str) -> Optional[str]:
    """What identifies the rows of one split (``"validation"``, ``"test"``) of a dataset, from its
    ``features.json``: the split's definition (expression, seed, fractions, key), that split's row count and the
    sources' digests (lineage); None where the dataset has no readable ``features.json``.

    The same preprocess run again gives the same identity (the split is a hash of the key, or of every column
    read); another split, other features of a keyless split, or other source data give another.  Not the
    split's file digest: Spark names part files with a random job id, so it changes on every run.
    """
    if not dataset_path:
        return None
    import hashlib
    import json

    try:
        meta = read_features_json(dataset_path) or {}
    except Exception:  # noqa: BLE001 - a dataset without a readable features.json has no identity to compare
        return None
    dataset = meta.get("dataset") or {}
    definition = {k: v for k, v in (dataset.get("split") or {}).items()
                  if k in ("expression", "seed", "fractions", "key")}
    rows = ((dataset.get("splits") or {}).get(split) or {}).get("rows")
    if not definition and rows is None:
        return None
    sources = sorted(str(src.get("digest") or src.get("paths")) for src in dataset.get("sources") or []
                     if isinstance(src, dict))
    body = json.dumps({"split": definition, "rows": rows, "sources": sources}, sort_keys=True, default=str)
    return SPLIT_ID + hashlib.sha256(body.encode()).hexdigest()[:16]


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


def unusable_columns(items: Sequence[Tuple[str, str]], where: str) -> SchemaError:
    """The one error that refuses every unusable column (``(name, what it is)``), with the fixes."""
    listing = "; ".join(f"'{c}' ({why})" for c, why in items)
    names = ", ".join(repr(c) for c, _ in items)
    return SchemaError(
        f"fit() cannot use {len(items)} column(s) of {where}, and drops none silently: {listing}. Fix: leave "
        f"them out with excludeCols=[{names}]; or encode them first (a features: spec through sparktrain "
        f"preprocess, or Spark ML stages such as StringIndexer); or name the inputs with featuresCol (e.g. a "
        f"VectorAssembler's output) or numericCols and categoricalCols")


def _arrow_kind(t: Any) -> Optional[str]:
    """``numeric``, ``categorical`` or ``block`` for a Parquet column the network can take, else None."""
    import pyarrow as pa

    from sparktrain.data.arrays import is_vector_type

    if pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t):
        return "numeric"
    if pa.types.is_integer(t):
        return "categorical"
    if is_vector_type(t):
        return "block"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        v = t.value_type
        if pa.types.is_floating(v) or pa.types.is_integer(v) or pa.types.is_decimal(v):
            return "block"
    return None


def block_width(train_path: str, column: str, t: Any) -> int:
    """Values per row of a float block in Parquet: from a fixed-size list's type, else from its first rows.

    Rows of another length further on fail in the reader, naming the column
    (``fit(df)`` checks every row instead: :func:`sparktrain.train.frame.check_blocks`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparktrain.data.arrays import column_to_numpy

    if pa.types.is_fixed_size_list(t):
        return int(t.list_size)
    fs, files = _parquet_files(train_path)
    for f in files:
        for batch in pq.ParquetFile(f, filesystem=fs).iter_batches(batch_size=1024, columns=[column]):
            col = batch.column(0).drop_null()
            if len(col):
                return int(column_to_numpy(column, col[:1]).shape[1])
    raise DataError(f"column '{column}' in '{train_path}' is null in every row, so its length is unknown; "
                    f"fill it, or leave it out with excludeCols=['{column}']")


def infer_inputs(train_path: str, label: str, numeric: Optional[Sequence[str]] = None,
                 categorical: Optional[Sequence[str]] = None, task: str = "auto",
                 exclude: Sequence[str] = (), meta: Optional[Dict[str, Any]] = None,
                 stats: Optional[Dict[str, Dict[str, Any]]] = None,
                 vectors: Optional[Mapping[str, Optional[int]]] = None) -> InputSpec:
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
    vectors : mapping of str to int or None, optional
        Explicit float blocks (``featuresCol``) with their widths when known
        (None: :func:`block_width`); inferred when not given.

    Data without a ``features.json`` (any Parquet, or a DataFrame's) follows
    the rules of ``fit(df)`` (:mod:`sparktrain.train.frame`): floats, decimals
    and booleans are numeric, integers categorical, numeric lists and Spark ML
    vectors float blocks, and every other column is refused by name unless
    the inputs are named (``vectors``, ``numeric`` and ``categorical`` all
    given) or excluded.  A preprocessed dataset's columns are its spec's.
    """
    import pyarrow as pa

    stats = stats if stats is not None else column_stats(train_path)
    if label not in stats:
        raise MissingColumnError(label, list(stats), where=f"the training data at '{train_path}' (labelCol)")
    for col in [*(numeric or []), *(categorical or []), *(vectors or {})]:
        if col not in stats:
            raise MissingColumnError(col, list(stats), where=f"the training data at '{train_path}'")
    for col in vectors or {}:
        if _arrow_kind(stats[col]["type"]) != "block":
            raise SchemaError(f"featuresCol '{col}' in '{train_path}' has type {stats[col]['type']}; it must be a "
                              f"Spark ML vector or a list of numbers of one length")
    ltype = stats[label]["type"]
    if not (pa.types.is_boolean(ltype) or pa.types.is_integer(ltype) or pa.types.is_floating(ltype)
            or pa.types.is_decimal(ltype)):
        raise SchemaError(
            f"label column '{label}' in '{train_path}' has type {ltype}; the model learns a boolean, integer "
            f"(classes) or floating-point (regression) label. Fix: pass the data to fit() as a DataFrame, or "
            f"preprocess it (sparktrain preprocess with a features: spec): both index a string label; a nested "
            f"label cannot be learned")
    skip = {label, *exclude, *(numeric or []), *(categorical or []), *(vectors or {})}
    preprocessed = any(k in (meta or {}) for k in ("features", "float_columns", "columns"))
    bags: List[Tuple[str, int, int, str]] = []
    if preprocessed:  # the spec decided the columns: floats are numeric, integers indices (as before)
        arrays = array_columns(meta)
        if vectors is None:
            vectors = {c: w for c, (kind, w, _, _) in arrays.items() if kind == "block" and c not in skip}
        bags = [(c, int(n), int(rows), str(pool)) for c, (kind, n, rows, pool) in arrays.items()
                if kind == "ids" and c not in skip and c in stats]
        skip |= set(arrays)
        kinds = {c: ("numeric" if pa.types.is_floating(s["type"]) else
                     "categorical" if pa.types.is_integer(s["type"]) else "other")
                 for c, s in stats.items() if c not in skip}
    else:
        kinds = {c: _arrow_kind(s["type"]) or "other" for c, s in stats.items() if c not in skip}
        named = numeric is not None and categorical is not None and vectors is not None
        refused = [(c, str(stats[c]["type"])) for c, k in kinds.items() if k == "other"]
        if refused and not named:
            raise unusable_columns(refused, f"the training data at '{train_path}'")
    if numeric is None:
        numeric = [c for c, k in kinds.items() if k == "numeric"]
    inferred_cat = categorical is None
    if categorical is None:
        categorical = [c for c, k in kinds.items() if k == "categorical"]
    if vectors is None:
        vectors = {c: None for c, k in kinds.items() if k == "block"}
    blocks = tuple((c, int(w) if w is not None else block_width(train_path, c, stats[c]["type"]))
                   for c, w in vectors.items())
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
            if task == "multiclass" and stats[label]["max"] is not None and not lmeta:
                from sparktrain.features.label import warn_many_integer_classes
                warn_many_integer_classes(label, int(stats[label]["max"]) + 1, stats[label]["min"],
                                          stats[label]["max"])
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
    if not numeric and not cat and not blocks and not bags:
        raise SchemaError(f"no input columns found in '{train_path}': need float (numeric) or integer "
                          f"(categorical index) columns, Spark ML vectors or numeric lists besides the label "
                          f"'{label}'")
    return InputSpec(numeric=tuple(numeric), categorical=tuple(cat), label=label, task=task,
                     num_classes=num_classes, classes=classes, vectors=blocks, bags=tuple(bags))


def array_columns(meta: Optional[Dict[str, Any]]) -> Dict[str, Tuple[str, int, int, str]]:
    """A preprocessed dataset's array outputs from ``features.json``: ``{column: (kind, n, rows, pooling)}``.

    ``kind`` is ``block`` (``array<float>``, ``n`` its width) or ``ids``
    (``array<int>`` embedding-bag ids: ``n`` per row, ``rows`` embedding rows).
    """
    out: Dict[str, Tuple[str, int, int, str]] = {}
    for col in (meta or {}).get("columns", []) or []:
        if not isinstance(col, dict):
            continue
        if col.get("dtype") == "array<float>":
            out[col["name"]] = ("block", int(col["width"]), 0, "")
        elif col.get("dtype") == "array<int>":
            out[col["name"]] = ("ids", int(col["length"]), int(col["cardinality"]), str(col.get("pooling", "mean")))
    return out
