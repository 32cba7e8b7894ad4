"""Every training setting, declared once.

One :class:`Setting` per knob: its ``train:`` YAML key (snake_case), its
Spark ML Param name (camelCase), type, default, doc, check and group.  From
this table come

- the estimators' Params, getters and setters (:mod:`sparktrain.train.params`),
- the Param <-> YAML key map (:data:`PARAM_OF`, :data:`KEY_OF`),
- the defaults and checks of :class:`sparktrain.config.TrainConfig` (its
  fields are spelled out for type checkers and IDEs; a test holds them to
  this table),
- the executor specs: each ``group`` is one frozen spec of
  :mod:`sparktrain.train._executor.spec` (``scaling``, ``optim``, ``model``,
  ``checkpoint``, ``failure``, ``logging``), after Ray's
  ``ScalingConfig``/``CheckpointConfig``/``FailureConfig``.  ``driver``
  settings never reach an executor; ``job`` settings exist only in YAML.

A bad value is refused with the same fix on both paths; each path names the
key its user wrote (``train.num_workers`` or ``numWorkers``)::

    >>> check_value(SETTINGS["num_workers"], 0, "numWorkers")
    Traceback (most recent call last):
    ...
    sparktrain.errors.ConfigError: parameter 'numWorkers' = 0: must be >= 1

(the choices of a ``str`` setting are checked here too, not by a ``Literal`` type, so that both paths
share the message).

To add a setting: one entry here, the field in ``TrainConfig`` (and in its
group's executor spec when executors read it), the keyword in the
estimators' signatures.  ``tests/test_settings.py`` fails until all agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from sparktrain.errors import ConfigError

Check = Callable[[Any], Optional[str]]  # returns the fix when the value is bad, else None

#: groups whose settings travel to the executors (one frozen spec each)
EXECUTOR_GROUPS = ("scaling", "optim", "model", "checkpoint", "failure", "logging")
GROUPS = (*EXECUTOR_GROUPS, "driver", "job")


@dataclass(frozen=True)
class Setting:
    """One training setting.

    Parameters
    ----------
    key : str
        ``train:`` YAML key and executor spec field (snake_case).
    param : str or None
        Spark ML Param name (camelCase); None for YAML-only (``job``) settings.
    kind : str
        ``int``, ``float``, ``bool``, ``str`` or ``ints`` (a list of ints).
    default : object
        The default on both paths.
    doc : str
        One line for the Param's doc and the YAML reference.
    group : str
        One of :data:`GROUPS`.
    check : callable, optional
        ``check(value) -> fix or None``; None values of an ``optional`` setting are not checked.
    optional : bool
        Whether None (YAML ``null``) is allowed.
    choices : tuple of str
        The allowed values of a ``str`` setting.
    """

    key: str
    param: Optional[str]
    kind: str
    default: Any
    doc: str
    group: str
    check: Optional[Check] = None
    optional: bool = False
    choices: Tuple[str, ...] = ()

    def fix_for(self, value: Any) -> Optional[str]:
        """What to do instead of ``value`` (None when it is fine)."""
        if value is None:
            return None if self.optional else "a value is required"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}"
        if self.kind == "float" and isinstance(value, float) and math.isinf(value):  # NaN: each check's own words
            return "must be a finite number" + (" (null for none)" if self.optional else "")
        return self.check(value) if self.check is not None else None


def at_least(n: int, unit: str = "") -> Check:
    return lambda v: None if v >= n else f"must be >= {n}{unit}"


def above(n: float, unit: str = "") -> Check:
    return lambda v: None if v > n else f"must be > {n:g}{unit}"


def in_unit_interval(what: str = "") -> Check:
    return lambda v: None if 0.0 <= v < 1.0 else f"must be in [0, 1){what}"


def _widths(v: Any) -> Optional[str]:
    if not v or any(x < 1 for x in v):
        return "give one or more layer widths >= 1, e.g. [64, 64]"
    return None


_S = Setting
_TABLE: Tuple[Setting, ...] = (
    # scaling: how many ranks, on what, talking how
    _S("num_workers", "numWorkers", "int", 2, "number of barrier tasks (ranks)", "scaling", at_least(1)),
    _S("backend", "backend", "str", "auto", "auto | ddp | horovod (torch); auto | gloo | mwms (Keras)", "scaling",
       choices=("auto", "ddp", "gloo", "horovod", "mwms")),
    _S("gpus_per_worker", "gpusPerWorker", "int", 0,
       "GPUs each rank requests (a Spark task resource; 0: train on CPU)", "scaling",
       at_least(0, " (0 trains on CPU)")),
    # optim: what one optimizer step is
    _S("epochs", "epochs", "int", 3, "passes over the training data", "optim", at_least(1)),
    _S("batch_size", "batchSize", "int", 512, "rows per micro-batch per worker", "optim", at_least(1)),
    _S("accumulate_steps", "accumulateSteps", "int", 1,
       "micro-batches whose gradients make one optimizer step (effective batch = k x batchSize)", "optim",
       at_least(1, " (1: no accumulation)")),
    _S("learning_rate", "learningRate", "float", 1e-3, "optimizer learning rate", "optim",
       above(0, ", e.g. 0.001")),
    _S("precision", "precision", "str", "fp32", "fp32 | bf16 | fp16 (mixed precision; fp16 loss-scaled on CUDA)",
       "optim", choices=("fp32", "bf16", "fp16")),
    _S("seed", "seed", "int", 42, "random seed (weights, shuffle, split of a DataFrame input)", "optim"),
    _S("shuffle_buffer", "shuffleBuffer", "int", 8192, "row-level shuffle buffer size", "optim", at_least(1)),
    # model: the default network
    _S("hidden_units", "hiddenUnits", "ints", (64, 64), "widths of the MLP's hidden layers", "model", _widths),
    _S("embedding_dim", "embeddingDim", "int", 8, "max embedding width per categorical", "model", at_least(1)),
    _S("dropout", "dropout", "float", 0.0, "dropout after each hidden layer", "model", in_unit_interval()),
    # checkpoint
    _S("checkpoint_every_steps", "checkpointEverySteps", "int", None,
       "mid-epoch checkpoint every N optimizer steps (None: by time only)", "checkpoint",
       at_least(1, " (steps between mid-epoch checkpoints), or null for none"), optional=True),
    _S("checkpoint_every_s", "checkpointEverySeconds", "float", 30.0,
       "mid-epoch checkpoint when this many seconds passed since the last one (None: by steps only)",
       "checkpoint", above(0, " seconds, or null for none"), optional=True),
    _S("keep_checkpoints", "keepCheckpoints", "int", 2,
       "newest checkpoints kept in the store (the best epoch's is kept too)", "checkpoint",
       at_least(1, " (the newest checkpoints kept, besides the best)")),
    # failure and elasticity
    _S("stall_timeout_s", "stallTimeout", "float", 600.0,
       "seconds a rank may make no progress before the fit fails naming it", "failure",
       above(0, " seconds (e.g. 600): how long a rank may make no progress")),
    _S("elastic", "elastic", "bool", False,
       "after a failure, continue on fewer workers (>= minWorkers) if fewer slots are free", "failure"),
    _S("min_workers", "minWorkers", "int", None, "fewest workers an elastic run continues on (None: numWorkers)",
       "failure", at_least(1), optional=True),
    _S("elastic_batch", "elasticBatch", "str", "global",
       "on a world-size change: 'global' keeps the global batch (per-rank batch = global / workers, same "
       "learning rate); 'per_rank' keeps batchSize and scales the learning rate with the global batch", "failure",
       choices=("global", "per_rank")),
    # logging
    _S("log_every_steps", "logEverySteps", "int", 50, "periodic metrics interval (optimizer steps)", "logging",
       at_least(1)),
    _S("log_every_s", "logEverySeconds", "float", 30.0,
       "seconds between progress log lines when not on a terminal", "logging",
       at_least(0, " seconds between progress log lines (0: every step report)")),
    # driver: read by plan/fit, never by an executor
    _S("task", "task", "str", "auto", "auto | binary | multiclass | regression", "driver",
       choices=("auto", "binary", "multiclass", "regression")),
    _S("store", "store", "str", "work/store", "checkpoint store: local path or pyarrow fs URI", "driver",
       lambda v: None if str(v).strip() else "give a local path or a URI, e.g. work/store or s3://bucket/store"),
    _S("validation_fraction", "validationFraction", "float", 0.1,
       "share of a DataFrame input held out for validation", "driver",
       in_unit_interval(": the share of a DataFrame input held out for validation")),
    # job: YAML only (the estimator class is the framework; preprocess and the job read the rest)
    _S("framework", None, "str", "torch", "torch | keras: which estimator trains", "job", choices=("torch", "keras")),
    _S("max_classes", None, "int", 1000, "the most classes a label may have (preprocess refuses more)", "job",
       at_least(2, ": the most classes a label may have (preprocess refuses more)")),
    _S("compare_baseline", None, "bool", True, "also fit Spark MLlib's baseline on the same splits; the report "
       "hints at too few steps when the network trails it (`train.result.TRAILS`)", "job"),
)

#: every setting by its YAML key, in declaration order
SETTINGS: Dict[str, Setting] = {s.key: s for s in _TABLE}
#: Param name -> YAML key, and back
KEY_OF: Dict[str, str] = {s.param: s.key for s in _TABLE if s.param}
PARAM_OF: Dict[str, str] = {s.key: s.param for s in _TABLE if s.param}


def in_group(group: str) -> List[Setting]:
    """The settings of one group, in declaration order."""
    return [s for s in _TABLE if s.group == group]


def defaults(keys: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Default value of each setting (all, or ``keys``), by YAML key."""
    return {k: SETTINGS[k].default for k in (keys if keys is not None else SETTINGS)}


def check_value(setting: Setting, value: Any, name: str, kind: Optional[str] = None) -> None:
    """Raise :class:`ConfigError` naming ``name`` (the key as the user wrote it; ``kind``: ``"parameter"`` for a
    Param, ``"config key"``...) when ``value`` is bad."""
    fix = setting.fix_for(value)
    if fix is not None:
        raise ConfigError(name, value, fix, kind=kind)


def check_together(values: Mapping[str, Any], framework: str, name: Callable[[str], str],
                   kind: Optional[str] = None) -> None:
    """The rules between settings, the same on both paths; ``name(key)`` is how the caller's user spells a key,
    ``kind`` what it is to them (as :class:`ConfigError` takes it).

    ``values`` holds every setting by YAML key.
    """
    def refuse(key: str, value: Any, fix: str) -> ConfigError:
        return ConfigError(name(key), value, fix, kind=kind)

    workers, least = values["num_workers"], values.get("min_workers")
    if least is not None and not 1 <= least <= workers:
        raise refuse("min_workers", least, f"must be in [1, {name('num_workers')} = {workers}]")
    backend = values["backend"]
    if framework == "keras" and backend not in ("auto", "gloo", "mwms"):
        raise refuse("backend", backend,
                     "Keras all-reduces its gradients with 'gloo' (default) or under MultiWorkerMirroredStrategy "
                     "('mwms'); Horovod with Keras 3 does not average gradients. Use backend: gloo, or framework: "
                     "torch for horovod/ddp")
    if framework == "torch" and backend not in ("auto", "ddp", "horovod"):
        raise refuse("backend", backend, "torch trains with 'ddp' or 'horovod'")
    if values.get("accumulate_steps", 1) > 1 and resolve_backend(framework, backend) in ("horovod", "mwms"):
        raise refuse("accumulate_steps", values["accumulate_steps"],
                     f"gradient accumulation runs under backend ddp (torch) or gloo (Keras), not "
                     f"{backend}; set {name('backend')} to one of those, or {name('accumulate_steps')} to 1")
    if values.get("precision") == "fp16" and values.get("gpus_per_worker", 0) == 0:
        raise refuse("precision", "fp16",
                     f"fp16 is for GPUs (it needs loss scaling); set {name('gpus_per_worker')} >= 1, or use "
                     "bf16 (which also runs on CPU) or fp32")


def reference_table() -> str:
    """The settings as a Markdown table (docs/training.md holds it between ``settings:table`` markers)."""
    rows = ["| YAML `train:` key | Param | default | group | what it does |", "|---|---|---|---|---|"]
    for s in _TABLE:
        default = "null" if s.default is None else (list(s.default) if isinstance(s.default, tuple) else s.default)
        rows.append(f"| `{s.key}` | {f'`{s.param}`' if s.param else '(YAML only)'} | `{default}` | {s.group} | "
                    f"{s.doc.replace('|', '/')} |")
    return "\n".join(rows)


def resolve_backend(framework: str, backend: str) -> str:
    """The backend ``auto`` stands for: gloo for Keras, ddp for torch."""
    if backend != "auto":
        return backend
    return "gloo" if framework == "keras" else "ddp"


__all__ = ["Setting", "SETTINGS", "KEY_OF", "PARAM_OF", "EXECUTOR_GROUPS", "GROUPS", "in_group", "defaults",
           "check_value", "check_together", "resolve_backend", "reference_table"]
