r"""Fit a compiled feature pipeline in two waves of Spark jobs instead of one pass per estimator.

``Pipeline.fit`` reads the data once per estimator, one after another: two
``Imputer``\s, the indexers, then, on the imputed values, the
``QuantileDiscretizer`` and the ``ColumnScaler``.  On a small cluster each of
those passes costs more in job overhead than in work.  :func:`fit_features`
fits the same stages of a pipeline built by
:func:`~sparktrain.features.compile.compile_pipeline` in two waves:

1. **Statistics**, as concurrent jobs: the caller's checks over all rows (the
   validation of :mod:`sparktrain.features.validate`); over the train rows,
   only the moments the stages need (an Imputer's mean; a scaler's count,
   mean and variance, or count, min and max); the medians of median Imputers
   (``percentile_approx`` at the Imputer's own relative error, the sketch
   ``approxQuantile`` uses); and one bounded count of every indexed column's
   values (:func:`~sparktrain.features.stages.top_values`).  ``check`` then
   sees the checks' values and can raise before anything is built.
2. **Models from the statistics**: ``StringIndexerModel`` and
   ``VocabularyIndexerModel`` from the counts; each ``ImputerModel`` from
   its surrogates with the JVM constructor ``Imputer.fit`` itself ends with
   (no job; on Spark Connect, ``Imputer.fit`` on one row of them); the
   ``ColumnScalerModel`` from the moments of the imputed column, exact
   functions of the non-null moments and the ``k`` imputed copies of the
   surrogate (Chan et al.'s pairwise update); and the ``QuantileDiscretizer``
   by a real ``fit`` on the imputed values, its only pass.

Jobs are kept apart on purpose: ``percentile_approx`` is an imperative
aggregate that turns off code generation for its whole aggregation, and an
aggregation of more than ``spark.sql.codegen.maxFields`` (100) results is not
code-generated either (measured at 1x: checks + moments 0.95 s as one job,
0.33 + 0.33 s as two).

The fitted stages are the ones ``Pipeline.fit`` gives (``tests/`` compare
them), except that an indexed column with no value in the train rows is
refused (see :func:`fit_features`' Raises) where ``Pipeline.fit`` fits an
empty vocabulary.  A pipeline that is not ``compile_pipeline``'s shape falls
back to :func:`~sparktrain.features.compile.fit_pipeline`.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from sparktrain.errors import DataError
from sparktrain.features.compile import FeaturePlan, fit_pipeline
from sparktrain.features.spec import NumericFeature


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_features` returns.

    Attributes
    ----------
    model : pyspark.ml.PipelineModel
        The fitted pipeline.
    fitted : mapping
        What the stages learned, as :func:`sparktrain.features.metadata.fitted_values` reads it.
    values : mapping
        The results of the ``extra`` aggregates (over all rows).
    """

    model: Any
    fitted: Mapping[str, Mapping[str, Any]] = field(repr=False)
    values: Mapping[str, Any] = field(default_factory=dict)


_MOMENTS = (("n", "count"), ("mean", "avg"), ("var", "var_samp"), ("min", "min"), ("max", "max"))


def fit_features(pipeline: Any, dataset: Any, plan: FeaturePlan, *, train: Optional[str] = None,
                 extra: Sequence[Any] = (), check: Optional[Callable[[Dict[str, Any]], None]] = None) -> FitResult:
    """Fit ``pipeline`` on the train rows of ``dataset`` in few passes (see the module docstring).

    Parameters
    ----------
    pipeline : pyspark.ml.Pipeline
        From :func:`~sparktrain.features.compile.compile_pipeline` for ``plan``'s specs.
    dataset : DataFrame
        The raw rows.
    plan : FeaturePlan
        ``plan_features`` of the same specs (and types) as ``pipeline``.
    train : str, optional
        SQL predicate selecting the rows to fit on; all rows when omitted.
    extra : sequence of Column or str
        Aggregates evaluated over *all* rows (one job, concurrent with the
        statistics), as Columns or SQL text (``"count(x) AS n"``); their
        values are passed to ``check`` and returned.
    check : callable, optional
        Called with the ``extra`` values (a dict) before any model is built;
        raise from it to stop.

    Returns
    -------
    FitResult

    Raises
    ------
    DataError
        No train rows; a numeric column with nothing to impute from; an
        indexed column over its ``vocab_limit``, or with no value (seen
        ``min_frequency`` times) in the train rows.  ``Pipeline.fit`` would
        fit an empty vocabulary for the last; here the error names the source
        column and the feature.

    Examples
    --------
    >>> types = {f.name: f.dataType.simpleString() for f in df.schema.fields}     # doctest: +SKIP
    >>> plan = plan_features(specs, key="id", label="label", types=types)       # doctest: +SKIP
    >>> pipe = compile_pipeline(specs, key="id", label="label", types=types)    # doctest: +SKIP
    >>> fit_features(pipe, df, plan, train="split = 'train'").model                # doctest: +SKIP
    PipelineModel_...
    """
    from sparktrain._internal.spark_compat import inheritable_target
    from pyspark.ml import PipelineModel
    from pyspark.sql import functions as F

    from sparktrain.features import metadata as md

    def first(frame: Any, aggs: Sequence[Any]) -> Dict[str, Any]:
        """One global aggregation; ``aggs`` are SQL text (``"expr AS alias"``) or Columns."""
        if all(isinstance(a, str) for a in aggs):
            return frame.selectExpr(*aggs).first().asDict()
        return frame.agg(*[F.expr(a) if isinstance(a, str) else a for a in aggs]).first().asDict()

    stages = pipeline.getStages()
    cond = train or "true"
    layout = _layout(stages, plan)
    if layout is None:  # not compile_pipeline's shape: validate, then fit stage by stage
        checked_all = first(dataset, extra) if extra else {}
        if check is not None:
            check(checked_all)
        model = fit_pipeline(pipeline, dataset.where(cond))
        return FitResult(model, md.fitted_values(model), checked_all)

    needs, medians, index_specs = layout
    sources = list(needs)
    train_rows = dataset.where(cond)
    # SQL text: about one JVM call per expression (a Column with an alias is several, plus PySpark's call-site capture)
    base = train_rows.selectExpr(*[f"{plan.stats_source[c]} AS __st_s{j}" for j, c in enumerate(sources)])
    moments = ["count(1) AS __rows"]
    moments += [f"{fn}(__st_s{j}) AS __s{j}_{name}"
                for j, c in enumerate(sources) for name, fn in _MOMENTS if name in needs[c]]
    # separate jobs: see the module docstring (codegen and JIT limits)
    median_aggs = [f"percentile_approx(__st_s{j}, 0.5, {medians[c]}) AS __s{j}_median"
                   for j, c in enumerate(sources) if c in medians]
    prepared = stages[0].transform(train_rows)
    indexers = [k for k, st in enumerate(stages) if _kind(st) == "indexer"]
    run = inheritable_target(dataset.sparkSession)

    with ThreadPoolExecutor(4) as pool:
        checks = pool.submit(run(first), dataset, extra) if extra else None
        jobs = [pool.submit(run(first), base, moments)]
        if median_aggs:
            jobs.append(pool.submit(run(first), base, median_aggs))
        counted = (pool.submit(run(_count_labels), [stages[k] for k in indexers], prepared, index_specs)
                   if indexers else None)
        errors = _results([f for f in (checks, *jobs, counted) if f is not None])  # all done before raising
    checked = checks.result() if checks is not None else {}
    if check is not None:
        check(checked)
    for error in errors:
        raise error
    values: Dict[str, Any] = {}
    for job in jobs:
        values.update(job.result())
    stats = {col: {name: values.get(f"__s{j}_{name}") for name, _ in (*_MOMENTS, ("median", ""))}
             for j, col in enumerate(sources)}
    rows = int(values["__rows"])
    if rows == 0:
        raise DataError(f"no rows to fit the features on: the predicate {cond!r} selects none of the input "
                        f"(for materialize: the train split is empty; check split.train and data.key)")
    names = {plan.internal(spec.name, "prep"): f"column '{spec.source}' (feature '{spec.name}')"
             for spec in plan.specs if isinstance(spec, NumericFeature)}
    models: Dict[int, Any] = {}
    if counted is not None:
        labels = iter(counted.result())
        models.update({k: _indexer_model(stages[k], [next(labels) for _ in stages[k].getInputCols()], prepared)
                       for k in indexers})
    built, surrogates = _models_from_statistics(stages, stats, rows, prepared, run, names)
    models.update(built)
    fitted_stages = [models.get(k, stage) for k, stage in enumerate(stages)]
    model = PipelineModel(stages=fitted_stages)
    # fitted_values would read each ImputerModel's surrogateDF back (a job each); the values are known
    fitted = md.fitted_values(PipelineModel(stages=[s for s in fitted_stages if _kind(s) != "imputer_model"]))
    fitted["impute"] = surrogates
    return FitResult(model, fitted, checked)


def _kind(stage: Any) -> str:
    from pyspark.ml.feature import (
        Bucketizer,
        Imputer,
        ImputerModel,
        QuantileDiscretizer,
        SQLTransformer,
        StringIndexer,
    )

    from sparktrain.features.label_stage import LabelIndexerModel
    from sparktrain.features.stages import ColumnScaler, FlatFeatureAssembler, VocabularyIndexer

    kinds = ((LabelIndexerModel, "label"), (SQLTransformer, "prepare"), (Imputer, "imputer"),
             (ImputerModel, "imputer_model"), (StringIndexer, "indexer"), (VocabularyIndexer, "indexer"),
             (QuantileDiscretizer, "discretizer"), (Bucketizer, "bucketizer"), (ColumnScaler, "scaler"),
             (FlatFeatureAssembler, "assembler"))
    return next((name for cls, name in kinds if isinstance(stage, cls)), "other")


def _layout(stages: Sequence[Any], plan: FeaturePlan
            ) -> Optional[Tuple[Dict[str, Set[str]], Dict[str, int], Dict[str, Any]]]:
    """What wave 1 must compute, or None when the pipeline is not ``compile_pipeline``'s shape.

    Returns the moments needed per prepared numeric column (an Imputer's
    mean, a scaler's count/mean/variance or count/min/max), the median
    accuracy per median-imputed column and the feature spec of each
    indexed column (StringIndexer or VocabularyIndexer input).
    """
    from sparktrain.features.spec import CategoricalFeature

    if not stages or _kind(stages[0]) != "prepare":
        return None
    kinds = [_kind(s) for s in stages[1:]]
    if any(k not in ("imputer", "indexer", "discretizer", "scaler", "assembler", "label") for k in kinds):
        return None
    imputed: Dict[str, str] = {}
    medians: Dict[str, int] = {}
    needs: Dict[str, Set[str]] = {}
    vocab = {plan.internal(s.name, "str"): s for s in plan.specs
             if isinstance(s, CategoricalFeature) and s.hash_buckets is None}
    index_specs: Dict[str, Any] = {}
    for stage in stages[1:]:
        kind = _kind(stage)
        if kind == "indexer" and _is_string_indexer(stage):
            if (not stage.isSet("inputCols") or stage.getHandleInvalid() != "keep"
                    or stage.getStringOrderType() != "frequencyDesc"
                    or any(c not in vocab for c in stage.getInputCols())):
                return None
        if kind == "indexer":
            index_specs.update({c: vocab[c] for c in stage.getInputCols() if c in vocab})
        if kind in ("indexer", "assembler", "label"):
            continue
        inputs = stage.getInputCols() if stage.isSet("inputCols") else []
        if any(imputed.get(c, c) not in plan.stats_source for c in inputs):
            return None
        if kind == "imputer":
            if not stage.isSet("outputCols") or not math.isnan(stage.getMissingValue()):
                return None
            imputed.update(zip(stage.getOutputCols(), inputs))
            if stage.getStrategy() == "median":
                if not stage.getRelativeError() > 0:
                    return None
                medians.update({c: max(1, int(1 / stage.getRelativeError())) for c in inputs})
                needs.update({c: needs.get(c, set()) for c in inputs})
            elif stage.getStrategy() == "mean":
                needs.update({c: needs.get(c, set()) | {"mean"} for c in inputs})
            else:
                return None
        elif kind == "scaler":
            for c, method in zip(inputs, stage.getMethods()):
                src = imputed.get(c, c)
                # standard also reads min/max: a constant column is recognized exactly (see _imputed_moments)
                needs[src] = needs.get(src, set()) | ({"n", "mean", "var", "min", "max"} if method == "standard"
                                                     else {"n", "min", "max"})
    return needs, medians, index_specs


def _is_string_indexer(stage: Any) -> bool:
    from pyspark.ml.feature import StringIndexer

    return isinstance(stage, StringIndexer)


def _count_labels(indexers: Sequence[Any], prepared: Any, specs: Mapping[str, Any]) -> List[List[str]]:
    """Every indexer's vocabularies in one counting job (:func:`~sparktrain.features.stages.top_values`).

    A StringIndexer column keeps at most ``vocab_limit + 1`` values, so a
    vocabulary over its limit is refused without collecting it.  Errors name
    the source column and the feature (``specs``: internal column -> spec),
    not the pipeline's internal column.
    """
    from pyspark.sql import functions as F

    from sparktrain.features.stages import top_values

    columns: List[Any] = []
    mins: List[int] = []
    caps: List[int] = []
    owners: List[str] = []
    for stage in indexers:
        inputs = stage.getInputCols()
        if _is_string_indexer(stage):
            lo, hi = [1] * len(inputs), [specs[c].vocab_limit + 1 for c in inputs]
        else:
            lo, hi = stage.countBounds()
        columns += [F.col(c) for c in inputs]
        mins += lo
        caps += hi
        owners += inputs
    labels = top_values(prepared, columns, mins, caps)
    for c, found, least in zip(owners, labels, mins):
        spec = specs.get(c)
        if spec is None:
            continue
        where = f"column '{spec.source}' (feature '{spec.name}', categorical)"
        seen = f" seen at least {least:,} times (min_frequency)" if least > 1 else ""
        if len(found) > spec.vocab_limit:
            keep = (f"Lower max_vocab (now {spec.max_vocab:,}) to at most vocab_limit" if spec.max_vocab
                    else "Set max_vocab to keep the most frequent ones")
            raise DataError(
                f"{where} has more than {spec.vocab_limit:,} distinct values{seen}, over its "
                f"vocab_limit={spec.vocab_limit}. {keep}, raise min_frequency or vocab_limit, or use hash_buckets: N.")
        if not found and least > 1:
            raise DataError(
                f"{where} has no value{seen} in the rows the features are fitted on (the train split), so its "
                f"vocabulary would be empty. Lower min_frequency (now {spec.min_frequency:,}), or drop the feature.")
        if not found:
            raise DataError(
                f"{where} is null in every row the features are fitted on (the train split), so its vocabulary "
                f"would be empty. Check the split (data.key, split.*) and the column, or drop the feature.")
    return labels


def _indexer_model(stage: Any, labels: List[List[str]], prepared: Any) -> Any:
    """The fitted indexer from its counted vocabularies (no pass over the data)."""
    from pyspark.ml.feature import StringIndexerModel
    from pyspark.sql.utils import is_remote

    if not _is_string_indexer(stage):
        return stage.modelFromLabels(labels)
    if is_remote():  # no JVM handle on Spark Connect: fit it
        return stage.fit(prepared)
    # StringIndexerModel(labelsArray), as fit builds it.  PySpark's from_arrays_of_labels would pad ragged
    # arrays with nulls (which moves a column's reserved index), so the Java String[][] is built here.
    gateway = prepared.sparkSession.sparkContext._gateway
    jarray = gateway.new_array(gateway.jvm.java.lang.String, len(labels), 0)
    for i, values in enumerate(labels):
        inner = gateway.new_array(gateway.jvm.java.lang.String, len(values))
        for j, v in enumerate(values):
            inner[j] = v
        jarray[i] = inner
    model = StringIndexerModel._create_from_java_class("org.apache.spark.ml.feature.StringIndexerModel",
                                                       stage.uid, jarray)
    return stage._copyValues(model)


def _imputer_model(stage: Any, surrogates: List[float], spark: Any) -> Any:
    """The ``ImputerModel`` that ``stage.fit`` builds for these surrogates (one per input column), with no job.

    ``Imputer.fit`` computes the surrogates and calls the same JVM constructor
    (:func:`~sparktrain._internal.spark_compat.java_imputer_model`: its arguments differ between Spark
    versions); the values are known here.
    """
    from pyspark.ml.feature import ImputerModel

    from sparktrain._internal.spark_compat import java_imputer_model

    java_model = java_imputer_model(spark, stage.uid, stage.getInputCols(), surrogates)
    return stage._copyValues(ImputerModel(java_model))


def _results(futures: Sequence[Future]) -> List[BaseException]:
    errors = []
    for f in futures:
        e = f.exception()
        if e is not None:
            errors.append(e)
    return errors


def _models_from_statistics(stages: Sequence[Any], stats: Mapping[str, Mapping[str, Any]], rows: int,
                            prepared: Any, run: Callable, names: Mapping[str, str]
                            ) -> Tuple[Dict[int, Any], Dict[str, float]]:
    """Wave 2: Imputer models, the scaler model and the discretizer, from wave 1's statistics.

    Returns the fitted stages by position and the surrogate of each imputed input column.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.utils import is_remote

    spark = prepared.sparkSession
    surrogate: Dict[str, float] = {}
    source: Dict[str, str] = {}
    jobs: Dict[int, Any] = {}
    out: Dict[int, Any] = {}
    with ThreadPoolExecutor(4) as pool:
        for k, stage in enumerate(stages):
            kind = _kind(stage)
            if kind == "imputer":
                inputs, key = stage.getInputCols(), stage.getStrategy()
                vals = [stats[c][key] for c in inputs]
                for c, o, v in zip(inputs, stage.getOutputCols(), vals):
                    source[o] = c
                    if v is not None:
                        surrogate[o] = float(v)
                missing = [c for c, v in zip(inputs, vals) if v is None]
                if missing:
                    raise DataError(
                        f"{names.get(missing[0], repr(missing[0]))} has no usable value in the {rows:,} rows "
                        f"the features are fitted on (the train split), so there is nothing to impute "
                        f"{key} from. Check the split (data.key, split.*) or use impute: constant.")
                if is_remote():  # no JVM handle on Spark Connect: fit on one row of the surrogates
                    one = spark.createDataFrame([tuple(float(v) for v in vals)],
                                                T.StructType([T.StructField(c, T.DoubleType()) for c in inputs]))
                    jobs[k] = pool.submit(run(stage.fit), one)
                else:
                    out[k] = _imputer_model(stage, [float(v) for v in vals], spark)
            elif kind == "discretizer":
                fill = {c: F.coalesce(F.col(source[c]), F.lit(surrogate[c])) for c in stage.getInputCols()
                        if c in surrogate}
                jobs[k] = pool.submit(run(stage.fit), prepared.withColumns(fill) if fill else prepared)
            elif kind == "scaler":
                moments = [_imputed_moments(stats[source.get(c, c)], surrogate.get(c), rows, m)
                           for c, m in zip(stage.getInputCols(), stage.getMethods())]
                out[k] = stage.modelFromStatistics(moments)
        errors = _results(list(jobs.values()))
        for error in errors:
            raise error
        out.update({k: f.result() for k, f in jobs.items()})
    return out, {source[o]: v for o, v in surrogate.items()}


def _imputed_moments(s: Mapping[str, Any], fill: Optional[float], rows: int, method: str
                     ) -> Tuple[Optional[float], Optional[float]]:
    """(mean, sample std) or (min, max) of a column once its nulls hold ``fill`` (None: left as they are)."""
    n1 = int(s["n"] or 0)
    if n1 == 0:
        return (fill, None) if fill is not None and rows else (None, None)
    k = rows - n1 if fill is not None else 0
    if method == "minmax":
        lo, hi = float(s["min"]), float(s["max"])
        return (min(lo, fill), max(hi, fill)) if k and fill is not None else (lo, hi)
    mean1, var1 = float(s["mean"]), s["var"]
    if var1 is not None and not math.isfinite(var1):  # overflow: what ColumnScaler.fit would see too
        return mean1, math.inf
    if not var1 and s.get("min") is not None and s["min"] == s["max"]:
        mean1 = float(s["min"])  # all non-null values equal: the exact value, not sum / n (c + ulp)
    m2 = float(var1) * (n1 - 1) if var1 is not None else 0.0
    if not k or fill is None:
        return mean1, (math.sqrt(m2 / (n1 - 1)) if n1 > 1 else None)
    n = n1 + k
    delta = fill - mean1
    mean = mean1 + delta * k / n
    m2 += delta * delta * n1 * k / n
    return mean, (math.sqrt(m2 / (n - 1)) if n > 1 else None)


__all__ = ["FitResult", "fit_features"]
