"""The ``tune.space`` YAML section, compiled into a Hyperopt search space.

Each key of ``tune.space`` is a ``train.*`` key; its value is a distribution,
or a constant that every trial uses::

    space:
      learning_rate: {loguniform: [1.0e-4, 1.0e-2]}   # bounds as real values
      batch_size:    {quniform: [128, 1024, 128]}      # [lo, hi, q]
      dropout:       {uniform: [0.0, 0.4]}
      hidden_units:  {choice: [[64], [64, 64], [128, 64]]}
      epochs: 2                                        # a constant
      architecture:                                    # a nested choice: a named group whose
        choice:                                        # options are dicts of sub-spaces
          - {embedding_dim: 4}
          - {embedding_dim: {quniform: [8, 32, 8]}, dropout: {uniform: [0.1, 0.5]}}

Distributions: ``uniform: [lo, hi]``, ``loguniform: [lo, hi]`` (``lo > 0``;
converted to log bounds for Hyperopt), ``quniform: [lo, hi, q]``,
``qloguniform: [lo, hi, q]`` and ``choice: [a, b, ...]`` (options may be
constants, distributions, or, for a named group, dicts of sub-spaces).
Integer keys (``batch_size``, ``embedding_dim``, ``epochs``...) need a
quantized distribution or a choice.  Every bound is checked against the
``train:`` section's own validation, so a search never starts with a range
that cannot train.

Examples
--------
>>> space = compile_space({"learning_rate": {"loguniform": [1e-4, 1e-2]},
...                        "hidden_units": {"choice": [[32], [64, 32]]}})
>>> sorted(space.keys)
['hidden_units', 'learning_rate']
>>> space.to_train_params({"learning_rate": 0.001, "hidden_units": [64, 32]})
{'learning_rate': 0.001, 'hidden_units': (64, 32)}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from sparktrain.config import TrainConfig
from sparktrain.errors import ConfigError, UnknownKeyError

#: ``train.*`` keys a search may set; the rest (framework, backend, num_workers,
#: store, ...) describe where and how to train, not the model.
TUNABLE: FrozenSet[str] = frozenset({"learning_rate", "batch_size", "hidden_units", "embedding_dim", "dropout",
                                     "epochs", "shuffle_buffer", "seed"})
DISTRIBUTIONS: Tuple[str, ...] = ("uniform", "loguniform", "quniform", "qloguniform", "choice")
_ROOT = "tune.space"
_DEFAULT_TRAIN = TrainConfig()


def _kind(key: str) -> type:
    """``int``, ``float`` or ``tuple`` (of ints): the type of ``train.<key>``'s default."""
    return type(getattr(_DEFAULT_TRAIN, key))


@dataclass(frozen=True)
class CompiledSpace:
    """A Hyperopt space plus what is needed to turn its samples into ``train`` fields.

    Attributes
    ----------
    hyperopt : dict
        The space to give Hyperopt (``Domain``/``fmin``): ``{name: pyll node or constant}``.
    keys : frozenset of str
        Every ``train.*`` key some sample can set.
    groups : frozenset of str
        Names of nested-choice groups (their sampled value is a dict that is merged).
    """

    hyperopt: Dict[str, Any]
    keys: FrozenSet[str]
    groups: FrozenSet[str]

    def to_train_params(self, sample: Mapping[str, Any]) -> Dict[str, Any]:
        """Flatten a sample (``hyperopt.space_eval`` output) into typed ``train`` fields."""
        out: Dict[str, Any] = {}

        def walk(node: Mapping[str, Any]) -> None:
            for key, value in node.items():
                if isinstance(value, Mapping):
                    walk(value)
                else:
                    out[key] = coerce_value(key, value)

        walk(sample)
        return out

    def sample(self, seed: int = 0) -> Dict[str, Any]:
        """One random draw as ``train`` fields (for previews and tests)."""
        import numpy as np
        from hyperopt.pyll.stochastic import sample

        return self.to_train_params(sample(self.hyperopt, rng=np.random.default_rng(seed)))


def compile_space(space: Mapping[str, Any], path: str = _ROOT) -> CompiledSpace:
    """Compile the YAML ``tune.space`` mapping into a :class:`CompiledSpace`.

    Parameters
    ----------
    space : mapping
        ``{train key: distribution or constant}``, plus named groups whose
        value is a ``choice`` among dicts of sub-spaces.
    path : str
        Dotted prefix used in error messages.

    Raises
    ------
    ConfigError
        For an unknown key or distribution, malformed or out-of-range bounds, a
        non-integer value for an integer key, or a key set twice.
    """
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(path, space, "give a mapping of train keys to distributions, e.g. "
                                       "{learning_rate: {loguniform: [1.0e-4, 1.0e-2]}}")
    nodes, keys, groups = _compile_mapping(space, path, label_prefix="")
    return CompiledSpace(hyperopt=nodes, keys=frozenset(keys), groups=frozenset(groups))


def _compile_mapping(space: Mapping[str, Any], path: str, label_prefix: str
                     ) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """Compile one (sub-)space; returns ``(nodes, train keys it may set, group names)``."""
    nodes: Dict[str, Any] = {}
    keys: List[str] = []
    groups: List[str] = []
    for raw_key, spec in space.items():
        key = str(raw_key)
        where = f"{path}.{key}"
        label = f"{label_prefix}{key}"
        if key in TUNABLE:
            nodes[key] = _compile_param(key, spec, where, label)
            owned = [key]
        elif _is_group(spec):
            nodes[key], owned, sub_groups = _compile_group(spec, where, label)
            groups += [label, *sub_groups]
        else:
            _unknown_key(key, spec, where)
        clash = set(owned) & set(keys)
        if clash:
            raise ConfigError(where, spec, f"train key '{sorted(clash)[0]}' is set twice in {path}; "
                                           "set each key in one place (at top level or inside one group)")
        keys += owned
    return nodes, keys, groups


def _unknown_key(key: str, spec: Any, where: str) -> None:
    if key in {f.name for f in fields(TrainConfig)}:
        raise ConfigError(where, spec, f"train.{key} cannot be tuned (it says where and how to train, not "
                                       f"what); tunable keys: {', '.join(sorted(TUNABLE))}")
    if isinstance(spec, Mapping) and "choice" in spec:
        raise ConfigError(where, spec, f"'{key}' is not a train key, so it must be a group: a choice whose "
                                       "options are all mappings of train keys, e.g. "
                                       "{choice: [{dropout: 0.0}, {dropout: {uniform: [0.1, 0.5]}}]}")
    raise UnknownKeyError(where, spec, sorted(TUNABLE))


def _is_group(spec: Any) -> bool:
    return (isinstance(spec, Mapping) and list(spec) == ["choice"] and isinstance(spec["choice"], list)
            and bool(spec["choice"]) and all(isinstance(o, Mapping) and not _is_distribution(o)
                                             for o in spec["choice"]))


def _is_distribution(spec: Any) -> bool:
    return isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) in DISTRIBUTIONS


def _compile_group(spec: Mapping[str, Any], where: str, label: str) -> Tuple[Any, List[str], List[str]]:
    from hyperopt import hp

    options, keys, groups = [], set(), []
    for i, option in enumerate(spec["choice"]):
        sub, sub_keys, sub_groups = _compile_mapping(option, f"{where}.choice[{i}]", f"{label}.{i}.")
        options.append(sub)
        keys.update(sub_keys)
        groups += sub_groups
    return hp.choice(label, options), sorted(keys), groups


def _compile_param(key: str, spec: Any, where: str, label: str) -> Any:
    """One train key: a constant, or a distribution node labelled ``label``."""
    from hyperopt import hp

    if not isinstance(spec, Mapping):
        value = coerce_value(key, spec, where)
        _check_in_range(key, value, where, spec)
        return value
    if len(spec) != 1:
        raise ConfigError(where, dict(spec), "give exactly one distribution, e.g. {uniform: [0.0, 0.5]}")
    dist, args = next(iter(spec.items()))
    if dist not in DISTRIBUTIONS:
        raise UnknownKeyError(f"{where}.{dist}", args, DISTRIBUTIONS)
    where = f"{where}.{dist}"
    kind = _kind(key)
    if dist == "choice":
        if not isinstance(args, list) or not args:
            raise ConfigError(where, args, "give a non-empty list of options, e.g. {choice: [256, 512]}")
        options = []
        for i, option in enumerate(args):
            if isinstance(option, Mapping) and not _is_distribution(option):
                raise ConfigError(f"{where}[{i}]", option, f"train.{key} takes a value, not a mapping; nested "
                                                           "sub-spaces belong in a named group (see docs/tuning.md)")
            options.append(_compile_param(key, option, f"{where}[{i}]", f"{label}.{i}")
                           if isinstance(option, Mapping) else _compile_param(key, option, f"{where}[{i}]", label))
        return hp.choice(label, options)
    quantized = dist.startswith("q")
    lo, hi, q = _bounds(args, where, quantized)
    if kind is not float and not quantized:
        raise ConfigError(where, args, f"train.{key} is an integer; use quniform: [lo, hi, q] (q >= 1), "
                                       "qloguniform or choice")
    if kind is not float and (q is None or q < 1 or q != int(q)):
        raise ConfigError(where, args, f"train.{key} is an integer, so q must be a whole number >= 1")
    if dist in ("loguniform", "qloguniform") and lo <= 0:
        raise ConfigError(where, args, "loguniform bounds are real values and must be > 0, "
                                       "e.g. [1.0e-4, 1.0e-2]")
    # the values a trial can actually get: quantized bounds round to the nearest multiple of q
    reach = (round(lo / q) * q, round(hi / q) * q) if q else (lo, hi)
    for value in reach:
        _check_in_range(key, coerce_value(key, value, where), where, args)
    if dist == "uniform":
        return hp.uniform(label, lo, hi)
    if dist == "quniform":
        return hp.quniform(label, lo, hi, q)
    if dist == "loguniform":
        return hp.loguniform(label, math.log(lo), math.log(hi))
    return hp.qloguniform(label, math.log(lo), math.log(hi), q)


def _bounds(args: Any, where: str, quantized: bool) -> Tuple[float, float, Optional[float]]:
    want = 3 if quantized else 2
    shape = "[lo, hi, q]" if quantized else "[lo, hi]"
    if not isinstance(args, (list, tuple)) or len(args) != want:
        raise ConfigError(where, args, f"give {shape} as a list of {want} numbers")
    nums = [_number(a, where, args) for a in args]
    lo, hi = nums[0], nums[1]
    if not lo < hi:
        raise ConfigError(where, args, f"lo must be < hi (got lo={lo:g}, hi={hi:g})")
    q = nums[2] if quantized else None
    if q is not None and q <= 0:
        raise ConfigError(where, args, f"q must be > 0 (got {q:g})")
    return lo, hi, q


def _number(value: Any, where: str, args: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(where, args, "bounds must be numbers, not booleans")
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(where, args, f"bound {value!r} is not a number") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(where, args, f"bound {value!r} is not a finite number")
    return float(value)


def coerce_value(key: str, value: Any, where: str = _ROOT) -> Any:
    """Convert a sampled or constant value to the type of ``train.<key>``.

    Raises
    ------
    ConfigError
        When the value has the wrong shape (e.g. ``2.5`` for an integer key).
    """
    kind = _kind(key)
    if kind is tuple:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return tuple(_integer(key, v, where) for v in items)
    if kind is int:
        return _integer(key, value, where)
    return _number(value, where, value)


def _integer(key: str, value: Any, where: str) -> int:
    number = _number(value, where, value)
    if number != round(number):
        raise ConfigError(where, value, f"train.{key} takes whole numbers; got {value!r}")
    return int(round(number))


def _check_in_range(key: str, value: Any, where: str, spec: Any) -> None:
    """Run ``TrainConfig``'s own validation on ``key = value``."""
    try:
        replace(TrainConfig(), **{key: value})
    except ConfigError as exc:
        raise ConfigError(where, spec, f"value {value!r} is out of range for train.{key}: {exc.fix}") from exc


def describe(space: CompiledSpace) -> str:
    """One line per searched key (for logs)."""
    return ", ".join(sorted(space.keys))


__all__: Sequence[str] = ["CompiledSpace", "compile_space", "coerce_value", "TUNABLE", "DISTRIBUTIONS", "describe"]
