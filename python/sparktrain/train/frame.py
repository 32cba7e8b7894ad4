"""What ``fit(df)`` does with each column of a DataFrame: an input of the network, or refused by name.

Every column is the label, an input, a column ``excludeCols`` keeps out, or
refused, never dropped silently.  Refusals are decided from the schema, before
any Spark job, and come as one :class:`~sparktrain.errors.SchemaError` naming
every unusable column and the fixes.

================================================  ========================================================
Spark type                                        input
================================================  ========================================================
``float``, ``double``                             numeric
``decimal(p,s)``                                  numeric (cast to double in Spark)
``boolean``                                       numeric 0/1 (cast to float in Spark)
``tinyint`` ... ``bigint``                        categorical index (embedding rows = max + 1, as today)
Spark ML vector (dense or sparse)                 float block (``vector_to_array(col, "float32")``)
``array<numeric>`` (one length in every row)      float block (cast to ``array<float>``)
``string``, ``date``, ``timestamp``, ``binary``,  refused: ``excludeCols``, a feature spec (sparktrain
``map``, ``struct``, other arrays                 preprocess) or Spark ML stages, or ``featuresCol``
================================================  ========================================================

A *float block* is written to Parquet as ``list<float>`` and becomes one
``(column, width)`` entry of :attr:`InputSpec.vectors`.  Its length is checked
in the aggregation job ``fit`` runs anyway (:func:`block_aggregates`,
:func:`check_blocks`): rows of different lengths, null rows, and NaN or
infinite elements are refused before anything is written.  The same job
counts nulls, NaN and infinities in every other input (:func:`value_aggregates`,
:func:`check_values`): ``handleInvalid='error'`` (the default) refuses them
naming each column, ``'skip'`` and ``'keep'`` leave those rows out of training.

``featuresCol`` set (Spark ML's contract: a stage reads the columns its Params
name), or both ``numericCols`` and ``categoricalCols`` set, names the inputs:
nothing is inferred and the other columns are left out (and listed in the
log).  Otherwise every column is classified by the table above; a kind whose
Param is given (``numericCols`` or ``categoricalCols``) is not inferred.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sparktrain.errors import DataError, DuplicateColumnError, MissingColumnError, SchemaError
from sparktrain.features._sql import quote
from sparktrain.train.inputs import unusable_columns

log = logging.getLogger(__name__)

NUMERIC, CATEGORICAL, BLOCK = "numeric", "categorical", "block"
_NUMBER_TYPES = ("byte", "short", "integer", "long", "float", "double", "decimal")


def _type_name(dtype: Any) -> str:
    return dtype.typeName()


def is_vector(dtype: Any) -> bool:
    """A Spark ML vector column (``VectorUDT``, either of pyspark.ml's or pyspark.mllib's)."""
    return _type_name(dtype) == "vectorudt" or type(dtype).__name__ == "VectorUDT"


def column_kind(dtype: Any) -> Optional[str]:
    """``numeric``, ``categorical`` or ``block`` for a Spark type ``fit(df)`` can use, else None."""
    name = _type_name(dtype)
    if is_vector(dtype):
        return BLOCK
    if name in ("float", "double", "decimal", "boolean"):
        return NUMERIC
    if name in ("byte", "short", "integer", "long"):
        return CATEGORICAL
    if name == "array" and _type_name(dtype.elementType) in _NUMBER_TYPES:
        return BLOCK
    return None


def why_not(dtype: Any) -> str:
    """What a column of type ``dtype`` is, and what makes it usable (for the refusal)."""
    name = _type_name(dtype)
    text = dtype.simpleString()
    if name in ("string", "char", "varchar"):
        return f"{text}: text; index it (a categorical feature spec, or StringIndexer)"
    if name in ("date", "timestamp", "timestamp_ntz"):
        return f"{text}: a point in time; a datetime feature spec, or numbers from it in Spark (unix_timestamp, hour)"
    if name in ("map", "struct"):
        return f"{text}: nested; flatten it in Spark (select('col.*'), col['key'])"
    if name == "array":
        return f"{text}: only arrays of numbers are float blocks"
    if name == "binary":
        return f"{text}: bytes"
    return f"{text}: no numeric meaning"


@dataclass(frozen=True)
class FrameInputs:
    """The resolved use of each column of a DataFrame passed to ``fit``.

    Attributes
    ----------
    numeric, categorical, vectors : tuple of str
        The network's inputs by kind (``vectors``: float blocks).
    kept : tuple of str
        ``excludeCols`` columns written with the data as they are (ids, keys), never inputs.
    unused : tuple of str
        Columns left out because the inputs were named (``featuresCol``, or
        ``numericCols`` with ``categoricalCols``), or because their kind's Param was given.
    casts : dict
        Input column -> Spark SQL conversion (``float``, ``double``, ``int``,
        ``array<float>``, or ``vector`` for ``vector_to_array``).
    """

    numeric: Tuple[str, ...]
    categorical: Tuple[str, ...]
    vectors: Tuple[str, ...]
    kept: Tuple[str, ...] = ()
    unused: Tuple[str, ...] = ()
    casts: Mapping[str, str] = field(default_factory=dict)

    @property
    def inputs(self) -> List[str]:
        return [*self.numeric, *self.vectors, *self.categorical]

    def frame(self, df: Any, label: str) -> Any:
        """``df`` as ``fit`` writes it: the label, each input converted in Spark, the kept columns."""
        from pyspark.sql import functions as F

        keep = {label, *self.inputs, *self.kept}
        cols = []
        for c in df.columns:  # in the DataFrame's order: the split hashes the columns in order
            if c not in keep:
                continue
            cast = self.casts.get(c)
            if cast == "vector":
                from pyspark.ml.functions import vector_to_array

                cols.append(vector_to_array(F.col(quote(c)), "float32").alias(c))
            elif cast == "index":  # NaN and infinities become null, so handleInvalid counts them (no cast error)
                v = F.col(quote(c))
                cols.append(F.when(_not_finite(v), None).otherwise(v).cast("int").alias(c))
            elif cast:
                cols.append(F.col(quote(c)).cast(cast).alias(c))
            else:
                cols.append(F.col(quote(c)))
        return df.select(*cols)


def resolve(schema: Any, label: str, features_col: Optional[str] = None,
            numeric: Optional[Sequence[str]] = None, categorical: Optional[Sequence[str]] = None,
            exclude: Sequence[str] = ()) -> FrameInputs:
    """Decide every column of a DataFrame's ``schema`` (see the module docstring); no Spark job.

    Raises
    ------
    MissingColumnError
        A named column (``featuresCol``, ``numericCols``, ``categoricalCols``) is not in the DataFrame.
    SchemaError
        A named column has a type its Param cannot take, or columns are unusable (one error names
        them all), or nothing is left to learn from.
    """
    where = "the DataFrame passed to fit()"
    DuplicateColumnError.check([f.name for f in schema.fields], where)
    types = {f.name: f.dataType for f in schema.fields}
    named: Dict[str, str] = {}
    for param, cols, kinds in (("featuresCol", [features_col] if features_col else [], (BLOCK,)),
                               ("numericCols", numeric or [], (NUMERIC, CATEGORICAL)),
                               ("categoricalCols", categorical or [], (NUMERIC, CATEGORICAL))):
        for c in cols:
            if c not in types:
                raise MissingColumnError(c, list(types), where=f"{where} ({param})")
            if c == label:  # before its type: a string label named as an input is not a column to encode
                raise SchemaError(f"column '{label}' is the label (labelCol) and also an input ({param}); a model "
                                  f"cannot learn its label from itself. Fix: drop it from {param}")
            if column_kind(types[c]) not in kinds:
                raise SchemaError(_bad_named(param, c, types[c]))
            named[c] = param
    explicit = features_col is not None or (numeric is not None and categorical is not None)
    for c in exclude:  # a name that is not there is most likely a typo: the column it meant would be an input
        if c not in types:
            raise MissingColumnError(c, list(types), where=f"{where} (excludeCols)")
        if c == label:
            raise SchemaError(f"column '{label}' is the label (labelCol) and is in excludeCols, which leaves "
                              f"columns out of the inputs; the label is never an input. Fix: drop it from "
                              f"excludeCols, or set labelCol to the column to predict")
    excluded = set(exclude)
    out: Dict[str, List[str]] = {NUMERIC: list(numeric or []), CATEGORICAL: list(categorical or []),
                                 BLOCK: [features_col] if features_col else []}
    kept: List[str] = []
    unused: List[str] = []
    refused: List[Tuple[str, Any]] = []
    given = {NUMERIC: numeric is not None, CATEGORICAL: categorical is not None, BLOCK: features_col is not None}
    for c, dtype in types.items():
        if c == label or c in named:
            continue
        if c in excluded:
            if _type_name(dtype) == "map":  # no hash of a map: left out of the written data
                log.info("fit(): excluded column '%s' (%s) is not written with the data", c, dtype.simpleString())
            else:
                kept.append(c)
            continue
        kind = column_kind(dtype)
        if explicit or (kind is not None and given[kind]):
            unused.append(c)
        elif kind is None:
            refused.append((c, dtype))
        else:
            out[kind].append(c)
    if refused:
        raise unusable_columns([(c, why_not(t)) for c, t in refused], "the DataFrame")
    guessed = [c for c in out[CATEGORICAL] if c not in (categorical or [])]
    if guessed:  # Spark ML reads an integer as a number: say what this one does with it (probe S)
        listed = ", ".join(f"'{c}'" for c in guessed)
        log.warning("fit(): integer column(s) %s are inferred as categorical indices (one embedding row per value "
                    "up to the largest in training; a larger one at scoring is refused, or skipped under "
                    "handleInvalid). A count or an amount is a number: name it in numericCols, or cast it to "
                    "double; categoricalCols=[%s] says they are indices and silences this", listed, listed)
    if not any(out.values()):
        raise SchemaError(f"no input columns in {where} besides the label '{label}': need numbers, booleans, "
                          f"integer indices, Spark ML vectors or numeric arrays. Fix: add feature columns, or "
                          f"name them with featuresCol / numericCols / categoricalCols")
    casts: Dict[str, str] = {}
    for c in out[NUMERIC]:
        name = _type_name(types[c])
        if name == "boolean" or name in ("byte", "short", "integer", "long"):
            casts[c] = "float"  # true/false -> 1.0/0.0; an integer named in numericCols is a number
        elif name == "decimal":
            casts[c] = "double"
    for c in out[CATEGORICAL]:
        if _type_name(types[c]) in ("float", "double"):
            casts[c] = "index"  # e.g. a StringIndexer's double index named in categoricalCols; NaN -> null
        elif _type_name(types[c]) in ("decimal", "boolean"):
            casts[c] = "int"
    for c in out[BLOCK]:
        casts[c] = "vector" if is_vector(types[c]) else "array<float>"
    return FrameInputs(numeric=tuple(out[NUMERIC]), categorical=tuple(out[CATEGORICAL]), vectors=tuple(out[BLOCK]),
                       kept=tuple(kept), unused=tuple(unused), casts=casts)


def _bad_named(param: str, col: str, dtype: Any) -> str:
    if param == "featuresCol":
        return (f"featuresCol '{col}' has type {dtype.simpleString()}; it must be a Spark ML vector (dense or "
                f"sparse, e.g. a VectorAssembler's output) or an array of numbers of one length. Fix: assemble "
                f"the features with VectorAssembler, or cast the array in Spark (e.g. to array<double>)")
    return (f"{param} names '{col}' of type {dtype.simpleString()}, which is not a number. Fix: encode it first "
            f"(StringIndexer, or a feature spec with sparktrain preprocess), or leave it out of {param}")


def _not_finite(x: Any) -> Any:
    """A Column, true where number ``x`` is null, NaN or infinite (a block's element, a scalar input)."""
    from pyspark.sql import functions as F

    return x.isNull() | F.isnan(x) | (F.abs(x) == float("inf"))


def block_aggregates(vectors: Sequence[str]) -> List[Any]:
    """Aggregate expressions over a :meth:`FrameInputs.frame` that :func:`check_blocks` reads."""
    from pyspark.sql import functions as F

    aggs = []
    for i, c in enumerate(vectors):
        v = F.col(quote(c))
        size = F.when(v.isNotNull(), F.size(v))
        bad = F.exists(v, _not_finite)
        aggs += [F.slice(F.array_sort(F.collect_set(size)), 1, 6).alias(f"__block{i}_sizes"),
                 F.sum(v.isNull().cast("long")).alias(f"__block{i}_nulls"),
                 F.sum(bad.cast("long")).alias(f"__block{i}_invalid")]
    return aggs


def check_blocks(row: Mapping[str, Any], vectors: Sequence[str], rows: int,
                 handle_invalid: str = "error") -> Dict[str, int]:
    """``{column: width}`` of each float block from :func:`block_aggregates`'s results.

    Raises :class:`DataError` naming the column for rows of different lengths
    (with the lengths seen), and, unless ``handle_invalid`` leaves such rows
    out (``skip``, ``keep``), for empty or null rows and NaN or infinite elements.
    """
    widths: Dict[str, int] = {}
    for i, c in enumerate(vectors):
        sizes = list(row[f"__block{i}_sizes"] or [])
        nulls, invalid = int(row[f"__block{i}_nulls"] or 0), int(row[f"__block{i}_invalid"] or 0)
        if handle_invalid != "error":  # null, empty and NaN rows are left out: only the lengths must agree
            sizes, nulls, invalid = [n for n in sizes if n], 0, 0
        fix_out = f"or leave it out with excludeCols=['{c}']"
        skip = "or set handleInvalid='skip' on the estimator (those rows are left out)"
        if len(sizes) > 1:
            seen = ", ".join(map(str, sizes[:5])) + (", ..." if len(sizes) > 5 else "")
            raise DataError(f"column '{c}' holds rows of different lengths ({seen}); a float block needs one "
                            f"length in every row. Fix: pad or slice the arrays to one length in Spark (slice(), "
                            f"concat with array_repeat), assemble fixed-size vectors (VectorAssembler), {fix_out}")
        if nulls:
            raise DataError(f"column '{c}' is null in {nulls:,} of {rows:,} row(s); a float block needs values in "
                            f"every row. Fix: fill or filter them in Spark (df.na.drop(subset=['{c}'])), {skip}, "
                            f"{fix_out}")
        if not sizes or sizes[0] == 0:
            raise DataError(f"column '{c}' holds empty vectors; a float block needs at least one value. "
                            f"Fix: {fix_out[3:]}")
        if invalid:
            raise DataError(f"column '{c}' has NaN, infinite or null values in {invalid:,} of {rows:,} row(s); a "
                            f"network cannot learn from them. Fix: impute or filter them in Spark (Imputer before "
                            f"VectorAssembler, or VectorAssembler(handleInvalid='skip')), {skip}, {fix_out}")
        widths[c] = int(sizes[0])
    return widths


def _invalid(c: str, kind: str) -> Any:
    """A Column, true where input ``c`` (as :meth:`FrameInputs.frame` writes it) cannot be trained on or scored."""
    from pyspark.sql import functions as F

    v = F.col(quote(c))
    if kind == NUMERIC:
        return _not_finite(v)
    if kind == CATEGORICAL:
        return v.isNull()
    return v.isNull() | (F.size(v) == 0) | F.exists(v, _not_finite)


def invalid_row(numeric: Sequence[str], categorical: Sequence[str], vectors: Sequence[str]) -> Any:
    """A Column, true for a row with a null, NaN or infinite input (``handleInvalid`` skips those); None if none."""
    parts = [_invalid(c, NUMERIC) for c in numeric] + [_invalid(c, CATEGORICAL) for c in categorical]
    parts += [_invalid(c, BLOCK) for c in vectors]
    return any_of(parts) if parts else None


def any_of(parts: Sequence[Any]) -> Any:
    """``parts[0] | parts[1] | ...`` as a balanced tree: a chain as deep as a wide table's column count
    overflowed the JVM's stack when Spark analysed it (600 columns)."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return any_of(parts[:mid]) | any_of(parts[mid:])


def value_aggregates(numeric: Sequence[str], categorical: Sequence[str], vectors: Sequence[str],
                     label: str) -> List[Any]:
    """Aggregates over a :meth:`FrameInputs.frame` that :func:`check_values` reads: invalid values per scalar
    input, and labelled rows with any invalid input."""
    from pyspark.sql import functions as F

    aggs = [F.sum(_invalid(c, NUMERIC).cast("long")).alias(f"__num{i}_invalid") for i, c in enumerate(numeric)]
    aggs += [F.sum(_invalid(c, CATEGORICAL).cast("long")).alias(f"__cat{i}_invalid")
             for i, c in enumerate(categorical)]
    bad = invalid_row(numeric, categorical, vectors)
    if bad is not None:
        aggs.append(F.sum((F.col(quote(label)).isNotNull() & bad).cast("long")).alias("__invalid_rows"))
    return aggs


#: an input whose root mean square is above this reaches the default network far from unit scale (warned about)
LARGE_RMS = 100.0


def magnitude_aggregates(numeric: Sequence[str], vectors: Sequence[str]) -> List[Any]:
    """Aggregates that :func:`large_inputs` reads: each numeric input's and float block's root mean square
    (over its finite values; a block's over all its elements)."""
    from pyspark.sql import functions as F

    def finite_square(x):
        return F.when(~F.isnan(x) & (F.abs(x) < float("inf")), x * x)

    aggs = [F.sqrt(F.avg(finite_square(F.col(quote(c)).cast("double")))).alias(f"__num{i}_rms")
            for i, c in enumerate(numeric)]
    for i, c in enumerate(vectors):
        v = F.col(quote(c))
        squares = F.aggregate(F.filter(v, lambda x: ~F.isnan(x) & (F.abs(x) < float("inf"))), F.lit(0.0),
                              lambda acc, x: acc + x.cast("double") * x.cast("double"))
        aggs.append(F.sqrt(F.avg(squares / F.size(v))).alias(f"__block{i}_rms"))
    return aggs


def large_inputs(row: Mapping[str, Any], numeric: Sequence[str], vectors: Sequence[str]) -> Dict[str, float]:
    """``{column: root mean square}`` of the inputs of :func:`magnitude_aggregates` above :data:`LARGE_RMS`."""
    found = {c: row.get(f"__num{i}_rms") for i, c in enumerate(numeric)}
    found.update({c: row.get(f"__block{i}_rms") for i, c in enumerate(vectors)})
    return {c: float(v) for c, v in found.items() if v is not None and v == v and v > LARGE_RMS}


def check_values(row: Mapping[str, Any], numeric: Sequence[str], categorical: Sequence[str], rows: int,
                 handle_invalid: str = "error") -> Dict[str, int]:
    """``{column: rows with a null, NaN or infinite value}`` of the scalar inputs, from :func:`value_aggregates`.

    Raises :class:`DataError` naming every such column (with its count and the
    fixes) when ``handle_invalid`` is ``error``; with ``skip`` or ``keep`` the
    rows are left out of training by the caller.
    """
    bad = {c: int(row[f"__num{i}_invalid"] or 0) for i, c in enumerate(numeric)}
    bad.update({c: int(row[f"__cat{i}_invalid"] or 0) for i, c in enumerate(categorical)})
    bad = {c: n for c, n in bad.items() if n}
    if bad and handle_invalid == "error":
        named = ", ".join(f"'{c}' ({n:,} of {rows:,} rows)" for c, n in bad.items())
        cols = ", ".join(f"'{c}'" for c in bad)
        raise DataError(f"input column(s) {named} hold nulls, NaN or infinite values; a network cannot learn "
                        f"from them and would train to NaN. Fix: fill them in Spark (pyspark.ml.feature.Imputer, "
                        f"or df.na.fill), leave those rows out with handleInvalid='skip' (or "
                        f"df.na.drop(subset=[{cols}])), or leave the column(s) out with excludeCols")
    return bad


def describe(inputs: Any, unused: Sequence[str] = ()) -> str:
    """The inputs by name for the log: ``numeric [a, b]; float blocks [features (12)]; categorical [c (5)];
    bags of ids [note (16 ids of 1000, mean)]`` (text and set features)."""
    parts = []
    if inputs.numeric:
        parts.append(f"numeric [{', '.join(inputs.numeric)}]")
    if inputs.vectors:
        parts.append(f"float blocks [{', '.join(f'{c} ({w})' for c, w in inputs.vectors)}]")
    if inputs.categorical:
        parts.append(f"categorical [{', '.join(f'{c} ({n})' for c, n in inputs.categorical)}]")
    if inputs.bags:
        bags = ", ".join(f"{c} ({n} ids of {rows}, {pool})" for c, n, rows, pool in inputs.bags)
        parts.append(f"bags of ids [{bags}]")
    text = "; ".join(parts)
    if unused:
        text += f"; not used: [{', '.join(unused)}]"
    return text


__all__ = ["FrameInputs", "block_aggregates", "check_blocks", "check_values", "column_kind", "describe",
           "invalid_row", "is_vector", "resolve", "value_aggregates", "why_not"]
