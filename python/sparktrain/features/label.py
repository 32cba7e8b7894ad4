"""The label: its type, one driver-side check over all rows, and how it is encoded for training.

:func:`label_kind` reads the Spark type alone (no job) and refuses a type no
model learns from (struct, map, array, binary...).  :func:`summarize_label`
runs one aggregation over the input: per class (bool, integer, string...)
the row count, or for a float label the count of nulls, NaN and infinities
with the mean, std, min and max.  :func:`check_label` turns the summary into
errors that name the column, the value and the fix, and :func:`encode_label`
decides what the training data holds:

===================  ============  =======================================================
label                task          written as
===================  ============  =======================================================
boolean              binary        float32 0/1 (false/true)
integer 0/1          binary        int32, values kept
integer 0..K-1       multiclass    int32, values kept
other integers       binary or     int32 index into ``vocabulary`` (classes sorted by value)
                     multiclass
string, date...      binary or     int32 index into ``vocabulary`` (classes sorted by their
                     multiclass    text, by code point: deterministic whatever the data order)
float, decimal       regression    float32
===================  ============  =======================================================

``train.task`` (when not ``auto``) overrides the task: ``regression`` on an
integer or boolean label writes float32 values; ``binary``/``multiclass`` on
a float label indexes its values like integers.  Classes come from all rows
(not only the train split), so every split uses the same indices; a class
unseen at fit time is scored as a null label.

:func:`decide_label` is the whole policy (type, summary, check, encoding).
Preprocess (:func:`sparktrain.features.materialize.materialize`) and
``fit(df)`` (:func:`sparktrain.train.plan.dataframe_label`) both call it, so
both accept the same labels and refuse the same ones with the same message.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sparktrain.errors import ConfigError, DataError, SchemaError
from sparktrain.features._sql import quote

log = logging.getLogger(__name__)

DEFAULT_MAX_CLASSES = 1000
TASKS = ("binary", "multiclass", "regression")
_INTEGER = ("tinyint", "smallint", "int", "bigint")
_FLOAT = ("float", "double", "decimal")
_CATEGORICAL = ("string", "char", "varchar", "date", "timestamp", "timestamp_ntz")


@dataclass(frozen=True)
class LabelSummary:
    """What one pass over all input rows found about the label.

    Attributes
    ----------
    column, source_dtype, kind : str
        The label column, its Spark type and :func:`label_kind`.
    rows, nulls : int
        Input rows, and rows whose label is null.
    classes : list of (value, text, count), optional
        Per class (non-null values), sorted by value (integers, floats) or text;
        None for a regression label.  ``text`` is Spark's ``CAST(value AS STRING)``.
    nan, inf : int
        NaN and infinite values (float labels).
    stats : dict
        ``mean``, ``std``, ``min``, ``max`` of the finite values (regression).
    """

    column: str
    source_dtype: str
    kind: str
    rows: int
    nulls: int
    classes: Optional[List[Tuple[Any, str, int]]] = None
    nan: int = 0
    inf: int = 0
    stats: Dict[str, Optional[float]] = field(default_factory=dict)
    whole: bool = False  # a float label whose finite values are all whole numbers (class indices?)


def _where(column: str) -> str:
    """How every label error names the column: the same words on the preprocess and the ``fit(df)`` path."""
    return f"label column '{column}' (data.label / labelCol)"


def task_override(cfg: Any) -> Optional[str]:
    """``train.task`` when the config has a ``train:`` section that sets it (not ``auto``), else None."""
    task = getattr(cfg.train, "task", "auto") if cfg.train is not None else "auto"
    return None if task == "auto" else task


def max_classes_of(cfg: Any) -> int:
    """``train.max_classes`` (the most classes a label may have), 1000 when the config does not say."""
    value = getattr(cfg.train, "max_classes", None) if cfg.train is not None else None
    return int(value) if value is not None else DEFAULT_MAX_CLASSES


#: An integer label with more classes than this, under ``task`` auto, is warned about: it may be a quantity.
MANY_INTEGER_CLASSES = 20


def warn_many_integer_classes(column: str, classes: int, low: Any, high: Any) -> None:
    """Warn (``UserWarning``, which a notebook shows) that an integer label becomes a ``classes``-way classifier
    under ``task`` auto: a count, a price in cents or a rounded measurement is a regression target."""
    if classes <= MANY_INTEGER_CLASSES:
        return
    warnings.warn(f"integer label column '{column}' has {classes:,} classes (values {low} to {high}), so task auto "
                  f"trains a {classes:,}-way classifier. If it is a quantity (a count, an amount, a rounded "
                  f"measurement), set task='regression' (config: train.task: regression); set task='multiclass' "
                  f"to keep the classes and silence this warning", UserWarning, stacklevel=2)


def warn_class_indices(summary: LabelSummary) -> None:
    """Warn (``UserWarning``) that a float label holding only the whole numbers 0..K-1 (K from 3 to
    :data:`MANY_INTEGER_CLASSES`) trains a regression under ``task`` auto: Spark ML classifiers read such a
    column (a StringIndexer output, say) as class indices."""
    low, high = summary.stats.get("min"), summary.stats.get("max")
    if not summary.whole or low != 0 or high is None or not 2 <= high < MANY_INTEGER_CLASSES:
        return
    warnings.warn(f"float label column '{summary.column}' holds only the whole numbers 0 to {high:.0f}, so task "
                  f"auto trains a regression on them. If they are class indices (a StringIndexer output, as Spark "
                  f"ML classifiers read such a column), set task='multiclass' (config: train.task: multiclass); "
                  f"set task='regression' to keep the regression and silence this warning", UserWarning,
                  stacklevel=2)


def warn_lookalike_classes(summary: LabelSummary) -> None:
    """Warn (``UserWarning``) about text classes that differ only in surrounding whitespace or letter case
    (``'>50K'`` and ``'>50K '``): each is a class of its own, which turns a binary label into a multiclass one.
    A CSV export's padding is the usual cause."""
    if summary.kind != "categorical" or not summary.classes:
        return
    groups: Dict[str, List[Tuple[str, int]]] = {}
    for _, text, count in summary.classes:
        groups.setdefault(str(text).strip().casefold(), []).append((str(text), int(count)))
    clashes = [g for g in groups.values() if len(g) > 1]
    if not clashes:
        return
    named = "; ".join(" and ".join(f"{t!r} ({n:,} rows)" for t, n in g) for g in clashes[:5])
    more = f" (and {len(clashes) - 5} more groups)" if len(clashes) > 5 else ""
    warnings.warn(f"label column '{summary.column}' has classes that differ only in spaces or letter case: "
                  f"{named}{more}; each is a class of its own, so the model learns {len(summary.classes)} classes "
                  f"where there may be {len(groups)}. If they are the same class, clean the label in Spark "
                  f"(F.trim(F.col('{summary.column}')), F.lower(...)) or, for a CSV, set the reader's "
                  f"ignoreLeadingWhiteSpace and ignoreTrailingWhiteSpace options (config: data.options)",
                  UserWarning, stacklevel=2)


def label_kind(column: str, spark_type: str) -> str:
    """``"boolean"``, ``"integer"``, ``"float"`` or ``"categorical"`` from the label's Spark ``simpleString``.

    Raises :class:`SchemaError` for a type no model can learn (struct, map, array, binary, ...).
    """
    base = spark_type.split("(", 1)[0].split("<", 1)[0]
    if base == "boolean":
        return "boolean"
    if base in _INTEGER:
        return "integer"
    if base in _FLOAT:
        return "float"
    if base in _CATEGORICAL:
        return "categorical"
    raise SchemaError(
        f"{_where(column)} has type {spark_type}, which a model cannot learn. Use a boolean, integer or string "
        f"column (classes) or a float column (regression) as data.label / labelCol; build it in your ETL or in "
        f"data.query (e.g. SELECT *, {column}.field AS label FROM ...).")


def class_kind(kind: str, task: Optional[str]) -> bool:
    """Whether a label of ``kind`` is counted per class under ``task`` (``None`` = auto)."""
    if task == "regression":
        return False
    return kind != "float" or task in ("binary", "multiclass")


def summarize_label(df: Any, column: str, source_dtype: str, task: Optional[str] = None,
                    max_classes: int = DEFAULT_MAX_CLASSES) -> LabelSummary:
    """One aggregation job over ``df``: the class counts (at most ``max_classes + 1`` reach the driver) or,
    for a regression label, nulls, NaN, infinities and moments."""
    kind = label_kind(column, source_dtype)
    if task == "regression" and kind == "categorical":
        raise ConfigError("train.task", task, f"label column '{column}' is {source_dtype}, not a number; use "
                                              f"binary or multiclass (or auto), or choose a numeric data.label")
    c = quote(column)
    if class_kind(kind, task):
        groups = (df.selectExpr(f"{c} AS v", f"CAST({c} AS STRING) AS t").groupBy("v", "t").count()
                  .limit(max_classes + 2).collect())  # the null group + max_classes + 1 at most
        nulls = sum(int(r["count"]) for r in groups if r["v"] is None)
        found = [(r["v"], r["t"], int(r["count"])) for r in groups if r["v"] is not None]
        bad = [x for x in found if kind == "float" and not math.isfinite(float(x[0]))]
        found = [x for x in found if x not in bad]
        numeric = kind in ("integer", "float", "boolean")
        found.sort(key=lambda x: (x[0] if numeric else x[1]))
        return LabelSummary(column, source_dtype, kind, rows=nulls + sum(n for _, _, n in found + bad), nulls=nulls,
                            classes=found, nan=sum(n for v, _, n in bad if math.isnan(float(v))),
                            inf=sum(n for v, _, n in bad if math.isinf(float(v))))
    v = c if source_dtype in ("float", "double") else f"CAST({c} AS DOUBLE)"
    finite = f"IF(abs({v}) < CAST('Infinity' AS DOUBLE), {v}, NULL)"
    row = df.selectExpr("count(1) AS rows", f"count({c}) AS n", f"count_if(isnan({v})) AS nan",
                        f"count_if(abs({v}) = CAST('Infinity' AS DOUBLE)) AS inf", f"avg({finite}) AS mean",
                        f"stddev_samp({finite}) AS std", f"min({finite}) AS min", f"max({finite}) AS max",
                        f"count_if({finite} <> floor({finite})) AS fractional").first()
    stats = {k: (float(row[k]) if row[k] is not None else None) for k in ("mean", "std", "min", "max")}
    return LabelSummary(column, source_dtype, kind, rows=int(row["rows"]), nulls=int(row["rows"]) - int(row["n"]),
                        nan=int(row["nan"]), inf=int(row["inf"]), stats=stats,
                        whole=kind == "float" and int(row["fractional"] or 0) == 0 and stats["max"] is not None)


def check_label(summary: LabelSummary, drop_null_labels: bool = True,
                max_classes: int = DEFAULT_MAX_CLASSES) -> int:
    """Raise :class:`DataError` when the label cannot be trained on; return how many rows to drop (null labels).

    Refused, each naming the column, the value and the fix: an input with no
    rows; null labels with ``drop_null_labels`` false; a label that is null
    everywhere; a single class, or a regression label with one value;
    more than ``max_classes`` classes; integer classes beyond 2^53 (a double
    prediction cannot tell them apart); NaN or infinity in a regression label.
    """
    col, n = summary.column, summary.rows
    where = _where(col)
    labelled = n - summary.nulls
    if not n:
        raise DataError(f"{where}: the input has no rows, so there is no label to learn; check the source, "
                        f"data.query or the filters of the DataFrame passed to fit()")
    if not labelled:
        raise DataError(f"{where} is null in all {n:,} rows; check data.label / labelCol (is '{col}' the right "
                        f"column?)")
    if summary.nulls and not drop_null_labels:
        raise DataError(f"{where} is null in {summary.nulls:,} of {n:,} rows (value: null). Set "
                        f"data.drop_null_labels: true to drop those rows, or fill the label in your ETL.")
    if summary.nan or summary.inf:
        task = "a regression label" if summary.classes is None else "a class"
        raise DataError(
            f"{where} ({summary.source_dtype}, {task}) has {summary.nan:,} NaN and {summary.inf:,} infinite values "
            f"(value: {'NaN' if summary.nan else 'Infinity'}); a label must be finite. Drop or fix those rows in "
            f"your ETL, data.query or the DataFrame passed to fit() (WHERE NOT isnan({col}) AND abs({col}) < "
            f"'Infinity').")
    if summary.classes is not None:
        classes = summary.classes
        if len(classes) > max_classes:
            sample = ", ".join(repr(t) for _, t, _ in classes[:5])
            raise DataError(
                f"{where} has more than {max_classes:,} classes (e.g. {sample}, ...), over train.max_classes="
                f"{max_classes}. Is it an id or a measurement? Use a float column for regression (or train.task: "
                f"regression), group rare classes in your ETL, or raise train.max_classes.")
        huge = [v for v, _, _ in classes if summary.kind == "integer" and isinstance(v, int) and abs(v) > 2 ** 53]
        if huge:
            raise DataError(
                f"{where} ({summary.source_dtype}) has class values beyond 2^53 (e.g. {huge[0]}), which a "
                f"prediction (a double) cannot tell apart: {huge[0]} and {huge[0] + 1} would come back as the same "
                f"number. Cast the label to string (F.col('{col}').cast('string'), or CAST in data.query) so "
                f"classes come back as their text, or map them to small ids in your ETL.")
        if len(classes) == 1:
            raise DataError(
                f"{where} has a single class, {classes[0][1]!r}, in all {labelled:,} labelled rows: there is "
                f"nothing to learn. Check data.label / labelCol and any filter in data.query or your ETL.")
    elif summary.stats.get("min") is not None and summary.stats.get("min") == summary.stats.get("max"):
        value = summary.stats["min"]
        raise DataError(
            f"{where} ({summary.source_dtype}) holds one value, {value!r}, in all {labelled:,} labelled rows: there "
            f"is nothing to learn (as a regression target it is a constant; as 0.0/1.0 classes, a single class). "
            f"Check data.label / labelCol and any filter in data.query or your ETL.")
    if summary.nulls and summary.nulls * 20 > n:  # over 5%: a parsing problem as often as missing labels
        log.warning("%s: %d of %d rows (%.0f%%) have a null label and are dropped (data.drop_null_labels). So many "
                    "usually means the input was misread: a CSV with quoted line breaks needs data.options "
                    "multiLine: true (each broken record otherwise becomes two rows without a label), or the "
                    "separator or header is off", where, summary.nulls, n, 100.0 * summary.nulls / n)
    elif summary.nulls:
        log.info("%s: %d of %d rows have a null label and are dropped (data.drop_null_labels)", where,
                 summary.nulls, n)
    return summary.nulls


@dataclass(frozen=True)
class LabelEncoding:
    """How the label is written for training (see the module docstring), and its ``features.json`` entry.

    ``labels`` is the text of each class in index order when the label is
    indexed (the :class:`~sparktrain.features.label_stage.LabelIndexerModel`
    matches on Spark's ``CAST(label AS STRING)``), ``[]`` when an integer or
    boolean label is cast to a float regression target, None when the value
    is written as it is.
    """

    task: str
    dtype: str
    labels: Optional[List[str]]
    entry: Dict[str, Any]


def encode_label(summary: LabelSummary, task: Optional[str] = None) -> LabelEncoding:
    """Decide the task, the written dtype and the vocabulary from a checked summary (``task``: override)."""
    entry: Dict[str, Any] = {"column": summary.column, "source_dtype": summary.source_dtype}
    labels: Optional[List[str]] = None
    if summary.classes is None:
        dtype, inferred = "float32", "regression"
        if summary.kind in ("integer", "boolean"):
            labels = []
        entry.update(vocabulary=None, num_classes=None, class_counts=None,
                     stats={k: _finite(v) for k, v in summary.stats.items()})
    else:
        values = [v for v, _, _ in summary.classes]
        counts = [n for _, _, n in summary.classes]
        k = len(values)
        inferred = "binary" if k == 2 else "multiclass"
        if summary.kind == "boolean":
            dtype, vocabulary = "float32", None  # false/true are 0.0/1.0
            counts = [dict((bool(v), n) for v, _, n in summary.classes).get(b, 0) for b in (False, True)]
        elif summary.kind == "integer" and values == list(range(k)):
            dtype, vocabulary = "int32", None
        else:
            dtype = "int32"
            vocabulary = [_plain(v, t, summary.kind) for v, t, _ in summary.classes]
            labels = [t for _, t, _ in summary.classes]
        entry.update(vocabulary=vocabulary, num_classes=k, class_counts=counts)
    final = task or inferred
    if task is None and summary.classes is None:
        warn_class_indices(summary)
    warn_lookalike_classes(summary)
    if task is None and summary.kind == "integer" and summary.classes:
        warn_many_integer_classes(summary.column, len(summary.classes), summary.classes[0][0],
                                  summary.classes[-1][0])
    if summary.classes is not None and final == "binary" and len(summary.classes) != 2:
        raise ConfigError("train.task", "binary",
                          f"label column '{summary.column}' has {len(summary.classes)} classes; use multiclass or auto")
    entry.update(dtype=dtype, task=final, inferred_task=inferred,
                 order="value" if summary.kind in ("integer", "float", "boolean") else "text")
    return LabelEncoding(task=final, dtype=dtype, labels=labels, entry=entry)


@dataclass(frozen=True)
class LabelDecision:
    """What :func:`decide_label` found and decided: the summary, how many rows to drop, the encoding."""

    summary: LabelSummary
    dropped: int
    encoding: LabelEncoding


def decide_label(df: Any, column: str, source_dtype: str, task: Optional[str] = None,
                 max_classes: int = DEFAULT_MAX_CLASSES, drop_null_labels: bool = True) -> LabelDecision:
    """The label policy, the one both preprocess and ``fit(df)`` apply: summarize, check, encode.

    Parameters
    ----------
    df : DataFrame
        All input rows (classes come from every row, so every split gets the same indices).
    column, source_dtype : str
        The label column and its Spark ``simpleString`` type.
    task : str, optional
        ``binary``, ``multiclass`` or ``regression`` to override the inferred task; None for auto.
    max_classes : int
        The most classes a label may have.
    drop_null_labels : bool
        Drop rows with a null label (counted in ``dropped``) instead of refusing them.

    Returns
    -------
    LabelDecision

    Raises
    ------
    SchemaError
        A type no model learns from (before any job).
    DataError, ConfigError
        From :func:`check_label` and :func:`encode_label`: each names the column, the value and the fix.
    """
    label_kind(column, source_dtype)
    summary = summarize_label(df, column, source_dtype, task, max_classes)
    dropped = check_label(summary, drop_null_labels, max_classes)
    return LabelDecision(summary=summary, dropped=dropped, encoding=encode_label(summary, task))


def _plain(value: Any, text: str, kind: str) -> Any:
    """A class value as JSON holds it: int, float, or Spark's text of it."""
    if kind == "integer":
        return int(value)
    if kind == "float":
        return float(value)
    return text


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


__all__ = ["DEFAULT_MAX_CLASSES", "MANY_INTEGER_CLASSES", "LabelDecision", "LabelEncoding", "LabelSummary",
           "check_label", "class_kind", "decide_label", "encode_label", "label_kind", "max_classes_of",
           "summarize_label", "task_override", "warn_class_indices", "warn_lookalike_classes",
           "warn_many_integer_classes"]
