"""Params shared by the Keras and PyTorch estimators and their models (Spark ML conventions)."""

from __future__ import annotations

from typing import Any, List

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasProbabilityCol, HasSeed

from sparktrain.errors import ConfigError


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


class _ModelParams(HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """Params a fitted model needs to score."""

    numericCols: "Param[List[str]]" = Param(
        Params._dummy(), "numericCols", "float32 input columns (default: inferred)", TypeConverters.toListString)
    categoricalCols: "Param[List[str]]" = Param(
        Params._dummy(), "categoricalCols", "int index input columns for embeddings (default: inferred)",
        TypeConverters.toListString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(labelCol="label", predictionCol="prediction", probabilityCol="probability")

    def getNumericCols(self) -> List[str]:
        return self.getOrDefault(self.numericCols)

    def getCategoricalCols(self) -> List[str]:
        return self.getOrDefault(self.categoricalCols)


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
                                            TypeConverters.toListInt)
    embeddingDim: "Param[int]" = Param(Params._dummy(), "embeddingDim", "max embedding width per categorical",
                                       _positive_int("embeddingDim"))
    dropout: "Param[float]" = Param(Params._dummy(), "dropout", "dropout after each hidden layer",
                                    _fraction("dropout"))
    task: "Param[str]" = Param(Params._dummy(), "task", "auto | binary | multiclass | regression",
                               _one_of("task", ["auto", "binary", "multiclass", "regression"]))
    backend: "Param[str]" = Param(Params._dummy(), "backend", "auto | ddp | horovod | mwms",
                                  _one_of("backend", ["auto", "ddp", "horovod", "mwms"]))
    store: "Param[str]" = Param(Params._dummy(), "store", "checkpoint store: local path or pyarrow fs URI",
                                TypeConverters.toString)
    runId: "Param[str]" = Param(Params._dummy(), "runId", "run id; re-running fit with it resumes training",
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

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(numWorkers=2, epochs=3, batchSize=512, learningRate=1e-3, hiddenUnits=[64, 64],
                         embeddingDim=8, dropout=0.0, task="auto", backend="auto", store="work/store",
                         shuffleBuffer=8192, validationFraction=0.1, useGpu=False, logEverySteps=50, seed=42,
                         labelCol="late")

    def getNumWorkers(self) -> int:
        return self.getOrDefault(self.numWorkers)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

    def getStore(self) -> str:
        return self.getOrDefault(self.store)

    def getBackend(self) -> str:
        return self.getOrDefault(self.backend)
