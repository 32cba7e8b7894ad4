"""A one-pass profile of a DataFrame: rows, null counts per column, and the label's classes or moments.

The label is profiled by its type, never cast to something it is not: per
class row counts for a boolean, integer or string label (and the rate of the
positive class for a boolean or 0/1 label), mean, std, min and max of the
finite values for a float label.  Everything comes from one aggregation job:
for a class label it is grouped by the label, with the null counts summed
per class on the driver (at most ``max_classes + 1`` groups come back; with
more, a second job counts the nulls and the classes are not listed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: Classes listed by :meth:`Profile.format` (all of them are in :attr:`Profile.classes`).
SHOWN_CLASSES = 20


@dataclass(frozen=True)
class Profile:
    """What :func:`profile` measured.

    Attributes
    ----------
    rows : int
    label : str, optional
        The label column (None when not given or not in the data).
    label_rate : float, optional
        Share of the positive class among labelled rows, for a boolean or 0/1 label.
    nulls : dict
        Null count per column.
    label_dtype : str, optional
        The label's Spark type.
    classes : list of (str, int), optional
        Rows per class (Spark's text of the value), sorted by value; None for a
        float label or when there are more than ``max_classes``.
    label_stats : dict, optional
        ``mean``, ``std``, ``min``, ``max`` of a float label's finite values, and ``nan``/``inf`` counts.
    """

    rows: int
    label: Optional[str]
    label_rate: Optional[float]
    nulls: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    label_dtype: Optional[str] = None
    classes: Optional[List[Tuple[str, int]]] = None
    label_stats: Optional[Dict[str, Optional[float]]] = None
    too_many_classes: bool = False

    def format(self) -> str:
        """A short human-readable table."""
        lines = [f"rows: {self.rows:,}"]
        lines += self._label_lines()
        with_nulls = {k: v for k, v in self.nulls.items() if v}
        lines.append(f"columns: {len(self.nulls)} ({len(with_nulls)} with nulls)")
        width = max((len(k) for k in with_nulls), default=0)
        for name, count in sorted(with_nulls.items(), key=lambda kv: -kv[1]):
            pct = 100.0 * count / self.rows if self.rows else 0.0
            lines.append(f"  {name:<{width}}  {count:>9,} nulls ({pct:5.1f}%)")
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)

    def _label_lines(self) -> List[str]:
        if self.label is None:
            return []
        head = f"label '{self.label}' ({self.label_dtype})"
        lines = []
        if self.classes is not None:
            labelled = sum(n for _, n in self.classes) or 1
            lines.append(f"{head}: {len(self.classes)} classes")
            width = max((len(t) for t, _ in self.classes[:SHOWN_CLASSES]), default=0)
            for text, n in self.classes[:SHOWN_CLASSES]:
                lines.append(f"  {text:<{width}}  {n:>11,} ({n / labelled:6.1%})")
            if len(self.classes) > SHOWN_CLASSES:
                lines.append(f"  ... {len(self.classes) - SHOWN_CLASSES} more classes")
        elif self.too_many_classes:
            lines.append(f"{head}: too many classes to list")
        elif self.label_stats is not None:
            s = self.label_stats
            stats = "  ".join(f"{k} {_num(s.get(k))}" for k in ("mean", "std", "min", "max"))
            bad = f"  ({int(s.get('nan') or 0):,} NaN, {int(s.get('inf') or 0):,} infinite)" \
                if s.get("nan") or s.get("inf") else ""
            lines.append(f"{head}: {stats}{bad}")
        if self.label_rate is not None:
            lines.append(f"label '{self.label}' rate: {self.label_rate:.4f}")
        return lines


def profile(df: Any, label: Optional[str] = None, max_classes: int = 1000) -> Profile:
    """Profile ``df`` with one aggregation job (nothing is collected but counts; see the module docstring).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    label : str, optional
        The label column: classes are counted for a boolean, integer or string
        label (any type but float/double/decimal), moments computed for a float one.
    max_classes : int
        The most classes listed.

    Examples
    --------
    >>> p = profile(spark.createDataFrame([("a",), ("b",), ("a",)], "label string"), label="label")  # doctest: +SKIP
    >>> p.classes                                                                                   # doctest: +SKIP
    [('a', 2), ('b', 1)]
    """
    from pyspark.sql import functions as F

    from sparktrain.features.compile import quote

    t0 = time.perf_counter()
    nulls = [F.sum(F.col(quote(c)).isNull().cast("long")).alias(f"__n{i}") for i, c in enumerate(df.columns)]
    rows_agg = F.count(F.lit(1)).alias("__rows")
    if label is None or label not in df.columns:
        row = df.agg(rows_agg, *nulls).first().asDict()
        return _profile(df, row, None, t0)
    dtype = df.schema[label].dataType.simpleString()
    kind = dtype.split("(", 1)[0]
    col = F.col(quote(label))
    if kind in ("float", "double", "decimal"):
        v = col.cast("double")
        finite = F.when(F.abs(v) < F.lit(math.inf), v)
        row = df.agg(rows_agg, *nulls, F.avg(finite).alias("mean"), F.stddev_samp(finite).alias("std"),
                     F.min(finite).alias("min"), F.max(finite).alias("max"),
                     F.count_if(F.isnan(v)).alias("nan"), F.count_if(F.abs(v) == F.lit(math.inf)).alias("inf")
                     ).first().asDict()
        stats = {k: (float(row.pop(k)) if row[k] is not None else row.pop(k)) for k in
                 ("mean", "std", "min", "max", "nan", "inf")}
        return _profile(df, row, label, t0, dtype=dtype, stats=stats)
    groups = (df.groupBy(col.alias("__v")).agg(F.first(col.cast("string")).alias("__t"), rows_agg, *nulls)
              .limit(max_classes + 2).collect())
    labelled = [g for g in groups if g["__v"] is not None]
    if len(labelled) > max_classes:  # too many to list: count the nulls alone
        row = df.agg(rows_agg, *nulls).first().asDict()
        return _profile(df, row, label, t0, dtype=dtype, too_many=True)
    total: Dict[str, int] = {}
    for g in groups:
        for k, v in g.asDict().items():
            if k.startswith("__n") or k == "__rows":
                total[k] = total.get(k, 0) + int(v or 0)
    numeric = kind in ("boolean", "tinyint", "smallint", "int", "bigint")
    labelled.sort(key=lambda g: g["__v"] if numeric else g["__t"])
    classes = [(str(g["__t"]), int(g["__rows"])) for g in labelled]
    rate = None
    values = [g["__v"] for g in labelled]
    if values and all(v in (0, 1) for v in values):  # boolean or 0/1: the positive class's share
        n = sum(c for _, c in classes)
        rate = sum(int(g["__rows"]) for g in labelled if g["__v"] == 1) / n if n else None
    return _profile(df, total, label, t0, dtype=dtype, classes=classes, rate=rate)


def _profile(df: Any, row: Dict[str, Any], label: Optional[str], t0: float, dtype: Optional[str] = None,
             classes: Optional[List[Tuple[str, int]]] = None, rate: Optional[float] = None,
             stats: Optional[Dict[str, Any]] = None, too_many: bool = False) -> Profile:
    nulls = {c: int(row.get(f"__n{i}") or 0) for i, c in enumerate(df.columns)}
    return Profile(rows=int(row["__rows"] or 0), label=label, label_rate=rate, nulls=nulls,
                   seconds=time.perf_counter() - t0, label_dtype=dtype, classes=classes, label_stats=stats,
                   too_many_classes=too_many)


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


__all__ = ["Profile", "profile"]
