"""Spark ML stages that encode the label for training, as :mod:`sparktrain.features.label` decides.

* :class:`LabelIndexerModel`: replaces the label column (when present, so the
  same model scores rows without one) by its class index (``mode="index"``:
  position in ``labels``, matched on ``CAST(label AS STRING)``; a value not in
  ``labels`` gives null), by its value as a double (``mode="float"``: an
  integer or boolean label trained as a regression target), or leaves it
  (``mode="keep"``).  One SQL expression, no UDF.
* :class:`LabelIndexer`: fits that model on a DataFrame (classes sorted, at
  most ``maxClasses``), for a ``Pipeline`` built by hand;
  :func:`~sparktrain.features.materialize.materialize` builds the model from
  its own check of all rows instead.

Examples
--------
>>> model = LabelIndexerModel(labelCol="city", labels=["Lima", "Oslo"])   # doctest: +SKIP
>>> model.transform(df).select("city").collect()                         # doctest: +SKIP
[Row(city=1), Row(city=0), Row(city=None)]
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame

from sparktrain.features._sql import quote, sql_string
from sparktrain.features.label import DEFAULT_MAX_CLASSES, decide_label

MODES = ("index", "float", "keep")


def _to_mode(value: Any) -> str:
    mode = TypeConverters.toString(value)
    if mode not in MODES:
        raise TypeError(f"label mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


class LabelIndexerModel(Model, HasLabelCol, DefaultParamsReadable, DefaultParamsWritable):
    """The label as training wants it: a class index, a float, or as it is (see the module docstring)."""

    _input_kwargs: Dict[str, Any]

    labels: "Param[List[str]]" = Param(Params._dummy(), "labels", "the text of each class, in index order",
                                       typeConverter=TypeConverters.toListString)
    mode: "Param[str]" = Param(Params._dummy(), "mode", "index, float or keep", typeConverter=_to_mode)

    @keyword_only
    def __init__(self, *, labelCol: Optional[str] = None, labels: Optional[List[str]] = None,
                 mode: Optional[str] = None) -> None:
        super().__init__()
        self._setDefault(labels=[], mode="index")
        self._set(**self._input_kwargs)

    def getLabels(self) -> List[str]:
        return self.getOrDefault(self.labels)

    def getMode(self) -> str:
        return self.getOrDefault(self.mode)

    def labelSql(self) -> Optional[str]:
        """The SQL expression of the encoded label (None for ``mode="keep"``)."""
        c = quote(self.getLabelCol())
        if self.getMode() == "float":
            return f"CAST({c} AS DOUBLE)"
        if self.getMode() == "keep":
            return None
        texts = ", ".join(sql_string(t) for t in self.getLabels())
        return f"CAST(nullif(array_position(array({texts}), CAST({c} AS STRING)), 0) - 1 AS INT)"

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        label, sql = self.getLabelCol(), self.labelSql()
        if sql is None or label not in dataset.columns:  # scoring rows without a label
            return dataset
        return dataset.withColumn(label, F.expr(sql))


class LabelIndexer(Estimator, HasLabelCol, DefaultParamsReadable, DefaultParamsWritable):
    """Fit a :class:`LabelIndexerModel`: classes sorted by value (numbers) or text (strings).

    Integer labels already 0..K-1 and boolean labels are kept; a float label is
    kept (regression).  More than ``maxClasses`` classes, a single class or NaN
    are refused with :class:`~sparktrain.errors.DataError`; null labels are ignored.
    """

    _input_kwargs: Dict[str, Any]

    maxClasses: "Param[int]" = Param(Params._dummy(), "maxClasses", "the most classes a label may have",
                                     typeConverter=TypeConverters.toInt)

    @keyword_only
    def __init__(self, *, labelCol: Optional[str] = None, maxClasses: Optional[int] = None) -> None:
        super().__init__()
        self._setDefault(maxClasses=DEFAULT_MAX_CLASSES)
        self._set(**self._input_kwargs)

    def getMaxClasses(self) -> int:
        return self.getOrDefault(self.maxClasses)

    def _fit(self, dataset: DataFrame) -> LabelIndexerModel:
        label = self.getLabelCol()
        dtype = dataset.schema[label].dataType.simpleString()
        decision = decide_label(dataset, label, dtype, max_classes=self.getMaxClasses())
        return self._copyValues(model_for(decision.encoding.labels, label))


def model_for(labels: Optional[List[str]], label: str) -> LabelIndexerModel:
    """The model of an encoding's ``labels`` (see :class:`~sparktrain.features.label.LabelEncoding`)."""
    if labels is None:
        return LabelIndexerModel(labelCol=label, mode="keep")
    if not labels:
        return LabelIndexerModel(labelCol=label, mode="float")
    return LabelIndexerModel(labelCol=label, labels=list(labels), mode="index")


__all__ = ["LabelIndexer", "LabelIndexerModel", "model_for"]
