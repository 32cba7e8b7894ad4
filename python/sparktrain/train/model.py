"""Fitted models: Spark ML Transformers that score DataFrames in Arrow batches.

``transform`` runs ``mapInArrow``: each Python worker loads the network once
(cached by a digest of its bytes) and scores whole Arrow batches.  It adds
``predictionCol`` and, for classification, ``probabilityCol`` (probability of
class index 1 for binary, the class probabilities in class-index order as
``array<double>`` for multiclass; Arrow-native rather than an ML Vector).
``prediction`` is in the label's original values: the class string for a
string label (the model's :attr:`labels` lists them in index order), the
class value as a double for a numeric one, the value for regression.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterator, List, Optional

from pyspark.ml import Model
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparktrain._internal.secrets import mask_strings
from sparktrain.errors import MissingColumnError, NotFittedError
from sparktrain.train._executor.spec import InputSpec
from sparktrain.train.params import _ModelParams


class _DistributedModel(Model, _ModelParams, MLReadable, MLWritable):
    """A trained network plus the description of its inputs."""

    def __init__(self, framework: str = "", model_bytes: Optional[bytes] = None,
                 inputs: Optional[InputSpec] = None, history: Optional[List[Dict[str, float]]] = None,
                 run_id: str = "") -> None:
        super().__init__()
        self.framework = framework
        self.model_bytes = model_bytes
        self.inputs = inputs
        self.history = list(history or [])
        self.launch: Any = None  # the LaunchResult of the fit that made this model (not persisted)
        if run_id:
            self._set(runId=run_id)

    @property
    def run_id(self) -> str:
        """The training run that produced this model (``getRunId()``; empty when unknown)."""
        return self.getOrDefault(self.runId) if self.isDefined(self.runId) else ""

    def _require_fitted(self) -> None:
        """Raise unless a trained network is attached (narrows the Optional attributes for callers)."""
        if not self.model_bytes or self.inputs is None:
            raise NotFittedError(f"{type(self).__name__} has no trained network; call fit() or load() first")

    @property
    def labels(self) -> List[Any]:
        """The original label value of each class index (empty when the label was not indexed)."""
        self._require_fitted()
        assert self.inputs is not None  # for mypy; checked above
        return list(self.inputs.classes)

    def getLabels(self) -> List[Any]:
        """Spark ML spelling of :attr:`labels` (as ``StringIndexerModel.labels``)."""
        return self.labels

    def _output_schema(self, df):
        from pyspark.sql.types import ArrayType, DoubleType, StringType, StructField, StructType

        pred_type = StringType() if self.inputs.prediction_type == "string" else DoubleType()
        fields = list(df.schema.fields) + [StructField(self.getPredictionCol(), pred_type)]
        if self.inputs.task == "binary":
            fields.append(StructField(self.getProbabilityCol(), DoubleType()))
        elif self.inputs.task == "multiclass":
            fields.append(StructField(self.getProbabilityCol(), ArrayType(DoubleType())))
        return StructType(fields)

    def _transform(self, dataset):
        return self._score(dataset, decode=True)

    def _score(self, dataset, decode: bool):
        """``transform``; without ``decode``, ``prediction`` is the class index (for indexed splits)."""
        self._require_fitted()
        assert self.model_bytes is not None and self.inputs is not None  # for mypy; checked above
        for col in self.inputs.columns:
            if col not in dataset.columns:
                raise MissingColumnError(col, dataset.columns, where="the DataFrame to score")
        inputs = self.inputs if decode else replace(self.inputs, classes=())
        fn = make_scoring_function(self.framework, self.model_bytes, inputs,
                                   self.getPredictionCol(), self.getProbabilityCol())
        out = self.copy()
        out.inputs = inputs
        return dataset.mapInArrow(fn, out._output_schema(dataset))

    def predict_numpy(self, batch: Dict[str, Any]):
        """Score a dict of numpy arrays on the driver (small data, tests, notebooks)."""
        from sparktrain.train._executor.batches import scoring_arrays
        from sparktrain.train._executor.predict import get_predictor

        self._require_fitted()
        assert self.model_bytes is not None and self.inputs is not None  # for mypy; checked above
        return get_predictor(self.framework, self.model_bytes, self.inputs)(*scoring_arrays(batch, self.inputs))

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


def make_scoring_function(framework: str, model_bytes: bytes, inputs: InputSpec, prediction_col: str,
                          probability_col: str):
    """The ``mapInArrow`` function; it captures bytes and plain values only."""
    from sparktrain.train._executor.predict import digest
    key = digest(model_bytes)

    def score(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from sparktrain.train._executor.batches import scoring_arrays
        from sparktrain.train._executor.predict import get_predictor, to_outputs

        predict = get_predictor(framework, model_bytes, inputs, key)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            arrays = {c: batch.column(c).to_numpy(zero_copy_only=False) for c in inputs.columns}
            out = to_outputs(predict(*scoring_arrays(arrays, inputs)), inputs)
            cols = [batch.column(i) for i in range(batch.num_columns)]
            names = list(batch.schema.names)
            cols.append(pa.array(out["prediction"], type=pa.string() if inputs.prediction_type == "string"
                                 else pa.float64()))
            names.append(prediction_col)
            if inputs.task == "binary":
                cols.append(pa.array(out["probability"]))
                names.append(probability_col)
            elif inputs.task == "multiclass":
                cols.append(pa.array(list(out["probability"])))  # type: ignore[call-overload]
                names.append(probability_col)
            yield pa.RecordBatch.from_arrays(cols, names=names)

    return score


class TorchModel(_DistributedModel):
    """A PyTorch network trained by :class:`~sparktrain.train.estimator.TorchEstimator`."""


class KerasModel(_DistributedModel):
    """A Keras network trained by :class:`~sparktrain.train.estimator.KerasEstimator`."""


class _ModelWriter(MLWriter):
    def __init__(self, instance: _DistributedModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from sparktrain.data.run_store import Store

        m = self.instance
        m._require_fitted()
        assert m.model_bytes is not None and m.inputs is not None  # for mypy; checked above
        extra = {"framework": m.framework, "inputs": m.inputs.to_dict(), "history": m.history, "run_id": m.run_id}
        params = mask_strings({p.name: v for p, v in m._paramMap.items()})  # a store URI's password stays out
        DefaultParamsWriter.saveMetadata(m, path, self.sparkSession, extraMetadata=extra, paramMap=params)
        Store(path).write_bytes("network/model.bin", m.model_bytes)


class _ModelReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> _DistributedModel:
        from sparktrain.data.run_store import Store

        meta = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        model = self.cls(framework=meta["framework"], model_bytes=Store(path).read_bytes("network/model.bin"),
                         inputs=InputSpec.from_dict(meta["inputs"]), history=meta.get("history", []),
                         run_id=meta.get("run_id", ""))
        model._resetUid(meta["uid"])
        DefaultParamsReader.getAndSetParams(model, meta)
        return model
