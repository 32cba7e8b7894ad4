"""Spark ML stages for the array-valued feature types: vectors, text and sets.

* :class:`VectorEncoder` / :class:`VectorEncoderModel`: a Spark ML vector
  (``vector_to_array`` in Spark) or a numeric array becomes an
  ``array<double>`` of one fitted width, with per-element standard scaling and
  the ``on_invalid`` rule for NaN, infinite and null elements.
* :class:`TokenIndexer` / :class:`TokenIndexerModel`: ``array<string>``
  tokens (a ``RegexTokenizer``'s output, or a set's items) become exactly
  ``maxLength`` int ids: ``0`` padding, ``1`` out of vocabulary, ``2 .. V+1``
  the vocabulary, most frequent first (ties by token); or ``2 + crc32 mod N``
  with hashing.

Both fit out of core: the statistics are aggregations, and only the kept
vocabulary (bounded by ``vocabLimit + 1``) or the per-element moments reach
the driver.  Vectors transform as SQL expressions; a vocabulary lookup runs
as an Arrow UDF (a hash lookup over whole Arrow columns, no per-row Python);
hashing is SQL.  Each stage persists with ``DefaultParamsWritable``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasOutputCols
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparktrain.errors import ConfigError, DataError
from sparktrain.features._sql import INTERNAL_PREFIX, quote, sql_double, sql_string
from sparktrain.features.stages import _check_lengths, _require_columns, _to_list_list_string

ON_INVALID = ("impute", "error")


def _to_on_invalid(value: Any) -> List[str]:
    rules = TypeConverters.toListString(value)
    for r in rules:
        if r not in ON_INVALID:
            raise TypeError(f"on_invalid rule {r!r} is not one of {', '.join(ON_INVALID)}")
    return rules


def _to_list_bool(value: Any) -> List[bool]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, bool) for v in value):
        raise TypeError(f"could not convert {value!r} to a list of booleans")
    return list(value)


def _to_list_list_float(value: Any) -> List[List[float]]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"could not convert {value!r} to a list of lists of floats")
    return [TypeConverters.toListFloat(v) for v in value]


def _per(values: List[Any], n: int, name: str) -> List[Any]:
    if len(values) != n:
        raise ConfigError(name, values, f"give one value per input column ({n})")
    return list(values)


def _as_array(dataset: DataFrame, column: str, alias: str) -> Any:
    """``column`` as an ``array<double>`` Column: ``vector_to_array`` for a Spark ML vector, else a cast."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    if isinstance(dataset.schema[column].dataType, VectorUDT):
        return vector_to_array(F.col(quote(column)), "float64").alias(alias)
    return F.col(quote(column)).cast("array<double>").alias(alias)


# ---------------------------------------------------------------------------------------------------------
class _VectorEncoderParams(HasInputCols, HasOutputCols):
    scaled: "Param[List[bool]]" = Param(Params._dummy(), "scaled", "per input column: standard-scale each element",
                                        typeConverter=_to_list_bool)
    onInvalid: "Param[List[str]]" = Param(
        Params._dummy(), "onInvalid",
        "per input column: a NaN, infinite or null element (or null row) is 'impute'd with 0 or an 'error'",
        typeConverter=_to_on_invalid)
    features: "Param[List[str]]" = Param(Params._dummy(), "features", "per input column: the feature's name "
                                         "(for error messages)", typeConverter=TypeConverters.toListString)

    def _settings(self) -> tuple:
        inputs, outputs = self.getInputCols(), self.getOutputCols()
        _check_lengths(inputs, outputs, "VectorEncoder")
        n = len(inputs)
        names = self.getOrDefault(self.features) or list(inputs)
        return (inputs, outputs, _per(self.getOrDefault(self.scaled) or [False] * n, n, "VectorEncoder.scaled"),
                _per(self.getOrDefault(self.onInvalid) or ["impute"] * n, n, "VectorEncoder.onInvalid"),
                _per(names, n, "VectorEncoder.features"))


class VectorEncoder(Estimator, _VectorEncoderParams, DefaultParamsReadable, DefaultParamsWritable):
    """Spark ML vectors or numeric arrays -> ``array<double>`` of one width, optionally standard-scaled.

    ``fit`` reads the train rows once for the lengths and invalid counts of
    every column, and once more (``posexplode`` + ``groupBy``) for the
    per-element moments of scaled columns.  Rows of different lengths, a
    column with no non-null row, or invalid elements under ``error`` raise
    :class:`~sparktrain.errors.DataError` naming the column.

    Examples
    --------
    >>> enc = VectorEncoder(inputCols=["emb"], outputCols=["emb_arr"], scaled=[True])  # doctest: +SKIP
    >>> enc.fit(df).getWidths()                                                        # doctest: +SKIP
    [64]
    """

    _input_kwargs: Dict[str, Any]

    @keyword_only
    def __init__(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                 scaled: Optional[List[bool]] = None, onInvalid: Optional[List[str]] = None,
                 features: Optional[List[str]] = None) -> None:
        super().__init__()
        self._setDefault(scaled=[], onInvalid=[], features=[])
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                  scaled: Optional[List[bool]] = None, onInvalid: Optional[List[str]] = None,
                  features: Optional[List[str]] = None) -> "VectorEncoder":
        """Set the params of this stage; returns ``self``."""
        return self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> "VectorEncoderModel":
        inputs, _, scaled, rules, names = self._settings()
        _require_columns(dataset, inputs, "the DataFrame given to VectorEncoder.fit")
        arrays = dataset.select(*[_as_array(dataset, c, f"a{i}") for i, c in enumerate(inputs)])
        aggs = []
        for i in range(len(inputs)):
            a = F.col(f"a{i}")
            bad = F.exists(a, lambda x: ~(F.abs(x) < F.lit(float("inf"))) | x.isNull())
            aggs += [F.count(a).alias(f"n{i}"), F.min(F.size(a)).alias(f"lo{i}"), F.max(F.size(a)).alias(f"hi{i}"),
                     F.count_if(bad).alias(f"bad{i}"), F.count_if(a.isNull()).alias(f"null{i}")]
        row = arrays.agg(*aggs).first()
        assert row is not None  # a global aggregate returns one row
        widths = []
        for i, (c, rule, name) in enumerate(zip(inputs, rules, names)):
            where = f"column '{c}' (feature '{name}', vector)"
            if not row[f"n{i}"]:
                raise DataError(f"{where} is null in every row the features are fitted on (the train split), so "
                                f"its length is unknown. Fix the input, or drop the feature.")
            lo, hi = int(row[f"lo{i}"]), int(row[f"hi{i}"])
            if lo != hi:
                seen = sorted(r[0] for r in arrays.select(F.size(f"a{i}")).where(F.col(f"a{i}").isNotNull())
                              .distinct().limit(10).collect())
                raise DataError(f"{where} holds rows of different lengths (lengths seen: "
                                f"{', '.join(map(str, seen))}); a vector feature needs one length. Pad or cut the "
                                f"arrays in Spark (slice, concat with array_repeat), or fix the pipeline that "
                                f"builds the vectors.")
            if rule == "error" and (row[f"bad{i}"] or row[f"null{i}"]):
                raise DataError(f"{where} has {row[f'bad{i}']:,} rows with a NaN, infinite or null element and "
                                f"{row[f'null{i}']:,} null rows (on_invalid: error). Set on_invalid: impute to "
                                f"read them as 0, or clean the data.")
            widths.append(lo)
        means: List[List[float]] = [[] for _ in inputs]
        stds: List[List[float]] = [[] for _ in inputs]
        todo = [i for i, s in enumerate(scaled) if s]
        if todo:
            parts = [arrays.select(F.lit(i).alias("c"), F.posexplode(f"a{i}").alias("p", "x")) for i in todo]
            frame = parts[0]
            for p in parts[1:]:
                frame = frame.unionByName(p)
            finite = F.when(F.abs("x") < F.lit(float("inf")), F.col("x"))
            rows = frame.groupBy("c", "p").agg(F.avg(finite).alias("m"), F.stddev_samp(finite).alias("s")).collect()
            for i in todo:
                means[i], stds[i] = [0.0] * widths[i], [1.0] * widths[i]
            for r in rows:
                m, s = r["m"], r["s"]
                means[r["c"]][r["p"]] = float(m) if m is not None else 0.0
                stds[r["c"]][r["p"]] = float(s) if s is not None and s > 0 else 1.0
        model = VectorEncoderModel(widths=widths, means=means, stds=stds)
        return self._copyValues(model)


class VectorEncoderModel(Model, _VectorEncoderParams, DefaultParamsReadable, DefaultParamsWritable):
    """Fitted :class:`VectorEncoder`; a row of another length than the fitted width fails the job, naming it."""

    _input_kwargs: Dict[str, Any]

    widths: "Param[List[int]]" = Param(Params._dummy(), "widths", "values per row, per input column",
                                       typeConverter=TypeConverters.toListInt)
    means: "Param[List[List[float]]]" = Param(Params._dummy(), "means", "per input column: element means "
                                              "(empty: not scaled)", typeConverter=_to_list_list_float)
    stds: "Param[List[List[float]]]" = Param(Params._dummy(), "stds", "per input column: element sample stds "
                                             "(empty: not scaled)", typeConverter=_to_list_list_float)

    @keyword_only
    def __init__(self, *, widths: Optional[List[int]] = None, means: Optional[List[List[float]]] = None,
                 stds: Optional[List[List[float]]] = None) -> None:
        super().__init__()
        self._setDefault(scaled=[], onInvalid=[], features=[], widths=[], means=[], stds=[])
        self._set(**self._input_kwargs)

    def getWidths(self) -> List[int]:
        return self.getOrDefault(self.widths)

    def getMeans(self) -> List[List[float]]:
        return self.getOrDefault(self.means)

    def getStds(self) -> List[List[float]]:
        return self.getOrDefault(self.stds)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        inputs, outputs, _, rules, names = self._settings()
        _require_columns(dataset, inputs, "the DataFrame given to VectorEncoderModel.transform")
        tmps = [f"{INTERNAL_PREFIX}vec{i}" for i in range(len(inputs))]
        frame = dataset.select("*", *[_as_array(dataset, c, t) for c, t in zip(inputs, tmps)])
        exprs = {}
        for c, out, tmp, w, m, s, rule, name in zip(inputs, outputs, tmps, self.getWidths(), self.getMeans(),
                                                     self.getStds(), rules, names):
            a = quote(tmp)
            where = f"column '{c}' (feature '{name}', vector)"
            length = sql_string(f"{where} has a row of another length than the {w} values it was fitted on; "
                                f"give every row {w} values")
            x = "x"
            if m:
                means = "array(" + ", ".join(sql_double(v) for v in m) + ")"
                stds = "array(" + ", ".join(sql_double(v) for v in s) + ")"
                x = f"(x - element_at({means}, i + 1)) / element_at({stds}, i + 1)"
            finite = "abs(x) < CAST('Infinity' AS DOUBLE)"
            if rule == "error":
                msg = sql_string(f"{where} has a NaN, infinite or null value (on_invalid: error); set "
                                 f"on_invalid: impute to read it as 0, or clean the data")
                element = f"IF(coalesce({finite}, false), {x}, raise_error({msg}))"
                null_row = f"raise_error({msg})"
            else:
                element = f"IF(coalesce({finite}, false), {x}, CAST(0 AS DOUBLE))"
                null_row = f"array_repeat(CAST(0 AS DOUBLE), {int(w)})"
            exprs[out] = F.expr(f"CASE WHEN {a} IS NULL THEN {null_row} WHEN size({a}) != {int(w)} "
                                f"THEN raise_error({length}) ELSE transform({a}, (x, i) -> {element}) END")
        return frame.withColumns(exprs).drop(*tmps)


# ---------------------------------------------------------------------------------------------------------
class _TokenIndexerParams(HasInputCols, HasOutputCols):
    maxLengths: "Param[List[int]]" = Param(Params._dummy(), "maxLengths", "per input column: ids per row "
                                           "(cut or padded with 0)", typeConverter=TypeConverters.toListInt)
    minFrequencies: "Param[List[int]]" = Param(Params._dummy(), "minFrequencies", "per input column: tokens seen "
                                               "fewer times are out of vocabulary (id 1)",
                                               typeConverter=TypeConverters.toListInt)
    maxVocabSizes: "Param[List[int]]" = Param(Params._dummy(), "maxVocabSizes", "per input column: keep the most "
                                              "frequent tokens (0 = no maximum)",
                                              typeConverter=TypeConverters.toListInt)
    vocabLimits: "Param[List[int]]" = Param(Params._dummy(), "vocabLimits", "per input column: refuse a larger "
                                            "vocabulary", typeConverter=TypeConverters.toListInt)
    hashBuckets: "Param[List[int]]" = Param(Params._dummy(), "hashBuckets", "per input column: hash tokens into N "
                                            "ids instead of a vocabulary (0 = vocabulary)",
                                            typeConverter=TypeConverters.toListInt)
    sources: "Param[List[str]]" = Param(Params._dummy(), "sources", "per input column: the raw column and feature, "
                                        "for error messages", typeConverter=TypeConverters.toListString)

    def _settings(self) -> tuple:
        inputs, outputs = self.getInputCols(), self.getOutputCols()
        _check_lengths(inputs, outputs, "TokenIndexer")
        n = len(inputs)

        def get(p: Param, default: Any) -> List[Any]:
            return _per(self.getOrDefault(p) or [default] * n, n, f"TokenIndexer.{p.name}")

        return (inputs, outputs, get(self.maxLengths, 32), get(self.minFrequencies, 1), get(self.maxVocabSizes, 0),
                get(self.vocabLimits, 100_000), get(self.hashBuckets, 0), get(self.sources, ""))


class TokenIndexer(Estimator, _TokenIndexerParams, DefaultParamsReadable, DefaultParamsWritable):
    """``array<string>`` tokens -> ``array<int>`` of exactly ``maxLength`` ids (0 padding, 1 unknown, 2.. vocabulary).

    ``fit`` counts each vocabulary column's tokens with one ``explode`` +
    ``groupBy`` over the train rows and keeps the ``min(maxVocabSize,
    vocabLimit + 1)`` most frequent (a bounded ``TakeOrderedAndProject``), so
    a vocabulary over ``vocabLimit`` is refused without collecting it.  A
    column with no token at all is refused by name.

    Examples
    --------
    >>> tok = TokenIndexer(inputCols=["words"], outputCols=["ids"], maxLengths=[4])  # doctest: +SKIP
    >>> tok.fit(df).getVocabularies()                                                 # doctest: +SKIP
    [['the', 'cat', 'sat']]
    """

    _input_kwargs: Dict[str, Any]

    @keyword_only
    def __init__(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                 maxLengths: Optional[List[int]] = None, minFrequencies: Optional[List[int]] = None,
                 maxVocabSizes: Optional[List[int]] = None, vocabLimits: Optional[List[int]] = None,
                 hashBuckets: Optional[List[int]] = None, sources: Optional[List[str]] = None) -> None:
        super().__init__()
        self._setDefault(maxLengths=[], minFrequencies=[], maxVocabSizes=[], vocabLimits=[], hashBuckets=[],
                         sources=[])
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, inputCols: Optional[List[str]] = None, outputCols: Optional[List[str]] = None,
                  maxLengths: Optional[List[int]] = None, minFrequencies: Optional[List[int]] = None,
                  maxVocabSizes: Optional[List[int]] = None, vocabLimits: Optional[List[int]] = None,
                  hashBuckets: Optional[List[int]] = None, sources: Optional[List[str]] = None) -> "TokenIndexer":
        """Set the params of this stage; returns ``self``."""
        return self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> "TokenIndexerModel":
        inputs, _, _, mins, maxes, limits, buckets, sources = self._settings()
        _require_columns(dataset, inputs, "the DataFrame given to TokenIndexer.fit")
        row = dataset.agg(*[F.sum(F.size(F.coalesce(F.col(quote(c)), F.array()))).alias(f"t{i}")
                            for i, c in enumerate(inputs)]).first()
        assert row is not None  # a global aggregate returns one row
        vocabularies: List[List[str]] = []
        for i, c in enumerate(inputs):
            where = sources[i] or f"column '{c}'"
            if not row[f"t{i}"]:
                raise DataError(f"{where} has no token in any row the features are fitted on (the train split): it "
                                f"is null or empty in every row after tokenization. Check the column (and the "
                                f"feature's pattern or delimiter), or drop the feature.")
            if buckets[i]:
                vocabularies.append([])
                continue
            cap = min(maxes[i], limits[i] + 1) if maxes[i] > 0 else limits[i] + 1
            counts = (dataset.select(F.explode(F.col(quote(c))).alias("t")).where(F.col("t").isNotNull())
                      .groupBy("t").count().where(F.col("count") >= mins[i]))
            top = counts.orderBy(F.desc("count"), F.asc("t")).limit(cap).collect()
            if len(top) > limits[i]:
                size = counts.count()
                raise DataError(f"{where} has {size:,} distinct values seen at least {mins[i]} time(s), over its "
                                f"vocab_limit={limits[i]:,}. Set max_vocab to keep the most frequent ones, raise "
                                f"min_frequency or vocab_limit, or use hash_buckets: N.")
            if not top:
                raise DataError(f"{where} has no token seen at least {mins[i]} times (min_frequency) in the train "
                                f"split, so its vocabulary is empty. Lower min_frequency or drop the feature.")
            vocabularies.append([r["t"] for r in top])
        model = TokenIndexerModel(vocabularies=vocabularies)
        return self._copyValues(model)


class TokenIndexerModel(Model, _TokenIndexerParams, DefaultParamsReadable, DefaultParamsWritable):
    """Fitted :class:`TokenIndexer`: ids from the fitted vocabularies (or hashing), cut or padded to ``maxLength``."""

    _input_kwargs: Dict[str, Any]

    vocabularies: "Param[List[List[str]]]" = Param(
        Params._dummy(), "vocabularies", "per input column: the vocabulary, most frequent first (empty: hashed)",
        typeConverter=_to_list_list_string)

    @keyword_only
    def __init__(self, *, vocabularies: Optional[List[List[str]]] = None) -> None:
        super().__init__()
        self._setDefault(maxLengths=[], minFrequencies=[], maxVocabSizes=[], vocabLimits=[], hashBuckets=[],
                         sources=[], vocabularies=[])
        self._set(**self._input_kwargs)

    def getVocabularies(self) -> List[List[str]]:
        return self.getOrDefault(self.vocabularies)

    def numIds(self) -> List[int]:
        """Embedding rows per column: padding and unknown, then the vocabulary or the hash buckets."""
        _, _, _, _, _, _, buckets, _ = self._settings()
        return [2 + (b if b else len(v)) for b, v in zip(buckets, self.getVocabularies())]

    def _transform(self, dataset: DataFrame) -> DataFrame:
        inputs, outputs, lengths, _, _, _, buckets, _ = self._settings()
        _require_columns(dataset, inputs, "the DataFrame given to TokenIndexerModel.transform")
        exprs = {}
        for c, out, n, b, vocab in zip(inputs, outputs, lengths, buckets, self.getVocabularies()):
            toks = f"slice(coalesce({quote(c)}, array()), 1, {int(n)})"
            if b:
                ids = f"transform({toks}, t -> CAST(pmod(crc32(CAST(t AS BINARY)), {int(b)}) + 2 AS INT))"
                col = F.expr(f"concat({ids}, array_repeat(0, {int(n)} - size({ids})))")
            else:
                col = vocabulary_udf(vocab, int(n))(F.expr(toks))
            exprs[out] = col
        return dataset.withColumns(exprs)


def vocabulary_udf(vocabulary: List[str], length: int) -> Any:
    """An Arrow UDF ``array<string> -> array<int>``: ids ``2 + position`` in ``vocabulary`` (unknown: 1), padded
    with 0 to ``length``.

    The lookup is pyarrow's hash ``index_in`` over the whole batch's tokens;
    the closure holds the vocabulary and the length only.
    """
    from sparktrain._internal.spark_compat import arrow_array_udf

    vocab = list(vocabulary)

    def ids(tokens: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        offsets = tokens.offsets.to_numpy()
        flat = tokens.flatten()
        found = pc.index_in(flat, value_set=pa.array(vocab, pa.string())).to_numpy(zero_copy_only=False)
        values = np.where(np.isnan(found.astype(np.float64)), 1, np.nan_to_num(found.astype(np.float64)) + 2)
        rows = len(tokens)
        out = np.zeros((rows, length), dtype=np.int32)
        sizes = np.diff(offsets)
        row_of = np.repeat(np.arange(rows), sizes)
        pos = np.arange(len(flat)) - np.repeat(offsets[:-1] - offsets[0], sizes)
        out[row_of, pos] = values.astype(np.int32)
        return pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), length).cast(pa.list_(pa.int32()))

    return arrow_array_udf(ids, "array<int>")


__all__ = ["TokenIndexer", "TokenIndexerModel", "VectorEncoder", "VectorEncoderModel", "vocabulary_udf"]
