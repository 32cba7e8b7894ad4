"""Plain, picklable descriptions of a training run, built on the driver, read on executors.

Nothing here refers to driver objects: the barrier task closure captures one
:class:`WorkerSpec` (frozen dataclass of primitives), never an Estimator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class InputSpec:
    """The model's inputs: float32 numeric columns, fixed-length float blocks and int32 categorical indices.

    A *float block* (``vectors``) is one column holding ``width`` floats per
    row: in Parquet a ``list<float>`` whose every row has ``width`` elements
    (``fit(df)`` writes a Spark ML vector or a numeric array that way, through
    ``vector_to_array``); the reader hands it over as a ``[rows, width]``
    array.  The network sees the numeric columns and then each block,
    concatenated into one ``[B, numeric_width]`` float32 input.

    An *embedding bag* (``bags``: a text or set feature) is one ``array<int>``
    column of ``length`` ids per row (``0`` padding, ``1`` unknown, ``2 ..
    rows-1`` the vocabulary or hash buckets).  The integer input ``x_cat``
    holds the categorical indices, then each bag's ``length`` ids:
    ``[B, cat_width]``; the default network pools each bag's embeddings
    (``mean`` or ``sum``, padding excluded).
    """

    numeric: Tuple[str, ...]
    categorical: Tuple[Tuple[str, int], ...]  # (column, cardinality = max index + 1)
    label: str
    task: str  # binary | multiclass | regression
    num_classes: int = 1
    classes: Tuple[Any, ...] = ()  # the original label value of each class index (empty: the index itself)
    vectors: Tuple[Tuple[str, int], ...] = ()  # (column, width): fixed-length float blocks
    bags: Tuple[Tuple[str, int, int, str], ...] = ()  # (column, ids per row, embedding rows, mean | sum)

    @property
    def columns(self) -> List[str]:
        return [*self.numeric, *(c for c, _ in self.vectors), *(c for c, _ in self.categorical),
                *(b[0] for b in self.bags)]

    @property
    def cat_width(self) -> int:
        """Width of the network's integer input: one per categorical column plus each bag's length."""
        return len(self.categorical) + sum(b[1] for b in self.bags)

    @property
    def numeric_width(self) -> int:
        """Width of the network's float input: one per numeric column plus each block's width."""
        return len(self.numeric) + sum(w for _, w in self.vectors)

    @property
    def prediction_type(self) -> str:
        """Spark SQL type of ``prediction``: the class value's type for string classes, else double."""
        if self.task != "regression" and any(isinstance(c, str) for c in self.classes):
            return "string"
        return "double"

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["categorical"] = [list(x) for x in self.categorical]
        d["classes"] = list(self.classes)
        d["vectors"] = [list(x) for x in self.vectors]
        d["bags"] = [list(x) for x in self.bags]
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "InputSpec":
        return cls(numeric=tuple(d["numeric"]), categorical=tuple((c, int(n)) for c, n in d["categorical"]),
                   label=d["label"], task=d["task"], num_classes=int(d.get("num_classes", 1)),
                   classes=tuple(d.get("classes") or ()),
                   vectors=tuple((c, int(w)) for c, w in d.get("vectors") or ()),
                   bags=tuple((c, int(n), int(r), str(p)) for c, n, r, p in d.get("bags") or ()))


@dataclass(frozen=True)
class ModelSpec:
    """Hyperparameters of the default network (embeddings + MLP + head): the ``model`` settings."""

    hidden_units: Tuple[int, ...] = (64, 64)
    embedding_dim: int = 8
    dropout: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {"hidden_units": list(self.hidden_units), "embedding_dim": self.embedding_dim,
                "dropout": self.dropout}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelSpec":
        return cls(hidden_units=tuple(d["hidden_units"]), embedding_dim=int(d["embedding_dim"]),
                   dropout=float(d["dropout"]))


def bag_dim(model: ModelSpec, rows: int) -> int:
    """Embedding width of a bag (text or set feature) with ``rows`` ids: ``embedding_dim``, at most ``rows``."""
    return max(1, min(model.embedding_dim, rows))


# One frozen spec per group of sparktrain.settings (fields = the group's settings; tests/test_settings.py
# holds them to the table).  Defaults are the settings' defaults.

@dataclass(frozen=True)
class ScalingSpec:
    """How many ranks, on what devices, all-reducing how."""

    num_workers: int = 2
    backend: str = "ddp"           # resolved: ddp | horovod (torch); gloo | mwms (Keras)
    gpus_per_worker: int = 0


@dataclass(frozen=True)
class OptimSpec:
    """What an optimizer step is: batches, accumulation, precision, learning rate, order."""

    epochs: int = 3
    batch_size: int = 512          # rows per micro-batch per rank
    accumulate_steps: int = 1      # micro-batches per optimizer step
    learning_rate: float = 1e-3
    precision: str = "fp32"        # fp32 | bf16 | fp16
    seed: int = 42
    shuffle_buffer: int = 8192


@dataclass(frozen=True)
class CheckpointSpec:
    """When rank 0 checkpoints, and how many it keeps."""

    checkpoint_every_steps: Optional[int] = None   # mid-epoch checkpoint every N optimizer steps (None: off)
    checkpoint_every_s: Optional[float] = 30.0     # ... or when this long passed (checked at log steps)
    keep_checkpoints: int = 2                      # newest checkpoints kept (plus the best epoch)


@dataclass(frozen=True)
class FailureSpec:
    """Timeouts, retries and elasticity."""

    stall_timeout_s: float = 600.0  # collectives' timeout; the driver's watchdog uses it too
    elastic: bool = False
    min_workers: Optional[int] = None
    elastic_batch: str = "global"   # on a world-size change: keep the global batch, or "per_rank"
    max_attempts: int = 1           # launches allowed (spark.task.maxFailures / local[N,F]); set by the launcher


@dataclass(frozen=True)
class LoggingSpec:
    """How often ranks report."""

    log_every_steps: int = 50
    log_every_s: float = 30.0


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a barrier task needs to train; only primitives, bytes and the group specs above."""

    framework: str                 # torch | keras
    inputs: InputSpec
    train_path: str
    val_path: Optional[str]
    store: str
    run_id: str
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    logging: LoggingSpec = field(default_factory=LoggingSpec)
    progress_address: Optional[str] = None
    token: str = ""
    model_factory: Optional[bytes] = None      # cloudpickled callable(inputs, model_spec) -> module/model
    loss_factory: Optional[bytes] = None       # cloudpickled callable() -> loss
    optimizer_factory: Optional[bytes] = None  # cloudpickled callable(params_or_none, lr) -> optimizer
    env: Dict[str, str] = field(default_factory=dict)
    python: Optional[str] = None               # interpreter for subprocess workers (Keras under MWMS)
    launch_id: str = ""                        # one fit() call (its Spark retries share it)
    prune_wait_s: Optional[float] = None       # a pruned search's trial: after each epoch rank 0 waits up to
                                               # this long for the driver's verdict (control.PruneHook)

    @property
    def num_workers(self) -> int:
        return self.scaling.num_workers

    @property
    def backend(self) -> str:
        return self.scaling.backend

    def with_workers(self, n: int) -> "WorkerSpec":
        """The same run on ``n`` ranks (an elastic relaunch)."""
        return replace(self, scaling=replace(self.scaling, num_workers=n))


#: the executor spec of each settings group
#: why fp16 is refused where a rank has no GPU (``{why}``: what the rank found), on the driver and on the ranks
FP16_ON_CPU = ("fp16 is mixed precision for GPUs, and this rank has none ({why}): on CPU it is slow, and torch has no "
               "loss scaling there. Fix: precision bf16 (runs on CPU) or fp32, or give the tasks GPUs (docs/gpu.md)")

GROUP_SPECS = {"scaling": ScalingSpec, "optim": OptimSpec, "model": ModelSpec, "checkpoint": CheckpointSpec,
               "failure": FailureSpec, "logging": LoggingSpec}


def group_specs(values: Dict[str, Any]) -> Dict[str, Any]:
    """``{group: spec}`` from settings by key (each spec takes the keys it has fields for)."""
    out = {}
    for group, cls in GROUP_SPECS.items():
        names = {f.name for f in fields(cls)}
        out[group] = cls(**{k: v for k, v in values.items() if k in names})
    return out
