"""Arrow columns to numpy arrays, whole columns at a time (no per-row Python).

Rules (also in ``docs/reader.md``):

* The numpy dtype follows the Arrow type only, so it is the same in every
  batch: ``float32 -> float32``, ``int64 -> int64``, ``bool -> bool``,
  ``decimal -> float64``, ``string``/``binary`` -> ``object``,
  ``date``/``timestamp`` -> ``datetime64``.
* Lists (``array<T>`` in Spark, also fixed-size lists) become 2-D arrays
  ``(rows, length)``; lists of lists become 3-D.  Every list of a column must
  have the same length (else :class:`~sparktrain.errors.DataError`).
* Spark ML vectors (``VectorUDT``, stored as a struct ``type, size, indices,
  values``) become dense ``float64`` arrays ``(rows, size)``, sparse ones
  included.
* Nulls: floating-point values (scalars, list elements, whole null lists or
  vectors) become ``NaN``; string/binary nulls become ``None``.  Nulls in
  integer, boolean, decimal or temporal columns raise
  :class:`~sparktrain.errors.DataError` unless ``fill_null`` gives a value for
  that column, which then replaces every null of it (list elements and whole
  null lists included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparktrain.errors import DataError, SchemaError

_VECTOR_FIELDS = ("type", "size", "indices", "values")


def is_vector_type(t: pa.DataType) -> bool:
    """True for the struct Spark writes for an ML ``Vector`` column."""
    return pa.types.is_struct(t) and sorted(t.field(i).name for i in range(t.num_fields)) == sorted(_VECTOR_FIELDS)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def check_supported(name: str, t: pa.DataType) -> None:
    """Raise :class:`SchemaError` for a column type batches cannot hold."""
    while _is_list(t):
        t = t.value_type
    if is_vector_type(t):
        return
    if pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_union(t) or pa.types.is_null(t):
        raise SchemaError(
            f"column '{name}' has type {t}, which a batch of numpy arrays cannot hold. Flatten it in Spark "
            f"(e.g. df.select('{name}.*')), or leave it out with columns=[...].")


def _null_error(name: str, t: pa.DataType, n: int) -> DataError:
    return DataError(
        f"column '{name}' ({t}) has {n} null value(s) in this batch and its numpy type has no null. Fill them "
        f"upstream (df.fillna / coalesce in Spark) or pass fill_null={{'{name}': <value>}} to the reader.")


def _scalar(name: str, arr: pa.Array, fill: Any) -> np.ndarray:
    t = arr.type
    if pa.types.is_dictionary(t):
        return _scalar(name, arr.dictionary_decode(), fill)
    if arr.null_count and fill is not None:
        arr = pc.fill_null(arr, pa.scalar(fill).cast(t))
    if arr.null_count and not (pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                               or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise _null_error(name, t, arr.null_count)
    if pa.types.is_decimal(t):
        arr = pc.cast(arr, pa.float64())
    return arr.to_numpy(zero_copy_only=False)


def _fill_value(dtype: np.dtype, fill: Any) -> Any:
    if fill is not None:
        return fill
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "O":
        return None
    return None


def _list(name: str, arr: pa.Array, fill: Any) -> np.ndarray:
    n = len(arr)
    lengths = pc.list_value_length(arr)
    valid_lens = pc.drop_null(lengths).to_numpy(zero_copy_only=False) if arr.null_count else \
        lengths.to_numpy(zero_copy_only=False)
    if len(valid_lens) == 0:
        raise DataError(f"column '{name}' has only null lists in this batch, so its length is unknown. Fill "
                        f"them upstream in Spark or leave the column out with columns=[...].")
    lo, hi = int(valid_lens.min()), int(valid_lens.max())
    if lo != hi:
        raise DataError(
            f"column '{name}' holds lists of different lengths ({lo}..{hi}) in one batch; batches need one "
            f"length per column. Pad or truncate in Spark (e.g. slice(), or concat with array_repeat), or leave "
            f"it out with columns=[...].")
    child = column_to_numpy(name, arr.flatten(), fill)
    child = child.reshape((len(valid_lens), lo) + child.shape[1:])
    if not arr.null_count:
        return child
    value = _fill_value(child.dtype, fill)
    if value is None:
        raise _null_error(name, arr.type, arr.null_count)
    out = np.full((n,) + child.shape[1:], value, dtype=child.dtype)
    out[arr.is_valid().to_numpy(zero_copy_only=False)] = child
    return out


def _vector(name: str, arr: pa.StructArray, fill: Any) -> np.ndarray:
    n = len(arr)
    fields = dict(zip([arr.type.field(i).name for i in range(arr.type.num_fields)], arr.flatten()))
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    kind = fields["type"].fill_null(1).to_numpy(zero_copy_only=False)
    values = fields["values"]
    val_lens = values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_vals = values.flatten().to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    dense = valid & (kind == 1)
    sparse = valid & (kind == 0)
    sizes = np.where(dense, val_lens, fields["size"].fill_null(-1).to_numpy(zero_copy_only=False))
    dims = np.unique(sizes[valid])
    if len(dims) != 1:
        raise DataError(f"column '{name}' holds ML vectors of different sizes ({', '.join(map(str, dims[:5]))}) "
                        f"in one batch; batches need one size per column. Fix the feature pipeline.")
    dim = int(dims[0])
    out = np.full((n, dim), np.nan if fill is None else fill, dtype=np.float64)
    out[sparse] = 0.0
    starts = np.concatenate([[0], np.cumsum(val_lens)[:-1]]).astype(np.int64)
    if dense.any():
        rows = np.flatnonzero(dense)
        out[rows] = flat_vals[starts[rows, None] + np.arange(dim)]
    if sparse.any():
        indices = fields["indices"]
        ind_lens = indices.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat_ind = indices.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        ind_rows = np.repeat(np.arange(n), ind_lens)
        keep = sparse[ind_rows]
        take = np.repeat(sparse, val_lens)
        out[ind_rows[keep], flat_ind[keep]] = flat_vals[take]
    return out


def column_to_numpy(name: str, col: Any, fill: Any = None) -> np.ndarray:
    """Convert one Arrow column (``Array`` or ``ChunkedArray``) to numpy.

    Parameters
    ----------
    name : str
        Column name, for error messages.
    col : pyarrow.Array or pyarrow.ChunkedArray
        The column.
    fill : object, optional
        Value that replaces nulls (see the module docstring).

    Returns
    -------
    numpy.ndarray
        1-D for scalar columns, 2-D (or more) for list and vector columns.
    """
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            col = col.chunk(0)
        elif col.num_chunks == 0:
            col = pa.array([], type=col.type)
        else:
            col = col.combine_chunks()
    t = col.type
    if _is_list(t):
        return _list(name, col, fill)
    if is_vector_type(t):
        return _vector(name, col, fill)
    check_supported(name, t)
    return _scalar(name, col, fill)


def table_to_numpy(table: pa.Table, fill_null: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Convert every column of ``table`` with :func:`column_to_numpy`."""
    fill_null = fill_null or {}
    return {name: column_to_numpy(name, table.column(name), fill_null.get(name)) for name in table.column_names}


def spec_of(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """``{column: (dtype, shape of one row)}`` of a converted batch."""
    return {k: (v.dtype, tuple(v.shape[1:])) for k, v in arrays.items()}
