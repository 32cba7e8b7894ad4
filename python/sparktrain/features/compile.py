"""Compile a feature spec into a ``pyspark.ml.Pipeline``.

The pipeline, in order:

1. ``SQLTransformer`` *prepare*: every unfitted transform as a SQL expression
   (casts, NaN/inf handling, constant impute, clip, log1p, crc32 hashing,
   crossing, datetime parts and their sin/cos, booleans).
2. ``Imputer`` (mean) and ``Imputer`` (median) for numeric features.
3. ``StringIndexer(handleInvalid="keep", stringOrderType="frequencyDesc")`` for
   plain categoricals, :class:`~sparktrain.features.stages.VocabularyIndexer`
   for those with ``min_frequency``/``max_vocab``.
4. ``QuantileDiscretizer`` for numeric ``buckets`` (on the imputed values).
5. :class:`~sparktrain.features.stages.ColumnScaler` for ``standard``/``minmax``.
6. ``RegexTokenizer`` (lowercase) per text feature, before the imputers;
   :class:`~sparktrain.features.array_stages.VectorEncoder` for vectors and
   :class:`~sparktrain.features.array_stages.TokenIndexer` for text and set
   ids, after the scaler.
7. :class:`~sparktrain.features.stages.FlatFeatureAssembler`: float32 and int32
   output columns (and ``array<float>``/``array<int>`` ones), plus the key and
   the label when present.

``Pipeline.fit`` works; :func:`fit_pipeline` gives the same ``PipelineModel``
faster by fitting estimators that do not read each other's outputs (2-4 of
the stages above) as concurrent Spark jobs.

Intermediate columns are named ``__st_<feature>__<step>`` and dropped by the
assembler.  Output names (see :func:`plan_features`):

===========  ===========================================================
numeric      ``<name>`` float32; ``<name>_bucket`` int32 with ``buckets``
categorical  ``<name>`` int32 (vocabulary index or hash bucket)
crossed      ``<name>`` int32 (hash bucket)
datetime     ``<name>_<part>`` int32; ``<name>_<part>_sin``/``_cos`` float32
boolean      ``<name>`` float32 (1.0 / 0.0, null is 0.0)
vector       ``<name>`` array<float> of the fitted width
text, set    ``<name>`` array<int> of ``max_tokens``/``max_items`` ids
===========  ===========================================================

:func:`plan_features` is pure Python (no Spark), so the layout is known before
any Spark work and :mod:`sparktrain.features.metadata` can read it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from sparktrain.errors import ConfigError
from sparktrain.features._sql import INTERNAL_PREFIX, quote, sql_double, sql_string
from sparktrain.features.spec import (
    BooleanFeature,
    CategoricalFeature,
    CrossedFeature,
    DatetimeFeature,
    FeatureSpec,
    NumericFeature,
    SetFeature,
    TextFeature,
    VectorFeature,
)

PREFIX = INTERNAL_PREFIX  # the intermediate columns are named PREFIX<feature>__<step>

#: Datetime part -> (number of distinct values, SQL expression of the part from ``secs`` and ``days``).
#: Parts are computed from the UTC epoch, so they do not depend on the session time zone.
DATETIME_PERIODS = {"hour": 24, "day_of_week": 7, "month": 12, "day_of_month": 31, "minute": 60}
_PART_SQL = {
    "hour": "pmod({secs}, 86400) div 3600",
    "minute": "pmod({secs}, 3600) div 60",
    "day_of_week": "pmod({days} + 3, 7)",  # 1970-01-01 was a Thursday; Monday = 0
    "month": "month(date_from_unix_date(CAST({days} AS INT))) - 1",
    "day_of_month": "dayofmonth(date_from_unix_date(CAST({days} AS INT))) - 1",
}
CROSS_SEPARATOR = "\x01"


@dataclass(frozen=True)
class OutputColumn:
    """One column of the training-ready output."""

    name: str
    dtype: str  # "float32", "int32", "array<float>" (a float block) or "array<int>" (embedding-bag ids)
    feature: str
    role: str  # value, bucket, index, <part>, <part>_sin, <part>_cos, block, ids
    internal: str  # the pipeline column it is cast from
    length: Optional[int] = None  # ids per row of an array<int> column


@dataclass(frozen=True)
class FeaturePlan:
    """The layout of a compiled pipeline: which intermediate column each step reads and writes."""

    specs: Tuple[FeatureSpec, ...]
    prepare: Dict[str, str] = field(default_factory=dict)  # intermediate column -> SQL expression
    # numeric prepared column -> the same SQL that never raises (on_invalid: error gives null): for statistics
    # computed in the same pass as the validation checks, which report bad values with a better message
    stats_source: Dict[str, str] = field(default_factory=dict)
    impute: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # strategy -> [(in, out)]
    buckets: List[Tuple[str, str, int]] = field(default_factory=list)
    string_index: List[Tuple[str, str]] = field(default_factory=list)
    vocab_index: List[Tuple[str, str, CategoricalFeature]] = field(default_factory=list)
    scale: List[Tuple[str, str, str]] = field(default_factory=list)
    vectors: List[Tuple[str, str, VectorFeature]] = field(default_factory=list)  # (source, out, spec)
    tokenize: List[Tuple[str, str, str]] = field(default_factory=list)  # (text in, tokens out, pattern)
    bags: List[Tuple[str, str, FeatureSpec]] = field(default_factory=list)  # (tokens, ids, text or set spec)
    outputs: List[OutputColumn] = field(default_factory=list)
    key: Optional[str] = None
    label: Optional[str] = None

    def internal(self, feature: str, step: str) -> str:
        return f"{PREFIX}{_safe(feature)}__{step}"

    def outputs_of(self, feature: str) -> List[OutputColumn]:
        return [o for o in self.outputs if o.feature == feature]


def _safe(name: str) -> str:
    """``name`` for an intermediate column: Spark ML's JVM stages read a dot as a struct field (``a.b``), so a
    name with anything but letters, digits and ``_`` is spelled with ``_`` and a digest of the name (unique)."""
    if all(ch.isalnum() or ch == "_" for ch in name):
        return name
    import hashlib

    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) + "_" + digest


def numeric_sql(spec: NumericFeature, source_type: Optional[str] = None) -> str:
    """The prepared double: cast, NaN/inf -> null (or an error), constant impute, clip, log1p.

    ``source_type`` (Spark's ``simpleString``) lets a double column skip the
    cast; without it the expression is ``try_cast``, right for any type.
    """
    if source_type == "double":
        v = quote(spec.source)
    elif source_type in ("float", "tinyint", "smallint", "int", "bigint", "boolean"):
        v = f"CAST({quote(spec.source)} AS DOUBLE)"
    else:
        v = f"try_cast({quote(spec.source)} AS DOUBLE)"
    finite = f"abs({v}) < CAST('Infinity' AS DOUBLE)"  # false for NaN and +-inf, null for null
    if spec.on_invalid == "error":
        msg = sql_string(f"column '{spec.source}' (feature '{spec.name}') has a NaN or infinite value; "
                         f"set on_invalid: impute to treat them as missing, or clean the data")
        x = f"CASE WHEN {v} IS NULL OR {finite} THEN {v} ELSE raise_error({msg}) END"
    else:
        x = f"IF({finite}, {v}, NULL)"
    if spec.impute == "constant":
        x = f"coalesce({x}, {sql_double(spec.impute_value)})"
    if spec.clip is not None:  # least/greatest skip nulls, so keep a null a null
        lo, hi = sql_double(spec.clip[0]), sql_double(spec.clip[1])
        x = f"IF({x} IS NULL, NULL, least(greatest({x}, {lo}), {hi}))"
    if spec.log1p:
        x = f"signum({x}) * log1p(abs({x}))"
    return x


def hash_sql(columns: Sequence[str], buckets: int) -> str:
    """``pmod(crc32(utf8(value)), N)``; several columns are joined with ``\\x01``; null is ''."""
    parts = [f"coalesce(CAST({quote(c)} AS STRING), '')" for c in columns]
    text = parts[0] if len(parts) == 1 else f"concat_ws(chr(1), {', '.join(parts)})"
    return f"CAST(pmod(crc32(CAST({text} AS BINARY)), {int(buckets)}) AS INT)"


def timestamp_sql(spec: DatetimeFeature) -> str:
    """The column as a timestamp: ``try_to_timestamp`` with the feature's ``format``, else ``try_cast``."""
    if spec.format is not None:
        return f"try_to_timestamp(CAST({quote(spec.source)} AS STRING), {sql_string(spec.format)})"
    return f"try_cast({quote(spec.source)} AS TIMESTAMP)"


def set_items_sql(spec: SetFeature) -> str:
    """A set's items as ``array<string>``: split on the delimiter (or the array cast), trimmed, without
    nulls, empty items and repeats."""
    if spec.delimiter is not None:
        regex = sql_string("\\Q" + spec.delimiter.replace("\\E", "\\E\\\\E\\Q") + "\\E")
        items = f"transform(split(CAST({quote(spec.source)} AS STRING), {regex}), x -> trim(x))"
    else:
        items = f"transform(CAST({quote(spec.source)} AS ARRAY<STRING>), x -> trim(x))"
    return f"array_distinct(filter(coalesce({items}, array()), x -> x IS NOT NULL AND x != ''))"


def datetime_sql(spec: DatetimeFeature) -> Dict[str, Tuple[str, Optional[str], Optional[str]]]:
    """Per part: (index expression, sin expression, cos expression); null gives index = period, sin = cos = 0."""
    secs = f"unix_seconds({timestamp_sql(spec)})"
    days = f"(({secs} - pmod({secs}, 86400)) div 86400)"
    out = {}
    for part in spec.parts:
        period = DATETIME_PERIODS[part]
        raw = _PART_SQL[part].format(secs=secs, days=days)
        index = f"CAST(coalesce({raw}, {period}) AS INT)"
        sin = cos = None
        if spec.cyclical:
            sin = f"coalesce(sin(2 * pi() * ({raw}) / {period}), CAST(0 AS DOUBLE))"
            cos = f"coalesce(cos(2 * pi() * ({raw}) / {period}), CAST(0 AS DOUBLE))"
        out[part] = (index, sin, cos)
    return out


def boolean_sql(spec: BooleanFeature) -> str:
    return f"IF(coalesce(try_cast({quote(spec.source)} AS BOOLEAN), false), CAST(1 AS DOUBLE), CAST(0 AS DOUBLE))"


def plan_features(specs: Sequence[FeatureSpec], key: Optional[str] = None, label: Optional[str] = None,
                  types: Optional[Mapping[str, str]] = None) -> FeaturePlan:
    """Lay out the pipeline for ``specs``: intermediate columns, stage inputs and output columns.

    ``types`` (column -> Spark ``simpleString``, optional) only makes the SQL
    cheaper for numeric columns that need no cast; the outputs are the same.
    Raises :class:`ConfigError` when the spec is empty or two outputs (or an
    output and the key/label) would share a name.
    """
    types = types or {}
    if not specs:
        raise ConfigError("features", [], "list at least one feature, e.g. - {name: city, type: categorical}")
    plan = FeaturePlan(specs=tuple(specs), key=key, label=label)
    outs = plan.outputs

    def add(name: str, dtype: str, feature: str, role: str, internal: str) -> None:
        outs.append(OutputColumn(name, dtype, feature, role, internal))

    for spec in specs:
        n = spec.name
        if isinstance(spec, NumericFeature):
            prep = plan.internal(n, "prep")
            plan.prepare[prep] = numeric_sql(spec, types.get(spec.source))
            plan.stats_source[prep] = numeric_sql(replace(spec, on_invalid="impute"), types.get(spec.source))
            value = prep
            if spec.impute in ("mean", "median"):
                value = plan.internal(n, "imp")
                plan.impute.setdefault(spec.impute, []).append((prep, value))
            if spec.buckets is not None:
                plan.buckets.append((value, plan.internal(n, "bucket"), spec.buckets))
            final = value
            if spec.scale != "none":
                final = plan.internal(n, "scaled")
                plan.scale.append((value, final, spec.scale))
            add(n, "float32", n, "value", final)
            if spec.buckets is not None:
                add(f"{n}_bucket", "int32", n, "bucket", plan.internal(n, "bucket"))
        elif isinstance(spec, CategoricalFeature):
            idx = plan.internal(n, "idx")
            if spec.hash_buckets is not None:
                plan.prepare[idx] = hash_sql([spec.source], spec.hash_buckets)
            else:
                text = plan.internal(n, "str")
                plan.prepare[text] = f"CAST({quote(spec.source)} AS STRING)"
                if spec.min_frequency == 1 and spec.max_vocab is None:
                    plan.string_index.append((text, idx))
                else:
                    plan.vocab_index.append((text, idx, spec))
            add(n, "int32", n, "index", idx)
        elif isinstance(spec, CrossedFeature):
            idx = plan.internal(n, "idx")
            plan.prepare[idx] = hash_sql(spec.columns, spec.hash_buckets)
            add(n, "int32", n, "index", idx)
        elif isinstance(spec, DatetimeFeature):
            for part, (index, sin, cos) in datetime_sql(spec).items():
                plan.prepare[plan.internal(n, part)] = index
                add(f"{n}_{part}", "int32", n, part, plan.internal(n, part))
                if sin is not None and cos is not None:
                    plan.prepare[plan.internal(n, f"{part}_sin")] = sin
                    plan.prepare[plan.internal(n, f"{part}_cos")] = cos
                    add(f"{n}_{part}_sin", "float32", n, f"{part}_sin", plan.internal(n, f"{part}_sin"))
                    add(f"{n}_{part}_cos", "float32", n, f"{part}_cos", plan.internal(n, f"{part}_cos"))
        elif isinstance(spec, BooleanFeature):
            prep = plan.internal(n, "prep")
            plan.prepare[prep] = boolean_sql(spec)
            add(n, "float32", n, "value", prep)
        elif isinstance(spec, VectorFeature):
            plan.vectors.append((spec.source, plan.internal(n, "vec"), spec))
            add(n, "array<float>", n, "block", plan.internal(n, "vec"))
        elif isinstance(spec, (TextFeature, SetFeature)):
            tokens = plan.internal(n, "tok")
            if isinstance(spec, TextFeature):
                text = plan.internal(n, "text")
                plan.prepare[text] = f"coalesce(CAST({quote(spec.source)} AS STRING), '')"
                plan.tokenize.append((text, tokens, spec.pattern))
                length = spec.max_tokens
            else:
                plan.prepare[tokens] = set_items_sql(spec)
                length = spec.max_items
            plan.bags.append((tokens, plan.internal(n, "ids"), spec))
            outs.append(OutputColumn(n, "array<int>", n, "ids", plan.internal(n, "ids"), length))
        else:  # pragma: no cover - parse_features only builds the classes above
            raise ConfigError(f"features.{getattr(spec, 'name', '?')}", spec, "unknown feature type")
    seen: Dict[str, str] = {}
    reserved = {c: role for c, role in ((key, "data.key"), (label, "data.label")) if c}
    for o in outs:
        if o.name in reserved:
            raise ConfigError(f"features.{o.feature}", o.name,
                              f"output column '{o.name}' would overwrite {reserved[o.name]}; rename the feature")
        if o.name in seen:
            raise ConfigError(f"features.{o.feature}", o.name,
                              f"output column '{o.name}' is also produced by feature '{seen[o.name]}'; "
                              f"rename one of them")
        seen[o.name] = o.feature
    return plan


def compile_pipeline(specs: Sequence[FeatureSpec], key: Optional[str] = None, label: Optional[str] = None,
                     keep_input_cols: bool = False, types: Optional[Mapping[str, str]] = None,
                     label_labels: Optional[Sequence[str]] = None):
    """Build the (unfitted) ``pyspark.ml.Pipeline`` for a feature spec.

    Parameters
    ----------
    specs : sequence of FeatureSpec
        From ``JobConfig.features`` or :func:`sparktrain.features.spec.parse_features`.
    key, label : str, optional
        Passed through by the final stage when present in the data.
    keep_input_cols : bool
        Keep the raw columns next to the outputs (for use inside a larger Pipeline).
    types : mapping, optional
        Raw column -> Spark type (``df.schema[c].dataType.simpleString()``): numeric
        columns that are already doubles then skip a cast.  The fitted model then
        expects those columns to keep their type.  A label of a non-numeric type
        (string, date...) gets a :class:`~sparktrain.features.label_stage.LabelIndexer`
        before the assembler, so the label is written as a class index.
    label_labels : sequence of str, optional
        The label encoding decided from all rows (:class:`~sparktrain.features.label.LabelEncoding`'s
        ``labels``): the class texts in index order, or ``[]`` for a float
        regression target.  A fitted
        :class:`~sparktrain.features.label_stage.LabelIndexerModel` then encodes
        the label instead of a ``LabelIndexer``.

    Returns
    -------
    pyspark.ml.Pipeline

    Examples
    --------
    >>> from sparktrain.features.spec import parse_features
    >>> specs = parse_features([{"name": "city", "type": "categorical"},
    ...                         {"name": "price", "type": "numeric", "log1p": True}])
    >>> model = compile_pipeline(specs, label="label").fit(train_df)  # doctest: +SKIP
    >>> model.transform(raw_df).columns                               # doctest: +SKIP
    ['label', 'price', 'city']
    """
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import Imputer, QuantileDiscretizer, SQLTransformer, StringIndexer

    from sparktrain.features.stages import ColumnScaler, FlatFeatureAssembler, VocabularyIndexer

    plan = plan_features(specs, key=key, label=label, types=types)
    stages: list = []
    if plan.prepare:
        selects = ", ".join(f"{expr} AS {quote(col)}" for col, expr in plan.prepare.items())
        stages.append(SQLTransformer(statement=f"SELECT *, {selects} FROM __THIS__"))
    if plan.tokenize:
        from pyspark.ml.feature import RegexTokenizer
        stages += [RegexTokenizer(inputCol=a, outputCol=b, pattern=p, gaps=True, toLowercase=True, minTokenLength=1)
                   for a, b, p in plan.tokenize]
    for strategy in ("mean", "median"):
        pairs = plan.impute.get(strategy)
        if pairs:
            stages.append(Imputer(strategy=strategy, inputCols=[a for a, _ in pairs],
                                  outputCols=[b for _, b in pairs]))
    if plan.string_index:
        stages.append(StringIndexer(inputCols=[a for a, _ in plan.string_index],
                                    outputCols=[b for _, b in plan.string_index],
                                    handleInvalid="keep", stringOrderType="frequencyDesc"))
    if plan.vocab_index:
        stages.append(VocabularyIndexer(
            inputCols=[a for a, _, _ in plan.vocab_index], outputCols=[b for _, b, _ in plan.vocab_index],
            minFrequencies=[s.min_frequency for _, _, s in plan.vocab_index],
            maxVocabSizes=[s.max_vocab or 0 for _, _, s in plan.vocab_index],
            vocabLimits=[s.vocab_limit for _, _, s in plan.vocab_index]))
    if plan.buckets:
        stages.append(QuantileDiscretizer(inputCols=[a for a, _, _ in plan.buckets],
                                          outputCols=[b for _, b, _ in plan.buckets],
                                          numBucketsArray=[n for _, _, n in plan.buckets], handleInvalid="keep"))
    if plan.scale:
        stages.append(ColumnScaler(inputCols=[a for a, _, _ in plan.scale], outputCols=[b for _, b, _ in plan.scale],
                                   methods=[m for _, _, m in plan.scale]))
    stages += array_stages(plan)
    if label and label_labels is not None:
        from sparktrain.features.label_stage import model_for
        stages.append(model_for(list(label_labels), label))
    elif label and types and label in types:
        from sparktrain.features.label import label_kind
        from sparktrain.features.label_stage import LabelIndexer
        if label_kind(label, types[label]) == "categorical":
            stages.append(LabelIndexer(labelCol=label))
    floats = [o for o in plan.outputs if o.dtype == "float32"]
    ints = [o for o in plan.outputs if o.dtype == "int32"]
    asm = FlatFeatureAssembler(
        floatInputCols=[o.internal for o in floats], floatOutputCols=[o.name for o in floats],
        intInputCols=[o.internal for o in ints], intOutputCols=[o.name for o in ints],
        keyCol=key or "", labelCol=label or "", keepInputCols=keep_input_cols)
    blocks = [o for o in plan.outputs if o.dtype == "array<float>"]
    ids = [o for o in plan.outputs if o.dtype == "array<int>"]
    if blocks or ids:
        asm._set(blockInputCols=[o.internal for o in blocks], blockOutputCols=[o.name for o in blocks],
                 idsInputCols=[o.internal for o in ids], idsOutputCols=[o.name for o in ids])
    stages.append(asm)
    return Pipeline(stages=stages)


def array_stages(plan: FeaturePlan) -> list:
    """The :class:`~sparktrain.features.array_stages.VectorEncoder` and
    :class:`~sparktrain.features.array_stages.TokenIndexer` of ``plan`` (none when it has no such feature)."""
    from sparktrain.features.array_stages import TokenIndexer, VectorEncoder

    stages: list = []
    if plan.vectors:
        stages.append(VectorEncoder(inputCols=[a for a, _, _ in plan.vectors],
                                    outputCols=[b for _, b, _ in plan.vectors],
                                    scaled=[s.scale for _, _, s in plan.vectors],
                                    onInvalid=[s.on_invalid for _, _, s in plan.vectors],
                                    features=[s.name for _, _, s in plan.vectors]))
    if plan.bags:
        specs = [s for _, _, s in plan.bags]
        stages.append(TokenIndexer(
            inputCols=[a for a, _, _ in plan.bags], outputCols=[b for _, b, _ in plan.bags],
            maxLengths=[s.max_tokens if isinstance(s, TextFeature) else s.max_items for s in specs],  # type: ignore
            minFrequencies=[s.min_frequency for s in specs], maxVocabSizes=[s.max_vocab or 0 for s in specs],  # type: ignore
            vocabLimits=[s.vocab_limit for s in specs], hashBuckets=[s.hash_buckets or 0 for s in specs],  # type: ignore
            sources=[f"column '{s.source}' (feature '{s.name}', {s.type})" for s in specs]))  # type: ignore
    return stages


def _columns(stage, single: str, multi: str) -> Optional[set]:
    """The columns a stage names in ``inputCol(s)``/``outputCol(s)``; None when it does not say."""
    for name, many in ((multi, True), (single, False)):
        if stage.hasParam(name) and stage.isDefined(stage.getParam(name)):
            value = stage.getOrDefault(stage.getParam(name))
            return set(value) if many else {value}
    return None


def fit_pipeline(pipeline, dataset, max_parallel: int = 4):
    """Fit ``pipeline`` on ``dataset`` like ``Pipeline.fit``, running independent estimators concurrently.

    Consecutive estimators that do not read each other's output columns are
    fitted at the same time, each as its own Spark job from its own thread
    (two Imputers, the indexers; then the discretizer and the scaler).  Each
    estimator still sees every column produced before it, so the fitted
    stages are the ones ``Pipeline.fit`` would give.  Stages that do not name
    their columns are fitted alone.

    Returns
    -------
    pyspark.ml.PipelineModel
    """
    from concurrent.futures import ThreadPoolExecutor

    from sparktrain._internal.spark_compat import inheritable_target
    from pyspark.ml import Estimator, PipelineModel

    stages = pipeline.getStages()
    fitted: list = [None] * len(stages)
    current = dataset
    i = 0
    while i < len(stages):
        if not isinstance(stages[i], Estimator):
            fitted[i] = stages[i]
            current = stages[i].transform(current)
            i += 1
            continue
        group, produced = [i], _columns(stages[i], "outputCol", "outputCols")
        j = i + 1
        while (produced is not None and j < len(stages) and len(group) < max_parallel
               and isinstance(stages[j], Estimator)):
            inputs = _columns(stages[j], "inputCol", "inputCols")
            outputs = _columns(stages[j], "outputCol", "outputCols")
            if inputs is None or outputs is None or inputs & produced:
                break
            group.append(j)
            produced |= outputs
            j += 1
        data = current
        if len(group) == 1:
            models = [stages[i].fit(data)]
        else:
            target = inheritable_target(data.sparkSession)(lambda k, data=data: stages[k].fit(data))
            with ThreadPoolExecutor(len(group)) as pool:
                models = list(pool.map(target, group))
        for k, model in zip(group, models):
            fitted[k] = model
            current = model.transform(current)
        i = j
    return PipelineModel(stages=fitted)


def source_columns(specs: Sequence[FeatureSpec]) -> List[str]:
    """The raw columns a spec reads, in first-use order."""
    cols: List[str] = []
    for spec in specs:
        for c in (spec.columns if isinstance(spec, CrossedFeature) else (spec.source,)):
            if c not in cols:
                cols.append(c)
    return cols


__all__ = [
    "CROSS_SEPARATOR",
    "DATETIME_PERIODS",
    "PREFIX",
    "FeaturePlan",
    "OutputColumn",
    "compile_pipeline",
    "fit_pipeline",
    "plan_features",
    "source_columns",
]
