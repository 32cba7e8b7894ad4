"""Job config: YAML (``yaml.safe_load`` only) into frozen dataclasses.

The whole file is validated before any Spark work.  Every error names the
dotted key path, the value received and the fix; an unknown key gets a
"did you mean" suggestion.  The ``data:``, ``split:`` and ``output:``
sections are declared in :mod:`sparktrain.features.sections` (preprocessing
reads them) and re-exported here.  Whether ``data.source`` names an embedded
dataset is the job's to check (:func:`sparktrain.job.check_scale`)::

    >>> from sparktrain.config import load_config
    >>> cfg = load_config("conf/job.yaml", overrides=["train.epochs=2"])
    >>> cfg.train.epochs
    2
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import yaml

from sparktrain._internal.secrets import mask_value, remember, secrets_of
from sparktrain._internal.typed_build import build, non_default_repr, require, to_dict
from sparktrain.errors import ConfigError, UnknownKeyError
from sparktrain.features.sections import DataConfig, OutputConfig, SplitConfig
from sparktrain.features.spec import FeatureSpec, parse_features
from sparktrain.settings import SETTINGS, check_together, check_value


@dataclass(frozen=True)
class SparkConfig:
    """Where Spark runs. ``master`` is ignored when a session is already active."""

    master: str = "local[*]"
    app_name: str = "sparktrain"
    conf: Dict[str, str] = field(default_factory=dict)

    __repr__ = non_default_repr


@dataclass(frozen=True)
class TrainConfig:
    """Distributed training knobs: the ``train:`` section.

    Each field is declared once, with its default, doc, check and group, in
    :mod:`sparktrain.settings`; the fields are spelled out here for type
    checkers, and ``tests/test_settings.py`` holds them to that table.  The
    estimators' Params come from the same table.
    """

    framework: str = "torch"
    backend: str = "auto"
    num_workers: int = 2
    gpus_per_worker: int = 0
    epochs: int = 3
    batch_size: int = 512
    accumulate_steps: int = 1
    learning_rate: float = 1e-3
    precision: str = "fp32"
    hidden_units: Tuple[int, ...] = (64, 64)
    embedding_dim: int = 8
    dropout: float = 0.0
    task: str = "auto"
    store: str = "work/store"
    shuffle_buffer: int = 8192
    seed: int = 42
    validation_fraction: float = 0.1
    log_every_steps: int = 50
    log_every_s: float = 30.0
    checkpoint_every_steps: Optional[int] = None
    checkpoint_every_s: Optional[float] = 30.0
    keep_checkpoints: int = 2
    stall_timeout_s: float = 600.0
    elastic: bool = False
    min_workers: Optional[int] = None
    elastic_batch: str = "global"
    max_classes: int = 1000
    compare_baseline: bool = True

    def __post_init__(self) -> None:
        values = {k: getattr(self, k) for k in SETTINGS}
        for key, setting in SETTINGS.items():
            check_value(setting, values[key], f"train.{key}")
        check_together(values, self.framework, lambda key: f"train.{key}")

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


#: search engines, samplers and pruners of ``tune:`` (docs/tuning.md says when to pick which)
TUNE_ENGINES: Tuple[str, ...] = ("hyperopt", "optuna")
TUNE_SAMPLERS: Tuple[str, ...] = ("tpe", "random", "cmaes")
TUNE_PRUNERS: Tuple[str, ...] = ("none", "median", "asha", "hyperband")


@dataclass(frozen=True)
class TuneConfig:
    """Hyperparameter search (Hyperopt or Optuna). ``space`` maps a ``train.*`` key to a distribution.

    ``sampler`` is the suggestion algorithm (``algo`` is its older name and
    the default when ``sampler`` is not given); ``pruner`` stops trials whose
    per-epoch ``metric`` falls behind (Optuna only).  ``sampler_options`` are
    the sampler's own keyword arguments (numbers, booleans, strings), e.g.
    ``{n_startup_jobs: 5}`` for Hyperopt's TPE or ``{n_startup_trials: 5}``
    for Optuna's; the search checks their names.  ``study`` and ``storage``
    name the Optuna study and where it persists (default: a journal file
    under ``train.store``), so a restarted search continues it.

    Besides ``max_trials``, three criteria stop launching trials (running ones
    finish): ``early_stop_trials`` finished trials in a row without a new best,
    ``time_budget_s`` seconds since the search started, and ``stop_at``, a
    finished trial's ``metric`` at or beyond that value (at or below it for a
    minimized metric, at or above it for a maximized one).
    """

    mode: Literal["single", "distributed"] = "single"
    max_trials: int = 8
    parallelism: int = 2
    early_stop_trials: Optional[int] = None
    trial_timeout_s: Optional[float] = None
    time_budget_s: Optional[float] = None
    stop_at: Optional[float] = None
    algo: Literal["tpe", "random"] = "tpe"
    metric: str = "val_loss"
    space: Dict[str, Any] = field(default_factory=dict)
    engine: Literal["hyperopt", "optuna"] = "hyperopt"
    sampler: Optional[Literal["tpe", "random", "cmaes"]] = None
    sampler_options: Dict[str, Any] = field(default_factory=dict)
    pruner: Literal["none", "median", "asha", "hyperband"] = "none"
    pruner_min_epochs: int = 1
    reduction_factor: int = 3
    pruner_startup_trials: int = 2
    study: Optional[str] = None
    storage: Optional[str] = None

    @property
    def effective_sampler(self) -> str:
        """The sampler in use: ``sampler``, else ``algo``."""
        return self.sampler if self.sampler is not None else self.algo

    def __post_init__(self) -> None:
        require(self.engine in TUNE_ENGINES, "tune.engine", self.engine,
                f"must be one of {', '.join(TUNE_ENGINES)}")
        require(self.sampler is None or self.sampler in TUNE_SAMPLERS, "tune.sampler", self.sampler,
                f"must be one of {', '.join(TUNE_SAMPLERS)}")
        require(self.pruner in TUNE_PRUNERS, "tune.pruner", self.pruner, f"must be one of {', '.join(TUNE_PRUNERS)}")
        require(self.algo in ("tpe", "random"), "tune.algo", self.algo, "must be one of tpe, random (or set "
                "tune.sampler, which also takes cmaes with tune.engine: optuna)")
        require(self.sampler is None or self.algo == "tpe" or self.sampler == self.algo, "tune.sampler",
                self.sampler, f"tune.algo = {self.algo!r} says otherwise; set only tune.sampler (algo is its "
                "older name)")
        require(isinstance(self.sampler_options, dict), "tune.sampler_options", self.sampler_options,
                "must be a mapping of the sampler's keyword arguments, e.g. {n_startup_trials: 5}")
        for key, value in self.sampler_options.items():
            require(isinstance(value, (bool, int, float, str)) and not (isinstance(value, float)
                    and not math.isfinite(value)), f"tune.sampler_options.{key}", value,
                    "must be a finite number, a boolean or a string (the sampler's own objects are not settable "
                    "from a config)")
        if self.engine == "hyperopt":
            require(self.effective_sampler != "cmaes", "tune.sampler", self.sampler,
                    "Hyperopt has no CMA-ES; use tpe or random, or set tune.engine: optuna")
            require(self.pruner == "none", "tune.pruner", self.pruner,
                    "Hyperopt cannot stop a trial early; set tune.engine: optuna to prune, or tune.pruner: none")
            for key in ("study", "storage"):
                require(getattr(self, key) is None, f"tune.{key}", mask_value(str(getattr(self, key))),
                        "only an Optuna search keeps a study (Hyperopt's trials live for one search); set "
                        f"tune.engine: optuna to continue it, or leave tune.{key} out")
        require(self.pruner_min_epochs >= 1, "tune.pruner_min_epochs", self.pruner_min_epochs, "must be >= 1")
        require(self.reduction_factor >= 2, "tune.reduction_factor", self.reduction_factor, "must be >= 2")
        require(self.pruner_startup_trials >= 0, "tune.pruner_startup_trials", self.pruner_startup_trials,
                "must be >= 0")
        if self.study is not None:
            require(bool(self.study.strip()), "tune.study", self.study, "give the study a name, or leave it out")
        require(self.max_trials >= 1, "tune.max_trials", self.max_trials, "must be >= 1")
        require(self.parallelism >= 1, "tune.parallelism", self.parallelism, "must be >= 1")
        if self.early_stop_trials is not None:
            require(self.early_stop_trials >= 1, "tune.early_stop_trials", self.early_stop_trials, "must be >= 1")
        if self.trial_timeout_s is not None:
            require(self.trial_timeout_s > 0, "tune.trial_timeout_s", self.trial_timeout_s, "must be > 0 seconds")
        if self.time_budget_s is not None:
            require(self.time_budget_s > 0, "tune.time_budget_s", self.time_budget_s,
                    "must be > 0 seconds (leave it out for no time limit)")
        if self.stop_at is not None:
            require(isinstance(self.stop_at, (int, float)) and not isinstance(self.stop_at, bool)
                    and math.isfinite(self.stop_at), "tune.stop_at", self.stop_at,
                    "must be a finite number: the value of tune.metric at which the search stops")
            leaf = self.metric.rsplit("_", 1)[-1]
            share = leaf in ("accuracy", "auc")
            unreachable = (share and not 0 <= self.stop_at <= 1) or \
                (leaf in ("loss", "rmse") and self.metric.startswith(("val_", "train_")) and self.stop_at < 0)
            require(not unreachable, "tune.stop_at", self.stop_at,
                    f"{self.metric} never reaches it ({'a share, in [0, 1]' if share else 'never below 0'}), so "
                    f"the search would never stop there; give a value {self.metric} can take")
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
    remember(secrets_of(flatten(cfg.to_dict())))  # masked wherever this process records or logs them
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
           "TrackingConfig", "TuneConfig", "TUNE_ENGINES", "TUNE_SAMPLERS", "TUNE_PRUNERS", "load_config",
           "parse_config", "apply_overrides", "flatten", "List"]
