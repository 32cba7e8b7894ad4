"""The ``tune.space`` YAML section, compiled once for both engines (Hyperopt and Optuna).

Each key of ``tune.space`` is a ``train.*`` key; its value is a distribution,
or a constant that every trial uses::

    space:
      learning_rate: {loguniform: [1.0e-4, 1.0e-2]}   # bounds as real values
      batch_size:    {quniform: [128, 1024, 128]}      # [lo, hi, q]
      epochs:        {int: [1, 4]}                     # whole numbers lo..hi
      dropout:       {uniform: [0.0, 0.4]}
      hidden_units:  {choice: [[64], [64, 64], [128, 64]]}
      seed: 2                                          # a constant
      architecture:                                    # a nested choice: a named group whose
        choice:                                        # options are dicts of sub-spaces
          - {embedding_dim: 4}
          - {embedding_dim: {quniform: [8, 32, 8]}, dropout: {uniform: [0.1, 0.5]}}

Distributions: ``uniform: [lo, hi]``, ``loguniform: [lo, hi]`` (``lo > 0``;
converted to log bounds for Hyperopt), ``quniform: [lo, hi, q]``,
``qloguniform: [lo, hi, q]``, ``int: [lo, hi]`` (integer keys) and
``choice: [a, b, ...]`` (options may be constants, distributions, or, for a
named group, dicts of sub-spaces).  Integer keys (``batch_size``,
``embedding_dim``, ``epochs``...) need ``int``, a quantized distribution or a
choice.  Every bound is checked against the ``train:`` section's own
validation, so a search never starts with a range that cannot train.

The YAML compiles into one engine-neutral tree (:class:`Dist`, :class:`Group`,
constants); :attr:`CompiledSpace.hyperopt` is its Hyperopt space and
:meth:`CompiledSpace.suggest` samples it define-by-run from an Optuna trial,
with the same labels (``architecture``, ``architecture.1.dropout``...), so a
conditional key is sampled only when its branch is chosen, by either engine.

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

import json
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from sparktrain.config import TrainConfig
from sparktrain.errors import ConfigError, UnknownKeyError

#: ``train.*`` keys a search may set; the rest (framework, backend, num_workers,
#: store, ...) describe where and how to train, not the model.
TUNABLE: FrozenSet[str] = frozenset({"learning_rate", "batch_size", "hidden_units", "embedding_dim", "dropout",
                                     "epochs", "shuffle_buffer", "seed"})
DISTRIBUTIONS: Tuple[str, ...] = ("uniform", "loguniform", "quniform", "qloguniform", "int", "choice")
#: the distributions CMA-ES can model (a ``choice`` cannot be: it is categorical)
NUMERIC: Tuple[str, ...] = ("uniform", "loguniform", "quniform", "qloguniform", "int")
_ROOT = "tune.space"
_DEFAULT_TRAIN = TrainConfig()


def _kind(key: str) -> type:
    """``int``, ``float`` or ``tuple`` (of ints): the type of ``train.<key>``'s default."""
    return type(getattr(_DEFAULT_TRAIN, key))


@dataclass(frozen=True)
class Const:
    """A value every trial (of this branch) uses, already typed as ``train.<key>``."""

    value: Any


@dataclass(frozen=True)
class Dist:
    """One sampled ``train.<key>``.

    Attributes
    ----------
    key : str
        The train key it sets.
    label : str
        The parameter's name in both engines (unique in the space).
    dist : str
        One of :data:`DISTRIBUTIONS`.
    lo, hi : float
        Bounds as written (real values, also for the log distributions); unused by ``choice``.
    q : float or None
        The step of ``quniform``/``qloguniform``.
    options : tuple
        ``choice`` only: each a :class:`Const` or a nested :class:`Dist`.
    """

    key: str
    label: str
    dist: str
    lo: float = 0.0
    hi: float = 0.0
    q: Optional[float] = None
    options: Tuple[Union[Const, "Dist"], ...] = ()

    @property
    def reach(self) -> Tuple[float, float]:
        """The lowest and highest value a trial can get (quantized bounds round to a multiple of ``q``)."""
        if self.q:
            return round(self.lo / self.q) * self.q, round(self.hi / self.q) * self.q
        return self.lo, self.hi


@dataclass(frozen=True)
class Group:
    """A named choice among sub-spaces; only the chosen option's keys are set."""

    label: str
    options: Tuple[Dict[str, "Node"], ...]


Node = Union[Const, Dist, Group]


@dataclass(frozen=True)
class CompiledSpace:
    """A search space for Hyperopt and Optuna, plus what turns samples into ``train`` fields.

    Attributes
    ----------
    hyperopt : dict
        The space to give Hyperopt (``Domain``/``fmin``): ``{name: pyll node or constant}``.
    keys : frozenset of str
        Every ``train.*`` key some sample can set.
    groups : frozenset of str
        Names of nested-choice groups (their sampled value is a dict that is merged).
    tree : dict
        The engine-neutral space: ``{name: Const | Dist | Group}``.
    """

    hyperopt: Dict[str, Any]
    keys: FrozenSet[str]
    groups: FrozenSet[str]
    tree: Dict[str, Node]

    def to_train_params(self, sample: Mapping[str, Any]) -> Dict[str, Any]:
        """Flatten a Hyperopt sample (``hyperopt.space_eval`` output) into typed ``train`` fields."""
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

    def suggest(self, trial: Any) -> Dict[str, Any]:
        """Sample the space from an Optuna ``trial`` (define-by-run); returns typed ``train`` fields.

        A key inside a group or a choice's option is suggested only when that
        branch is chosen (Optuna's conditional parameters).
        """
        out: Dict[str, Any] = {}
        _suggest_mapping(trial, self.tree, out)
        return out

    def numeric_labels(self) -> List[str]:
        """Labels of the numeric distributions sampled in every trial (what CMA-ES can model)."""
        return sorted(n.label for n in self.tree.values() if isinstance(n, Dist) and n.dist in NUMERIC)

    def categorical_labels(self) -> List[str]:
        """Labels of the choices and groups, and of every key only some branches set (not CMA-ES's)."""
        out: List[str] = []

        def walk(node: Node, top: bool) -> None:
            if isinstance(node, Group):
                out.append(node.label)
                for option in node.options:
                    for sub in option.values():
                        walk(sub, False)
            elif isinstance(node, Dist):
                if node.dist == "choice":
                    out.append(node.label)
                    for opt in node.options:
                        walk(opt, False)
                elif not top:
                    out.append(node.label)

        for node in self.tree.values():
            walk(node, True)
        return sorted(out)


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
    tree, keys, groups = _compile_mapping(space, path, label_prefix="")
    return CompiledSpace(hyperopt=_hyperopt_mapping(tree), keys=frozenset(keys), groups=frozenset(groups),
                         tree=tree)


def _compile_mapping(space: Mapping[str, Any], path: str, label_prefix: str
                     ) -> Tuple[Dict[str, Node], List[str], List[str]]:
    """Compile one (sub-)space; returns ``(nodes, train keys it may set, group names)``."""
    nodes: Dict[str, Node] = {}
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


def _compile_group(spec: Mapping[str, Any], where: str, label: str) -> Tuple[Group, List[str], List[str]]:
    options: List[Dict[str, Node]] = []
    keys: set = set()
    groups: List[str] = []
    for i, option in enumerate(spec["choice"]):
        sub, sub_keys, sub_groups = _compile_mapping(option, f"{where}.choice[{i}]", f"{label}.{i}.")
        options.append(sub)
        keys.update(sub_keys)
        groups += sub_groups
    return Group(label, tuple(options)), sorted(keys), groups


def _compile_param(key: str, spec: Any, where: str, label: str) -> Union[Const, Dist]:
    """One train key: a constant, or a distribution labelled ``label``."""
    if not isinstance(spec, Mapping):
        value = coerce_value(key, spec, where)
        _check_in_range(key, value, where, spec)
        return Const(value)
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
        options: List[Union[Const, Dist]] = []
        for i, option in enumerate(args):
            if isinstance(option, Mapping) and not _is_distribution(option):
                raise ConfigError(f"{where}[{i}]", option, f"train.{key} takes a value, not a mapping; nested "
                                                           "sub-spaces belong in a named group (see docs/tuning.md)")
            options.append(_compile_param(key, option, f"{where}[{i}]", f"{label}.{i}"))
        return Dist(key, label, "choice", options=tuple(options))
    if dist == "int":
        if kind is not int:
            raise ConfigError(where, args, f"int: [lo, hi] is for integer keys; train.{key} takes "
                                           + ("a list of layer sizes: use choice" if kind is tuple else
                                              "real values: use uniform or loguniform"))
        lo, hi, _ = _bounds(args, where, False)
        if lo != int(lo) or hi != int(hi):
            raise ConfigError(where, args, f"train.{key} is an integer, so the bounds must be whole numbers")
        for value in (lo, hi):
            _check_in_range(key, coerce_value(key, value, where), where, args)
        return Dist(key, label, "int", lo, hi)
    quantized = dist.startswith("q")
    lo, hi, q = _bounds(args, where, quantized)
    if kind is not float and not quantized:
        raise ConfigError(where, args, f"train.{key} is an integer; use quniform: [lo, hi, q] (q >= 1), "
                                       "int: [lo, hi], qloguniform or choice")
    if kind is not float and (q is None or q < 1 or q != int(q)):
        raise ConfigError(where, args, f"train.{key} is an integer, so q must be a whole number >= 1")
    if dist in ("loguniform", "qloguniform") and lo <= 0:
        raise ConfigError(where, args, "loguniform bounds are real values and must be > 0, "
                                       "e.g. [1.0e-4, 1.0e-2]")
    node = Dist(key, label, dist, lo, hi, q)
    for value in node.reach:
        _check_in_range(key, coerce_value(key, value, where), where, args)
    return node


# ---- Hyperopt ------------------------------------------------------------------------------------------------

def _hyperopt_mapping(tree: Mapping[str, Node]) -> Dict[str, Any]:
    return {name: _hyperopt_node(node) for name, node in tree.items()}


def _hyperopt_node(node: Node) -> Any:
    from hyperopt import hp

    if isinstance(node, Const):
        return node.value
    if isinstance(node, Group):
        return hp.choice(node.label, [_hyperopt_mapping(option) for option in node.options])
    if node.dist == "choice":
        return hp.choice(node.label, [_hyperopt_node(option) for option in node.options])
    if node.dist == "uniform":
        return hp.uniform(node.label, node.lo, node.hi)
    if node.dist == "quniform":
        return hp.quniform(node.label, node.lo, node.hi, node.q)
    if node.dist == "loguniform":
        return hp.loguniform(node.label, math.log(node.lo), math.log(node.hi))
    if node.dist == "int":
        return hp.uniformint(node.label, node.lo, node.hi)
    return hp.qloguniform(node.label, math.log(node.lo), math.log(node.hi), node.q)


# ---- Optuna (define-by-run) ----------------------------------------------------------------------------------

def _suggest_mapping(trial: Any, tree: Mapping[str, Node], out: Dict[str, Any]) -> None:
    for node in tree.values():
        if isinstance(node, Group):
            index = trial.suggest_categorical(node.label, list(range(len(node.options))))
            _suggest_mapping(trial, node.options[int(index)], out)
        elif isinstance(node, Const):
            continue  # set below, so that a constant never depends on the walk's order
        else:
            out[node.key] = _suggest_value(trial, node)
    for name, node in tree.items():
        if isinstance(node, Const):
            out[name] = node.value


def _suggest_value(trial: Any, node: Union[Const, Dist]) -> Any:
    if isinstance(node, Const):
        return node.value
    key, label = node.key, node.label
    integer = _kind(key) is int
    if node.dist == "choice":
        tokens = _choice_tokens(node.options)
        token = trial.suggest_categorical(label, tokens)
        return _suggest_value(trial, node.options[tokens.index(token)])
    if node.dist == "uniform":
        return coerce_value(key, trial.suggest_float(label, node.lo, node.hi))
    if node.dist == "loguniform":
        return coerce_value(key, trial.suggest_float(label, node.lo, node.hi, log=True))
    if node.dist == "int":
        return coerce_value(key, trial.suggest_int(label, int(node.lo), int(node.hi)))
    lo, hi = node.reach
    q = float(node.q or 1.0)
    if node.dist == "quniform":
        if integer:
            return coerce_value(key, trial.suggest_int(label, int(lo), int(hi), step=int(q)))
        value = trial.suggest_float(label, lo, hi, step=q)
        return coerce_value(key, round(value / q) * q)  # a multiple of q, as Hyperopt gives
    # qloguniform: Optuna has no log scale with a step; sample the log scale and round to q (as Hyperopt does)
    if integer and q == 1:
        return coerce_value(key, trial.suggest_int(label, int(lo), int(hi), log=True))
    value = trial.suggest_float(label, node.lo, node.hi, log=True)
    return coerce_value(key, min(max(round(value / q) * q, lo), hi))


def _choice_tokens(options: Sequence[Union[Const, Dist]]) -> List[Any]:
    """Optuna's categorical values for a choice: the constants themselves when they can be, else indices.

    Optuna stores None, bool, int, float or str; a list option (``hidden_units``)
    becomes its JSON text, a nested distribution ``"<i>: <dist>"``.
    """
    tokens: List[Any] = []
    for i, option in enumerate(options):
        if isinstance(option, Dist):
            tokens.append(f"{i}: {option.dist}")
        elif option.value is None or isinstance(option.value, (bool, int, float, str)):
            tokens.append(option.value)
        else:
            tokens.append(json.dumps(list(option.value) if isinstance(option.value, tuple) else option.value))
    unique = {(type(t), t) for t in tokens}
    return tokens if len(unique) == len(tokens) else list(range(len(options)))


# ---- values --------------------------------------------------------------------------------------------------

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
        if any(isinstance(v, (bool, str, list, tuple, dict)) or v is None for v in items):
            raise ConfigError(where, value, f"train.{key} is a list of layer widths, e.g. [64, 32]; as a choice "
                                            f"of them: {{choice: [[64, 32], [128]]}}")
        return tuple(_integer(key, v, where) for v in items)
    if isinstance(value, (list, tuple, dict)):
        example = "{loguniform: [1.0e-4, 1.0e-2]}" if kind is not int else "{int: [1, 8]}"
        raise ConfigError(where, value, f"a constant for train.{key} is one number; for a range name its "
                                        f"distribution, e.g. {example}, and for options {{choice: [...]}}")
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


def max_value(space: CompiledSpace, key: str) -> Optional[float]:
    """The largest value any trial can give ``train.<key>`` (None when the space does not set it)."""
    found: List[float] = []

    def walk(name: str, node: Node) -> None:
        if isinstance(node, Group):
            for option in node.options:
                for sub_name, sub in option.items():
                    walk(sub_name, sub)
        elif isinstance(node, Const):
            if name == key and isinstance(node.value, (int, float)):
                found.append(float(node.value))
        elif node.dist == "choice":
            for opt in node.options:
                walk(name, opt)
        elif node.key == key:
            found.append(float(node.reach[1]))

    for name, node in space.tree.items():
        walk(name, node)
    return max(found) if found else None


def describe(space: CompiledSpace) -> str:
    """One line per searched key (for logs)."""
    return ", ".join(sorted(space.keys))


__all__: Sequence[str] = ["CompiledSpace", "Const", "Dist", "Group", "compile_space", "coerce_value", "TUNABLE",
                          "DISTRIBUTIONS", "NUMERIC", "describe", "max_value"]
