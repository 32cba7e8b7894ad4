"""The ``data:``, ``split:`` and ``output:`` sections of a job config: what preprocessing reads.

They live in the features layer, below :mod:`sparktrain.config`, so that
:mod:`sparktrain.features.load` and :mod:`sparktrain.features.materialize`
take them typed without importing the whole job config;
:mod:`sparktrain.config` re-exports them (``from sparktrain.config import
DataConfig`` works).  :class:`PreprocessConfig` is the part of a job config
preprocessing reads; :class:`sparktrain.config.JobConfig` is one.

Which names ``data.source`` may give instead of a path (embedded datasets)
is not known here: whoever loads the input passes them
(:func:`sparktrain.features.load.load_input`'s ``embedded``), and the job
checks ``data.scale`` against them (:func:`sparktrain.job.check_scale`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional, Protocol, Tuple

from sparktrain._internal.typed_build import non_default_repr, require
from sparktrain.data.guard import TrackingPaths
from sparktrain.errors import ConfigError
from sparktrain.features.spec import FeatureSpec


@dataclass(frozen=True)
class DataConfig:
    """The raw input and its label: exactly one of ``source``, ``table`` or ``query``.

    ``source`` is a path read with Spark's ``format`` reader and ``options``
    (CSV defaults to ``header: true`` and ``inferSchema: true``), or the name
    of an embedded dataset (the job knows :data:`sparktrain.datasets.EMBEDDED`;
    only such a dataset can be replicated with ``scale`` > 1).  ``table``
    is a catalog table or view; ``query`` is Spark SQL over the tables and
    views the session knows.  ``key`` is optional: without it the split hashes
    every column the job reads (:func:`sparktrain.features.materialize.split_expression`).
    Rows with a null label are dropped (and counted in the log) unless
    ``drop_null_labels`` is false, in which case they are refused.

    Examples
    --------
    >>> DataConfig(source="data/houses.csv", format="csv", options={"nullValue": "NA"}, label="price")
    DataConfig(source='data/houses.csv', format='csv', options={'nullValue': 'NA'}, label='price')
    """

    source: Optional[str] = None
    table: Optional[str] = None
    query: Optional[str] = None
    format: Literal["parquet", "csv", "json", "orc"] = "parquet"
    options: Dict[str, Any] = field(default_factory=dict)
    scale: int = 1
    label: str = "label"
    key: Optional[str] = None
    drop_null_labels: bool = True

    def __post_init__(self) -> None:
        from sparktrain.features.reader_options import check_reader_options

        given = {k: getattr(self, k) for k in INPUT_KEYS if getattr(self, k) is not None}
        if len(given) > 1:
            raise ConfigError("data", given, f"set exactly one of {', '.join('data.' + k for k in INPUT_KEYS)}; "
                                             f"remove {' or '.join('data.' + k for k in list(given)[1:])}")
        for k, v in given.items():
            require(bool(str(v).strip()), f"data.{k}", v, "must not be empty")
        require(bool(self.label.strip()), "data.label", self.label, "name the label column, e.g. label: price")
        if self.key is not None:
            require(bool(self.key.strip()), "data.key", self.key,
                    "name a column that identifies a row, or leave data.key out to split by a hash of all columns")
        require(self.scale >= 1, "data.scale", self.scale, "must be >= 1 (1 is the data as it is)")
        if self.options and self.source is None:
            key = next(iter(given), "source")
            raise ConfigError("data.options", self.options,
                              f"reader options apply to files read from data.source; data.{key} is read as the "
                              f"catalog defines it. Remove data.options")
        check_reader_options(self.format, self.options)

    def require_input(self) -> None:
        """Raise :class:`ConfigError` (naming ``data.source`` and the fix) when no input is set."""
        if all(getattr(self, k) is None for k in INPUT_KEYS):
            raise ConfigError("data.source", None,
                              "no input data: set data.source to a path (with data.format: parquet, csv, json or "
                              "orc) or an embedded dataset name, data.table to a catalog table, or data.query to "
                              "Spark SQL, e.g. data: {source: data/houses.csv, format: csv, label: price}")

    @property
    def input_kind(self) -> Optional[str]:
        """``"source"``, ``"table"``, ``"query"``, or None when nothing is set."""
        return next((k for k in INPUT_KEYS if getattr(self, k) is not None), None)

    def describe(self) -> str:
        """The input in words, for logs and reports (the path, ``table db.t``, ``query SELECT ...``)."""
        kind = self.input_kind
        if kind is None:
            return "<no input>"
        if kind == "source":
            return str(self.source)
        if kind == "query":
            text = " ".join(str(self.query).split())
            return f"query {text[:60] + '...' if len(text) > 60 else text}"
        return f"{kind} {getattr(self, kind)}"

    __repr__ = non_default_repr


INPUT_KEYS = ("source", "table", "query")


@dataclass(frozen=True)
class SplitConfig:
    """Deterministic train/validation/test split by a hash of ``data.key`` (or of every column read, keyless)."""

    train: float = 0.8
    validation: float = 0.1
    test: float = 0.1
    seed: int = 42

    def __post_init__(self) -> None:
        total = self.train + self.validation + self.test
        require(abs(total - 1.0) < 1e-6, "split", {"train": self.train, "validation": self.validation,
                                                   "test": self.test}, f"fractions must add up to 1 (got {total:g})")
        for name in ("train", "validation", "test"):
            require(0.0 <= getattr(self, name) <= 1.0, f"split.{name}", getattr(self, name), "must be in [0, 1]")
        require(self.train > 0, "split.train", self.train, "must be > 0")

    __repr__ = non_default_repr


@dataclass(frozen=True)
class OutputConfig:
    """Where materialized Parquet goes, and how it is laid out.

    ``row_group_rows`` defaults to 64k rows: about 2-8 MB of flat float32
    columns, small enough that a reader prefetching a few row groups stays in
    tens of MB and large enough to amortize Parquet's per-group overhead.
    ``path`` defaults to ``work/<job name>/dataset`` (filled in by :class:`~sparktrain.config.JobConfig`).
    """

    path: str = ""
    row_group_rows: int = 65_536
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    overwrite: bool = True

    def __post_init__(self) -> None:
        require(self.row_group_rows >= 1024, "output.row_group_rows", self.row_group_rows,
                "must be >= 1024; tiny row groups make streaming slow")

    __repr__ = non_default_repr


class TrainSettings(Protocol):
    """What preprocessing reads of a ``train:`` section (:class:`sparktrain.config.TrainConfig` is one)."""

    @property
    def task(self) -> str: ...

    @property
    def max_classes(self) -> int: ...

    @property
    def store(self) -> str: ...


TrackingSettings = TrackingPaths  # what the output checks read of a ``tracking:`` section


class PreprocessConfig(Protocol):
    """The part of a job config that preprocessing reads (:class:`sparktrain.config.JobConfig` is one)."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def features(self) -> Tuple[FeatureSpec, ...]: ...

    @property
    def split(self) -> SplitConfig: ...

    @property
    def output(self) -> OutputConfig: ...

    @property
    def train(self) -> Optional[TrainSettings]: ...

    @property
    def tracking(self) -> TrackingSettings: ...


__all__ = ["INPUT_KEYS", "DataConfig", "OutputConfig", "PreprocessConfig", "SplitConfig", "TrackingSettings",
           "TrainSettings"]
