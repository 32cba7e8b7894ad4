"""One declaration per setting: the Params, getters, setters, YAML keys, checks and executor specs agree with it."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest

from sparktrain.config import TrainConfig, parse_config
from sparktrain.errors import ConfigError
from sparktrain.settings import EXECUTOR_GROUPS, GROUPS, PARAM_OF, SETTINGS, in_group
from sparktrain.train._executor.spec import GROUP_SPECS, WorkerSpec
from sparktrain.train.estimator import KerasEstimator, TorchEstimator, _DistributedEstimator
from sparktrain.train.params import getter_name, setter_name

#: one value each checked setting must refuse (a new setting without one fails test_every_check_is_tested)
BAD = {
    "num_workers": 0, "backend": "nccl", "gpus_per_worker": -1, "epochs": 0, "batch_size": 0,
    "accumulate_steps": 0, "learning_rate": 0.0, "precision": "fp8", "shuffle_buffer": 0, "hidden_units": [0],
    "embedding_dim": 0, "dropout": 1.0, "checkpoint_every_steps": 0, "checkpoint_every_s": 0.0,
    "keep_checkpoints": 0, "stall_timeout_s": -1.0, "min_workers": 0, "elastic_batch": "half",
    "log_every_steps": 0, "log_every_s": -1.0, "task": "ranking", "store": " ", "validation_fraction": 1.0,
    "framework": "jax", "max_classes": 1,
}
#: the Params of the estimators that are columns or the run, not training settings
COLUMN_PARAMS = {"runId", "labelCol", "numericCols", "categoricalCols", "excludeCols", "predictionCol",
                 "probabilityCol", "featuresCol", "rawPredictionCol", "handleInvalid"}


def test_every_setting_has_a_group_a_doc_and_a_yaml_field():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert set(fields) == set(SETTINGS), "TrainConfig's fields and sparktrain.settings differ"
    for key, setting in SETTINGS.items():
        assert setting.group in GROUPS, key
        assert setting.doc, key
        default = fields[key].default
        assert default == setting.default, f"train.{key}: TrainConfig default {default!r} != {setting.default!r}"
        assert getattr(TrainConfig(), key) == setting.default


@pytest.mark.parametrize("cls", [TorchEstimator, KerasEstimator])
def test_every_param_setting_has_a_param_getter_and_setter_with_the_default(cls):
    est = cls()
    for key, param in PARAM_OF.items():
        assert est.hasParam(param), param
        value = getattr(est, getter_name(param))()
        expected = SETTINGS[key].default
        assert (tuple(value) if isinstance(value, list) else value) == expected, param
        assert getattr(est, setter_name(param))(getattr(est, getter_name(param))()) is est
    # YAML-only settings have no Param
    for key in (k for k, s in SETTINGS.items() if s.param is None):
        assert SETTINGS[key].group == "job"


def test_explicit_signatures_match_the_declaration():
    expected = set(PARAM_OF.values()) | COLUMN_PARAMS
    for fn in (_DistributedEstimator.__init__, _DistributedEstimator.setParams):
        names = {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}
        assert names == expected, f"{fn.__qualname__}: missing {expected - names}, extra {names - expected}"


def test_every_check_is_tested():
    checked = {k for k, s in SETTINGS.items() if s.check is not None or s.choices}
    assert checked <= set(BAD), f"add a bad value for {sorted(checked - set(BAD))} to BAD"


@pytest.mark.parametrize("key", sorted(BAD))
def test_both_paths_refuse_the_same_bad_value_with_the_same_fix(key):
    with pytest.raises(ConfigError) as yaml_err:
        parse_config({"train": {key: BAD[key]}})
    assert yaml_err.value.path == f"train.{key}"
    assert yaml_err.value.value in (BAD[key], tuple(BAD[key]) if isinstance(BAD[key], list) else BAD[key])
    param = SETTINGS[key].param
    if param is None:
        return
    with pytest.raises(ConfigError) as est_err:
        TorchEstimator(**{param: BAD[key]})
    assert est_err.value.path == param
    assert est_err.value.fix == yaml_err.value.fix, (est_err.value.fix, yaml_err.value.fix)
    assert (est_err.value.kind, yaml_err.value.kind) == ("parameter", "config key")
    assert str(est_err.value) == str(yaml_err.value).replace(f"config key 'train.{key}'", f"parameter '{param}'") \
        .replace("(0,)", "[0]")


@pytest.mark.parametrize("key", sorted(k for k, s in SETTINGS.items() if s.kind == "float" and s.param))
def test_an_infinite_float_is_refused_on_both_paths(key):
    """Probe U/S: stallTimeout=inf passed every check and crashed each rank with an OverflowError (retried by
    Spark), learningRate=inf trained a whole run to a diverged error."""
    with pytest.raises(ConfigError) as yaml_err:
        parse_config({"train": {key: float("inf")}})
    with pytest.raises(ConfigError) as est_err:
        TorchEstimator(**{SETTINGS[key].param: float("inf")})
    assert "must be a finite number" in yaml_err.value.fix and est_err.value.fix == yaml_err.value.fix


def test_none_for_a_setting_that_needs_a_value_and_a_yaml_key_as_keyword_are_refused_by_name():
    """Probe U/S: Spark's _set skips the converter for None, so epochs=None reached a rank as a TypeError
    (precision=None trained fp32 silently), where YAML's null is refused; learning_rate= (the YAML spelling)
    was a bare TypeError; '3' for an int was 'Could not convert 3 to int'."""
    for param in ("epochs", "precision", "hiddenUnits", "accumulateSteps"):
        with pytest.raises(ConfigError, match=rf"^parameter '{param}' = None: a value is required"):
            TorchEstimator(**{param: None})
        with pytest.raises(ConfigError, match=rf"^parameter '{param}' = None: a value is required"):
            TorchEstimator().setParams(**{param: None})
    assert TorchEstimator(minWorkers=None).getMinWorkers() is None  # optional settings take None
    with pytest.raises(ConfigError, match=r"^parameter 'learning_rate' = 0.01: TorchEstimator has no Param "
                                          r"'learning_rate': the Param is learningRate \('learning_rate' is its "
                                          r"YAML key under train:\)"):
        TorchEstimator(learning_rate=0.01)
    with pytest.raises(ConfigError, match=r"KerasEstimator has no Param 'epoch': the Param is epochs"):
        KerasEstimator().setParams(epoch=3)
    with pytest.raises(ConfigError, match=r"^parameter 'epochs' = '3': expected an int, got str '3'; pass e.g. "
                                          r"epochs=3"):
        TorchEstimator().setEpochs("3")


@pytest.mark.parametrize("train, framework, key, fix", [
    ({"num_workers": 2, "min_workers": 3}, "torch", "min_workers", "must be in [1, {num_workers} = 2]"),
    ({"backend": "gloo"}, "torch", "backend", "torch trains with 'ddp' or 'horovod'"),
    ({"accumulate_steps": 2, "backend": "mwms"}, "keras", "accumulate_steps",
     "gradient accumulation runs under backend ddp (torch) or gloo (Keras), not mwms; set {backend} to one of "
     "those, or {accumulate_steps} to 1"),
    ({"precision": "fp16"}, "torch", "precision",
     "fp16 is for GPUs (it needs loss scaling); set {gpus_per_worker} >= 1, or use bf16 (which also runs on CPU) "
     "or fp32"),
])
def test_rules_between_settings_are_the_same_on_both_paths(train, framework, key, fix):
    """min_workers <= num_workers used to be checked on the YAML path only."""
    with pytest.raises(ConfigError) as yaml_err:
        parse_config({"train": {**train, "framework": framework}})
    assert yaml_err.value.path == f"train.{key}"
    assert yaml_err.value.fix == fix.format(**{k: f"train.{k}" for k in SETTINGS})
    cls = TorchEstimator if framework == "torch" else KerasEstimator
    est = cls(**{SETTINGS[k].param: v for k, v in train.items()})
    with pytest.raises(ConfigError) as est_err:
        est.checked_settings()
    assert est_err.value.path == SETTINGS[key].param
    assert est_err.value.fix == fix.format(**PARAM_OF)


def test_executor_specs_are_the_groups():
    assert set(GROUP_SPECS) == set(EXECUTOR_GROUPS)
    for group, cls in GROUP_SPECS.items():
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        keys = {s.key for s in in_group(group)}
        derived = {"max_attempts"} if group == "failure" else set()  # set by the launcher, not the user
        assert set(fields) - derived == keys, f"{cls.__name__}: {set(fields) ^ keys}"
        for key in keys:
            if key != "backend":  # the spec holds the resolved backend
                assert fields[key] == SETTINGS[key].default, f"{cls.__name__}.{key}"
    spec_fields = {f.name for f in dataclasses.fields(WorkerSpec)}
    assert set(EXECUTOR_GROUPS) <= spec_fields


def test_one_frozen_spec_carries_every_executor_setting(tmp_path):
    est = TorchEstimator(numWorkers=1, accumulateSteps=4, batchSize=64, elastic=True, minWorkers=1,
                         logEverySeconds=5.0, checkpointEverySteps=7, store=str(tmp_path))
    from sparktrain.train._executor.spec import InputSpec

    inputs = InputSpec(numeric=("x",), categorical=(), label="y", task="regression")
    spec = est._worker_spec("t", None, inputs, "run", str(tmp_path))
    assert (spec.optim.batch_size, spec.optim.accumulate_steps) == (64, 4)
    assert (spec.failure.elastic, spec.failure.min_workers) == (True, 1)
    assert spec.logging.log_every_s == 5.0 and spec.checkpoint.checkpoint_every_steps == 7
    assert spec.scaling.backend == "ddp"  # auto resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.optim.batch_size = 1  # type: ignore[misc]


def test_saving_an_estimator_with_factories_warns_naming_them(spark, tmp_path):
    def my_net(inputs, model):  # pragma: no cover - never called
        return None

    est = TorchEstimator(epochs=2).setModelFactory(my_net)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.write().overwrite().save(str(tmp_path / "est"))
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any("model factory" in m and "my_net" in m and "not persisted" in m for m in messages), messages
    loaded = TorchEstimator.load(str(tmp_path / "est"))
    assert loaded.getEpochs() == 2 and loaded._model_factory is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TorchEstimator(epochs=2).write().overwrite().save(str(tmp_path / "plain"))
    assert not [w for w in caught if "not persisted" in str(w.message)]


def test_the_docs_show_the_declared_settings():
    """docs/training.md's settings table is the one the declaration renders (regenerate it if this fails)."""
    from pathlib import Path

    from sparktrain.settings import reference_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    start, end = text.index("<!-- settings:table -->\n"), text.index("<!-- /settings:table -->")
    assert text[start + len("<!-- settings:table -->\n"):end].strip() == reference_table()
