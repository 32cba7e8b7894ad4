"""Stream Parquet datasets into TensorFlow and PyTorch (petastorm's role).

Built on ``pyarrow.parquet``: the reader plans from the manifest (or the
footers) and decodes one row group at a time with
``ParquetFile.read_row_group``; files are opened through ``pyarrow.fs``.

Executor-safe: importing this package imports neither pyspark, TensorFlow nor
torch.  Names are resolved lazily on first access:

* :func:`make_reader`, :class:`Reader`, :class:`Cursor` -- sharded, shuffled,
  resumable batches of numpy arrays (``sparktrain.data.reader``);
* :func:`make_tf_dataset` (``sparktrain.data.tf``) and
  :func:`make_torch_dataloader` (``sparktrain.data.torch``);
* :func:`make_spark_converter` (``sparktrain.data.converter``, driver side);
* :func:`write_parquet`, :func:`build_manifest`, :func:`write_manifest`,
  :func:`read_manifest`, :func:`committed_files`, :func:`atomic_dir`, ``MANIFEST_NAME``
  (``sparktrain.data.manifest``);
* :class:`Generation` -- commits without directory renames (``sparktrain.data.commit``);
* :func:`claim` -- exclusive leases on a run or an output (``sparktrain.data.lease``).

See ``docs/reader.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "make_reader": "reader",
    "Reader": "reader",
    "Cursor": "reader",
    "make_tf_dataset": "tf",
    "make_torch_dataloader": "torch",
    "TorchBatchLoader": "torch",
    "make_spark_converter": "converter",
    "SparkDatasetConverter": "converter",
    "write_parquet": "manifest",
    "build_manifest": "manifest",
    "write_manifest": "manifest",
    "read_manifest": "manifest",
    "atomic_dir": "manifest",
    "committed_files": "manifest",
    "MANIFEST_NAME": "manifest",
    "Generation": "commit",
    "claim": "lease",
}

__all__ = [
    "Generation",
    "MANIFEST_NAME",
    "Cursor",
    "Reader",
    "SparkDatasetConverter",
    "TorchBatchLoader",
    "atomic_dir",
    "build_manifest",
    "claim",
    "committed_files",
    "make_reader",
    "make_spark_converter",
    "make_tf_dataset",
    "make_torch_dataloader",
    "read_manifest",
    "write_manifest",
    "write_parquet",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparktrain.data' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"sparktrain.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
