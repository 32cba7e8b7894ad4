"""A one-pass profile of a DataFrame: rows, label rate and null counts per column."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass(frozen=True)
class Profile:
    """What :func:`profile` measured."""

    rows: int
    label: Optional[str]
    label_rate: Optional[float]
    nulls: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def format(self) -> str:
        """A short human-readable table."""
        lines = [f"rows: {self.rows:,}"]
        if self.label is not None and self.label_rate is not None:
            lines.append(f"label '{self.label}' rate: {self.label_rate:.4f}")
        with_nulls = {k: v for k, v in self.nulls.items() if v}
        lines.append(f"columns: {len(self.nulls)} ({len(with_nulls)} with nulls)")
        width = max((len(k) for k in with_nulls), default=0)
        for name, count in sorted(with_nulls.items(), key=lambda kv: -kv[1]):
            pct = 100.0 * count / self.rows if self.rows else 0.0
            lines.append(f"  {name:<{width}}  {count:>9,} nulls ({pct:5.1f}%)")
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)


def profile(df, label: Optional[str] = None) -> Profile:
    """Profile ``df`` with a single aggregation job (nothing is collected but the counts).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    label : str, optional
        A boolean or 0/1 column whose mean is reported as the label rate.
    """
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    aggs = [F.count(F.lit(1)).alias("__rows")]
    aggs += [F.sum(F.col(c).isNull().cast("long")).alias(c) for c in df.columns]
    if label is not None and label in df.columns:
        aggs.append(F.avg(F.col(label).cast("double")).alias("__label_rate"))
    row = df.agg(*aggs).first().asDict()
    rows = int(row.pop("__rows"))
    rate = row.pop("__label_rate", None)
    nulls = {c: int(row[c] or 0) for c in df.columns}
    return Profile(rows=rows, label=label if rate is not None else None,
                   label_rate=float(rate) if rate is not None else None, nulls=nulls,
                   seconds=time.perf_counter() - t0)
