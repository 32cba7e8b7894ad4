"""Fitted models: Spark ML Transformers that score DataFrames in Arrow batches.

``transform`` runs ``mapInArrow``: each Python worker loads the network once
(cached by a digest of its bytes) and scores whole Arrow batches.  It adds
``predictionCol`` and, for classification, ``probabilityCol`` (probability of
class index 1 for binary, the class probabilities in class-index order as
``array<double>`` for multiclass; Arrow-native rather than an ML Vector) and
``rawPredictionCol`` (the logit of class 1 as a double for binary, one logit
per class for multiclass), so Spark's ``BinaryClassificationEvaluator`` and
``MulticlassClassificationEvaluator`` work with their default column names.
A float-block input (``featuresCol``: a Spark ML vector or a numeric array) is
converted in Spark (``vector_to_array``) before the batches reach Python.
``prediction`` is in the label's original values: the class string for a
string label (the model's :attr:`labels` lists them in index order), the
class value as a double for a numeric one, the value for regression.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterator, List, Optional, Tuple

from pyspark.ml import Model
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparktrain._internal.secrets import mask_strings
from sparktrain.errors import (ColumnClashError, ConfigError, DataError, DuplicateColumnError, MissingColumnError,
                               NotFittedError, SchemaError)
from sparktrain.train._executor.spec import InputSpec
from sparktrain.train.params import _attach_params, _ModelParams


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

    # Spark ML's setters: each returns the model (``model.setPredictionCol("p2").transform(df)``)
    def setFeaturesCol(self, value: str) -> "_DistributedModel":
        """Read the float block from column ``value`` (trained on another name: the same block, renamed)."""
        return self._set(featuresCol=value)

    def setNumericCols(self, value: List[str]) -> "_DistributedModel":
        """Read the numeric inputs from these columns, one per trained numeric input, in its order."""
        return self._set(numericCols=value)

    def setCategoricalCols(self, value: List[str]) -> "_DistributedModel":
        """Read the categorical inputs from these columns, one per trained categorical input, in its order."""
        return self._set(categoricalCols=value)

    def setPredictionCol(self, value: str) -> "_DistributedModel":
        """Name of the prediction column ``transform`` adds ('' adds none)."""
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> "_DistributedModel":
        """Name of the probability column ``transform`` adds ('' adds none)."""
        return self._set(probabilityCol=value)

    def setRawPredictionCol(self, value: str) -> "_DistributedModel":
        """Name of the raw prediction (logit) column ``transform`` adds ('' adds none)."""
        return self._set(rawPredictionCol=value)

    def _input_sources(self) -> Dict[str, str]:
        """``{trained input: the DataFrame column to read it from}``, from the column Params.

        As in Spark ML, a model reads ``$(featuresCol)``: set to another name than the one it was trained on,
        the block is read from that column; ``numericCols``/``categoricalCols`` rename the trained columns one
        to one, in order.  A value that cannot be such a renaming is refused, naming the Param."""
        assert self.inputs is not None  # for mypy; callers check
        out: Dict[str, str] = {}
        features = self.getFeaturesCol()
        blocks = [c for c, _ in self.inputs.vectors]
        if features and features not in blocks:
            if len(blocks) != 1:
                raise ConfigError("featuresCol", features,
                                  f"the model was trained on {len(blocks)} float blocks "
                                  f"({', '.join(blocks) or 'none'}), so featuresCol cannot say which one "
                                  f"'{features}' replaces. Fix: rename the column in the DataFrame "
                                  f"(withColumnRenamed) to the trained name, or leave featuresCol as it was")
            out[blocks[0]] = features
        for param, trained in (("numericCols", list(self.inputs.numeric)),
                               ("categoricalCols", [c for c, _ in self.inputs.categorical])):
            given = list(self.getOrDefault(param)) if self.isDefined(param) else trained
            if given == trained:
                continue
            if len(given) != len(trained):
                raise ConfigError(param, given, f"the model was trained on {len(trained)} such column(s) "
                                                f"({', '.join(trained) or 'none'}): give one column per trained "
                                                f"input, in that order, to read them from other columns")
            out.update({t: g for t, g in zip(trained, given) if t != g})
        return out

    def _output_columns(self) -> List[Any]:
        """``[(column, Spark type)]`` that ``transform`` adds (an empty name adds no column, as in Spark ML)."""
        from pyspark.sql.types import ArrayType, DoubleType, StringType

        assert self.inputs is not None  # for mypy; callers check
        pred_type = StringType() if self.inputs.prediction_type == "string" else DoubleType()
        out: List[Any] = [(self.getPredictionCol(), pred_type)] if self.getPredictionCol() else []
        per_class = DoubleType() if self.inputs.task == "binary" else ArrayType(DoubleType())
        if self.inputs.task != "regression":  # an empty column name adds no column (Spark ML's convention)
            out += [(c, per_class) for c in (self.getProbabilityCol(), self.getRawPredictionCol()) if c]
        return out

    def _output_schema(self, df):
        from pyspark.sql.types import StructField, StructType

        return StructType(list(df.schema.fields) + [StructField(n, t) for n, t in self._output_columns()])

    def _transform(self, dataset):
        return self._score(dataset, decode=True)

    def _score(self, dataset, decode: bool):
        """``transform``; without ``decode``, ``prediction`` is the class index (for indexed splits)."""
        self._require_fitted()
        assert self.model_bytes is not None and self.inputs is not None  # for mypy; checked above
        read = self._input_sources()
        for col in self.inputs.columns:
            column = read.get(col, col)
            if column not in dataset.columns:
                param = next((p for p, names in (("featuresCol", [c for c, _ in self.inputs.vectors]),
                                                  ("numericCols", self.inputs.numeric),
                                                  ("categoricalCols", [c for c, _ in self.inputs.categorical]))
                              if col in names and col in read), None)
                raise MissingColumnError(column, dataset.columns, where="the DataFrame to score" +
                                         (f" ({param}, the model's input '{col}')" if param else ""))
        outputs = [n for n, _ in self._output_columns()]
        used = {read.get(c, c) for c in self.inputs.columns} | set(outputs)  # once, not once per column
        DuplicateColumnError.check([c for c in dataset.columns if c in used], "the DataFrame to score")
        clash = [n for n in outputs if n in dataset.columns]
        if clash:
            raise ColumnClashError(clash, "the DataFrame to score", "the model",
                                   "drop or rename them, or give the model other names (model.setPredictionCol, "
                                   "setProbabilityCol, setRawPredictionCol; '' adds no column)")
        if not outputs:
            import logging

            logging.getLogger(__name__).warning(
                "%s.transform() adds no column: predictionCol, probabilityCol and rawPredictionCol are all empty; "
                "the DataFrame is returned as it is", type(self).__name__)
            return dataset
        inputs = self.inputs if decode else replace(self.inputs, classes=())
        prepared, sources = scoring_frame(dataset, inputs, read)
        # mapInArrow resolves every column by name, and a name with a dot reads as a struct field: the function
        # sees positional names, and writes the DataFrame's own names back
        safe = [f"__sparktrain_c{i}" for i in range(len(prepared.columns))]
        renamed = dict(zip(prepared.columns, safe))
        sources = {c: renamed[sources.get(c, c)] for c in inputs.columns}
        fn = make_scoring_function(self.framework, self.model_bytes, inputs, self.getPredictionCol(),
                                   self.getProbabilityCol(), raw_col=self.getRawPredictionCol(), sources=sources,
                                   keep=len(dataset.columns), handle_invalid=self.getHandleInvalid(),
                                   names=list(dataset.columns))
        prepared = prepared.toDF(*safe)
        out = self.copy()
        out.inputs = inputs
        return prepared.mapInArrow(fn, out._output_schema(dataset))

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


def scoring_frame(df: Any, inputs: InputSpec, read: Optional[Dict[str, str]] = None
                  ) -> Tuple[Any, Dict[str, str]]:
    """``df`` plus the inputs the network reads converted in Spark, and ``{input: column to read}``.

    ``read`` maps an input to the column of ``df`` that holds it when the names differ (the model's column
    Params).  A float block (a Spark ML vector or a numeric array) becomes an
    ``array<float>`` column (``vector_to_array``); a boolean, decimal or
    integer numeric input becomes a double.  The added columns come after
    ``df``'s and are dropped again by the scoring function.
    """
    from pyspark.sql import functions as F

    from sparktrain.features._sql import quote
    from sparktrain.train.frame import column_kind, is_vector

    read = dict(read or {})
    types = {name: f.dataType for name in inputs.columns for f in df.schema.fields if f.name == read.get(name, name)}
    extra, sources = [], dict(read)
    for i, (col, width) in enumerate(inputs.vectors):
        t, name = types[col], read.get(col, col)
        if column_kind(t) != "block":
            raise SchemaError(f"column '{name}' of the DataFrame to score has type {t.simpleString()}; the model "
                              f"reads it as a float block of {width} values (a Spark ML vector or an array of "
                              f"numbers)")
        tmp = f"__sparktrain_in{i}"
        if is_vector(t):
            from pyspark.ml.functions import vector_to_array

            extra.append(vector_to_array(F.col(quote(name)), "float32").alias(tmp))
        else:
            extra.append(F.col(quote(name)).cast("array<float>").alias(tmp))
        sources[col] = tmp
    for col in [*inputs.numeric, *(c for c, _ in inputs.categorical)]:
        name = read.get(col, col)
        if column_kind(types[col]) not in ("numeric", "categorical"):  # a cast would fail on 'abc', unnamed
            kind = "a number" if col in inputs.numeric else "a category index (a whole number)"
            raise SchemaError(f"column '{name}' of the DataFrame to score has type {types[col].simpleString()}; the "
                              f"model reads it as {kind}, as in training. Cast it in Spark first "
                              f"(F.col('{name}').cast('double'); try_cast turns a malformed value into null, which "
                              f"handleInvalid then skips or keeps)")
    for i, col in enumerate(inputs.numeric):
        if types[col].typeName() not in ("float", "double"):
            tmp = f"__sparktrain_num{i}"
            extra.append(F.col(quote(read.get(col, col))).cast("double").alias(tmp))
            sources[col] = tmp
    return (df.select("*", *extra) if extra else df), sources


def make_scoring_function(framework: str, model_bytes: bytes, inputs: InputSpec, prediction_col: str,
                          probability_col: str, raw_col: str = "", sources: Optional[Dict[str, str]] = None,
                          keep: Optional[int] = None, handle_invalid: str = "error",
                          names: Optional[List[str]] = None):
    """The ``mapInArrow`` function; it captures bytes and plain values only.

    ``sources`` maps an input to the column holding it (:func:`scoring_frame`);
    only the first ``keep`` columns of each batch are passed through (the
    converted ones are not), named ``names`` when given (else as in the
    batch).  A row with a null, NaN or infinite input
    (:func:`~sparktrain.train._executor.batches.invalid_rows`) raises a
    :class:`~sparktrain.errors.DataError` naming the columns
    (``handle_invalid='error'``), is dropped (``'skip'``) or gets null outputs
    (``'keep'``).
    """
    from sparktrain.train._executor.predict import digest
    key = digest(model_bytes)
    sources = dict(sources or {})
    blocks = {c for c, _ in inputs.vectors} | {b[0] for b in inputs.bags}  # array columns: 2-D arrays

    def score(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        import numpy as np

        from sparktrain.data.arrays import column_to_numpy
        from sparktrain.train._executor.batches import invalid_message, invalid_rows, scoring_arrays
        from sparktrain.train._executor.keras_model import to_prediction_np
        from sparktrain.train._executor.predict import get_predictor, to_outputs

        logits_of = get_predictor(framework, model_bytes, inputs, key, raw=True)
        pred_type = pa.string() if inputs.prediction_type == "string" else pa.float64()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            valid = None
            bad = invalid_rows(batch, inputs, sources)
            if bad:
                if handle_invalid == "error":
                    raise DataError(invalid_message(batch, bad, inputs, sources))
                valid = ~np.logical_or.reduce(list(bad.values()))
                scored = batch.filter(pa.array(valid))
            else:
                scored = batch
            out: Dict[str, Any] = {}
            if scored.num_rows:
                arrays = {}
                for c in inputs.columns:
                    col = scored.column(sources.get(c, c))
                    arrays[c] = column_to_numpy(c, col) if c in blocks else col.to_numpy(zero_copy_only=False)
                logits = logits_of(*scoring_arrays(arrays, inputs))
                out = to_outputs(to_prediction_np(logits, inputs.task), inputs, raw=logits)
            elif handle_invalid == "skip":
                continue
            rows = batch if handle_invalid == "keep" else scored  # 'keep': every row, null outputs where invalid
            spread = valid if rows is batch else None  # 'keep' with invalid rows: null outputs there
            n = rows.num_columns if keep is None else keep
            cols = [rows.column(i) for i in range(n)]
            out_names = list(names if names is not None else rows.schema.names)[:n]
            if prediction_col:  # '' adds no column, as in Spark ML
                cols.append(_output_column(out.get("prediction", []), pred_type, pred_type, spread))
                out_names.append(prediction_col)
            if inputs.task != "regression":
                per_class = pa.float64() if inputs.task == "binary" else pa.list_(pa.float64())
                for name, col_name in (("probability", probability_col), ("rawPrediction", raw_col)):
                    if col_name:
                        cols.append(_output_column(out.get(name, []), per_class, None, spread))
                        out_names.append(col_name)
            yield pa.RecordBatch.from_arrays(cols, names=out_names)

    return score


def _output_column(values: Any, type_: Any, fast_type: Any, valid: Any) -> Any:
    """An Arrow output column: ``values`` (one per scored row) as they are, or, with a ``valid`` row mask,
    spread over the batch's rows with nulls where ``valid`` is false (``handleInvalid='keep'``)."""
    import numpy as np
    import pyarrow as pa

    if valid is None:
        return pa.array(values if getattr(values, "ndim", 1) == 1 else list(values), type=fast_type)
    full: List[Any] = [None] * len(valid)
    for i, v in zip(np.flatnonzero(valid), values):
        full[i] = v.tolist() if hasattr(v, "tolist") else v
    return pa.array(full, type=type_)


_attach_params(_DistributedModel)  # the training settings it was fitted with, read-only (getters, no setters)


class TorchModel(_DistributedModel):
    """A PyTorch network trained by :class:`~sparktrain.train.estimator.TorchEstimator`."""


class KerasModel(_DistributedModel):
    """A Keras network trained by :class:`~sparktrain.train.estimator.KerasEstimator`."""


class _ModelWriter(MLWriter):
    def __init__(self, instance: _DistributedModel) -> None:
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:
        """``write().overwrite()``: replace a saved sparktrain model (or nothing) at ``path``, through pyarrow.

        PySpark's own handler asks the JVM, which a Spark Connect client has
        not, and deletes whatever the folder holds.  This one works on both,
        and refuses (:class:`~sparktrain.errors.OutputNotOwnedError`, from
        :func:`~sparktrain.data.guard.check_replaceable`) a folder that holds
        anything else: sparktrain deletes only what it wrote.
        """
        from pyarrow import fs as pafs

        from sparktrain.data import _fs
        from sparktrain.data.guard import check_replaceable

        fs, inner = _fs.resolve(path)
        folder = fs.get_file_info(inner).type == pafs.FileType.Directory
        if not (folder and _saved_model(fs, inner)):  # nothing there, an empty folder, or refused naming its content
            check_replaceable(path, "write().overwrite().save()", markers=("metadata/ of a saved sparktrain model",))
        if folder:
            fs.delete_dir(inner)

    def saveImpl(self, path: str) -> None:
        from sparktrain.data.run_store import Store

        m = self.instance
        m._require_fitted()
        assert m.model_bytes is not None and m.inputs is not None  # for mypy; checked above
        extra = {"framework": m.framework, "inputs": m.inputs.to_dict(), "history": m.history, "run_id": m.run_id}
        params = mask_strings({p.name: v for p, v in m._paramMap.items()})  # a store URI's password stays out
        DefaultParamsWriter.saveMetadata(m, path, self.sparkSession, extraMetadata=extra, paramMap=params)
        Store(path).write_bytes("network/model.bin", m.model_bytes)


def _saved_model(fs: Any, inner: str) -> bool:
    """Whether the folder ``inner`` holds a saved sparktrain model: Spark ML's ``metadata/part-*`` naming a
    ``sparktrain.`` class."""
    return str((read_metadata(fs, inner) or {}).get("class", "")).startswith("sparktrain.")


def read_metadata(fs: Any, inner: str) -> Optional[Dict[str, Any]]:
    """Spark ML's saved metadata (``metadata/part-*``, one JSON line) of the folder ``inner`` on ``fs``, read
    through pyarrow (the same on every Spark line and over Spark Connect); ``None`` when there is none."""
    import json

    from pyarrow import fs as pafs

    try:
        parts = sorted(e.path for e in fs.get_file_info(pafs.FileSelector(f"{inner}/metadata", allow_not_found=True))
                       if e.type == pafs.FileType.File and e.base_name.startswith("part-"))
        if not parts:
            return None
        with fs.open_input_stream(parts[0]) as fh:
            meta = json.loads(fh.read().decode().splitlines()[0])
        return meta if isinstance(meta, dict) else None
    except (OSError, ValueError, IndexError):
        return None


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
