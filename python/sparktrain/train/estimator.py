"""Spark ML Estimators that train Keras or PyTorch models across executors.

Flow of :meth:`_fit` (after xgboost.spark): resolve the input to a materialized
dataset, infer the model inputs, run the driver preflight, launch one barrier
stage of ``numWorkers`` tasks, then build the Model and ``_copyValues`` into it.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from typing import Any, Callable, List, Optional, Sequence, Tuple

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from sparktrain.errors import ConfigError
from sparktrain.train import preflight
from sparktrain.train._executor.spec import ModelSpec, WorkerSpec
from sparktrain.train.inputs import exists, infer_inputs, read_features_json
from sparktrain.train.launcher import LaunchResult, launch
from sparktrain.train.model import KerasModel, TorchModel, _DistributedModel
from sparktrain.train.params import _DistributedParams
from sparktrain.train.progress import TrainingCallback

log = logging.getLogger(__name__)


class _DistributedEstimator(Estimator, _DistributedParams, DefaultParamsReadable, DefaultParamsWritable):
    _framework = ""
    _model_cls: type = _DistributedModel

    @keyword_only
    def __init__(self, *, numWorkers: Optional[int] = None, epochs: Optional[int] = None,
                 batchSize: Optional[int] = None, learningRate: Optional[float] = None,
                 hiddenUnits: Optional[List[int]] = None, embeddingDim: Optional[int] = None,
                 dropout: Optional[float] = None, task: Optional[str] = None, backend: Optional[str] = None,
                 store: Optional[str] = None, runId: Optional[str] = None, shuffleBuffer: Optional[int] = None,
                 validationFraction: Optional[float] = None, useGpu: Optional[bool] = None,
                 logEverySteps: Optional[int] = None, seed: Optional[int] = None,
                 labelCol: Optional[str] = None, numericCols: Optional[List[str]] = None,
                 categoricalCols: Optional[List[str]] = None, predictionCol: Optional[str] = None,
                 probabilityCol: Optional[str] = None) -> None:
        super().__init__()
        self.callbacks: List[TrainingCallback] = []
        self.show_progress = True
        self.last_launch: Optional[LaunchResult] = None
        self._model_factory: Optional[Callable] = None
        self._loss_factory: Optional[Callable] = None
        self._optimizer_factory: Optional[Callable] = None
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, **kwargs: Any) -> "_DistributedEstimator":
        """Set any of the constructor's params; returns self."""
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    def setNumWorkers(self, value: int) -> "_DistributedEstimator":
        return self._set(numWorkers=value)

    def setEpochs(self, value: int) -> "_DistributedEstimator":
        return self._set(epochs=value)

    def setRunId(self, value: str) -> "_DistributedEstimator":
        return self._set(runId=value)

    def setCallbacks(self, callbacks: Sequence[TrainingCallback]) -> "_DistributedEstimator":
        """Objects with ``on_step``/``on_epoch`` that receive live metrics (not persisted)."""
        self.callbacks = list(callbacks)
        return self

    def setModelFactory(self, fn: Callable) -> "_DistributedEstimator":
        """``fn(inputs: InputSpec, model: ModelSpec)`` returning the network (not persisted)."""
        self._model_factory = fn
        return self

    def setLossFactory(self, fn: Callable) -> "_DistributedEstimator":
        """``fn()`` returning ``loss(outputs, labels)`` (not persisted)."""
        self._loss_factory = fn
        return self

    def setOptimizerFactory(self, fn: Callable) -> "_DistributedEstimator":
        """Torch: ``fn(parameters, lr)``; Keras: ``fn(lr)`` returning an optimizer (not persisted)."""
        self._optimizer_factory = fn
        return self

    def run_id(self) -> str:
        """The run id (set one with ``runId`` to make a re-run resume)."""
        if not self.isSet(self.runId):
            self._set(runId=uuid.uuid4().hex[:12])
        return self.getOrDefault(self.runId)

    def _fit(self, dataset: Any) -> _DistributedModel:
        from pyspark.sql import SparkSession

        spark = SparkSession.active()
        run_id = self.run_id()
        train_path, val_path, meta = self._resolve_input(spark, dataset, run_id)
        inputs = infer_inputs(
            train_path, self.getLabelCol(),
            numeric=self.getNumericCols() if self.isDefined(self.numericCols) else None,
            categorical=self.getCategoricalCols() if self.isDefined(self.categoricalCols) else None,
            task=self.getOrDefault(self.task), exclude=(meta or {}).get("exclude", ["flight_id"]), meta=meta)
        spec = self._worker_spec(train_path, val_path, inputs, run_id)
        preflight.run_all(spark, spec)
        log.info("training %s (%s) with %d workers, run %s: %d numeric + %d categorical inputs, task %s",
                 self._framework, spec.backend, spec.num_workers, run_id, len(inputs.numeric),
                 len(inputs.categorical), inputs.task)
        result = launch(spark, spec, self.callbacks, show_bar=self.show_progress)
        self.last_launch = result
        model = self._model_cls(framework=self._framework, model_bytes=result.model_bytes, inputs=inputs,
                                history=result.history, run_id=run_id)
        self._copyValues(model)
        model._set(numericCols=list(inputs.numeric), categoricalCols=[c for c, _ in inputs.categorical])
        return model

    def _worker_spec(self, train_path: str, val_path: Optional[str], inputs, run_id: str) -> WorkerSpec:
        import cloudpickle

        backend = self.getBackend()
        if backend == "auto":
            backend = "mwms" if self._framework == "keras" else "ddp"
        if self._framework == "keras" and backend != "mwms":
            preflight.check_framework("keras", backend)  # explains why horovod+keras is refused
            raise ConfigError("backend", backend, "Keras trains with 'mwms' (MultiWorkerMirroredStrategy)")
        if self._framework == "torch" and backend == "mwms":
            raise ConfigError("backend", backend, "torch trains with 'ddp' or 'horovod'")
        store = self.getStore()
        if "://" not in store:
            store = os.path.abspath(store)

        def pickled(fn: Optional[Callable]) -> Optional[bytes]:
            if fn is None:
                return None
            try:
                return cloudpickle.dumps(fn)
            except Exception as exc:
                raise preflight.PreflightError(
                    f"the factory {getattr(fn, '__name__', fn)!r} cannot be pickled for the executors: {exc}. "
                    "Model/loss/optimizer factories must be plain functions or classes that do not capture "
                    "a SparkSession, DataFrame, lock or open file.") from exc

        return WorkerSpec(
            framework=self._framework, backend=backend, num_workers=self.getNumWorkers(),
            epochs=self.getEpochs(), batch_size=self.getBatchSize(), learning_rate=self.getLearningRate(),
            seed=self.getOrDefault(self.seed), shuffle_buffer=self.getOrDefault(self.shuffleBuffer),
            inputs=inputs,
            model=ModelSpec(hidden_units=tuple(self.getOrDefault(self.hiddenUnits)),  # type: ignore[arg-type]
                            embedding_dim=self.getOrDefault(self.embeddingDim),
                            dropout=self.getOrDefault(self.dropout)),
            train_path=train_path, val_path=val_path, store=store, run_id=run_id,
            use_gpu=self.getOrDefault(self.useGpu), log_every_steps=self.getOrDefault(self.logEverySteps),
            model_factory=pickled(self._model_factory), loss_factory=pickled(self._loss_factory),
            optimizer_factory=pickled(self._optimizer_factory),
            env={k: v for k, v in os.environ.items() if k.startswith("SPARKTRAIN_")},
            python=sys.executable)

    def _resolve_input(self, spark, dataset: Any, run_id: str) -> Tuple[str, Optional[str], Optional[dict]]:
        """``(train_path, validation_path, features.json)`` for a path, a materialized result or a DataFrame."""
        root = getattr(dataset, "path", dataset)
        if isinstance(root, (str, os.PathLike)):
            root = os.fspath(root).rstrip("/")
            train = f"{root}/train"
            if not exists(train):
                train = root  # a single split given directly
            val = f"{root}/validation"
            meta = read_features_json(root)
            if meta is not None:
                meta.setdefault("exclude", [k for k in (meta.get("key"),) if k])
            return train, (val if exists(val) else None), meta
        return self._materialize_dataframe(spark, dataset, run_id)

    def _materialize_dataframe(self, spark, df, run_id: str) -> Tuple[str, Optional[str], Optional[dict]]:
        from pyspark.sql import functions as F

        from sparktrain.data.manifest import atomic_dir, write_parquet

        label = self.getLabelCol()
        if label not in df.columns:
            from sparktrain.errors import MissingColumnError
            raise MissingColumnError(label, df.columns, where="the DataFrame passed to fit() (labelCol)")
        root = os.path.join(os.path.abspath(self.getStore()), run_id, "data")
        if os.path.isdir(os.path.join(root, "train")):
            log.info("reusing the dataset materialized for run %s at %s", run_id, root)
        else:
            frac = self.getOrDefault(self.validationFraction)
            bucket = F.abs(F.xxhash64(*[F.col(c) for c in df.columns])) % 10_000
            with atomic_dir(root) as staging:
                write_parquet(df.where(bucket >= int(frac * 10_000)), os.path.join(staging, "train"))
                if frac > 0:
                    write_parquet(df.where(bucket < int(frac * 10_000)), os.path.join(staging, "validation"))
        val = os.path.join(root, "validation")
        return os.path.join(root, "train"), (val if os.path.isdir(val) else None), None


class TorchEstimator(_DistributedEstimator):
    """Train a PyTorch network data-parallel across Spark executors (DDP or Horovod).

    Examples
    --------
    >>> est = TorchEstimator(numWorkers=2, epochs=3, labelCol="late", store="work/store")  # doctest: +SKIP
    >>> model = est.fit("work/flights/dataset")          # a materialized dataset   # doctest: +SKIP
    >>> model.transform(test_df).select("prediction", "probability").show(3)          # doctest: +SKIP
    """

    _framework = "torch"
    _model_cls = TorchModel


class KerasEstimator(_DistributedEstimator):
    """Train a Keras 3 (TensorFlow) network across executors under MultiWorkerMirroredStrategy.

    A custom training loop runs under the strategy (``model.fit`` under MWMS
    fails with Keras 3, keras-team/keras#20585).  Horovod is refused: with
    Keras 3 its DistributedOptimizer silently does not average gradients.

    Examples
    --------
    >>> est = KerasEstimator(numWorkers=2, epochs=2, labelCol="late")  # doctest: +SKIP
    >>> model = est.fit("work/flights/dataset")                          # doctest: +SKIP
    """

    _framework = "keras"
    _model_cls = KerasModel
