"""Shared plumbing of the framework adapters: get a reader from a path or a Reader."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from sparktrain.data.reader import Reader, make_reader
from sparktrain.errors import ConfigError


@contextlib.contextmanager
def open_reader(path_or_reader: str | Reader, columns: Sequence[str] | None, batch_size: int | None,
                reader_kwargs: dict) -> Iterator[Reader]:
    """Yield ``path_or_reader`` itself, or a new reader that is closed on exit.

    Adapters default ``num_epochs`` to None: each pass over the adapter
    yields one epoch, and the reader keeps going for the next pass.
    """
    if isinstance(path_or_reader, Reader):
        if columns is not None or batch_size is not None or reader_kwargs:
            given = sorted(list(reader_kwargs) + [k for k, v in (("columns", columns), ("batch_size", batch_size))
                                                  if v is not None])
            raise ConfigError(given[0], "given with a Reader", "pass reader arguments to make_reader, or pass a "
                              "path instead of a Reader")
        yield path_or_reader
        return
    reader_kwargs.setdefault("num_epochs", None)
    with make_reader(path_or_reader, columns, 1024 if batch_size is None else batch_size, **reader_kwargs) as r:
        yield r


def missing(package: str, install: str) -> Any:
    """The ImportError raised when an optional framework is absent."""
    from sparktrain.errors import MissingDependencyError

    return MissingDependencyError(package, install, why="for this sparktrain.data adapter")
