"""Plain, picklable descriptions of a training run, built on the driver, read on executors.

Nothing here refers to driver objects: the barrier task closure captures one
:class:`WorkerSpec` (frozen dataclass of primitives), never an Estimator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class InputSpec:
    """The model's inputs: float32 numeric columns and int32 categorical indices."""

    numeric: Tuple[str, ...]
    categorical: Tuple[Tuple[str, int], ...]  # (column, cardinality = max index + 1)
    label: str
    task: str  # binary | multiclass | regression
    num_classes: int = 1
    classes: Tuple[Any, ...] = ()  # the original label value of each class index (empty: the index itself)

    @property
    def columns(self) -> List[str]:
        return [*self.numeric, *(c for c, _ in self.categorical)]

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
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "InputSpec":
        return cls(numeric=tuple(d["numeric"]), categorical=tuple((c, int(n)) for c, n in d["categorical"]),
                   label=d["label"], task=d["task"], num_classes=int(d.get("num_classes", 1)),
                   classes=tuple(d.get("classes") or ()))


@dataclass(frozen=True)
class ModelSpec:
    """Hyperparameters of the default network (embeddings + MLP + head)."""

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


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a barrier task needs to train; only primitives and bytes."""

    framework: str                 # torch | keras
    backend: str                   # ddp | horovod (torch); gloo | mwms (Keras)
    num_workers: int
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    shuffle_buffer: int
    inputs: InputSpec
    model: ModelSpec
    train_path: str
    val_path: Optional[str]
    store: str
    run_id: str
    progress_address: Optional[str] = None
    token: str = ""
    use_gpu: bool = False
    log_every_steps: int = 50
    model_factory: Optional[bytes] = None      # cloudpickled callable(inputs, model_spec) -> module/model
    loss_factory: Optional[bytes] = None       # cloudpickled callable() -> loss
    optimizer_factory: Optional[bytes] = None  # cloudpickled callable(params_or_none, lr) -> optimizer
    env: Dict[str, str] = field(default_factory=dict)
    python: Optional[str] = None               # interpreter for subprocess workers (Keras)
    launch_id: str = ""                        # one fit() call (its Spark retries share it)
    max_attempts: int = 1                      # launches allowed (spark.task.maxFailures / local[N,F])
    checkpoint_every_steps: Optional[int] = None   # mid-epoch checkpoint every N steps (None: off)
    checkpoint_every_s: Optional[float] = 30.0     # ... or when this long passed (checked at log steps)
    keep_checkpoints: int = 2                  # newest checkpoints kept (plus the best epoch)
    elastic_batch: str = "global"              # on a world-size change: keep the global batch, or "per_rank"
    stall_timeout_s: float = 600.0             # collectives' timeout; the driver's watchdog uses it too
