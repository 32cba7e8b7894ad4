"""The feature spec and its layout: pure Python, no Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sparktrain.errors import ConfigError
from sparktrain.features.compile import plan_features, source_columns
from sparktrain.features.spec import parse_features

REPO = Path(__file__).resolve().parents[2]


def test_output_columns_follow_the_naming_rules():
    specs = parse_features([
        {"name": "dep_delay", "type": "numeric", "buckets": 4},
        {"name": "carrier", "type": "categorical"},
        {"name": "cx", "type": "crossed", "columns": ["carrier", "origin"], "hash_buckets": 16},
        {"name": "ts", "type": "datetime", "column": "time_hour", "parts": ["hour", "month"]},
        {"name": "flag", "type": "boolean"},
    ])
    plan = plan_features(specs, key="id", label="y")
    assert [(o.name, o.dtype) for o in plan.outputs] == [
        ("dep_delay", "float32"), ("dep_delay_bucket", "int32"), ("carrier", "int32"), ("cx", "int32"),
        ("ts_hour", "int32"), ("ts_hour_sin", "float32"), ("ts_hour_cos", "float32"),
        ("ts_month", "int32"), ("ts_month_sin", "float32"), ("ts_month_cos", "float32"), ("flag", "float32")]
    assert source_columns(specs) == ["dep_delay", "carrier", "origin", "time_hour", "flag"]
    assert plan.impute == {"mean": [("__st_dep_delay__prep", "__st_dep_delay__imp")]}
    assert plan.buckets == [("__st_dep_delay__imp", "__st_dep_delay__bucket", 4)]
    assert plan.string_index == [("__st_carrier__str", "__st_carrier__idx")]


def test_sql_uses_crc32_of_utf8_and_the_separator_for_crosses():
    specs = parse_features([{"name": "t", "type": "categorical", "hash_buckets": 8},
                            {"name": "cx", "type": "crossed", "columns": ["a", "b"], "hash_buckets": 4}])
    prep = plan_features(specs).prepare
    assert prep["__st_t__idx"] == "CAST(pmod(crc32(CAST(coalesce(CAST(`t` AS STRING), '') AS BINARY)), 8) AS INT)"
    assert "concat_ws(chr(1), coalesce(CAST(`a` AS STRING), ''), coalesce(CAST(`b` AS STRING), ''))" \
        in prep["__st_cx__idx"]


def test_numeric_sql_casts_only_when_needed():
    spec = parse_features([{"name": "x", "type": "numeric", "clip": [0, 1], "log1p": True}])
    as_double = plan_features(spec, types={"x": "double"}).prepare["__st_x__prep"]
    as_text = plan_features(spec, types={"x": "string"}).prepare["__st_x__prep"]
    assert "try_cast" not in as_double and "try_cast(`x` AS DOUBLE)" in as_text
    assert "log1p(abs(" in as_double and "least(greatest(" in as_double


def test_collisions_and_empty_specs_are_config_errors():
    with pytest.raises(ConfigError, match="output column 'x_bucket' is also produced by feature 'x'"):
        plan_features(parse_features([{"name": "x", "type": "numeric", "buckets": 3},
                                      {"name": "x_bucket", "type": "numeric"}]))
    with pytest.raises(ConfigError, match="would overwrite data.key"):
        plan_features(parse_features([{"name": "id", "column": "x", "type": "numeric"}]), key="id")
    with pytest.raises(ConfigError, match="at least one feature"):
        plan_features(())


def test_spec_rejects_bad_options_with_the_key_path():
    with pytest.raises(ConfigError, match=r"features.x.clip.*finite"):
        parse_features([{"name": "x", "type": "numeric", "clip": [0, float("inf")]}])
    with pytest.raises(ConfigError, match=r"features.c.hash_buckets.*no vocabulary"):
        parse_features([{"name": "c", "type": "categorical", "hash_buckets": 8, "max_vocab": 3}])
    with pytest.raises(ConfigError, match=r"features.t.parts\[0\].*one of hour"):
        parse_features([{"name": "t", "type": "datetime", "parts": ["week"]}])


def test_the_local_transform_imports_no_spark():
    code = ("import sys; import sparktrain.serve.local, sparktrain.features.metadata, sparktrain.features; "
            "from sparktrain.serve import transform_local; assert 'pyspark' not in sys.modules; "
            "assert 'mlflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(REPO / "python")})
