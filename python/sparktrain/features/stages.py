"""Our own Spark ML stages, for what ``pyspark.ml.feature`` lacks.

* :class:`ColumnScaler` / :class:`ColumnScalerModel`: standard or min-max
  scaling of flat double columns (Spark's scalers need a vector column).
* :class:`VocabularyIndexer` / :class:`VocabularyIndexerModel`: a
  ``StringIndexer`` with a minimum frequency, a maximum vocabulary size and a
  hard limit, fitted in one shuffle.
* :class:`FlatFeatureAssembler`: the last stage; selects and casts the
  training-ready columns (float32 values, int32 indices, key and label).

Each is a ``Params`` stage with typed params, persisted with
``DefaultParamsWritable``/``DefaultParamsReadable``, so a fitted
``PipelineModel`` holding them saves and loads like any other.  Transforms are
SQL expressions, never Python UDFs.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from pyspark import keyword_only
from pyspark.ml import Estimator, Model, Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasOutputCols
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparktrain.errors import ConfigError, DataError, MissingColumnError
from sparktrain.features._sql import INTERNAL_PREFIX, quote, sql_double

SCALE_METHODS = ("standard", "minmax")


def _to_methods(value: Any) -> List[str]:
    methods = TypeConverters.toListString(value)
    for m in methods:
        if m not in SCALE_METHODS:
            raise TypeError(f"scaling method {m!r} is not one of {', '.join(SCALE_METHODS)}")
    return methods


def _to_non_negative_ints(value: Any) -> List[int]:
    ints = TypeConverters.toListInt(value)
    if any(v < 0 for v in ints):
        raise TypeError(f"expected integers >= 0, got {ints}")
    return ints


def _to_positive_ints(value: Any) -> List[int]:
    ints = TypeConverters.toListInt(value)
    if any(v < 1 for v in ints):
        raise TypeError(f"expected integers >= 1, got {ints}")
    return ints


def _to_list_list_string(value: Any) -> List[List[str]]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"could not convert {value!r} to a list of lists of strings")
    return [TypeConverters.toListString(v) for v in value]


def _per_column(values: List[int], n: int, default: int, name: str) -> List[int]:
    if not values:
        return [default] * n
    if len(values) != n:
        raise ConfigError(name, values, f"give one value per input column ({n}), or none for the default")
    return list(values)


def _require_columns(dataset: DataFrame, cols: List[str], where: str) -> List[str]:
    """Raise :class:`MissingColumnError` for the first of ``cols`` not in ``dataset``; return its columns."""
    available = dataset.columns
    present = set(available)
    for c in cols:
        if c not in present:
            raise MissingColumnError(c, available, where)
    return available


def _check_lengths(inputs: List[str], outputs: List[str], stage: str) -> None:
    if not inputs or len(inputs) != len(outputs):
        raise ConfigError(f"{stage}.outputCols", outputs,
                          f"give one output column per input column ({len(inputs)} inputs: {inputs})")


# ---------------------------------------------------------------------------------------------------------
class _ColumnScalerParams(HasInputCols, HasOutputCols):
    methods: "Param[List[str]]" = Param(
        Params._dummy(), "methods",
        "scaling per input column: 'standard' ((x - mean) / sample std) or 'minmax' ((x - min) / (max - min))",
        typeConverter=_to_methods)

    def getMethods(self) -> List[str]:
        return self.getOrDefault(self.methods)


class ColumnScaler(Estimator, _ColumnScalerParams, DefaultParamsReadable, DefaultParamsWritable):
    """Standard or min-max scaling of flat numeric columns, fitted in one aggregation.

    ``standard`` gives ``(x - mean) / std`` (sample std; a constant column
    gets std 1), ``minmax`` gives ``(x - min) / (max - min)`` (a constant
    column gives 0).  Nulls stay null.  Output columns are doubles.

    Examples
    --------
    >>> df = spark.createDataFrame([(1.0, 10.0), (3.0, 30.0)], "a double, b double")  # doctest: +SKIP
    >>> model = ColumnScaler(inputCols=["a", "b"], outputCols=["a_s", "b_s"],
    ...                      methods=["standard", "minmax"]).fit(df)                    # doctest: +SKIP
    >>> model.getOffsets(), model.getScales()                                           # doctest: +SKIP
    ([2.0, 10.0], [1.4142135623730951, 20.0])
    """

    _input_kwargs: Dict[str, Any]

    @keyword_only
    def __init__(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                 methods: Optional[List[str]] = None) -> None:
        super().__init__()
        kwargs = self._input_kwargs
        self.setParams(**kwargs)

    @keyword_only
    def setParams(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                  methods: Optional[List[str]] = None) -> "ColumnScaler":
        """Set the params of this stage; returns ``self``."""
        return self._set(**self._input_kwargs)

    def setInputCols(self, value: List[str]) -> "ColumnScaler":
        return self._set(inputCols=value)

    def setOutputCols(self, value: List[str]) -> "ColumnScaler":
        return self._set(outputCols=value)

    def setMethods(self, value: List[str]) -> "ColumnScaler":
        return self._set(methods=value)

    def _fit(self, dataset: DataFrame) -> "ColumnScalerModel":
        inputs, outputs, methods = self.getInputCols(), self.getOutputCols(), self.getMethods()
        _check_lengths(inputs, outputs, "ColumnScaler")
        if len(methods) != len(inputs):
            raise ConfigError("ColumnScaler.methods", methods, f"give one method per input column ({len(inputs)})")
        _require_columns(dataset, inputs, "the DataFrame given to ColumnScaler.fit")
        aggs = []
        for i, (c, m) in enumerate(zip(inputs, methods)):
            col = F.col(c).cast("double")
            if m == "standard":
                aggs += [F.avg(col).alias(f"a{i}"), F.stddev_samp(col).alias(f"b{i}")]
            else:
                aggs += [F.min(col).alias(f"a{i}"), F.max(col).alias(f"b{i}")]
        row = dataset.agg(*aggs).first()  # one row of statistics
        if row is None:  # pragma: no cover - a global aggregate always returns one row
            raise DataError("ColumnScaler: the statistics query returned no row")
        return self.modelFromStatistics([(row[f"a{i}"], row[f"b{i}"]) for i in range(len(inputs))])

    def modelFromStatistics(self, statistics: List[Any]) -> "ColumnScalerModel":
        """The fitted model from per-column statistics computed elsewhere.

        ``statistics`` holds one ``(mean, sample_std)`` pair per ``standard``
        column and one ``(min, max)`` pair per ``minmax`` column, as ``fit``
        computes them (non-null values; ``None`` when there are none).  Lets a
        caller that already aggregated the data in a fused pass skip ``fit``'s
        own pass; the scale rules stay here.
        """
        offsets, scales = [], []
        for c, m, (a, b) in zip(self.getInputCols(), self.getMethods(), statistics):
            if a is None:
                raise DataError(f"column '{c}' has no non-null values to fit a '{m}' scaler on. "
                                f"Impute it first or drop the feature.")
            if m == "standard":
                scale = b if b is not None and math.isfinite(b) and b > 0 else 1.0
            else:
                scale = (b - a) if b > a else 1.0
            offsets.append(float(a))
            scales.append(float(scale))
        model = ColumnScalerModel(offsets=offsets, scales=scales)
        return self._copyValues(model)


class ColumnScalerModel(Model, _ColumnScalerParams, DefaultParamsReadable, DefaultParamsWritable):
    """Fitted :class:`ColumnScaler`: ``(x - offset) / scale`` per column."""

    _input_kwargs: Dict[str, Any]

    offsets: "Param[List[float]]" = Param(Params._dummy(), "offsets", "subtracted per column (mean or min)",
                                          typeConverter=TypeConverters.toListFloat)
    scales: "Param[List[float]]" = Param(Params._dummy(), "scales", "divisor per column (std or max - min), > 0",
                                         typeConverter=TypeConverters.toListFloat)

    @keyword_only
    def __init__(self, *, offsets: Optional[List[float]] = None, scales: Optional[List[float]] = None) -> None:
        super().__init__()
        self._setDefault(offsets=[], scales=[])
        self._set(**self._input_kwargs)

    def getOffsets(self) -> List[float]:
        return self.getOrDefault(self.offsets)

    def getScales(self) -> List[float]:
        return self.getOrDefault(self.scales)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        inputs, outputs = self.getInputCols(), self.getOutputCols()
        _require_columns(dataset, inputs, "the DataFrame given to ColumnScalerModel.transform")
        # one projection from SQL text: about one JVM call per column (a Column expression tree is several)
        exprs = {out: F.expr(f"(CAST({quote(c)} AS DOUBLE) - {sql_double(o)}) / {sql_double(s)}")
                 for c, out, o, s in zip(inputs, outputs, self.getOffsets(), self.getScales())}
        return dataset.withColumns(exprs)


# ---------------------------------------------------------------------------------------------------------
class _VocabularyIndexerParams(HasInputCols, HasOutputCols):
    minFrequencies: "Param[List[int]]" = Param(
        Params._dummy(), "minFrequencies",
        "per input column: values seen fewer times map to the reserved index (empty: 1 for all)",
        typeConverter=_to_positive_ints)
    maxVocabSizes: "Param[List[int]]" = Param(
        Params._dummy(), "maxVocabSizes",
        "per input column: keep only the most frequent values (0 = no maximum; empty: 0 for all)",
        typeConverter=_to_non_negative_ints)
    vocabLimits: "Param[List[int]]" = Param(
        Params._dummy(), "vocabLimits",
        "per input column: refuse to fit when the vocabulary would exceed this size (empty: 10000 for all)",
        typeConverter=_to_positive_ints)

    def getMinFrequencies(self) -> List[int]:
        return self.getOrDefault(self.minFrequencies)

    def getMaxVocabSizes(self) -> List[int]:
        return self.getOrDefault(self.maxVocabSizes)

    def getVocabLimits(self) -> List[int]:
        return self.getOrDefault(self.vocabLimits)


class VocabularyIndexer(Estimator, _VocabularyIndexerParams, DefaultParamsReadable, DefaultParamsWritable):
    """A ``StringIndexer`` with minimum frequency, maximum size and a hard size limit.

    Index layout is ``StringIndexer(handleInvalid="keep",
    stringOrderType="frequencyDesc")``'s: ``0 .. V-1`` by descending count,
    ties by value, and ``V`` for null, unseen and rare values.  All columns
    are counted in one shuffle; only the kept vocabulary (at most
    ``vocabLimit + 1`` values per column) reaches the driver.

    Examples
    --------
    >>> df = spark.createDataFrame([("a",), ("a",), ("b",), (None,)], "x string")  # doctest: +SKIP
    >>> model = VocabularyIndexer(inputCols=["x"], outputCols=["x_idx"], minFrequencies=[2]).fit(df)  # doctest: +SKIP
    >>> model.getLabelsArray()                                                       # doctest: +SKIP
    [['a']]
    """

    _input_kwargs: Dict[str, Any]

    @keyword_only
    def __init__(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                 minFrequencies: Optional[List[int]] = None, maxVocabSizes: Optional[List[int]] = None,
                 vocabLimits: Optional[List[int]] = None) -> None:
        super().__init__()
        self._setDefault(minFrequencies=[], maxVocabSizes=[], vocabLimits=[])
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                  minFrequencies: Optional[List[int]] = None, maxVocabSizes: Optional[List[int]] = None,
                  vocabLimits: Optional[List[int]] = None) -> "VocabularyIndexer":
        """Set the params of this stage; returns ``self``."""
        return self._set(**self._input_kwargs)

    def setInputCols(self, value: List[str]) -> "VocabularyIndexer":
        return self._set(inputCols=value)

    def setOutputCols(self, value: List[str]) -> "VocabularyIndexer":
        return self._set(outputCols=value)

    def _fit(self, dataset: DataFrame) -> "VocabularyIndexerModel":
        inputs, outputs = self.getInputCols(), self.getOutputCols()
        _check_lengths(inputs, outputs, "VocabularyIndexer")
        _require_columns(dataset, inputs, "the DataFrame given to VocabularyIndexer.fit")
        mins, caps = self.countBounds()
        return self.modelFromLabels(top_values(dataset, [F.col(c) for c in inputs], mins, caps))

    def countBounds(self) -> Tuple[List[int], List[int]]:
        """Per input column: the minimum count and the most values :func:`top_values` must keep
        (``min(maxVocabSize, vocabLimit + 1)``: one over the limit shows it is exceeded)."""
        n = len(self.getInputCols())
        mins = _per_column(self.getMinFrequencies(), n, 1, "VocabularyIndexer.minFrequencies")
        maxes = _per_column(self.getMaxVocabSizes(), n, 0, "VocabularyIndexer.maxVocabSizes")
        limits = _per_column(self.getVocabLimits(), n, 10_000, "VocabularyIndexer.vocabLimits")
        return mins, [min(m, lim + 1) if m > 0 else lim + 1 for m, lim in zip(maxes, limits)]

    def modelFromLabels(self, labels: List[List[str]]) -> "VocabularyIndexerModel":
        """The fitted model from per-column vocabularies counted elsewhere (:func:`top_values` with
        :meth:`countBounds`); checks the limits."""
        inputs = self.getInputCols()
        n = len(inputs)
        mins = _per_column(self.getMinFrequencies(), n, 1, "VocabularyIndexer.minFrequencies")
        limits = _per_column(self.getVocabLimits(), n, 10_000, "VocabularyIndexer.vocabLimits")
        for i, c in enumerate(inputs):
            if len(labels[i]) > limits[i]:  # only possible without a max_vocab below the limit
                raise DataError(
                    f"column '{c}' has more than {limits[i]} distinct values seen at least {mins[i]} times "
                    f"(vocab_limit={limits[i]}). Set max_vocab to keep the most frequent ones, raise "
                    f"min_frequency or vocab_limit, or use hash_buckets.")
            if not labels[i]:
                raise DataError(f"column '{c}' has no value seen at least {mins[i]} times (min_frequency), so "
                                f"its vocabulary is empty. Lower min_frequency or drop the feature.")
        model = VocabularyIndexerModel(labelsArray=[list(x) for x in labels])
        return self._copyValues(model)


def top_values(dataset: DataFrame, columns: List[Any], mins: List[int], caps: List[int]) -> List[List[str]]:
    """Per column: its non-null values (as text) seen at least ``mins[i]`` times, most frequent first, ties by
    value, at most ``caps[i]`` of them (``StringIndexer``'s ``frequencyDesc`` order).

    All columns are counted in one shuffle; only the kept values (``sum(caps)``
    rows at most) reach the driver.
    """
    from pyspark.sql import Window

    pairs = dataset.select(F.explode(F.array(*[
        F.struct(F.lit(i).alias("c"), col.cast("string").alias("v")) for i, col in enumerate(columns)
    ])).alias("p")).select("p.c", "p.v").where(F.col("v").isNotNull())
    counts = pairs.groupBy("c", "v").count()
    counts = counts.where(F.col("count") >= F.element_at(F.array(*map(F.lit, mins)), F.col("c") + 1))
    labels: List[List[str]] = [[] for _ in columns]
    bound = sum(caps) + 1
    found = counts.limit(bound).collect()
    if len(found) < bound:  # the usual case: every kept value fits in the bound, rank them here
        for c, v, _ in sorted(found, key=lambda r: (r["c"], -r["count"], r["v"])):
            if len(labels[c]) < caps[c]:
                labels[c].append(v)
        return labels
    # many values: rank per column on the cluster, so only sum(caps) rows reach the driver
    window = Window.partitionBy("c").orderBy(F.desc("count"), F.asc("v"))
    ranked = (counts.withColumn("r", F.row_number().over(window))
              .where(F.col("r") <= F.element_at(F.array(*map(F.lit, caps)), F.col("c") + 1)))
    for row in sorted(ranked.select("c", "r", "v").collect()):
        labels[row["c"]].append(row["v"])
    return labels


class VocabularyIndexerModel(Model, _VocabularyIndexerParams, DefaultParamsReadable, DefaultParamsWritable):
    """Fitted :class:`VocabularyIndexer`; transforms like ``StringIndexerModel(handleInvalid='keep')``."""

    _input_kwargs: Dict[str, Any]

    labelsArray: "Param[List[List[str]]]" = Param(
        Params._dummy(), "labelsArray", "the vocabulary of each input column, most frequent first",
        typeConverter=_to_list_list_string)

    @keyword_only
    def __init__(self, *, labelsArray: Optional[List[List[str]]] = None) -> None:
        super().__init__()
        self._setDefault(minFrequencies=[], maxVocabSizes=[], vocabLimits=[], labelsArray=[])
        self._set(**self._input_kwargs)

    def getLabelsArray(self) -> List[List[str]]:
        return self.getOrDefault(self.labelsArray)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.feature import StringIndexerModel

        inputs, outputs = self.getInputCols(), self.getOutputCols()
        _require_columns(dataset, inputs, "the DataFrame given to VocabularyIndexerModel.transform")
        # Spark's JVM lookup (a hash map, no Python UDF) with our fitted labels; like fit, it casts a
        # numeric input to string.  One model per column: from_arrays_of_labels pads ragged label
        # arrays with nulls, which would move the reserved index.
        for c, out, labels in zip(inputs, outputs, self.getLabelsArray()):
            inner = StringIndexerModel.from_labels(labels, inputCol=c, outputCol=out, handleInvalid="keep")
            dataset = inner.transform(dataset)
        return dataset


# ---------------------------------------------------------------------------------------------------------
class FlatFeatureAssembler(Transformer, DefaultParamsReadable, DefaultParamsWritable):
    """The training-ready frame: float32 value columns, int32 index columns, key and label.

    Unlike ``VectorAssembler`` it keeps columns flat, so the Parquet it feeds
    reads at full pyarrow speed and each index column can feed an embedding.
    A boolean label becomes float32 0/1, a fractional one float32 and an
    integral one int32; key and label pass through only when present, so the
    same model scores raw data that has neither.

    Examples
    --------
    >>> asm = FlatFeatureAssembler(floatInputCols=["__st_x"], floatOutputCols=["x"],
    ...                            intInputCols=["__st_c"], intOutputCols=["c"], labelCol="label")  # doctest: +SKIP
    >>> asm.transform(df).dtypes                                                      # doctest: +SKIP
    [('label', 'float'), ('x', 'float'), ('c', 'int')]
    """

    _input_kwargs: Dict[str, Any]

    floatInputCols: "Param[List[str]]" = Param(Params._dummy(), "floatInputCols", "columns cast to float32",
                                               typeConverter=TypeConverters.toListString)
    floatOutputCols: "Param[List[str]]" = Param(Params._dummy(), "floatOutputCols", "names of the float32 columns",
                                                typeConverter=TypeConverters.toListString)
    intInputCols: "Param[List[str]]" = Param(Params._dummy(), "intInputCols", "columns cast to int32",
                                             typeConverter=TypeConverters.toListString)
    intOutputCols: "Param[List[str]]" = Param(Params._dummy(), "intOutputCols", "names of the int32 columns",
                                              typeConverter=TypeConverters.toListString)
    keyCol: "Param[str]" = Param(Params._dummy(), "keyCol", "row key passed through when present ('' = none)",
                                 typeConverter=TypeConverters.toString)
    labelCol: "Param[str]" = Param(Params._dummy(), "labelCol", "label passed through when present ('' = none)",
                                   typeConverter=TypeConverters.toString)
    keepInputCols: "Param[bool]" = Param(
        Params._dummy(), "keepInputCols",
        "also keep the input columns (e.g. inside a larger Pipeline); intermediate columns are always dropped",
        typeConverter=TypeConverters.toBoolean)
    passThroughCols: "Param[List[str]]" = Param(
        Params._dummy(), "passThroughCols", "more columns passed through as they are, when present",
        typeConverter=TypeConverters.toListString)
    blockInputCols: "Param[List[str]]" = Param(Params._dummy(), "blockInputCols", "array columns cast to "
                                               "array<float> (float blocks)", typeConverter=TypeConverters.toListString)
    blockOutputCols: "Param[List[str]]" = Param(Params._dummy(), "blockOutputCols", "names of the array<float> "
                                                "columns", typeConverter=TypeConverters.toListString)
    idsInputCols: "Param[List[str]]" = Param(Params._dummy(), "idsInputCols", "array columns cast to array<int> "
                                             "(embedding-bag ids)", typeConverter=TypeConverters.toListString)
    idsOutputCols: "Param[List[str]]" = Param(Params._dummy(), "idsOutputCols", "names of the array<int> columns",
                                              typeConverter=TypeConverters.toListString)

    @keyword_only
    def __init__(self, *, floatInputCols: Optional[List[str]] = None, floatOutputCols: Optional[List[str]] = None,
                 intInputCols: Optional[List[str]] = None, intOutputCols: Optional[List[str]] = None,
                 keyCol: Optional[str] = None, labelCol: Optional[str] = None,
                 keepInputCols: Optional[bool] = None) -> None:
        super().__init__()
        self._setDefault(floatInputCols=[], floatOutputCols=[], intInputCols=[], intOutputCols=[],
                         keyCol="", labelCol="", keepInputCols=False, passThroughCols=[], blockInputCols=[],
                         blockOutputCols=[], idsInputCols=[], idsOutputCols=[])
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, floatInputCols: Optional[List[str]] = None, floatOutputCols: Optional[List[str]] = None,
                  intInputCols: Optional[List[str]] = None, intOutputCols: Optional[List[str]] = None,
                  keyCol: Optional[str] = None, labelCol: Optional[str] = None,
                  keepInputCols: Optional[bool] = None) -> "FlatFeatureAssembler":
        """Set the params of this stage; returns ``self``."""
        return self._set(**self._input_kwargs)

    def setKeepInputCols(self, value: bool) -> "FlatFeatureAssembler":
        return self._set(keepInputCols=value)

    def getKeepInputCols(self) -> bool:
        return self.getOrDefault(self.keepInputCols)

    def getKeyCol(self) -> str:
        return self.getOrDefault(self.keyCol)

    def getLabelCol(self) -> str:
        return self.getOrDefault(self.labelCol)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        f_in, f_out = self.getOrDefault(self.floatInputCols), self.getOrDefault(self.floatOutputCols)
        i_in, i_out = self.getOrDefault(self.intInputCols), self.getOrDefault(self.intOutputCols)
        b_in, b_out = self.getOrDefault(self.blockInputCols), self.getOrDefault(self.blockOutputCols)
        d_in, d_out = self.getOrDefault(self.idsInputCols), self.getOrDefault(self.idsOutputCols)
        if len(f_in) != len(f_out) or len(i_in) != len(i_out) or len(b_in) != len(b_out) or len(d_in) != len(d_out):
            raise ConfigError("FlatFeatureAssembler", (f_in, f_out, i_in, i_out, b_in, b_out, d_in, d_out),
                              "give one output column per input column")
        available = _require_columns(dataset, f_in + i_in + b_in + d_in,
                                     "the DataFrame given to FlatFeatureAssembler.transform")
        outputs = set(f_out) | set(i_out) | set(b_out) | set(d_out)
        cols: List[str] = []
        key, label = self.getKeyCol(), self.getLabelCol()
        if key and key in available:
            cols.append(quote(key))
        if label and label in available:
            cols.append(label_sql(dataset.schema[label].dataType, label))
        passed = [c for c in self.getOrDefault(self.passThroughCols) if c in available and c not in (key, label)]
        cols += [quote(c) for c in passed]
        if self.getKeepInputCols():
            cols += [quote(c) for c in available
                     if not c.startswith(INTERNAL_PREFIX) and c not in outputs and c not in (key, label, *passed)]
        cols += [f"CAST({quote(c)} AS FLOAT) AS {quote(o)}" for c, o in zip(f_in, f_out)]
        cols += [f"CAST({quote(c)} AS INT) AS {quote(o)}" for c, o in zip(i_in, i_out)]
        cols += [f"CAST({quote(c)} AS ARRAY<FLOAT>) AS {quote(o)}" for c, o in zip(b_in, b_out)]
        cols += [f"CAST({quote(c)} AS ARRAY<INT>) AS {quote(o)}" for c, o in zip(d_in, d_out)]
        return dataset.selectExpr(*cols)  # SQL text: about one JVM call per column, not five


def label_sql(dtype: T.DataType, name: str) -> str:
    """The label as training wants it, as SQL: boolean/fractional -> float32, integral -> int32, else as is."""
    if isinstance(dtype, (T.BooleanType, T.FloatType, T.DoubleType, T.DecimalType)):
        return f"CAST({quote(name)} AS FLOAT) AS {quote(name)}"
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return f"CAST({quote(name)} AS INT) AS {quote(name)}"
    return quote(name)


__all__ = [
    "INTERNAL_PREFIX",
    "ColumnScaler",
    "ColumnScalerModel",
    "FlatFeatureAssembler",
    "top_values",
    "VocabularyIndexer",
    "VocabularyIndexerModel",
]
