"""A registered model as one Spark ``PipelineModel`` that takes raw rows and keeps them.

:func:`raw_scoring_model` wraps the fitted feature stages and the network
between two stages of this module:

* :class:`KeepRawColumns` (first) refuses a frame that lacks a column the
  model reads (:class:`~sparktrain.errors.MissingColumnError`), has two
  columns of one name, or already has a column the model adds, then copies
  every input column under a private name (:data:`RAW_PREFIX`) and hands the
  feature stages only the columns they read, each read as the model was
  trained on it (:func:`read_as`);
* :class:`RestoreRawColumns` (last) renames the copies back and keeps the
  model's outputs.

So ``transform`` returns every input column with its raw value and type (ids,
the label, anything else), then ``prediction`` and the other outputs, even
where a feature's output has the name of its source.  Both stages persist
with ``DefaultParamsWritable``: ``model.save(path)`` then
``PipelineModel.load(path)`` gives the same raw-in, raw-out model.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from pyspark import keyword_only
from pyspark.ml import PipelineModel, Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparktrain.errors import ColumnClashError, DuplicateColumnError, MissingColumnError, SchemaError
from sparktrain.features._sql import quote

#: Prefix of the private copies of the input columns (not the feature stages' ``__st_``, which the assembler drops).
RAW_PREFIX = "__sparktrain_raw__"
#: the Spark types a text column is cast to for scoring (``try_cast``: null where a value does not cast)
CASTABLE = ("double", "float", "bigint", "int", "boolean")
_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double")
_FRACTIONS = ("float", "double")


def read_as(name: str, given: str, trained: Optional[str], model: str = "the model"):
    """Column ``name`` of Spark type ``given`` as the model reads it, where it was trained on type ``trained``.

    * text where the model read a number or a boolean: ``try_cast`` (a value that does not cast is
      missing, as the pyfunc path reads it);
    * a fraction (``double``, ``float``, ``decimal``) where an integer (``bigint``) was trained: an
      integral value as that integer (``1.0`` is category ``1``, not an unseen ``"1.0"``), any other value
      missing, and so a ``double`` above 2**53, which cannot name one integer;
    * a number or a boolean where a text categorical was trained: refused, since every value would be an
      unseen category (``SchemaError`` naming the column and the cast that keeps the values as text);
    * anything else as it is.
    """
    from pyspark.sql import functions as F

    from sparktrain._internal.spark_compat import try_cast

    col = F.col(quote(name))
    if trained is None or given == trained:
        return col
    if given == "string" and trained in CASTABLE:
        return try_cast(name, trained)
    if trained == "bigint" and (given in _FRACTIONS or given.startswith("decimal")):
        whole = col == F.floor(col)  # 1.0 -> 1; 1.5 (no such category) -> missing
        if given in _FRACTIONS:  # a double above 2**53 names no one integer (2**60 + 1 reads as 2**60): missing
            whole = whole & (F.abs(col) <= F.lit(2.0 ** 53))
        return F.when(whole, col.cast("bigint"))
    if trained == "string" and (given in _NUMBERS or given == "boolean" or given.startswith("decimal")):
        raise SchemaError(f"column '{name}' is {given} here, but {model} was trained on it as text (string): "
                          f"every value would be a category it never saw. Fix: read it as text (a CSV or JSON "
                          f"input: --option inferSchema=false, or data.options; a number's text loses leading zeros "
                          f"such as 01000); in Python, if its values are the same text, cast it "
                          f"(F.col('{name}').cast('string')); else fix what changed its type upstream")
    return col


class KeepRawColumns(Transformer, DefaultParamsReadable, DefaultParamsWritable):
    """First stage: check the raw frame, copy every column under :data:`RAW_PREFIX` (see the module docstring)."""

    _input_kwargs: Dict[str, Any]

    inputCols: "Param[List[str]]" = Param(Params._dummy(), "inputCols", "the raw columns the model reads",
                                          typeConverter=TypeConverters.toListString)
    outputCols: "Param[List[str]]" = Param(Params._dummy(), "outputCols", "the columns the model adds",
                                           typeConverter=TypeConverters.toListString)
    modelUri: "Param[str]" = Param(Params._dummy(), "modelUri", "where the model came from (for messages)",
                                   typeConverter=TypeConverters.toString)
    inputTypes: "Param[str]" = Param(Params._dummy(), "inputTypes",
                                     "JSON {column: Spark type} the model was trained on ({}: read as given)",
                                     typeConverter=TypeConverters.toString)

    @keyword_only
    def __init__(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                 modelUri: Optional[str] = None, inputTypes: Optional[str] = None) -> None:
        super().__init__()
        self._setDefault(inputCols=[], outputCols=[], modelUri="", inputTypes="{}")
        self._set(**self._input_kwargs)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        uri = self.getOrDefault(self.modelUri)
        model = f"model {uri}" if uri else "the model"
        DuplicateColumnError.check(dataset.columns, "the DataFrame to score")
        for name in self.getOrDefault(self.inputCols):
            if name not in dataset.columns:
                raise MissingColumnError(name, dataset.columns, where=f"the DataFrame to score ({model} reads it)")
        clashes = [n for n in self.getOrDefault(self.outputCols) if n in dataset.columns]
        if clashes:
            raise ColumnClashError(clashes, "the DataFrame to score", model,
                                   "drop or rename them (a scored frame is scored again from its raw columns)")
        trained: Dict[str, str] = json.loads(self.getOrDefault(self.inputTypes) or "{}")
        given = dict(dataset.dtypes)
        reads = [read_as(c, given[c], trained.get(c), model).alias(c) for c in self.getOrDefault(self.inputCols)]
        return dataset.select(*reads, *[F.col(quote(c)).alias(RAW_PREFIX + c) for c in dataset.columns])


class RestoreRawColumns(Transformer, DefaultParamsReadable, DefaultParamsWritable):
    """Last stage: the private copies under their own names again, then the model's outputs."""

    _input_kwargs: Dict[str, Any]

    outputCols: "Param[List[str]]" = Param(Params._dummy(), "outputCols", "the columns the model adds",
                                           typeConverter=TypeConverters.toListString)

    @keyword_only
    def __init__(self, *, outputCols: Optional[List[str]] = None) -> None:
        super().__init__()
        self._setDefault(outputCols=[])
        self._set(**self._input_kwargs)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        raw = [F.col(quote(c)).alias(c[len(RAW_PREFIX):]) for c in dataset.columns if c.startswith(RAW_PREFIX)]
        return dataset.select(*raw, *[F.col(quote(c)) for c in self.getOrDefault(self.outputCols)])


def raw_scoring_model(features: PipelineModel, network: Any, reads: Sequence[str], model_uri: str = "",
                      types: Optional[Mapping[str, str]] = None):
    """The fitted feature stages and ``network`` as one raw-in, raw-out ``PipelineModel``.

    Parameters
    ----------
    features : PipelineModel
        The fitted feature pipeline (its last stage is the ``FlatFeatureAssembler``).
    network : TorchModel or KerasModel
        The fitted network.
    reads : sequence of str
        The raw columns the features read (:func:`sparktrain.serve.pyfunc.raw_columns`).
    model_uri : str
        Named in the errors.
    types : mapping, optional
        ``{raw column: Spark type}`` the model was trained on (:func:`read_as` reads each input so).

    Returns
    -------
    PipelineModel
        ``[KeepRawColumns, *feature stages, network, RestoreRawColumns]``; its
        outputs are the network's output columns as they are set now.
    """
    from sparktrain.features.stages import FlatFeatureAssembler

    outputs = [name for name, _ in network._output_columns()]
    stages: List[Any] = [KeepRawColumns(inputCols=list(reads), outputCols=outputs, modelUri=model_uri,
                                        inputTypes=json.dumps(dict(types or {})))]
    for stage in features.stages:
        if isinstance(stage, FlatFeatureAssembler):  # the private copies ride along to the network and past it
            stage = stage.copy({stage.keepInputCols: True})
        stages.append(stage)
    return PipelineModel(stages=[*stages, network, RestoreRawColumns(outputCols=outputs)])


__all__ = ["CASTABLE", "RAW_PREFIX", "KeepRawColumns", "RestoreRawColumns", "raw_scoring_model", "read_as"]
