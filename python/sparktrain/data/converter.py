"""Petastorm-shaped convenience: materialize a DataFrame once, then stream it.

Driver side (it uses Spark); the readers it hands out are executor-safe.
``docs/migrating-from-petastorm.md`` maps petastorm's names onto these.

>>> conv = make_spark_converter(df, "file:///tmp/cache")        # doctest: +SKIP
>>> with conv.make_torch_dataloader(batch_size=256) as loader:  # doctest: +SKIP
...     for batch in loader: ...
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs

from sparktrain.data import _fs
from sparktrain.data.manifest import atomic_dir, read_manifest, write_parquet
from sparktrain.errors import ConfigError, DataError, DatasetExistsError

log = logging.getLogger(__name__)

#: Spark conf key read when ``cache_dir`` is not given (petastorm: parentCacheDirUrl).
CACHE_DIR_CONF = "sparktrain.data.cacheDir"
_KEY_VERSION = "1"
#: petastorm argument names accepted by the converter's loaders.
_PETASTORM_ALIASES = {"cur_shard": "rank", "shard_count": "world_size", "shuffling_queue_capacity": "shuffle_buffer"}


def _plan_key(df: Any, params: str) -> str:
    """Cache key of a DataFrame: its plan (semantic hash + canonicalized plan text) and schema.

    ``semanticHash`` works on classic Spark and Spark Connect; the canonicalized
    plan text (classic only) guards against 32-bit hash collisions.
    """
    parts = [str(df.semanticHash()), df.schema.json(), params, _KEY_VERSION]
    jdf = getattr(df, "_jdf", None)  # classic pyspark only; Spark Connect has no JVM handle
    if jdf is not None:
        try:
            parts.append(jdf.queryExecution().analyzed().canonicalized().toString())
        except Exception as e:  # noqa: BLE001 - py4j errors vary; the key just gets shorter
            log.debug("no analyzed plan for the cache key: %s", e)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _to_float_precision(df: Any, dtype: str | None) -> Any:
    """Cast double columns (scalars, arrays, ML vectors) to ``dtype``, as petastorm does."""
    if dtype is None:
        return df
    if dtype not in ("float32", "float64"):
        raise ConfigError("dtype", dtype, "must be 'float32', 'float64' or None (keep the column types)")
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    target = T.FloatType() if dtype == "float32" else T.DoubleType()
    cols = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        dt = f.dataType
        if isinstance(dt, (T.DoubleType, T.FloatType)) and dt != target:
            c = c.cast(target)
        elif isinstance(dt, T.ArrayType) and isinstance(dt.elementType, (T.DoubleType, T.FloatType)) \
                and dt.elementType != target:
            c = c.cast(T.ArrayType(target, dt.containsNull))
        elif isinstance(dt, T.UserDefinedType) and type(dt).__name__ == "VectorUDT":
            from pyspark.ml.functions import vector_to_array

            c = vector_to_array(c, dtype=dtype)
        else:
            cols.append(c)
            continue
        cols.append(c.alias(f.name))
    return df.select(*cols)


class SparkDatasetConverter:
    """A materialized DataFrame: a Parquet dataset with a manifest, and loaders over it.

    Parameters
    ----------
    path : str
        Dataset directory (URI or local path).
    manifest : dict
        Its manifest.
    """

    def __init__(self, path: str, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @property
    def dataset_size(self) -> int:
        """Rows in the dataset (petastorm's name)."""
        return int(self.manifest["num_rows"])

    def __len__(self) -> int:
        return self.dataset_size

    @staticmethod
    def _kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        out = dict(kwargs)
        for old, new in _PETASTORM_ALIASES.items():
            if old in out:
                value = out.pop(old)
                if new in out:
                    raise ConfigError(old, value, f"give either '{old}' (petastorm) or '{new}', not both")
                if value is not None:
                    out[new] = value
        out.setdefault("require_manifest", True)
        return out

    @contextlib.contextmanager
    def make_tf_dataset(self, batch_size: int = 32, **kwargs: Any) -> Iterator[Any]:
        """:func:`sparktrain.data.make_tf_dataset` over this dataset (petastorm names accepted)."""
        from sparktrain.data.tf import make_tf_dataset

        with make_tf_dataset(self.path, batch_size=batch_size, **self._kwargs(kwargs)) as ds:
            yield ds

    @contextlib.contextmanager
    def make_torch_dataloader(self, batch_size: int = 32, **kwargs: Any) -> Iterator[Any]:
        """:func:`sparktrain.data.make_torch_dataloader` over this dataset (petastorm names accepted)."""
        from sparktrain.data.torch import make_torch_dataloader

        with make_torch_dataloader(self.path, batch_size=batch_size, **self._kwargs(kwargs)) as loader:
            yield loader

    def make_reader(self, batch_size: int = 1024, **kwargs: Any) -> Any:
        """:func:`sparktrain.data.make_reader` over this dataset."""
        from sparktrain.data.reader import make_reader

        return make_reader(self.path, batch_size=batch_size, **self._kwargs(kwargs))

    def delete(self) -> None:
        """Delete the materialized dataset."""
        fs, inner = _fs.resolve(self.path)
        if _fs.info(fs, inner).type != pafs.FileType.NotFound:
            fs.delete_dir(inner)

    def __repr__(self) -> str:
        return f"SparkDatasetConverter(path={self.path!r}, rows={self.dataset_size})"


def make_spark_converter(df: Any, cache_dir: str | None = None, *, dtype: str | None = "float32",
                         row_group_rows: int = 65536, compression: str = "zstd") -> SparkDatasetConverter:
    """Materialize ``df`` once as Parquet (atomically, with a manifest) and wrap it.

    The folder is ``<cache_dir>/sparktrain-<key>``, where the key hashes the
    DataFrame's plan and schema and the write options, so the same
    DataFrame is written once and found again later.  The key does not see
    the *content* of source files: if they change under an unchanged plan,
    call :meth:`SparkDatasetConverter.delete` first.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Data to materialize.
    cache_dir : str, optional
        Parent folder (URI or local path), visible to every executor.  Default:
        the Spark conf ``sparktrain.data.cacheDir``.
    dtype : {"float32", "float64", None}
        Cast floating-point columns, arrays of them and ML vectors (which
        become arrays) to this precision, as petastorm does; None keeps the
        types.
    row_group_rows, compression
        Passed to :func:`sparktrain.data.write_parquet`.

    Returns
    -------
    SparkDatasetConverter
    """
    if cache_dir is None:
        cache_dir = df.sparkSession.conf.get(CACHE_DIR_CONF, None)
        if not cache_dir:
            raise ConfigError("cache_dir", None, f"pass cache_dir='file:///shared/dir' or set the Spark conf "
                                                 f"{CACHE_DIR_CONF}")
    df = _to_float_precision(df, dtype)
    key = _plan_key(df, f"{row_group_rows}|{compression}")
    path = cache_dir.rstrip("/") + f"/sparktrain-{key}"
    manifest = read_manifest(path)
    if manifest is not None:
        log.info("make_spark_converter: reusing %s (%d rows)", path, manifest["num_rows"])
        return SparkDatasetConverter(path, manifest)
    fs, inner = _fs.resolve(path)
    # A folder without a manifest is left over from something else: replace it.  Its name
    # (sparktrain-<hash of the plan>) is one only this function makes, hence owned=None.
    overwrite = _fs.info(fs, inner).type != pafs.FileType.NotFound
    try:
        with atomic_dir(path, overwrite=overwrite, owned=None) as staging:
            write_parquet(df, staging, row_group_rows, compression,
                          extra={"source": "make_spark_converter", "plan_key": key})
    except DatasetExistsError:
        log.info("make_spark_converter: another writer materialized %s first; using it", path)
    manifest = read_manifest(path)
    if manifest is None:
        raise DataError(f"'{path}' has no manifest after it was written. Check that cache_dir='{cache_dir}' is "
                        f"writable and the same filesystem for Spark and this process.")
    return SparkDatasetConverter(path, manifest)
