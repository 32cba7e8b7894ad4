"""PyTorch adapter over :class:`sparktrain.data.reader.Reader`.

Batches are whole numpy arrays turned into tensors with ``torch.from_numpy``
(no copy, never row by row).  torch is imported when
:func:`make_torch_dataloader` is called, never at package import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from sparktrain.data._adapters import missing, open_reader
from sparktrain.data.reader import Cursor, Reader


class TorchBatchLoader:
    """Iterable of ``{column: torch.Tensor}`` batches; one pass = one epoch.

    Non-numeric columns (strings, timestamps) stay numpy arrays.  ``len()``
    is the number of batches per epoch (the same on every rank).

    Parameters
    ----------
    reader : Reader
        Source of batches.
    device : str or torch.device, optional
        Move tensors there (``non_blocking``) before yielding.
    """

    def __init__(self, reader: Reader, device: Any = None) -> None:
        import torch

        self.reader = reader
        self.device = torch.device(device) if device is not None else None
        self._torch = torch

    def _convert(self, arr: np.ndarray) -> Any:
        if arr.dtype.kind not in "biuf":
            return arr
        t = self._torch.from_numpy(arr)
        return t.to(self.device, non_blocking=True) if self.device is not None else t

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.reader.iter_epoch():
            yield {k: self._convert(v) for k, v in batch.items()}

    def __len__(self) -> int:
        return self.reader.steps_per_epoch

    @property
    def cursor(self) -> Cursor:
        """The reader's cursor: the next batch this loader yields."""
        return self.reader.cursor


@contextlib.contextmanager
def make_torch_dataloader(path_or_reader: str | Reader, columns: Sequence[str] | None = None,
                          batch_size: int | None = None, *, device: Any = None,
                          **reader_kwargs: Any) -> Iterator[TorchBatchLoader]:
    """A loader of torch tensor batches streamed from Parquet.

    Parameters
    ----------
    path_or_reader : str or Reader
        Dataset path (a reader is opened and closed with the context), or an
        existing :class:`Reader` (left open; the caller owns it).
    columns, batch_size, **reader_kwargs
        As for :func:`sparktrain.data.make_reader`; ``num_epochs`` defaults
        to None here (one epoch per pass, for ever).
    device : str or torch.device, optional
        Where to put the tensors.

    Yields
    ------
    TorchBatchLoader

    Examples
    --------
    >>> with make_torch_dataloader("/data/train", ["x", "y"], 256, rank=r, world_size=n) as loader:  # doctest: +SKIP
    ...     for epoch in range(3):
    ...         for batch in loader:
    ...             loss = loss_fn(model(batch["x"]), batch["y"])
    """
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise missing("torch", "pip install 'sparktrain[torch]'") from e
    with open_reader(path_or_reader, columns, batch_size, dict(reader_kwargs)) as reader:
        yield TorchBatchLoader(reader, device=device)
