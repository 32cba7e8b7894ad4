"""Declarative feature spec: one frozen dataclass per feature type.

These are plain Python (no Spark import) so that a job config is validated
before any Spark work.  :mod:`sparktrain.features.compile` turns a tuple of
specs into a ``pyspark.ml.Pipeline``.

YAML form (inside ``features:`` of a job config)::

    - {name: city, type: categorical, min_frequency: 10}
    - {name: price, type: numeric, impute: median, clip: [0, 1000000], log1p: true}
    - {name: street, type: categorical, hash_buckets: 512}
    - {name: sold_at, type: datetime, parts: [hour, day_of_week, month], cyclical: true}
    - {name: city_x_street, type: crossed, columns: [city, street], hash_buckets: 128}
    - {name: embedding, type: vector, scale: true}
    - {name: title, type: text, max_tokens: 32, min_frequency: 2, max_vocab: 20000}
    - {name: tags, type: set, delimiter: "|", max_vocab: 500}
    - {name: listed_on, type: datetime, format: "yyyy/MM/dd", parts: [day_of_week, month]}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Tuple, Union

from sparktrain._internal.typed_build import build, require
from sparktrain.errors import ConfigError

DATETIME_PARTS = ("hour", "day_of_week", "month", "day_of_month", "minute")


@dataclass(frozen=True)
class NumericFeature:
    """A numeric input column, emitted as one float32 column (plus optional bucket index).

    Parameters
    ----------
    impute : {'mean', 'median', 'constant'}
        How nulls (and NaN/inf when ``on_invalid='impute'``) are filled.  Mean
        and median are fitted (Spark ``Imputer``) on the clipped, log1p'd values
        of the train split; the median is Spark's approximate one (relative
        error 0.001).
    impute_value : float
        The fill value when ``impute='constant'``, in the column's raw units:
        it is filled in before clipping and log1p.
    log1p : bool
        Apply ``sign(x) * log1p(|x|)`` after clipping.
    clip : (float, float), optional
        Clip to ``[low, high]`` before the other transforms.
    scale : {'standard', 'minmax', 'none'}
        Normalization after imputing: ``(x - mean) / std`` (sample std) or
        ``(x - min) / (max - min)``, fitted on the train split.
    buckets : int, optional
        Also emit a quantile-bucket index ``<name>_bucket`` (QuantileDiscretizer).
    on_invalid : {'impute', 'error'}
        NaN or infinity: treat as missing, or reject the data with an error.
    """

    name: str
    type: Literal["numeric"] = "numeric"
    column: Optional[str] = None
    impute: Literal["mean", "median", "constant"] = "mean"
    impute_value: float = 0.0
    log1p: bool = False
    clip: Optional[Tuple[float, float]] = None
    scale: Literal["standard", "minmax", "none"] = "standard"
    buckets: Optional[int] = None
    on_invalid: Literal["impute", "error"] = "impute"

    def __post_init__(self) -> None:
        if self.clip is not None:
            require(all(math.isfinite(v) for v in self.clip), f"features.{self.name}.clip", list(self.clip),
                    "both bounds must be finite numbers, e.g. [-60, 600]")
            require(self.clip[0] < self.clip[1], f"features.{self.name}.clip", list(self.clip),
                    "low must be below high, e.g. [-60, 600]")
        require(math.isfinite(self.impute_value), f"features.{self.name}.impute_value", self.impute_value,
                "must be a finite number")
        if self.buckets is not None:
            require(self.buckets >= 2, f"features.{self.name}.buckets", self.buckets,
                    "must be >= 2 (or remove the key)")

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical column, emitted as an int32 index for an embedding.

    Index layout: ``0 .. V-1`` are vocabulary entries (most frequent first) and
    ``V`` is reserved for null, unseen and rare values, so the embedding needs
    ``V + 1`` rows.  With ``hash_buckets=N`` the index is ``crc32(value) mod N``
    (nulls hash as the empty string), which needs no fitted vocabulary.
    """

    name: str
    type: Literal["categorical"] = "categorical"
    column: Optional[str] = None
    min_frequency: int = 1
    max_vocab: Optional[int] = None
    vocab_limit: int = 10_000
    hash_buckets: Optional[int] = None

    def __post_init__(self) -> None:
        require(self.min_frequency >= 1, f"features.{self.name}.min_frequency", self.min_frequency,
                "must be >= 1")
        if self.max_vocab is not None:
            require(self.max_vocab >= 1, f"features.{self.name}.max_vocab", self.max_vocab, "must be >= 1")
        require(self.vocab_limit >= 1, f"features.{self.name}.vocab_limit", self.vocab_limit, "must be >= 1")
        if self.hash_buckets is not None:
            require(self.hash_buckets >= 2, f"features.{self.name}.hash_buckets", self.hash_buckets,
                    "must be >= 2")
            require(self.max_vocab is None and self.min_frequency == 1,
                    f"features.{self.name}.hash_buckets", self.hash_buckets,
                    "hashing has no vocabulary: drop min_frequency/max_vocab, or drop hash_buckets")

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class DatetimeFeature:
    """A timestamp (or ISO-8601 string) column, decomposed into calendar parts.

    Each part becomes an int32 index; with ``cyclical`` each part also gets
    ``<name>_<part>_sin`` / ``_cos`` float32 columns.  Parts are read in UTC.

    ``format`` is a Spark datetime pattern (``to_timestamp``'s, e.g.
    ``"yyyy/MM/dd"`` or ``"dd.MM.yyyy HH:mm"``) for a string column; values that
    do not match it count as unparseable and are refused like any value that
    cannot be cast.  Without it a string must be ISO-8601.
    """

    name: str
    type: Literal["datetime"] = "datetime"
    column: Optional[str] = None
    parts: Tuple[str, ...] = ("hour", "day_of_week", "month")
    cyclical: bool = True
    format: Optional[str] = None

    def __post_init__(self) -> None:
        if self.format is not None:
            require(bool(self.format.strip()), f"features.{self.name}.format", self.format,
                    "give a Spark datetime pattern such as 'yyyy/MM/dd', or remove the key for ISO-8601")
        for i, part in enumerate(self.parts):
            require(part in DATETIME_PARTS, f"features.{self.name}.parts[{i}]", part,
                    f"must be one of {', '.join(DATETIME_PARTS)}")
        require(len(self.parts) > 0, f"features.{self.name}.parts", list(self.parts), "list at least one part")

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class BooleanFeature:
    """A boolean column emitted as float32 1.0 / 0.0 (null becomes 0.0)."""

    name: str
    type: Literal["boolean"] = "boolean"
    column: Optional[str] = None

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class CrossedFeature:
    """Two (or more) categorical columns crossed by hashing into ``hash_buckets``."""

    name: str
    columns: Tuple[str, ...]
    hash_buckets: int
    type: Literal["crossed"] = "crossed"

    def __post_init__(self) -> None:
        require(len(self.columns) >= 2, f"features.{self.name}.columns", list(self.columns),
                "list at least two columns to cross")
        require(self.hash_buckets >= 2, f"features.{self.name}.hash_buckets", self.hash_buckets, "must be >= 2")


@dataclass(frozen=True)
class VectorFeature:
    """A Spark ML vector (dense or sparse) or an ``array<float|double>`` column, emitted as a float block.

    Every row must hold the same number of values; the width is learned from
    the train rows and recorded, and a row of another length is refused with
    the column and the lengths seen.  Written as ``array<float>`` of that width.

    Parameters
    ----------
    scale : bool
        Standard-scale each element with its own mean and sample std, fitted
        on the train split.
    on_invalid : {'impute', 'error'}
        A NaN, infinite or null element (or a null row): replaced by 0 (after
        scaling, so by the element's mean with ``scale``), or refused.
    """

    name: str
    type: Literal["vector"] = "vector"
    column: Optional[str] = None
    scale: bool = False
    on_invalid: Literal["impute", "error"] = "impute"

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class TextFeature:
    """A free-text column, tokenized in Spark and emitted as padded token ids for a mean-pooled embedding bag.

    Tokens come from Spark's ``RegexTokenizer`` (lowercased; ``pattern``
    splits, empty tokens dropped).  The first ``max_tokens`` tokens of a row
    are kept as an ``array<int>`` of exactly ``max_tokens`` ids: ``0`` is
    padding, ``1`` an out-of-vocabulary token, ``2 .. V+1`` the vocabulary
    (most frequent first).  With ``hash_buckets=N`` a token's id is
    ``2 + crc32(token) mod N`` and no vocabulary is fitted.

    Parameters
    ----------
    max_tokens : int
        Tokens kept per row (longer rows are cut, shorter ones padded).
    min_frequency : int
        Tokens seen fewer times in the train split are out of vocabulary.
    max_vocab : int, optional
        Keep only the most frequent tokens.
    vocab_limit : int
        Refuse a vocabulary larger than this (set ``max_vocab`` to cap it instead).
    hash_buckets : int, optional
        Hash tokens instead of fitting a vocabulary.
    pattern : str
        The regex between tokens (Java syntax, as ``RegexTokenizer``'s).
    pooling : {'mean', 'sum'}
        How the network pools the token embeddings of a row (padding excluded).
    """

    name: str
    type: Literal["text"] = "text"
    column: Optional[str] = None
    max_tokens: int = 32
    min_frequency: int = 1
    max_vocab: Optional[int] = None
    vocab_limit: int = 100_000
    hash_buckets: Optional[int] = None
    pattern: str = "\\W+"
    pooling: Literal["mean", "sum"] = "mean"

    def __post_init__(self) -> None:
        _check_bag(self, self.max_tokens, "max_tokens")
        require(bool(self.pattern), f"features.{self.name}.pattern", self.pattern,
                "give the regex between tokens, e.g. '\\W+'")

    @property
    def source(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class SetFeature:
    """A multi-valued categorical (tags), emitted as padded item ids for a pooled embedding bag (multi-hot).

    The column is an ``array<string>`` or a string split on ``delimiter``
    (items trimmed; empty items, nulls and repeats dropped).  Ids follow
    :class:`TextFeature`'s layout (0 padding, 1 unknown, 2.. the vocabulary),
    at most ``max_items`` per row.  A vocabulary over ``vocab_limit`` is
    refused; ``max_vocab`` keeps the most frequent items instead.
    """

    name: str
    type: Literal["set"] = "set"
    column: Optional[str] = None
    delimiter: Optional[str] = None
    max_items: int = 16
    min_frequency: int = 1
    max_vocab: Optional[int] = None
    vocab_limit: int = 10_000
    hash_buckets: Optional[int] = None
    pooling: Literal["sum", "mean"] = "sum"

    def __post_init__(self) -> None:
        _check_bag(self, self.max_items, "max_items")
        if self.delimiter is not None:
            require(len(self.delimiter) > 0, f"features.{self.name}.delimiter", self.delimiter,
                    "give the text between items, e.g. '|' (or remove the key for an array<string> column)")

    @property
    def source(self) -> str:
        return self.column or self.name


def _check_bag(spec: Any, length: int, key: str) -> None:
    p = f"features.{spec.name}"
    require(length >= 1, f"{p}.{key}", length, "must be >= 1")
    require(spec.min_frequency >= 1, f"{p}.min_frequency", spec.min_frequency, "must be >= 1")
    if spec.max_vocab is not None:
        require(spec.max_vocab >= 1, f"{p}.max_vocab", spec.max_vocab, "must be >= 1")
    require(spec.vocab_limit >= 1, f"{p}.vocab_limit", spec.vocab_limit, "must be >= 1")
    if spec.hash_buckets is not None:
        require(spec.hash_buckets >= 2, f"{p}.hash_buckets", spec.hash_buckets, "must be >= 2")
        require(spec.max_vocab is None and spec.min_frequency == 1, f"{p}.hash_buckets", spec.hash_buckets,
                "hashing has no vocabulary: drop min_frequency/max_vocab, or drop hash_buckets")


FeatureSpec = Union[NumericFeature, CategoricalFeature, DatetimeFeature, BooleanFeature, CrossedFeature,
                    VectorFeature, TextFeature, SetFeature]
#: Feature types emitted as padded id arrays for an embedding bag.
BagFeature = Union[TextFeature, SetFeature]

FEATURE_TYPES = {
    "numeric": NumericFeature,
    "categorical": CategoricalFeature,
    "datetime": DatetimeFeature,
    "boolean": BooleanFeature,
    "crossed": CrossedFeature,
    "vector": VectorFeature,
    "text": TextFeature,
    "set": SetFeature,
}


def parse_feature(raw: Any, path: str) -> FeatureSpec:
    """Build one feature spec from its YAML mapping, choosing the class by ``type``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, raw, "each feature is a mapping like {name: city, type: categorical}")
    ftype = raw.get("type")
    if ftype not in FEATURE_TYPES:
        raise ConfigError(f"{path}.type", ftype, f"must be one of {', '.join(FEATURE_TYPES)}")
    return build(FEATURE_TYPES[ftype], raw, path)


def parse_features(raw: Any, path: str = "features") -> Tuple[FeatureSpec, ...]:
    """Build the tuple of feature specs, rejecting duplicate names."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(path, raw, "expected a list of features")
    specs = tuple(parse_feature(item, f"{path}[{i}]") for i, item in enumerate(raw))
    seen: set = set()
    for i, spec in enumerate(specs):
        require(spec.name not in seen, f"{path}[{i}].name", spec.name, "feature names must be unique")
        seen.add(spec.name)
    return specs
