"""``tf.data`` adapter over :class:`sparktrain.data.reader.Reader`.

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


@contextlib.contextmanager
def make_tf_dataset(path_or_reader: str | Reader, columns: Sequence[str] | None = None,
                    batch_size: int | None = None, **reader_kwargs: Any) -> Iterator[Any]:
    """A ``tf.data.Dataset`` of batches (dicts of tensors) streamed from Parquet.

    Each pass over the dataset (a Keras epoch, a ``for`` loop) yields the
    rest of the reader's current epoch, so ``model.fit(ds, epochs=3)`` sees
    three data epochs.  The ``element_spec`` is exact: dtypes from the
    schema, and row shapes (list lengths) from the first rows.

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

        def generate() -> Iterator[dict[str, np.ndarray]]:
            yield from reader.iter_epoch()

        yield tf.data.Dataset.from_generator(generate, output_signature=signature)
