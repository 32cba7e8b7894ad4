"""Build frozen dataclasses from plain YAML dicts, validating as we go.

One generic walker instead of hand-written getters: it follows the type hints of
the target dataclass, so a new config field needs no parsing code.  Errors name
the dotted key path, the value and the fix; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, Literal, Mapping, Optional, Tuple, Type, TypeVar, Union, get_args, get_origin

from sparktrain.errors import ConfigError, UnknownKeyError

T = TypeVar("T")

_NONE = type(None)


def build(cls: Type[T], data: Any, path: str) -> T:
    """Instantiate dataclass ``cls`` from mapping ``data``.

    Unknown keys raise :class:`UnknownKeyError`; type mismatches raise
    :class:`ConfigError`.  ``__post_init__`` of ``cls`` runs range checks.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path or "<root>", data, f"expected a mapping of keys for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise UnknownKeyError(_join(path, str(key)), data[key], fields)
    kwargs: Dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = coerce(hints[name], value, _join(path, name))
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(_join(path, missing[0]), None, "this key is required")
    return cls(**kwargs)


def coerce(tp: Any, value: Any, path: str) -> Any:
    """Convert a YAML value to type ``tp`` or raise a ConfigError naming ``path``."""
    generic = get_origin(tp)
    if tp is Any:
        return value
    if generic is Union:
        args: Any = [a for a in get_args(tp) if a is not _NONE]
        if value is None:
            if _NONE in get_args(tp):
                return None
            raise ConfigError(path, value, "a value is required")
        errors = []
        for arg in args:
            try:
                return coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if generic is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(path, value, f"must be one of {', '.join(map(repr, allowed))}")
        return value
    if generic in (tuple, Tuple):
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, value, "expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(path, value, f"expected a list of {len(args)} values")
        return tuple(coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if generic in (dict, Dict, Mapping, typing.Mapping):
        kt, vt = get_args(tp) or (str, Any)
        if not isinstance(value, Mapping):
            raise ConfigError(path, value, "expected a mapping")
        return {coerce(kt, k, path): coerce(vt, v, _join(path, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "expected true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(path, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(path, value, "expected a number")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(path, value, "expected a string")
        return str(value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(path, value, f"expected {getattr(tp, '__name__', tp)}")


def to_dict(obj: Any) -> Any:
    """Inverse of :func:`build`: plain dicts/lists for YAML or MLflow params."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def non_default_repr(obj: Any) -> str:
    """``repr`` that shows only fields that differ from their defaults (Ray AIR style)."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if default is dataclasses.MISSING or value != default:
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def require(cond: bool, path: str, value: Any, fix: str) -> None:
    """Raise ``ConfigError(path, value, fix)`` unless ``cond``."""
    if not cond:
        raise ConfigError(path, value, fix)


__all__ = ["build", "coerce", "to_dict", "non_default_repr", "require", "Optional"]
