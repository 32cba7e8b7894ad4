"""Job config: YAML (``yaml.safe_load`` only) into frozen dataclasses.

The whole file is validated before any Spark work.  Every error names the
dotted key path, the value received and the fix; an unknown key gets a
"did you mean" suggestion::

    >>> from sparktrain.config import load_config
    >>> cfg = load_config("conf/job.yaml", overrides=["train.epochs=2"])
    >>> cfg.train.epochs
    2
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import yaml

from sparktrain._internal.typed_build import build, non_default_repr, require, to_dict
from sparktrain.errors import ConfigError, UnknownKeyError
from sparktrain.features.spec import FeatureSpec, parse_features


@dataclass(frozen=True)
class SparkConfig:
    """Where Spark runs. ``master`` is ignored when a session is already active."""

    master: str = "local[*]"
    app_name: str = "sparktrain"
    conf: Dict[str, str] = field(default_factory=dict)

    __repr__ = non_default_repr


@dataclass(frozen=True)
class DataConfig:
    """The raw input and its label: exactly one of ``source``, ``table`` or ``query``.

    ``source`` is a path read with Spark's ``format`` reader and ``options``
    (CSV defaults to ``header: true`` and ``inferSchema: true``), or the name
    of an embedded dataset (:data:`sparktrain.datasets.EMBEDDED`).  ``table``
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
        from sparktrain.datasets import EMBEDDED
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
        if self.scale > 1:
            require(self.source in EMBEDDED, "data.scale", self.scale,
                    f"only an embedded dataset ({', '.join(sorted(EMBEDDED))}) can be replicated; "
                    f"set data.scale: 1 for data.{next(iter(given), 'source')}")
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
    ``path`` defaults to ``work/<job name>/dataset`` (filled in by :class:`JobConfig`).
    """

    path: str = ""
    row_group_rows: int = 65_536
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    overwrite: bool = True

    def __post_init__(self) -> None:
        require(self.row_group_rows >= 1024, "output.row_group_rows", self.row_group_rows,
                "must be >= 1024; tiny row groups make streaming slow")

    __repr__ = non_default_repr


@dataclass(frozen=True)
class TrainConfig:
    """Distributed training knobs.

    The single source of training defaults: the estimators' Params take
    their defaults from these fields (``sparktrain.train.params.PARAM_FIELDS``
    maps each Param to its field).
    """

    framework: Literal["torch", "keras"] = "torch"
    backend: Literal["auto", "ddp", "gloo", "mwms", "horovod"] = "auto"
    num_workers: int = 2
    epochs: int = 3
    batch_size: int = 512
    learning_rate: float = 1e-3
    hidden_units: Tuple[int, ...] = (64, 64)
    embedding_dim: int = 8
    dropout: float = 0.0
    task: Literal["auto", "binary", "multiclass", "regression"] = "auto"
    store: str = "work/store"
    shuffle_buffer: int = 8192
    seed: int = 42
    use_gpu: bool = False
    validation_fraction: float = 0.1
    log_every_steps: int = 50
    log_every_s: float = 30.0
    checkpoint_every_steps: Optional[int] = None
    checkpoint_every_s: Optional[float] = 30.0
    keep_checkpoints: int = 2
    stall_timeout_s: float = 600.0
    elastic: bool = False
    min_workers: Optional[int] = None
    elastic_batch: Literal["global", "per_rank"] = "global"
    max_classes: int = 1000
    compare_baseline: bool = True

    def __post_init__(self) -> None:
        require(self.num_workers >= 1, "train.num_workers", self.num_workers, "must be >= 1")
        require(self.epochs >= 1, "train.epochs", self.epochs, "must be >= 1")
        require(self.batch_size >= 1, "train.batch_size", self.batch_size, "must be >= 1")
        require(self.learning_rate > 0, "train.learning_rate", self.learning_rate, "must be > 0, e.g. 0.001")
        require(0.0 <= self.dropout < 1.0, "train.dropout", self.dropout, "must be in [0, 1)")
        require(self.embedding_dim >= 1, "train.embedding_dim", self.embedding_dim, "must be >= 1")
        require(self.shuffle_buffer >= 1, "train.shuffle_buffer", self.shuffle_buffer, "must be >= 1")
        require(0.0 <= self.validation_fraction < 1.0, "train.validation_fraction", self.validation_fraction,
                "must be in [0, 1): the share of a DataFrame input held out for validation")
        require(self.log_every_steps >= 1, "train.log_every_steps", self.log_every_steps, "must be >= 1")
        require(self.log_every_s >= 0, "train.log_every_s", self.log_every_s,
                "must be >= 0 seconds between progress log lines (0: every step report)")
        if self.checkpoint_every_steps is not None:
            require(self.checkpoint_every_steps >= 1, "train.checkpoint_every_steps", self.checkpoint_every_steps,
                    "must be >= 1 (steps between mid-epoch checkpoints), or null for none")
        if self.checkpoint_every_s is not None:
            require(self.checkpoint_every_s > 0, "train.checkpoint_every_s", self.checkpoint_every_s,
                    "must be > 0 seconds, or null for none")
        require(self.keep_checkpoints >= 1, "train.keep_checkpoints", self.keep_checkpoints,
                "must be >= 1 (the newest checkpoints kept, besides the best)")
        require(self.stall_timeout_s > 0, "train.stall_timeout_s", self.stall_timeout_s,
                "must be > 0 seconds (e.g. 600): how long a rank may make no progress")
        require(self.max_classes >= 2, "train.max_classes", self.max_classes,
                "must be >= 2: the most classes a label may have (preprocess refuses more)")
        if self.min_workers is not None:
            require(1 <= self.min_workers <= self.num_workers, "train.min_workers", self.min_workers,
                    f"must be in [1, num_workers = {self.num_workers}]")
        if self.framework == "keras":
            require(self.backend in ("auto", "gloo", "mwms"), "train.backend", self.backend,
                    "Keras all-reduces its gradients with 'gloo' (default) or under MultiWorkerMirroredStrategy "
                    "('mwms'); Horovod with Keras 3 does not average gradients. Use backend: gloo, or framework: "
                    "torch for horovod/ddp")
        else:
            require(self.backend in ("auto", "ddp", "horovod"), "train.backend", self.backend,
                    "torch trains with 'ddp' or 'horovod'")

    __repr__ = non_default_repr


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow: a local sqlite store by default, or any tracking URI.

    ``experiment`` and ``model_name`` default to the job's ``name`` (filled in
    by :class:`JobConfig`).
    """

    enabled: bool = True
    uri: str = "sqlite:///work/mlflow.db"
    artifact_location: str = "work/mlartifacts"
    experiment: str = ""
    model_name: str = ""
    register: bool = True

    __repr__ = non_default_repr


@dataclass(frozen=True)
class TuneConfig:
    """Hyperopt search. ``space`` maps a ``train.*`` key to a distribution."""

    mode: Literal["single", "distributed"] = "single"
    max_trials: int = 8
    parallelism: int = 2
    early_stop_trials: Optional[int] = None
    trial_timeout_s: Optional[float] = None
    algo: Literal["tpe", "random"] = "tpe"
    metric: str = "val_loss"
    space: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.max_trials >= 1, "tune.max_trials", self.max_trials, "must be >= 1")
        require(self.parallelism >= 1, "tune.parallelism", self.parallelism, "must be >= 1")
        if self.early_stop_trials is not None:
            require(self.early_stop_trials >= 1, "tune.early_stop_trials", self.early_stop_trials, "must be >= 1")
        if self.trial_timeout_s is not None:
            require(self.trial_timeout_s > 0, "tune.trial_timeout_s", self.trial_timeout_s, "must be > 0 seconds")
        require(bool(self.space), "tune.space", self.space,
                "give at least one parameter, e.g. {learning_rate: {loguniform: [1.0e-4, 1.0e-2]}}")

    __repr__ = non_default_repr


@dataclass(frozen=True)
class JobConfig:
    """A whole job: data -> features -> split/output -> train -> tune -> tracking."""

    name: str = "sparktrain-job"
    spark: SparkConfig = field(default_factory=SparkConfig)
    data: DataConfig = field(default_factory=DataConfig)
    features: Tuple[FeatureSpec, ...] = ()
    split: SplitConfig = field(default_factory=SplitConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    train: Optional[TrainConfig] = None
    tune: Optional[TuneConfig] = None
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    source_path: Optional[str] = None

    def __post_init__(self) -> None:
        # defaults that follow the job's name, resolved once (so to_dict/flatten show the real values)
        require(bool(self.name.strip()) and "/" not in self.name and "\\" not in self.name, "name", self.name,
                "give the job a name without slashes, e.g. name: house-prices (it names work/<name>/ and MLflow)")
        if not self.output.path:
            object.__setattr__(self, "output", replace(self.output, path=f"work/{self.name}/dataset"))
        if not self.tracking.experiment or not self.tracking.model_name:
            tracking = replace(self.tracking, experiment=self.tracking.experiment or self.name,
                               model_name=self.tracking.model_name or self.name)
            object.__setattr__(self, "tracking", tracking)

    __repr__ = non_default_repr

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict (YAML round-trippable), without ``source_path``."""
        out = to_dict(self)
        out.pop("source_path", None)
        return out

    def with_train(self, **changes: Any) -> "JobConfig":
        """A copy with some ``train`` fields replaced (used by tuning)."""
        return replace(self, train=replace(self.train or TrainConfig(), **changes))


_SECTIONS = {"name", "spark", "data", "features", "split", "output", "train", "tune", "tracking"}


def parse_config(raw: Any, source_path: Optional[str] = None) -> JobConfig:
    """Validate a plain dict (as from YAML) into a :class:`JobConfig`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("<root>", raw, "a job config is a YAML mapping with sections like data:, features:")
    raw = dict(raw)
    unknown = [k for k in raw if k not in _SECTIONS]  # source_path is set here, never by the file
    if unknown:
        raise UnknownKeyError(str(unknown[0]), raw[unknown[0]], _SECTIONS)
    features = parse_features(raw.pop("features", None))
    cfg = build(JobConfig, raw, "")
    cfg = replace(cfg, features=features, source_path=source_path)
    _cross_check(cfg)
    return cfg


def load_config(path: Union[str, os.PathLike], overrides: Sequence[str] = ()) -> JobConfig:
    """Read a YAML job config with ``yaml.safe_load`` and apply ``key.path=value`` overrides.

    Parameters
    ----------
    path : str or PathLike
        The YAML file.
    overrides : sequence of str
        ``--set`` style overrides; the value is parsed as YAML (``train.epochs=2``,
        ``train.hidden_units=[32,32]``).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("<file>", str(path), "no such config file; pass a path like conf/job.yaml")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("<file>", str(path), f"not valid YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError("<root>", raw, f"{path} must be a YAML mapping with sections like data:, features:")
    raw = apply_overrides(raw, overrides)
    return parse_config(raw, source_path=str(p))


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """Return a deep copy of ``raw`` with each ``a.b.c=value`` applied.

    A list of named mappings (``features``) is addressed by name, as
    :func:`flatten` writes it: ``features.price.log1p=false``.  Under
    ``spark.conf.`` the rest is one Spark key: ``spark.conf.spark.sql.shuffle.partitions=8``.
    """
    out: Dict[str, Any] = copy.deepcopy(dict(raw))
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "use key.path=value, e.g. --set train.epochs=2")
        key, _, text = item.partition("=")
        parts = key.strip().split(".")
        if parts[:2] == ["spark", "conf"] and len(parts) > 3:  # Spark keys contain dots themselves
            parts = ["spark", "conf", ".".join(parts[2:])]
        if parts[0] not in _SECTIONS:
            raise UnknownKeyError(parts[0], item, _SECTIONS)
        node = out
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):  # e.g. features: pick the item by name
                named = [x for x in node if isinstance(x, dict) and x.get("name") == part]
                if not named:
                    names = [x.get("name") for x in node if isinstance(x, dict)]
                    raise UnknownKeyError(".".join(parts[:i + 1]), item, [str(n) for n in names])
                node = named[0]
                continue
            nxt: Any = node.get(part)
            if not isinstance(nxt, (dict, list)):
                nxt = {}
                node[part] = nxt
            node = nxt
        if isinstance(node, list):
            raise ConfigError(key, text, "address one item by name, e.g. --set features.price.log1p=false")
        try:
            node[parts[-1]] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(key, text, f"value is not valid YAML: {exc}") from exc
    return out


def _cross_check(cfg: JobConfig) -> None:
    names = [f.name for f in cfg.features]
    if cfg.data.label in names:
        raise ConfigError("data.label", cfg.data.label, "the label cannot also be a feature; remove it from features")
    if cfg.data.key is not None and cfg.data.key == cfg.data.label:
        raise ConfigError("data.key", cfg.data.key, "the key cannot also be the label; name the row id column, or "
                                                    "leave data.key out to split by a hash of all columns")
    if cfg.tune is not None and cfg.train is None:
        raise ConfigError("tune", "...", "tuning needs a train: section to start from")


def flatten(d: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Flatten nested dicts into ``a.b.c`` keys (lists become their YAML text)."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, Mapping) and "name" in x for x in v):
            for item in v:
                out.update(flatten({kk: vv for kk, vv in item.items() if kk != "name"}, f"{key}.{item['name']}."))
        elif isinstance(v, (list, tuple)):
            out[key] = yaml.safe_dump(list(v), default_flow_style=True, width=1 << 16).strip()
        else:
            out[key] = v
    return out


__all__ = ["JobConfig", "SparkConfig", "DataConfig", "SplitConfig", "OutputConfig", "TrainConfig",
           "TrackingConfig", "TuneConfig", "load_config", "parse_config", "apply_overrides", "flatten", "List"]
