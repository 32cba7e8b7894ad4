"""Turn reader batches (dicts of numpy arrays) into model inputs, framework-neutral.

One reader is built per epoch from an explicit cursor, so a resumed run reads
exactly the rows it has not seen yet, in the order a fresh run would have.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import numpy as np

from sparktrain.errors import DataError
from sparktrain.train._executor.spec import InputSpec

Arrays = Tuple[np.ndarray, np.ndarray, np.ndarray]


def to_arrays(batch: Dict[str, np.ndarray], inputs: InputSpec) -> Arrays:
    """``(numeric [B, numeric_width] float32, categorical [B, cat_width] int64, label [B])``.

    The float input holds the numeric columns, then each float block (``inputs.vectors``) in order; the
    integer input the categorical indices, then each bag's ids (``inputs.bags``) in order.
    """
    n = len(batch[inputs.label])
    x_num = np.empty((n, inputs.numeric_width), dtype=np.float32)
    for j, col in enumerate(inputs.numeric):
        x_num[:, j] = batch[col]
    j = len(inputs.numeric)
    for col, width in inputs.vectors:
        block = batch[col]
        if block.ndim != 2 or block.shape[1] != width:
            seen = block.shape[1] if block.ndim == 2 else "no fixed length"
            raise DataError(f"column '{col}' is a float block of {width} values per row for this model, but a "
                            f"batch has {seen}. Give it rows of {width} values (the length it was trained on)")
        x_num[:, j:j + width] = block
        j += width
    x_cat = np.empty((n, inputs.cat_width), dtype=np.int64)
    for j, (col, card) in enumerate(inputs.categorical):
        x_cat[:, j] = np.clip(batch[col], 0, card - 1)
    j = len(inputs.categorical)
    for col, length, rows, _ in inputs.bags:
        ids = batch[col]
        if ids.ndim != 2 or ids.shape[1] != length:
            seen = ids.shape[1] if ids.ndim == 2 else "no fixed length"
            raise DataError(f"column '{col}' holds {length} token ids per row for this model, but a batch has "
                            f"{seen}. Transform the rows with the feature pipeline the model was trained with")
        x_cat[:, j:j + length] = np.clip(ids, 0, rows - 1)
        j += length
    y = np.asarray(batch[inputs.label])
    y = y.astype(np.int64) if inputs.task == "multiclass" else y.astype(np.float32)
    return x_num, x_cat, y


def epoch_batches(path: str, inputs: InputSpec, batch_size: int, rank: int, world_size: int, epoch: int,
                  seed: int, shuffle: bool = True, shuffle_buffer: int = 8192,
                  remainder: str = "wrap") -> Tuple[int, Iterator[Arrays]]:
    """``(steps, iterator)`` over one epoch of this rank's shard, starting at batch 0."""
    from sparktrain.data.reader import Cursor, make_reader

    columns = [*inputs.columns, inputs.label]
    reader = make_reader(path, columns=columns, batch_size=batch_size, rank=rank, world_size=world_size,
                         shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer, num_epochs=1,
                         remainder=remainder, cursor=Cursor(epoch=epoch, batch_index=0))
    steps = reader.steps_per_epoch

    def gen() -> Iterator[Arrays]:
        with reader:
            for batch in reader:
                yield to_arrays(batch, inputs)

    return steps, gen()


def invalid_rows(batch: Any, inputs: InputSpec, sources: Dict[str, str]) -> Dict[str, np.ndarray]:
    """``{input: boolean mask}`` of the rows of an Arrow ``batch`` where that input is null, NaN or infinite.

    Only inputs with such a row are in the result.  A categorical index
    outside ``0 .. cardinality - 1``, or not a whole number, counts too (the model has no embedding
    row for it; it used to be clamped to the last one).  Float blocks count a
    null or empty row, or a NaN, infinite or null element; ``sources`` maps an input to
    the column that holds it (converted in Spark, see
    :func:`sparktrain.train.model.scoring_frame`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    out: Dict[str, np.ndarray] = {}
    blocks = {c for c, _ in inputs.vectors}
    cards = dict(inputs.categorical)
    n = batch.num_rows
    for c in [*inputs.numeric, *blocks, *cards]:
        col = batch.column(sources.get(c, c))
        nulls = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool) if col.null_count \
            else np.zeros(n, dtype=bool)
        bad = nulls.copy()
        if c in blocks and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False))
            bad |= lengths == 0
            flat = col.flatten()  # the values of the non-null rows, in order
            if len(flat) and (flat.null_count or pa.types.is_floating(flat.type)):
                values = flat.to_numpy(zero_copy_only=False)
                wrong = ~np.isfinite(values) if values.dtype.kind == "f" else np.zeros(len(values), dtype=bool)
                if flat.null_count:
                    wrong |= np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                if wrong.any():  # row of each value: the non-null rows repeated by their lengths
                    kept = np.flatnonzero(~nulls)
                    bad[np.repeat(kept, lengths[kept])[wrong]] = True
        elif c in cards or pa.types.is_floating(col.type):
            values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)  # nulls: NaN; decimal, bool too
            with np.errstate(invalid="ignore"):
                wrong = ~np.isfinite(values)
            if c in cards:  # an index with no embedding row is not clamped
                wrong |= no_embedding_row(values, cards[c])
            bad |= wrong
        if bad.any():
            out[c] = bad
    return out


def no_embedding_row(values: np.ndarray, cardinality: int) -> np.ndarray:
    """Mask of the finite category indices in float64 ``values`` with no embedding row.

    Outside ``0 .. cardinality - 1`` (unseen in training, or negative) or not
    a whole number (2.7 is no category, and casting it would score it as 2).
    """
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & ((values < 0) | (values >= cardinality) | (values != np.floor(values)))


def invalid_message(batch: Any, bad: Dict[str, np.ndarray], inputs: InputSpec, sources: Dict[str, str]) -> str:
    """The :class:`DataError` text for the rows of one Arrow ``batch`` that :func:`invalid_rows` found ``bad``.

    The counts are this batch's (a total would need another pass over the
    data); the range of a categorical input is named only when it holds an
    index with no embedding row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    cards = dict(inputs.categorical)
    blocks = {c for c, _ in inputs.vectors}
    n = batch.num_rows
    ranges = []
    for c in bad:
        if c in cards:
            values = pc.cast(batch.column(sources.get(c, c)), pa.float64()).to_numpy(zero_copy_only=False)
            outside = int(no_embedding_row(values, cards[c]).sum())
            if outside:
                ranges.append(f"'{c}' takes 0 .. {cards[c] - 1}, and {outside:,} of these rows hold another index")
    named = ", ".join(f"'{c}' ({int(m.sum()):,} of the {n:,} rows)" for c, m in bad.items())
    what = "nulls, NaN or infinite values" + (" (or empty arrays)" if blocks & set(bad) else "")
    if ranges:
        what += f", or category indices that are not whole numbers or have no embedding row ({'; '.join(ranges)})"
    return (f"input column(s) {named} of one batch of the rows to score hold {what}; the counts are this "
            f"batch's, other batches may hold more. Fix: fill them in Spark (Imputer, df.na.fill), or set "
            f"handleInvalid on the model: 'skip' leaves those rows out, 'keep' scores them as null")


def scoring_arrays(batch: Dict[str, np.ndarray], inputs: InputSpec) -> Tuple[np.ndarray, np.ndarray]:
    """Model inputs for scoring (no label needed)."""
    fake = dict(batch)
    if inputs.label not in fake:
        first = next(iter(batch.values()))
        fake[inputs.label] = np.zeros(len(first), dtype=np.float32)
    x_num, x_cat, _ = to_arrays(fake, inputs)
    return x_num, x_cat
