"""Apply a fitted feature pipeline without Spark: numpy, pyarrow and zlib only.

:func:`transform_local` reads ``features.json`` (see
:mod:`sparktrain.features.metadata`) and reproduces, column for column, what
the Spark ``PipelineModel`` writes: the same float32 values (to float32
rounding) and the same int32 indices.  It is what a scorer without a JVM (an
MLflow pyfunc model, a web service) runs.  This module must never import
pyspark.

Known differences from Spark, all outside what the pipeline itself produces:

* pandas input: a NaN in a float column is read as missing (pandas' convention),
  so ``on_invalid: error`` cannot see it.
* strings parsed as numbers use Python's ``float`` (Spark's ``try_cast`` rejects
  a few forms Python accepts, like ``1_000``); strings parsed as timestamps use
  pandas, in ``features.json``'s ``timezone``.
* a fractional (float/double) categorical column is turned into text like Java's
  ``Double.toString`` for magnitudes in [1e-3, 1e7); outside that range the text
  (and so the index) may differ.
* a float where the categorical was trained on integers is read as that integer
  when it is whole; one above 2**53 names no one integer (pandas gives float64
  for an integer column with a null), so it is an unseen category, with a
  warning, as in Spark's scorer.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Dict, Mapping, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparktrain.errors import DataError, MissingColumnError

_TRUE = {"t", "true", "y", "yes", "1"}
#: Feature types that :func:`transform_local` refuses: the Spark pipeline applies them.
SPARK_ONLY = ("vector", "text", "set")


def transform_local(data: Any, features_json: Union[Mapping[str, Any], str],
                    as_pandas: bool = False) -> Union[Dict[str, np.ndarray], Any]:
    """Transform raw rows exactly like the fitted Spark pipeline, without Spark.

    Parameters
    ----------
    data : pyarrow.Table, pandas.DataFrame or mapping of column -> array
        Raw rows with (at least) the columns the features read.
    features_json : dict or str
        The parsed ``features.json``, or its path.
    as_pandas : bool
        Return a pandas DataFrame instead of a dict.

    Returns
    -------
    dict of str -> numpy.ndarray
        The key and label when present in ``data``, then the float32 columns and
        the int32 columns, in ``features.json`` order.

    Examples
    --------
    >>> import pyarrow.parquet as pq
    >>> meta = json.load(open("work/houses/dataset/features.json"))    # doctest: +SKIP
    >>> out = transform_local(pq.read_table("new_houses.parquet"), meta)   # doctest: +SKIP
    >>> out["city"].dtype, out["price"].dtype                          # doctest: +SKIP
    (dtype('int32'), dtype('float32'))
    """
    meta = _load(features_json)
    table = _as_table(data)
    n = table.num_rows
    out: Dict[str, np.ndarray] = {}
    key = meta.get("key")
    if key and key in table.column_names:
        out[key] = _column(table, key).to_numpy(zero_copy_only=False)
    label = meta.get("label")
    if label and label["column"] in table.column_names:
        out[label["column"]] = _label(_column(table, label["column"]), label)
    values: Dict[str, np.ndarray] = {}
    for f in meta["features"]:
        kind = f["type"]
        if kind in SPARK_ONLY or (kind == "datetime" and f.get("format")):
            what = f"a {kind} feature" + (" with a format" if kind == "datetime" else "")
            raise DataError(f"feature '{f['name']}' is {what}, which only the fitted Spark pipeline applies "
                            f"(tokenizer, vector conversion or Spark datetime patterns). Score with Spark: "
                            f"sparktrain score, or sparktrain.serve.pyfunc.load_spark_model(uri).transform(df)")
        if kind == "crossed":
            cols = [_as_trained(_require(table, c, f["name"]), t, c)
                    for c, t in zip(f["columns"], f.get("source_dtypes") or [None] * len(f["columns"]))]
            values[f["name"]] = _hash(cols, f["hash"]["buckets"], f["hash"]["separator"])
            continue
        col = _require(table, f["source"], f["name"])
        if kind == "numeric":
            x = _numeric(col, f)
            if "buckets" in f:
                values[f["buckets"]["column"]] = _bucketize(x, f["buckets"]["splits"])
            scale = f["scale"]
            if scale["method"] != "none":
                x = (x - scale["offset"]) / scale["scale"]
            values[f["name"]] = x.astype(np.float32)
        elif kind == "categorical":
            col = _as_trained(col, f.get("source_dtype"), f["source"])
            if f["encoding"] == "hash":
                values[f["name"]] = _hash([col], f["hash"]["buckets"], "\x01")
            else:
                values[f["name"]] = _vocab_index(col, f["vocabulary"])
        elif kind == "datetime":
            secs = _epoch_seconds(col, meta.get("timezone") or "UTC")
            for p in f["parts"]:
                part, period = _part(secs, p["part"]), p["period"]
                missing = np.isnan(part)
                values[p["column"]] = np.where(missing, period, part).astype(np.int32)
                if "sin" in p:
                    angle = 2 * np.pi * part / period
                    values[p["sin"]] = np.where(missing, 0.0, np.sin(angle)).astype(np.float32)
                    values[p["cos"]] = np.where(missing, 0.0, np.cos(angle)).astype(np.float32)
        elif kind == "boolean":
            values[f["name"]] = _boolean(col).astype(np.float32)
        else:
            raise DataError(f"features.json lists feature '{f['name']}' with unknown type {kind!r}; "
                            f"regenerate it with this version of sparktrain")
    for name in list(meta["float_columns"]) + list(meta["int_columns"]):
        out[name] = values[name]
    if any(len(v) != n for v in out.values()):  # pragma: no cover - defensive
        raise DataError("internal error: an output column has the wrong length")
    if as_pandas:
        import pandas as pd
        return pd.DataFrame(out)
    return out


def needs_spark(meta: Mapping[str, Any]) -> bool:
    """Whether a feature of ``features.json`` is one :func:`transform_local` refuses (Spark applies it)."""
    return any(f["type"] in SPARK_ONLY or (f["type"] == "datetime" and f.get("format")) for f in meta["features"])


def _load(features_json: Union[Mapping[str, Any], str]) -> Mapping[str, Any]:
    if isinstance(features_json, str):
        with open(features_json) as fh:
            return json.load(fh)
    return features_json


def _as_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_numpy") and hasattr(data, "columns"):  # pandas.DataFrame
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):
        return pa.table({k: pa.array(v) for k, v in data.items()})  # NaN stays a value (not null)
    raise TypeError(f"transform_local takes a pyarrow Table, a pandas DataFrame or a dict of arrays, "
                    f"not {type(data).__name__}")


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _require(table: pa.Table, name: str, feature: str) -> pa.Array:
    if name not in table.column_names:
        raise MissingColumnError(name, table.column_names, f"the data to transform (feature '{feature}' reads it)")
    return _column(table, name)


def _to_float(col: pa.Array) -> np.ndarray:
    """float64 with NaN for null (and for strings that are not numbers); a NaN value stays NaN."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        uniques, codes = _factorize(col)
        parsed = np.array([_parse_float(u) for u in uniques], dtype=np.float64)
        return np.where(codes >= 0, parsed[np.maximum(codes, 0)] if len(parsed) else np.nan, np.nan)
    if pa.types.is_boolean(t):
        col = pc.cast(col, pa.int8())
    arr = pc.cast(col, pa.float64(), safe=False)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64)


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        return np.nan


def _numeric(col: pa.Array, f: Mapping[str, Any]) -> np.ndarray:
    null = _null_mask(col)
    x = _to_float(col)
    invalid = ~null & ~np.isfinite(x)
    if f.get("on_invalid") == "error" and invalid.any():
        raise DataError(f"column '{f['source']}' (feature '{f['name']}') has a NaN or infinite value; "
                        f"set on_invalid: impute to treat them as missing, or clean the data")
    x = np.where(np.isfinite(x), x, np.nan)
    impute = f["impute"]
    if impute["strategy"] == "constant":
        x = np.where(np.isnan(x), impute["value"], x)
    if f.get("clip") is not None:
        lo, hi = f["clip"]
        x = np.where(x < lo, lo, np.where(x > hi, hi, x))
    if f.get("log1p"):
        x = np.sign(x) * np.log1p(np.abs(x))
    if impute["strategy"] != "constant":
        x = np.where(np.isnan(x), impute["value"], x)
    return x


def _bucketize(x: np.ndarray, splits: Any) -> np.ndarray:
    s = np.asarray(splits, dtype=np.float64)
    nb = len(s) - 1
    idx = np.searchsorted(s, x, side="right") - 1
    idx = np.where(x == s[-1], nb - 1, idx)  # Bucketizer: the last bucket includes its upper bound
    return np.where(np.isnan(x), nb, np.clip(idx, 0, nb - 1)).astype(np.int32)


def _null_mask(col: pa.Array) -> np.ndarray:
    return col.is_null().to_numpy(zero_copy_only=False)


def _factorize(col: pa.Array):
    """(unique non-null values as Python objects, codes with -1 for null)."""
    enc = pc.dictionary_encode(col)
    uniques = enc.dictionary.to_pylist()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return uniques, codes


def _as_text(col: pa.Array) -> pa.Array:
    """Values as Spark's ``CAST(x AS STRING)`` would print them."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col.cast(pa.string())
    if pa.types.is_floating(t):
        return pa.array([None if v is None else _java_double(v) for v in col.to_pylist()], pa.string())
    if pa.types.is_dictionary(t):
        return _as_text(col.dictionary_decode())
    return pc.cast(col, pa.string())


_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def _as_trained(col: pa.Array, source_dtype: Any, name: str = "") -> pa.Array:
    """A fractional column where the categorical was fitted on integers: an integral value as that integer
    (``1.0`` is category ``1``, not an unseen ``"1.0"``), any other missing, as Spark's scorer reads it.

    A float above 2**53 cannot name one integer (2**60 and 2**60 + 1 are the same double), so it is missing
    too, with a warning, rather than a confident index of its neighbour's category.
    """
    if str(source_dtype or "").lower() not in _INTEGERS or not pa.types.is_floating(col.type):
        return col
    x = col.to_numpy(zero_copy_only=False).astype(np.float64)
    whole = np.isfinite(x) & (np.floor(x) == x)
    inexact = whole & (np.abs(x) > 2.0 ** 53)
    if inexact.any():
        import warnings

        warnings.warn(f"column '{name}' was trained as integers, but {int(inexact.sum())} value(s) arrived as floats "
                      f"above 2**53 (e.g. {x[inexact][0]:.0f}), which cannot name one integer: they are scored as "
                      f"an unseen category. Pass the column as integers (pandas: .astype('Int64'), which also "
                      f"keeps nulls; pandas turns an integer column with a null into float64)", UserWarning,
                      stacklevel=3)
    whole &= ~inexact
    return pa.array(np.where(whole, x, 0).astype(np.int64), mask=~whole)


def _java_double(v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    text = repr(float(v))
    if "e" in text or "inf" in text:
        return text  # outside Java's plain range; may differ (documented)
    return text if "." in text else text + ".0"


def _hash(cols: Any, buckets: int, separator: str) -> np.ndarray:
    texts = [pc.fill_null(_as_text(c), "") for c in cols]
    joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, separator)
    uniques, codes = _factorize(joined)
    hashed = np.array([zlib.crc32(u.encode("utf-8")) % buckets for u in uniques], dtype=np.int64)
    return hashed[codes].astype(np.int32) if len(hashed) else np.zeros(len(codes), np.int32)


def _vocab_index(col: pa.Array, vocabulary: Any) -> np.ndarray:
    reserved = len(vocabulary)
    idx = pc.index_in(_as_text(col), value_set=pa.array(vocabulary, pa.string()))
    return pc.fill_null(idx, reserved).to_numpy(zero_copy_only=False).astype(np.int32)


def _epoch_seconds(col: pa.Array, timezone: str) -> np.ndarray:
    """Seconds since the epoch (float64 with NaN for null), floored like Spark's ``unix_seconds``."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        import pandas as pd
        parsed = pd.to_datetime(pd.Series(col.to_pylist(), dtype=object), errors="coerce", format="mixed")
        if parsed.dt.tz is None:
            parsed = parsed.dt.tz_localize(timezone)
        col = pa.array(parsed.dt.tz_convert("UTC"), pa.timestamp("us", "UTC"))
        t = col.type
    if pa.types.is_date(t):
        days = pc.cast(pc.cast(col, pa.date32()), pa.int32()).to_numpy(zero_copy_only=False)
        return np.where(_null_mask(col), np.nan, days.astype(np.float64) * 86400)
    if not pa.types.is_timestamp(t):
        raise DataError(f"a datetime feature needs a timestamp, date or string column, got {t}")
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[t.unit]
    raw = pc.cast(col, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    secs = np.floor_divide(raw, per_second).astype(np.float64)
    return np.where(_null_mask(col), np.nan, secs)


def _part(secs: np.ndarray, part: str) -> np.ndarray:
    """A calendar part as float64 (NaN for null), 0-based like the Spark expressions."""
    ok = ~np.isnan(secs)
    s = np.where(ok, secs, 0).astype(np.int64)
    days = np.floor_divide(s, 86400)
    if part == "hour":
        v = np.mod(s, 86400) // 3600
    elif part == "minute":
        v = np.mod(s, 3600) // 60
    elif part == "day_of_week":
        v = np.mod(days + 3, 7)
    else:
        d = days.astype("datetime64[D]")
        m = d.astype("datetime64[M]")
        v = (m.astype(np.int64) % 12) if part == "month" else (d - m.astype("datetime64[D]")).astype(np.int64)
    return np.where(ok, v.astype(np.float64), np.nan)


def _boolean(col: pa.Array) -> np.ndarray:
    t = col.type
    if pa.types.is_boolean(t):
        return pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(np.float64)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        uniques, codes = _factorize(col)
        vals = np.array([1.0 if u.strip().lower() in _TRUE else 0.0 for u in uniques] + [0.0])
        return vals[np.where(codes >= 0, codes, len(uniques))]
    x = _to_float(col)  # like Spark's cast: any non-zero number (NaN too) is true, null is false
    return np.where(_null_mask(col) | (x == 0), 0.0, 1.0)


def _label(col: pa.Array, entry: Mapping[str, Any]) -> np.ndarray:
    """The label as the pipeline writes it: a class index (``vocabulary``; unseen or null: -1, where
    Spark writes null), a float32 value, or an int32 value."""
    dtype, vocabulary = entry.get("dtype"), entry.get("vocabulary")
    if vocabulary is not None:
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            values = pa.array(vocabulary, pa.float64())
            found = pc.index_in(pc.cast(col, pa.float64()), value_set=values)
        else:
            found = pc.index_in(pc.cast(col, pa.string()), value_set=pa.array([str(v) for v in vocabulary]))
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    if dtype == "float32":
        return _to_float(col).astype(np.float32)
    if dtype == "int32":
        return pc.cast(col, pa.int32()).to_numpy(zero_copy_only=False)
    return col.to_numpy(zero_copy_only=False)


__all__ = ["transform_local"]
