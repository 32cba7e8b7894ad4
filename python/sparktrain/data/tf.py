"""``tf.data`` adapter over :class:`sparktrain.data.reader.Reader`.

The reader builds batches in numpy (its background thread decodes row groups
and permutes windows).  The adapter hands them to TensorFlow a *chunk* at a
time, not a batch at a time: consecutive full batches (one reader window, 8
batches of 1024 by default) go through ``Dataset.from_generator`` as one
``(k, batch) + row shape`` array per column (a zero-copy reshape when the
batches are consecutive slices of one window, as the reader cuts them), and
TensorFlow's C++ ``unbatch`` splits them back into batches.  The per-element
cost of a Python generator (a few hundred microseconds) is paid once per
chunk, and a ``prefetch`` overlaps the generator with the consumer.  Nothing
is done per row in Python.  ``bench/reader.py`` measures it against raw
``pq.read_table``.

TensorFlow is imported when :func:`make_tf_dataset` is called, never at
package import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from sparktrain.data._adapters import missing, open_reader
from sparktrain.data.reader import Reader
from sparktrain.errors import SchemaError

#: Most batches handed to TensorFlow in one generator element.
MAX_CHUNK_BATCHES = 16
#: Chunks TensorFlow prefetches ahead of the consumer.
PREFETCH_CHUNKS = 2


def _tf_dtype(tf: Any, column: str, dtype: np.dtype) -> Any:
    if dtype.kind == "O":
        return tf.string
    if dtype.kind in "biuf":
        return tf.as_dtype(dtype)
    raise SchemaError(f"column '{column}' becomes numpy {dtype}, which TensorFlow cannot take. Cast it in Spark "
                      f"(e.g. to long or double) or leave it out with columns=[...].")


def element_spec(reader: Reader) -> dict[str, Any]:
    """The ``tf.TensorSpec`` of each column: ``(None,) + row shape`` and its dtype."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise missing("tensorflow", "pip install 'sparktrain[tensorflow]'") from e
    spec: dict[str, tuple[np.dtype, tuple[int, ...]]] = reader.peek_spec()
    return {c: tf.TensorSpec(shape=(None,) + shape, dtype=_tf_dtype(tf, c, dtype), name=c)
            for c, (dtype, shape) in spec.items()}


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _follows(batch: dict[str, np.ndarray], prev: dict[str, np.ndarray]) -> bool:
    """Whether every column of ``batch`` starts in memory right where ``prev``'s ends (same base array)."""
    for c, a in batch.items():
        p = prev[c]
        if (a.dtype.kind == "O" or a.base is None or a.base is not p.base or not a.flags.c_contiguous
                or a.shape != p.shape or _address(a) != _address(p) + p.nbytes):
            return False
    return True


def _stack(parts: list[np.ndarray], contiguous: bool) -> np.ndarray:
    """``np.stack(parts)``; a read-only view instead of a copy when they are consecutive slices of one array."""
    first = parts[0]
    if contiguous and len(parts) > 1:
        return np.lib.stride_tricks.as_strided(first, shape=(len(parts),) + first.shape,
                                               strides=(first.nbytes,) + first.strides, writeable=False)
    return np.stack(parts)


def iter_chunks(reader: Reader, max_batches: int = MAX_CHUNK_BATCHES) -> Iterator[dict[str, np.ndarray]]:
    """The rest of the reader's epoch as ``{column: (k, batch) + row shape}`` chunks of equal-size batches.

    Concatenating the chunks' batches gives exactly the reader's batches, in
    order.  A chunk is a run of batches cut from one reader window, so it is
    a view, not a copy, for numeric columns.  The reader's cursor moves as
    the chunks are built (it runs up to one chunk ahead of a consumer).
    """
    run: list[dict[str, np.ndarray]] = []
    contiguous = True

    def flush() -> dict[str, np.ndarray]:
        return {c: _stack([b[c] for b in run], contiguous) for c in run[0]}

    for batch in reader.iter_epoch():
        if run:
            follows = _follows(batch, run[-1])
            if len(run) < max_batches and follows and contiguous:
                pass  # extend the view
            elif len(run) < max_batches and (len(run) == 1 or not contiguous) and _same_shapes(batch, run[-1]):
                contiguous = False  # not one array (strings, a window boundary): stack copies
            else:
                yield flush()
                run, contiguous = [], True
        run.append(batch)
    if run:
        yield flush()


def _same_shapes(batch: dict[str, np.ndarray], prev: dict[str, np.ndarray]) -> bool:
    return all(a.shape == prev[c].shape for c, a in batch.items())


@contextlib.contextmanager
def make_tf_dataset(path_or_reader: str | Reader, columns: Sequence[str] | None = None,
                    batch_size: int | None = None, **reader_kwargs: Any) -> Iterator[Any]:
    """A ``tf.data.Dataset`` of batches (dicts of tensors) streamed from Parquet.

    Each pass over the dataset (a Keras epoch, a ``for`` loop) yields the
    rest of the reader's current epoch, so ``model.fit(ds, epochs=3)`` sees
    three data epochs.  The ``element_spec`` is exact and fixed up front:
    dtypes from the schema, and row shapes (list lengths) from the first rows.

    The dataset reads ahead (up to a few reader windows), so the reader's
    cursor is ahead of what the model has consumed: to checkpoint a position
    mid-epoch, count the steps taken (``Cursor(epoch, steps)``) rather than
    reading ``reader.cursor``.

    Parameters
    ----------
    path_or_reader : str or Reader
        Dataset path (a reader is opened and closed with the context), or an
        existing :class:`Reader` (left open; the caller owns it).
    columns, batch_size, **reader_kwargs
        As for :func:`sparktrain.data.make_reader`; ``num_epochs`` defaults
        to None here (one epoch per pass, for ever).

    Yields
    ------
    tf.data.Dataset
        Elements ``{column: tf.Tensor}`` with shape ``(batch,) + row shape``.

    Examples
    --------
    >>> with make_tf_dataset("/data/train", ["x", "y"], 256, rank=r, world_size=n) as ds:  # doctest: +SKIP
    ...     model.fit(ds.map(lambda b: (b["x"], b["y"])), epochs=3)
    """
    try:
        import tensorflow as tf
    except ImportError as e:
        raise missing("tensorflow", "pip install 'sparktrain[tensorflow]'") from e
    with open_reader(path_or_reader, columns, batch_size, dict(reader_kwargs)) as reader:
        signature = element_spec(reader)
        chunked = {c: tf.TensorSpec(shape=(None,) + s.shape, dtype=s.dtype, name=c) for c, s in signature.items()}

        def generate() -> Iterator[dict[str, np.ndarray]]:
            yield from iter_chunks(reader)

        ds = tf.data.Dataset.from_generator(generate, output_signature=chunked).unbatch()
        yield _with_spec(ds, signature).prefetch(PREFETCH_CHUNKS * MAX_CHUNK_BATCHES)


def _with_spec(ds: Any, signature: dict[str, Any]) -> Any:
    """``ds`` with ``signature`` as its element spec (``unbatch`` drops the column names from the specs).

    Uses TensorFlow's internal ``_RestructuredDataset`` (no copy, no per-element cost); without it the
    dataset is returned as is, with unnamed specs.
    """
    try:
        from tensorflow.python.data.ops import dataset_ops

        return dataset_ops._RestructuredDataset(ds, signature)
    except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - another TF version
        return ds
