"""Params shared by the Keras and PyTorch estimators and their models (Spark ML conventions).

Training defaults live in one place, :class:`sparktrain.config.TrainConfig`;
:data:`PARAM_FIELDS` maps each training Param to its ``train:`` key, and the
Params take their defaults from a default ``TrainConfig``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasProbabilityCol, HasSeed

from sparktrain.config import TrainConfig
from sparktrain.errors import ConfigError

#: Estimator Param -> ``train:`` key of a job config (the same knob under two naming conventions).
PARAM_FIELDS: Dict[str, str] = {
    "numWorkers": "num_workers", "epochs": "epochs", "batchSize": "batch_size",
    "learningRate": "learning_rate", "hiddenUnits": "hidden_units", "embeddingDim": "embedding_dim",
    "dropout": "dropout", "task": "task", "backend": "backend", "store": "store",
    "shuffleBuffer": "shuffle_buffer", "validationFraction": "validation_fraction", "useGpu": "use_gpu",
    "logEverySteps": "log_every_steps", "seed": "seed", "logEverySeconds": "log_every_s",
    "checkpointEverySteps": "checkpoint_every_steps", "checkpointEverySeconds": "checkpoint_every_s",
    "keepCheckpoints": "keep_checkpoints", "stallTimeout": "stall_timeout_s", "elastic": "elastic",
    "minWorkers": "min_workers", "elasticBatch": "elastic_batch",
}


def params_from_config(train: TrainConfig) -> Dict[str, Any]:
    """The estimator Params (camelCase) of a ``train:`` section."""
    out = {p: getattr(train, f) for p, f in PARAM_FIELDS.items()}
    out["hiddenUnits"] = list(out["hiddenUnits"])
    return out


def _positive_int(name: str):
    def convert(value: Any) -> int:
        v = TypeConverters.toInt(value)
        if v < 1:
            raise ConfigError(name, value, "must be >= 1")
        return v
    return convert


def _positive_float(name: str):
    def convert(value: Any) -> float:
        v = TypeConverters.toFloat(value)
        if not v > 0:
            raise ConfigError(name, value, "must be > 0")
        return v
    return convert


def _non_negative_float(name: str):
    def convert(value: Any) -> float:
        v = TypeConverters.toFloat(value)
        if not v >= 0:
            raise ConfigError(name, value, "must be >= 0")
        return v
    return convert


def _positive_ints(name: str):
    def convert(value: Any) -> List[int]:
        v = TypeConverters.toListInt(value)
        if not v or any(x < 1 for x in v):
            raise ConfigError(name, value, "give one or more layer widths >= 1, e.g. [64, 64]")
        return v
    return convert


def _one_of(name: str, allowed: List[str]):
    def convert(value: Any) -> str:
        v = TypeConverters.toString(value)
        if v not in allowed:
            raise ConfigError(name, value, f"must be one of {', '.join(allowed)}")
        return v
    return convert


def _fraction(name: str):
    def convert(value: Any) -> float:
        v = TypeConverters.toFloat(value)
        if not 0.0 <= v < 1.0:
            raise ConfigError(name, value, "must be in [0, 1)")
        return v
    return convert


def _run_id(value: Any) -> str:
    v = TypeConverters.toString(value)
    if not v or "/" in v or "\\" in v or v in (".", "..") or v.startswith("."):
        raise ConfigError("runId", value, "use a plain name (letters, digits, '-', '_'), e.g. 'churn-2026-12'")
    return v


class _ModelParams(HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """Params a fitted model needs to score."""

    numericCols: "Param[List[str]]" = Param(
        Params._dummy(), "numericCols", "float32 input columns (default: inferred)", TypeConverters.toListString)
    categoricalCols: "Param[List[str]]" = Param(
        Params._dummy(), "categoricalCols", "int index input columns for embeddings (default: inferred)",
        TypeConverters.toListString)
    runId: "Param[str]" = Param(
        Params._dummy(), "runId",
        "training run id. On an estimator: unset (each fit() is a new run) or set to resume that run; "
        "on a model: the run that trained it", _run_id)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(labelCol="label", predictionCol="prediction", probabilityCol="probability")

    def getNumericCols(self) -> List[str]:
        """The float32 input columns."""
        return self.getOrDefault(self.numericCols)

    def getCategoricalCols(self) -> List[str]:
        """The int index input columns."""
        return self.getOrDefault(self.categoricalCols)

    def getRunId(self) -> str:
        """The run id (raises if unset, as Spark's getters do)."""
        return self.getOrDefault(self.runId)


class _DistributedParams(_ModelParams, HasSeed):
    """Training params shared by :class:`TorchEstimator` and :class:`KerasEstimator`."""

    numWorkers: "Param[int]" = Param(Params._dummy(), "numWorkers", "number of barrier tasks (ranks)",
                                     _positive_int("numWorkers"))
    epochs: "Param[int]" = Param(Params._dummy(), "epochs", "passes over the training data",
                                 _positive_int("epochs"))
    batchSize: "Param[int]" = Param(Params._dummy(), "batchSize", "rows per step per worker",
                                    _positive_int("batchSize"))
    learningRate: "Param[float]" = Param(Params._dummy(), "learningRate", "optimizer learning rate",
                                         _positive_float("learningRate"))
    hiddenUnits: "Param[List[int]]" = Param(Params._dummy(), "hiddenUnits", "widths of the MLP's hidden layers",
                                            _positive_ints("hiddenUnits"))
    embeddingDim: "Param[int]" = Param(Params._dummy(), "embeddingDim", "max embedding width per categorical",
                                       _positive_int("embeddingDim"))
    dropout: "Param[float]" = Param(Params._dummy(), "dropout", "dropout after each hidden layer",
                                    _fraction("dropout"))
    task: "Param[str]" = Param(Params._dummy(), "task", "auto | binary | multiclass | regression",
                               _one_of("task", ["auto", "binary", "multiclass", "regression"]))
    backend: "Param[str]" = Param(Params._dummy(), "backend",
                                  "auto | ddp | horovod (torch); auto | gloo | mwms (Keras)",
                                  _one_of("backend", ["auto", "ddp", "gloo", "horovod", "mwms"]))
    store: "Param[str]" = Param(Params._dummy(), "store", "checkpoint store: local path or pyarrow fs URI",
                                TypeConverters.toString)
    shuffleBuffer: "Param[int]" = Param(Params._dummy(), "shuffleBuffer", "row-level shuffle buffer size",
                                        _positive_int("shuffleBuffer"))
    validationFraction: "Param[float]" = Param(
        Params._dummy(), "validationFraction", "share of a DataFrame input held out for validation",
        _fraction("validationFraction"))
    useGpu: "Param[bool]" = Param(Params._dummy(), "useGpu", "train on CUDA devices (nccl)",
                                  TypeConverters.toBoolean)
    logEverySteps: "Param[int]" = Param(Params._dummy(), "logEverySteps", "periodic metrics interval",
                                        _positive_int("logEverySteps"))
    logEverySeconds: "Param[float]" = Param(
        Params._dummy(), "logEverySeconds", "seconds between progress log lines when not on a terminal",
        _non_negative_float("logEverySeconds"))
    checkpointEverySteps: "Param[int]" = Param(
        Params._dummy(), "checkpointEverySteps", "mid-epoch checkpoint every N steps (None: by time only)",
        _positive_int("checkpointEverySteps"))
    checkpointEverySeconds: "Param[float]" = Param(
        Params._dummy(), "checkpointEverySeconds",
        "mid-epoch checkpoint when this many seconds passed since the last one (None: by steps only)",
        _positive_float("checkpointEverySeconds"))
    keepCheckpoints: "Param[int]" = Param(Params._dummy(), "keepCheckpoints",
                                          "newest checkpoints kept in the store (the best epoch's is kept too)",
                                          _positive_int("keepCheckpoints"))
    stallTimeout: "Param[float]" = Param(
        Params._dummy(), "stallTimeout", "seconds a rank may make no progress before the fit fails naming it",
        _positive_float("stallTimeout"))
    elastic: "Param[bool]" = Param(Params._dummy(), "elastic",
                                   "after a failure, continue on fewer workers (>= minWorkers) if fewer slots "
                                   "are free", TypeConverters.toBoolean)
    minWorkers: "Param[int]" = Param(Params._dummy(), "minWorkers", "fewest workers an elastic run continues on",
                                     _positive_int("minWorkers"))
    elasticBatch: "Param[str]" = Param(
        Params._dummy(), "elasticBatch",
        "on a world-size change: 'global' keeps the global batch (per-rank batch = global / workers, same "
        "learning rate); 'per_rank' keeps batchSize and scales the learning rate with the global batch",
        _one_of("elasticBatch", ["global", "per_rank"]))
    excludeCols: "Param[List[str]]" = Param(
        Params._dummy(), "excludeCols",
        "columns never used as inputs when they are inferred (ids, keys, leaky columns); a dataset's "
        "features.json key is always left out", TypeConverters.toListString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(**params_from_config(TrainConfig()), excludeCols=[])

    def getNumWorkers(self) -> int:
        """Number of barrier tasks (ranks)."""
        return self.getOrDefault(self.numWorkers)

    def getEpochs(self) -> int:
        """Passes over the training data."""
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        """Rows per step per worker."""
        return self.getOrDefault(self.batchSize)

    def getLearningRate(self) -> float:
        """Optimizer learning rate."""
        return self.getOrDefault(self.learningRate)

    def getHiddenUnits(self) -> List[int]:
        """Widths of the MLP's hidden layers."""
        return list(self.getOrDefault(self.hiddenUnits))  # type: ignore[arg-type]

    def getEmbeddingDim(self) -> int:
        """Max embedding width per categorical input."""
        return self.getOrDefault(self.embeddingDim)

    def getDropout(self) -> float:
        """Dropout after each hidden layer."""
        return self.getOrDefault(self.dropout)

    def getTask(self) -> str:
        """``auto``, ``binary``, ``multiclass`` or ``regression``."""
        return self.getOrDefault(self.task)

    def getBackend(self) -> str:
        """``auto``, ``ddp``, ``horovod`` (torch), ``gloo`` or ``mwms`` (Keras)."""
        return self.getOrDefault(self.backend)

    def getStore(self) -> str:
        """The checkpoint store (local path or URI)."""
        return self.getOrDefault(self.store)

    def getShuffleBuffer(self) -> int:
        """Row-level shuffle buffer size."""
        return self.getOrDefault(self.shuffleBuffer)

    def getValidationFraction(self) -> float:
        """Share of a DataFrame input held out for validation."""
        return self.getOrDefault(self.validationFraction)

    def getUseGpu(self) -> bool:
        """Whether to train on CUDA devices."""
        return self.getOrDefault(self.useGpu)

    def getLogEverySteps(self) -> int:
        """Periodic metrics interval in steps."""
        return self.getOrDefault(self.logEverySteps)

    def getLogEverySeconds(self) -> float:
        """Seconds between progress log lines when not on a terminal."""
        return self.getOrDefault(self.logEverySeconds)

    def getCheckpointEverySteps(self) -> Optional[int]:
        """Steps between mid-epoch checkpoints (None: by time only)."""
        return self.getOrDefault(self.checkpointEverySteps)

    def getCheckpointEverySeconds(self) -> Optional[float]:
        """Seconds between mid-epoch checkpoints (None: by steps only)."""
        return self.getOrDefault(self.checkpointEverySeconds)

    def getKeepCheckpoints(self) -> int:
        """Newest checkpoints kept."""
        return self.getOrDefault(self.keepCheckpoints)

    def getStallTimeout(self) -> float:
        """Seconds a rank may make no progress."""
        return self.getOrDefault(self.stallTimeout)

    def getElastic(self) -> bool:
        """Whether a failed run may continue on fewer workers."""
        return self.getOrDefault(self.elastic)

    def getMinWorkers(self) -> Optional[int]:
        """Fewest workers an elastic run continues on (None: numWorkers)."""
        return self.getOrDefault(self.minWorkers)

    def getElasticBatch(self) -> str:
        """``global`` or ``per_rank``."""
        return self.getOrDefault(self.elasticBatch)

    def getExcludeCols(self) -> List[str]:
        """Columns never used as inferred inputs."""
        return list(self.getOrDefault(self.excludeCols))  # type: ignore[arg-type]
