"""Bad-input checks before any fitting: the schema first (no Spark job), then one aggregation pass.

:func:`check_schema` finds missing columns and types that cannot feed a
feature.  :func:`validation_sql` writes every data check as one list of SQL
aggregate expressions, so they run in a single pass: one ``selectExpr``
(:func:`validate`, and :func:`sparktrain.features.fit.fit_features` beside its statistics) or
piggy-backed on a write with ``DataFrame.observe`` (the staged path of
:func:`sparktrain.features.materialize.materialize`).  :func:`check_results`
turns the numbers into errors:

* a value that cannot be cast (``'abc'`` for a numeric feature),
* a column with no usable value (all null, or all NaN/inf),
* NaN or infinity with ``on_invalid: error``,
* a vocabulary (approximately) over ``vocab_limit``; the exact check runs on the
  fitted vocabulary (:func:`sparktrain.features.metadata.check_vocabularies`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sparktrain.errors import DataError, MissingColumnError, SchemaError
from sparktrain.features._sql import quote
from sparktrain.features.compile import timestamp_sql
from sparktrain.features.spec import (
    CategoricalFeature,
    CrossedFeature,
    DatetimeFeature,
    FeatureSpec,
    NumericFeature,
    SetFeature,
)

log = logging.getLogger(__name__)

_NUMBER = ("tinyint", "smallint", "int", "bigint", "float", "double")
#: Accepted Spark source types per feature type (``decimal(p,s)`` counts as a number).
ACCEPTED = {
    "numeric": _NUMBER + ("decimal", "boolean", "string"),
    "boolean": _NUMBER + ("decimal", "boolean", "string"),
    "datetime": ("timestamp", "timestamp_ntz", "date", "string"),
    "categorical": _NUMBER + ("decimal", "boolean", "string", "date"),
    "crossed": _NUMBER + ("decimal", "boolean", "string", "date"),
    "vector": ("vector",) + tuple(f"array<{t}>" for t in _NUMBER + ("decimal",)),
    "text": ("string",),
    "set": ("array<string>", "string"),
}
#: approx_count_distinct errs by ~2%; refuse early only when clearly over the limit.
APPROX_SLACK = 1.05


@dataclass(frozen=True)
class ValidationReport:
    """What the checks found (per feature: present values, NaN, inf, approx distinct...)."""

    rows: int
    features: Dict[str, Dict[str, int]] = field(default_factory=dict)
    null_keys: int = 0


def _base_type(simple: str) -> str:
    if simple.startswith("array<decimal"):
        return "array<decimal>"
    return simple.split("(", 1)[0]


def check_schema(schema: Any, specs: Sequence[FeatureSpec], key: Optional[str] = None,
                 label: Optional[str] = None) -> Dict[str, str]:
    """Check columns and types against the spec; return ``{column: simpleString type}``.

    Raises :class:`MissingColumnError` (naming the column and listing those that
    exist) or :class:`SchemaError` (a type the feature cannot use).
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    available = list(types)
    for spec in specs:
        cols = spec.columns if isinstance(spec, CrossedFeature) else (spec.source,)
        for c in cols:
            if c not in types:
                raise MissingColumnError(c, available, f"the input data (feature '{spec.name}' reads it)")
            base = _base_type(types[c])
            if base not in ACCEPTED[spec.type]:
                raise SchemaError(
                    f"column '{c}' has type {types[c]}, which a {spec.type} feature ('{spec.name}') cannot use "
                    f"(accepted: {', '.join(ACCEPTED[spec.type])}). Cast it in your ETL or change the feature type.")
            if isinstance(spec, DatetimeFeature) and spec.format is not None and base != "string":
                raise SchemaError(
                    f"column '{c}' has type {types[c]}; format ({spec.format!r}) parses strings only. Remove "
                    f"format from feature '{spec.name}' (a {types[c]} is read as it is).")
            if isinstance(spec, SetFeature) and base == "string" and spec.delimiter is None:
                raise SchemaError(
                    f"column '{c}' is a string, which a set feature ('{spec.name}') reads only with a delimiter. "
                    f"Set delimiter (e.g. delimiter: '|'), or give an array<string> column.")
    for col, role in ((key, "data.key"), (label, "data.label")):
        if col and col not in types:
            raise MissingColumnError(col, available, f"the input data (configured as {role})")
    return types


def validation_sql(types: Mapping[str, str], specs: Sequence[FeatureSpec], key: Optional[str] = None,
                   label: Optional[str] = None, distinct: bool = True) -> List[str]:
    """All data checks as SQL aggregates (``"<aggregate> AS `v<i>_<check>`"``), for one pass, e.g. one ``selectExpr``.

    ``distinct=False`` leaves out the approximate vocabulary-size check
    (``approx_count_distinct``, an imperative aggregate that turns off code
    generation for the whole pass), for a caller that counts vocabularies
    exactly and bounded, as :func:`sparktrain.features.fit.fit_features` does.
    """
    exprs: List[Tuple[str, str]] = [("rows", "count(1)")]
    if key:
        exprs.append(("keys", f"count({quote(key)})"))
    if label:
        exprs.append(("labels", f"count({quote(label)})"))
    for i, spec in enumerate(specs):
        if isinstance(spec, CrossedFeature):
            continue
        s = quote(spec.source)
        is_string = _base_type(types[spec.source]) == "string"
        target = {"numeric": "DOUBLE", "datetime": "TIMESTAMP", "boolean": "BOOLEAN"}.get(spec.type)
        cast = f"try_cast({s} AS {target})"
        if isinstance(spec, DatetimeFeature):
            cast = timestamp_sql(spec)
        if target and is_string:
            bad = f"{s} IS NOT NULL AND {cast} IS NULL"
            exprs += [(f"v{i}_bad", f"count_if({bad})"), (f"v{i}_sample", f"min(IF({bad}, {s}, NULL))")]
        if isinstance(spec, NumericFeature):
            # simple expressions on purpose: this pass runs over all the input
            v = s if _base_type(types[spec.source]) in ("float", "double") else f"try_cast({s} AS DOUBLE)"
            exprs += [(f"v{i}_nonnull", f"count({v})"), (f"v{i}_nan", f"count_if(isnan({v}))"),
                      (f"v{i}_inf", f"count_if(abs({v}) = CAST('Infinity' AS DOUBLE))")]
        elif target:
            exprs.append((f"v{i}_present", f"count({cast})"))
        else:
            exprs.append((f"v{i}_present", f"count({s})"))
        if (distinct and isinstance(spec, CategoricalFeature) and spec.hash_buckets is None
                and spec.max_vocab is None and spec.min_frequency == 1):
            exprs.append((f"v{i}_distinct", f"approx_count_distinct({s}, 0.02)"))
    return [f"{e} AS {quote(a)}" for a, e in exprs]


def number_fix(sample: str, column: str) -> str:
    """The fix for text a numeric feature cannot read, from what the text looks like."""
    text = sample.strip()
    ref = f"`{column}`"
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        return (f"drop the thousands separators before it is read (data.query: "
                f"CAST(regexp_replace({ref}, ',', '') AS DOUBLE) AS {ref})")
    if re.fullmatch(r"[-+]?\d+,\d+", text):
        return (f"read the decimal comma (data.query: CAST(regexp_replace({ref}, ',', '.') AS DOUBLE) AS {ref}); "
                f"if ',' also separates the file's fields, set data.options sep")
    if re.fullmatch(r"[-–—.?]|n/?a|null|none|nan|missing", text, re.I):
        return (f"make {text!r} a missing value: data.options nullValue: {text!r} (one token per file), or "
                f"data.query: NULLIF({ref}, {text!r})")
    return "declare the feature as categorical if it is a code rather than a quantity"


def check_results(values: Mapping[str, Any], specs: Sequence[FeatureSpec], label: Optional[str] = None,
                  types: Optional[Mapping[str, str]] = None) -> ValidationReport:
    """Raise :class:`DataError` for the first problem in ``values`` (the aggregates' results)."""
    rows = int(values["rows"])
    if rows == 0:
        raise DataError("the input data has no rows; check data.source (and any filter in your ETL)")
    per: Dict[str, Dict[str, int]] = {}
    for i, spec in enumerate(specs):
        if isinstance(spec, CrossedFeature):
            continue
        got = {k.split("_", 1)[1]: values[k] for k in values if k.startswith(f"v{i}_")}
        if "nonnull" in got:
            got["present"] = got.pop("nonnull") - got["nan"] - got["inf"]
        src, where = spec.source, f"column '{spec.source}' (feature '{spec.name}', {spec.type})"
        if got.get("bad"):
            target = {"numeric": "a number", "datetime": "a timestamp", "boolean": "a boolean"}[spec.type]
            fix, how = "declare the feature as categorical", ""
            if isinstance(spec, NumericFeature):
                fix = number_fix(str(got.get("sample") or ""), src)
            if isinstance(spec, DatetimeFeature):
                how = f" (read with format {spec.format!r})" if spec.format else " (read as ISO-8601)"
                fix = "set format: to its Spark datetime pattern (e.g. 'yyyy/MM/dd'), or " + fix
            raise DataError(
                f"{where} has {got['bad']:,} of {rows:,} values that cannot be cast to {target}, "
                f"e.g. {got['sample']!r}{how}. Clean the column in your ETL, or {fix}.")
        if not got["present"]:
            what = "null, NaN or infinite" if isinstance(spec, NumericFeature) else "null"
            raise DataError(f"{where} is {what} in all {rows:,} rows, so there is nothing to learn from it. "
                            f"Drop the feature or fix the input (is '{src}' the right column?).")
        if isinstance(spec, NumericFeature) and (got["nan"] or got["inf"]):
            if spec.on_invalid == "error":
                raise DataError(
                    f"{where} has {got['nan']:,} NaN and {got['inf']:,} infinite values (on_invalid: error). "
                    f"Set on_invalid: impute to treat them as missing, or clean the data.")
            log.info("%s: %d NaN and %d infinite values are imputed (%s)", where, got["nan"], got["inf"], spec.impute)
        if isinstance(spec, CategoricalFeature) and got.get("distinct", 0) > spec.vocab_limit * APPROX_SLACK:
            raise DataError(
                f"{where} has about {got['distinct']:,} distinct values, over its vocab_limit={spec.vocab_limit}. "
                f"Set max_vocab to keep the most frequent ones, raise min_frequency or vocab_limit, "
                f"or use hash_buckets: N.")
        per[spec.name] = {k: int(v) for k, v in got.items() if k != "sample" and v is not None}
    if label and "labels" in values and not values["labels"]:
        raise DataError(f"the label column '{label}' is null in all {rows:,} rows; check data.label")
    null_keys = rows - int(values["keys"]) if "keys" in values else 0
    if null_keys:
        log.warning("%d rows have a null key; they all land in the same split", null_keys)
    return ValidationReport(rows=rows, features=per, null_keys=null_keys)


def validate(df: Any, specs: Sequence[FeatureSpec], key: Optional[str] = None,
             label: Optional[str] = None) -> ValidationReport:
    """Check ``df`` against ``specs``: the schema, then every data check in one ``agg`` pass.

    Examples
    --------
    >>> validate(df, cfg.features, key="id", label="label").rows   # doctest: +SKIP
    100000
    """
    types = check_schema(df.schema, specs, key, label)
    row = df.selectExpr(*validation_sql(types, specs, key, label)).first()  # a global aggregate
    return check_results(row.asDict(), specs, label, types)


__all__ = ["ACCEPTED", "ValidationReport", "check_results", "check_schema", "validate", "validation_sql"]
