"""The Spark reader options ``data.options`` may set, per ``data.format``.

Spark ignores a reader option it does not know (``{delimter: ";"}`` reads
the file with ``,`` and no error), so sparktrain checks the names against the
options Spark 4.x documents for each file format (the "Data Source Option"
tables of the CSV, JSON, Parquet and ORC guides, plus the generic file-source
options) and refuses any other name with a did-you-mean, naming
``data.options.<key>``.  Names are matched case-insensitively, as Spark does.
Write-only options (``compression``, ``quoteAll``...) are refused: they do
nothing on read.  A value Spark rejects (``sep: ""``) surfaces when the data
is loaded, as a :class:`~sparktrain.errors.ConfigError` on ``data.options``
that carries Spark's message.

This module imports nothing from pyspark, so the config is checked before
any JVM starts.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from sparktrain.errors import ConfigError, UnknownKeyError

#: Options every file source reads (Spark's "Generic File Source Options").
GENERIC = ("ignoreCorruptFiles", "ignoreMissingFiles", "pathGlobFilter", "recursiveFileLookup", "modifiedBefore",
           "modifiedAfter", "basePath")

#: Read options per format, from Spark's data source guides.
READER_OPTIONS: Dict[str, Tuple[str, ...]] = {
    "csv": GENERIC + (
        "sep", "delimiter", "encoding", "charset", "quote", "escape", "comment", "header", "inferSchema",
        "preferDate", "enforceSchema", "ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace", "nullValue",
        "nanValue", "positiveInf", "negativeInf", "dateFormat", "timestampFormat", "timestampNTZFormat",
        "enableDateTimeParsingFallback", "maxColumns", "maxCharsPerColumn", "mode", "columnNameOfCorruptRecord",
        "multiLine", "charToEscapeQuoteEscaping", "samplingRatio", "emptyValue", "locale", "lineSep",
        "unescapedQuoteHandling", "timeZone", "singleVariantColumn"),
    "json": GENERIC + (
        "timeZone", "primitivesAsString", "prefersDecimal", "allowComments", "allowUnquotedFieldNames",
        "allowSingleQuotes", "allowNumericLeadingZeros", "allowNumericLeadingZero",
        "allowBackslashEscapingAnyCharacter", "mode", "columnNameOfCorruptRecord", "dateFormat", "timestampFormat",
        "timestampNTZFormat", "enableDateTimeParsingFallback", "multiLine", "allowUnquotedControlChars", "encoding",
        "lineSep", "samplingRatio", "dropFieldIfAllNull", "locale", "allowNonNumericNumbers",
        "singleVariantColumn", "useUnsafeRow"),
    "parquet": GENERIC + ("mergeSchema", "datetimeRebaseMode", "int96RebaseMode"),
    "orc": GENERIC + ("mergeSchema",),
}

#: What ``data.format: csv`` reads with unless ``data.options`` says otherwise.
CSV_DEFAULTS = {"header": True, "inferSchema": True}


def check_reader_options(fmt: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for an option name ``fmt``'s reader does not know, or a non-scalar value.

    Examples
    --------
    >>> check_reader_options("csv", {"header": True, "nullValue": "NA", "delimiter": ";"})
    >>> check_reader_options("csv", {"delimter": ";"})
    Traceback (most recent call last):
    ...
    sparktrain.errors.UnknownKeyError: config key 'data.options.delimter' = ';': unknown key; did you mean ...
    """
    known = READER_OPTIONS.get(fmt)
    if known is None:  # data.format is a Literal: build() has refused it already
        raise ConfigError("data.format", fmt, f"must be one of {', '.join(sorted(READER_OPTIONS))}")
    lower = {k.lower() for k in known}
    for key, value in options.items():
        path = f"data.options.{key}"
        if str(key).lower() not in lower:
            raise UnknownKeyError(path, value, known)
        if value is None or isinstance(value, (dict, list, tuple)):
            raise ConfigError(path, value, "a reader option is a string, a number or true/false")


def reader_options(fmt: str, options: Mapping[str, Any]) -> Dict[str, str]:
    """The options to pass to Spark's reader: the format's defaults, then ``options`` (as text)."""
    merged: Dict[str, Any] = {}
    if fmt == "csv":
        overridden = {k.lower() for k in options}
        merged.update({k: v for k, v in CSV_DEFAULTS.items() if k.lower() not in overridden})
    merged.update(options)
    return {k: _text(v) for k, v in merged.items()}


def reader_record(data: Any) -> Dict[str, Any]:
    """What a registered model records of the ``data:`` section it was trained from (MLflow metadata ``data``).

    ``{"input": "source" | "table" | "query", "format": ..., "options": {...}}``
    (format and options for ``data.source`` only, the options as Spark got
    them: defaults included, values masked like every value sparktrain
    logs); ``sparktrain score`` reads its input with them by default.
    """
    from sparktrain._internal.secrets import mask_value

    kind = data.input_kind or "source"
    record: Dict[str, Any] = {"input": kind}
    if kind == "source":
        record.update(format=data.format,
                      options={k: mask_value(v) for k, v in reader_options(data.format, data.options).items()})
    return record


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["CSV_DEFAULTS", "GENERIC", "READER_OPTIONS", "check_reader_options", "reader_options", "reader_record"]
