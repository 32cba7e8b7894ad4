"""The one split expression: which split a row belongs to, from a seeded hash of its key or its columns.

Both ways of getting training data use it: preprocess
(:func:`sparktrain.features.materialize.split_expression`, train /
validation / test by ``split.seed``) and ``fit(df)``
(:func:`sparktrain.train.plan.materialize_dataframe`, train / validation by
the estimator's ``seed``).  A row's bucket is
``pmod(xxhash64(seed, columns...), 10000)``: the same on every run, every
partitioning and every cluster size, and different for another seed.

Plain Python (SQL text only, no pyspark import).
"""

from __future__ import annotations

from typing import Sequence, Tuple

from sparktrain.errors import ConfigError
from sparktrain.features._sql import quote, sql_string

#: A row's split is decided in steps of 1 / SPLIT_BUCKETS.
SPLIT_BUCKETS = 10_000


def split_bucket(seed: int, columns: Sequence[str]) -> str:
    """SQL of a row's bucket in ``[0, SPLIT_BUCKETS)``: a hash of ``seed`` and ``columns``.

    Raises :class:`ConfigError` when ``columns`` is empty (nothing to hash).
    """
    if not columns:
        raise ConfigError("data.key", None, "give data.key, or the columns to hash for a keyless split")
    hashed = ", ".join(quote(c) for c in columns)
    return f"pmod(xxhash64(CAST({int(seed)} AS BIGINT), {hashed}), {SPLIT_BUCKETS})"


def split_case(seed: int, columns: Sequence[str], fractions: Sequence[Tuple[str, float]]) -> str:
    """SQL naming a row's split: ``CASE WHEN bucket < hi_1 THEN 'name_1' ... ELSE 'name_n' END``.

    Parameters
    ----------
    seed : int
        The hash seed (another seed moves rows to other splits).
    columns : sequence of str
        What is hashed: the key, or every column (identical rows then share a split).
    fractions : sequence of (name, fraction)
        The splits in order; fractions add up to 1, the last one takes the remaining buckets.

    Examples
    --------
    >>> split_case(7, ["id"], [("train", 0.9), ("validation", 0.1)])
    "CASE WHEN pmod(xxhash64(CAST(7 AS BIGINT), `id`), 10000) < 9000 THEN 'train' ELSE 'validation' END"
    """
    bucket = split_bucket(seed, columns)
    whens, total = [], 0.0
    for name, fraction in fractions[:-1]:
        total += fraction
        whens.append(f"WHEN {bucket} < {round(total * SPLIT_BUCKETS)} THEN {sql_string(name)}")
    last = sql_string(fractions[-1][0])
    return f"CASE {' '.join(whens)} ELSE {last} END" if whens else last


__all__ = ["SPLIT_BUCKETS", "split_bucket", "split_case"]
