"""SQL text helpers shared by the feature modules.

Plain Python (no pyspark import), so :mod:`sparktrain.features.compile`,
:mod:`sparktrain.features.stages`, :mod:`sparktrain.features.validate`,
:mod:`sparktrain.features.label`, :mod:`sparktrain.features.label_stage`,
:mod:`sparktrain.features.split` and :mod:`sparktrain.features.materialize`
can all use them without importing each other.
"""

from __future__ import annotations

#: Prefix of the intermediate columns the compiled pipeline creates (dropped by the assembler).
INTERNAL_PREFIX = "__st_"


def quote(name: str) -> str:
    """A SQL identifier in backticks."""
    return "`" + name.replace("`", "``") + "`"


def sql_double(value: float) -> str:
    """A double literal that keeps every bit of ``value`` (``repr`` round-trips; NaN and inf included)."""
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def sql_string(text: str) -> str:
    """A single-quoted SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


__all__ = ["INTERNAL_PREFIX", "quote", "sql_double", "sql_string"]
