"""Params shared by the Keras and PyTorch estimators and their models (Spark ML conventions).

The training Params are not written out: each comes from its declaration in
:mod:`sparktrain.settings` (name, doc, default, check), attached to
:class:`_DistributedParams` with its getter, and to the estimators with its
setter, as xgboost.spark attaches its Params from one defaults table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasProbabilityCol, HasRawPredictionCol

from sparktrain.config import TrainConfig
from sparktrain.errors import ConfigError
from sparktrain.settings import KEY_OF, PARAM_OF, SETTINGS, Setting, check_value

_CONVERT: Dict[str, Callable[[Any], Any]] = {
    "int": TypeConverters.toInt, "float": TypeConverters.toFloat, "bool": TypeConverters.toBoolean,
    "str": TypeConverters.toString, "ints": TypeConverters.toListInt}


def params_from_config(train: TrainConfig) -> Dict[str, Any]:
    """The estimator Params (camelCase) of a ``train:`` section."""
    out = {param: getattr(train, key) for key, param in PARAM_OF.items()}
    out["hiddenUnits"] = list(out["hiddenUnits"])
    return out


def _converter(setting: Setting) -> Callable[[Any], Any]:
    """Spark's type conversion, then the setting's own check (the YAML path runs the same check)."""
    base = _CONVERT[setting.kind]

    def convert(value: Any) -> Any:
        if value is None and setting.optional:
            return None
        try:
            v = base(value)
        except TypeError:
            example = list(setting.default) if isinstance(setting.default, tuple) else setting.default
            what = {"ints": "a list of ints", "int": "an int", "float": "a number", "bool": "True or False",
                    "str": "a string"}.get(setting.kind, setting.kind)
            raise ConfigError(str(setting.param), value, f"expected {what}, got {type(value).__name__} "
                                                         f"{value!r}; pass e.g. {setting.param}={example!r}",
                              kind="parameter") from None
        check_value(setting, v, str(setting.param), kind="parameter")
        return v
    convert.__name__ = f"to_{setting.key}"
    return convert


def _run_id(value: Any) -> str:
    v = TypeConverters.toString(value)
    if not v or "/" in v or "\\" in v or v in (".", "..") or v.startswith("."):
        raise ConfigError("runId", value, "use a plain name (letters, digits, '-', '_'), e.g. 'churn-2026-12'")
    return v


def getter_name(param: str) -> str:
    return "get" + param[0].upper() + param[1:]


def setter_name(param: str) -> str:
    return "set" + param[0].upper() + param[1:]


def _features_col(value: Any) -> str:
    v = TypeConverters.toString(value)
    if not v.strip():
        raise ConfigError("featuresCol", value, "name a vector or array column, e.g. 'features' (a VectorAssembler's "
                                                "outputCol), or leave featuresCol unset to infer the inputs")
    return v


#: ``handleInvalid`` values (Spark ML's Param of the name, as on VectorAssembler and StringIndexer)
HANDLE_INVALID = ("error", "skip", "keep")


def _handle_invalid(value: Any) -> str:
    v = TypeConverters.toString(value)
    if v not in HANDLE_INVALID:
        raise ConfigError("handleInvalid", value, f"use one of {', '.join(HANDLE_INVALID)}: 'error' refuses rows "
                                                  "with a null, NaN or infinite input, 'skip' leaves them out, "
                                                  "'keep' scores them as null (fit() leaves them out)")
    return v


class _ModelParams(HasLabelCol, HasPredictionCol, HasProbabilityCol, HasRawPredictionCol):
    """Params a fitted model needs to score.

    The column Params (``labelCol``, ``featuresCol``, ``numericCols``...) are
    Spark ML's shared column Params, not training settings, so they are not in
    :mod:`sparktrain.settings` (whose table is the ``train:`` section).
    """

    featuresCol: "Param[str]" = Param(
        Params._dummy(), "featuresCol",
        "a Spark ML vector (VectorUDT, dense or sparse) or fixed-length numeric array column, the network's float "
        "block (Spark ML's name). Set, the inputs are this column plus numericCols/categoricalCols when given; "
        "unset, every usable column is an input", _features_col)
    numericCols: "Param[List[str]]" = Param(
        Params._dummy(), "numericCols", "float32 input columns (default: inferred)", TypeConverters.toListString)
    categoricalCols: "Param[List[str]]" = Param(
        Params._dummy(), "categoricalCols", "int index input columns for embeddings (default: inferred)",
        TypeConverters.toListString)
    handleInvalid: "Param[str]" = Param(
        Params._dummy(), "handleInvalid",
        "rows with a null, NaN or infinite input (or, at scoring, a categorical index with no embedding row): "
        "'error' (default) refuses them naming the columns, 'skip' leaves them out (fit(df) and transform), 'keep' "
        "leaves them out of fit(df) and scores them as null; a fit on a dataset path reads it as preprocess wrote it",
        _handle_invalid)
    runId: "Param[str]" = Param(
        Params._dummy(), "runId",
        "training run id. On an estimator: unset (each fit() is a new run) or set to resume that run; "
        "on a model: the run that trained it", _run_id)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(labelCol="label", predictionCol="prediction", probabilityCol="probability",
                         rawPredictionCol="rawPrediction", handleInvalid="error")

    def getFeaturesCol(self) -> Optional[str]:
        """The vector or array input column; None when unset (inputs are inferred)."""
        return self.getOrDefault(self.featuresCol) if self.isDefined(self.featuresCol) else None

    def getNumericCols(self) -> List[str]:
        """The float32 input columns."""
        return self.getOrDefault(self.numericCols)

    def getCategoricalCols(self) -> List[str]:
        """The int index input columns."""
        return self.getOrDefault(self.categoricalCols)

    def getHandleInvalid(self) -> str:
        """What rows with a null, NaN or infinite input get: ``error``, ``skip`` or ``keep``."""
        return self.getOrDefault(self.handleInvalid)

    def setHandleInvalid(self, value: str) -> Any:
        """Set ``handleInvalid`` (``error``, ``skip`` or ``keep``); returns self."""
        return self._set(handleInvalid=value)

    def getRunId(self) -> str:
        """The run id (raises if unset, as Spark's getters do)."""
        return self.getOrDefault(self.runId)


class _DistributedParams(_ModelParams):
    """Training params shared by :class:`TorchEstimator` and :class:`KerasEstimator`.

    One Param and one getter per setting of :mod:`sparktrain.settings` with a
    Param name (attached below), plus ``excludeCols``.
    """

    excludeCols: "Param[List[str]]" = Param(
        Params._dummy(), "excludeCols",
        "columns never used as inputs when they are inferred (ids, keys, leaky columns); a dataset's "
        "features.json key is always left out", TypeConverters.toListString)

    if TYPE_CHECKING:  # the generated Params, getters and setters
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self) -> None:
        super().__init__()
        defaults = {p: SETTINGS[k].default for p, k in KEY_OF.items()}
        defaults["hiddenUnits"] = list(defaults["hiddenUnits"])
        self._setDefault(**defaults, excludeCols=[])

    def _set(self, **kwargs: Any) -> Any:
        """Spark's ``_set``, except that None is no value for a setting that needs one: Spark skips the converter
        for None, so ``epochs=None`` would get through to a rank (the YAML path refuses ``null`` the same way)."""
        for param, value in kwargs.items():
            key = KEY_OF.get(param)
            if value is None and key is not None and not SETTINGS[key].optional:
                default = SETTINGS[key].default
                default = list(default) if isinstance(default, tuple) else default
                raise ConfigError(param, None, f"a value is required (default {default!r}); leave "
                                               f"{param} out, or clear it with est.clear(est.{param}), for the "
                                               f"default", kind="parameter")
        return super()._set(**kwargs)

    def settings(self) -> Dict[str, Any]:
        """Every setting's value (set or default), by ``train:`` key."""
        out = {key: self.getOrDefault(getattr(self, param)) for key, param in PARAM_OF.items()}
        out["hidden_units"] = tuple(out["hidden_units"])
        return out

    def getExcludeCols(self) -> List[str]:
        """Columns never used as inferred inputs."""
        return list(self.getOrDefault(self.excludeCols))  # type: ignore[arg-type]


def _attach_params(cls: type) -> None:
    for setting in SETTINGS.values():
        if setting.param is None:
            continue
        param = setting.param
        setattr(cls, param, Param(Params._dummy(), param, setting.doc, _converter(setting)))

        def getter(self: Params, _p: str = param) -> Any:
            return self.getOrDefault(getattr(self, _p))
        getter.__name__ = getter_name(param)
        getter.__doc__ = f"{setting.doc[0].upper()}{setting.doc[1:]} (``train.{setting.key}``)."
        setattr(cls, getter.__name__, getter)


def attach_setters(cls: type) -> None:
    """``setX(value)`` returning ``self`` for every setting with a Param (estimators only)."""
    for setting in SETTINGS.values():
        if setting.param is None:
            continue
        param = setting.param

        def setter(self: Any, value: Any, _p: str = param) -> Any:
            return self._set(**{_p: value})
        setter.__name__ = setter_name(param)
        setter.__doc__ = f"Set ``{param}``: {setting.doc}."
        setattr(cls, setter.__name__, setter)


_attach_params(_DistributedParams)
