"""A library users install into their own Spark: the jar per Scala version, the version refusals, the metadata.

The jars are small zip files written by the tests, and the refusals run the real checks (``java -version`` of
a stand-in script, an installed pyspark's metadata); only the last tests (spark_compat's helpers) use the
session.  ``tests/compat/`` runs the built wheel on each Spark line (``make test-compat``).
"""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "python" / "sparktrain"


def _jar(path: Path, scala=None, classes: bytes = b"") -> Path:
    with zipfile.ZipFile(path, "w") as jar:
        if scala:
            jar.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\nScala-Binary-Version: {scala}\n")
        jar.writestr("io/sparktrain/lineage/LineageListener.class", classes)
    return path


@pytest.fixture
def jars(monkeypatch, tmp_path):
    """An empty package jars/ folder and no checkout jar: each test puts the jars it needs."""
    import sparktrain.jvm as jvm

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    monkeypatch.setattr(jvm, "PACKAGE_JARS", pkg)
    monkeypatch.setattr(jvm, "_DEFAULT_JAR", tmp_path / "checkout" / jvm.JAR_NAME)
    monkeypatch.delenv(jvm.JAR_ENV, raising=False)
    return pkg


def test_jar_scala_version_from_manifest_name_or_classes(tmp_path):
    from sparktrain.jvm import jar_scala_version

    assert jar_scala_version(str(_jar(tmp_path / "a.jar", scala="2.12"))) == "2.12"
    assert jar_scala_version(str(_jar(tmp_path / "sparktrain-listener_2.13.jar"))) == "2.13"
    assert jar_scala_version(str(_jar(tmp_path / "b.jar", classes=b"..scala/collection/IterableOnceOps.."))) == "2.13"
    assert jar_scala_version(str(_jar(tmp_path / "c.jar", classes=b"..scala/collection/TraversableOnce.."))) == "2.12"
    assert jar_scala_version(str(_jar(tmp_path / "d.jar"))) is None
    (tmp_path / "broken.jar").write_bytes(b"not a zip")
    assert jar_scala_version(str(tmp_path / "broken.jar")) is None


def test_the_built_jars_say_their_scala_version():
    """`make jar` (and `make dist`) write Scala-Binary-Version into the manifest; class files say it too."""
    from sparktrain.jvm import _DEFAULT_JAR, jar_scala_version

    if not _DEFAULT_JAR.is_file():
        pytest.skip("build/libs/sparktrain-listener.jar is missing: run `make jar`")
    assert jar_scala_version(str(_DEFAULT_JAR)) == "2.13"
    for scala in ("2.12", "2.13"):
        built = REPO / "build" / "jars" / f"sparktrain-listener_{scala}.jar"
        if built.is_file():
            assert jar_scala_version(str(built)) == scala


def test_the_package_jar_for_this_scala_is_picked(jars):
    from sparktrain.jvm import find_listener_jar, listener_jar

    _jar(jars / "sparktrain-listener_2.12.jar", scala="2.12")
    _jar(jars / "sparktrain-listener_2.13.jar", scala="2.13")
    assert listener_jar(scala="2.12") == str(jars / "sparktrain-listener_2.12.jar")
    path, why = find_listener_jar("2.13")
    assert path == str(jars / "sparktrain-listener_2.13.jar") and why == "from the installed package"


def test_a_jar_for_another_scala_is_never_loaded_and_the_reason_names_both(jars, tmp_path, monkeypatch):
    from sparktrain.errors import MissingDependencyError
    from sparktrain.jvm import JAR_ENV, find_listener_jar, listener_jar

    _jar(jars / "sparktrain-listener_2.13.jar", scala="2.13")
    path, why = find_listener_jar("2.12")
    assert path is None
    assert "sparktrain-listener_2.13.jar" in why and "built for Scala 2.13" in why and "runs Scala 2.12" in why
    with pytest.raises(MissingDependencyError) as err:
        listener_jar(required=True, scala="2.12")
    assert "built for Scala 2.13" in str(err.value)
    # $SPARKTRAIN_JAR is the user's choice: a wrong one is refused, not swapped for another
    wrong = _jar(tmp_path / "mine.jar", scala="2.12")
    monkeypatch.setenv(JAR_ENV, str(wrong))
    path, why = find_listener_jar("2.13")
    assert path is None and str(wrong) in why and "Scala 2.12" in why and "Scala 2.13" in why
    assert "the installed package has one" in why and JAR_ENV in why


def test_an_unlabelled_jar_from_the_env_is_taken_as_given(jars, tmp_path, monkeypatch):
    from sparktrain.jvm import JAR_ENV, find_listener_jar

    plain = _jar(tmp_path / "plain.jar")
    monkeypatch.setenv(JAR_ENV, str(plain))
    assert find_listener_jar("2.12") == (str(plain), f"from {JAR_ENV}")


def test_no_jar_says_where_it_looked(jars):
    from sparktrain.jvm import find_listener_jar

    path, why = find_listener_jar("2.13")
    assert path is None and "sparktrain-listener_2.13.jar" in why and "make jar" in why and "make dist" in why


class _NoJvm:
    """A classic-looking session whose driver has no listener class (the jar was not loaded)."""

    @property
    def sparkContext(self):
        raise RuntimeError("no JVM here")


def test_lineage_off_is_one_log_line_with_the_reason(jars, caplog):
    import sparktrain.jvm as jvm

    _jar(jars / "sparktrain-listener_2.13.jar", scala="2.13")
    jvm._logged.clear()
    assert jvm.listener_jar(scala="2.12") is None
    with caplog.at_level(logging.INFO, logger="sparktrain.jvm"):
        assert jvm.enable_lineage(_NoJvm()) is False
        assert jvm.enable_lineage(_NoJvm()) is False
    lines = [r for r in caplog.records if r.name == "sparktrain.jvm"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "lineage of sources is off" in lines[0].getMessage() and "Scala 2.12" in lines[0].getMessage()


def test_a_session_the_user_built_without_the_jar_says_once_that_lineage_is_off(monkeypatch, caplog):
    """Probe Q: a notebook's own SparkSession without spark.jars recorded no sources and said nothing (only a
    session sparktrain starts ran enable_lineage): the recorder says it, once, with how to add the jar."""
    import sparktrain.jvm as jvm

    monkeypatch.setattr(jvm, "_off_reason", None)  # no jar lookup in this process: the user built the session
    jvm._logged.clear()
    with caplog.at_level(logging.INFO, logger="sparktrain.jvm"):
        for _ in range(2):
            with jvm.LineageRecorder(_NoJvm()) as rec:
                assert not rec.active
    lines = [r.getMessage() for r in caplog.records if r.name == "sparktrain.jvm"]
    assert len(lines) == 1, lines
    assert "data lineage of sources is off" in lines[0]
    assert "a session you build: .config('spark.jars', <the path `python -m sparktrain.jvm` prints>)" in lines[0]


def test_python_m_sparktrain_jvm_prints_the_jar_or_the_reason(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "SPARKTRAIN_JAR": str(_jar(tmp_path / "x_2.13.jar"))}
    out = subprocess.run([sys.executable, "-m", "sparktrain.jvm", "--scala", "2.13"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "x_2.13.jar")
    out = subprocess.run([sys.executable, "-m", "sparktrain.jvm", "--scala", "2.12"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 1 and "never loaded" in out.stderr


def test_scala_version_of_this_pyspark():
    from sparktrain._internal.spark_compat import scala_binary_version

    import pyspark

    assert scala_binary_version() == ("2.12" if pyspark.__version__.startswith("3.") else "2.13")
    assert scala_binary_version(spark_version="3.5.9") in ("2.12", "2.13")  # the jars dir wins when found


# -- versions refused before any job ----------------------------------------------------------------------

@pytest.mark.parametrize("version", ["3.4.4", "5.0.0", "2.4.8"])
def test_an_unsupported_pyspark_is_refused_with_the_range_and_the_fix(version):
    from sparktrain._internal.spark_compat import check_pyspark
    from sparktrain.errors import UnsupportedVersionError

    with pytest.raises(UnsupportedVersionError) as err:
        check_pyspark(version)
    text = str(err.value)
    assert f"pyspark {version}" in text and ">= 3.5 and < 5" in text and "pip install 'pyspark>=3.5,<5'" in text


@pytest.mark.parametrize("version", ["3.5.0", "3.5.9", "4.0.5", "4.3.0", "4.9.0.dev1"])
def test_supported_pysparks_pass(version):
    from sparktrain._internal.spark_compat import check_pyspark

    assert check_pyspark(version) == version


def test_an_unsupported_python_is_refused():
    from sparktrain._internal.spark_compat import check_python
    from sparktrain.errors import UnsupportedVersionError

    check_python((3, 10, 0))
    check_python((3, 12, 7))
    for bad in ((3, 9, 18), (3, 13, 0)):
        with pytest.raises(UnsupportedVersionError, match=r"Python 3\.10 to 3\.12"):
            check_python(bad)


def _fake_java(tmp_path: Path, version: str) -> str:
    java = tmp_path / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    return str(java)


@pytest.mark.parametrize("spark,java,ok", [
    ("4.3.0", "17.0.15", True), ("4.0.5", "21.0.2", True), ("4.3.0", "11.0.22", False), ("4.1.4", "1.8.0_392", False),
    ("3.5.9", "1.8.0_392", True), ("3.5.9", "11.0.22", True), ("3.5.9", "21.0.2", False)])
def test_java_is_checked_against_the_spark_line(tmp_path, monkeypatch, spark, java, ok):
    from sparktrain._internal.spark_compat import check_java
    from sparktrain.errors import UnsupportedVersionError

    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    fake = _fake_java(tmp_path, java)
    if ok:
        check_java(spark, java=fake)
        return
    with pytest.raises(UnsupportedVersionError) as err:
        check_java(spark, java=fake)
    assert f"Java {java}" in str(err.value) and f"for Spark {spark}" in str(err.value) and "JAVA_HOME" in str(err.value)


def test_refusals_become_warnings_when_allowed(monkeypatch, caplog):
    from sparktrain._internal.spark_compat import ALLOW_UNSUPPORTED_ENV, check_pyspark

    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    with caplog.at_level(logging.WARNING):
        check_pyspark("3.4.4")
    assert "pyspark 3.4.4 is not supported" in caplog.text


def test_import_refuses_an_installed_pyspark_out_of_range(tmp_path):
    dist = tmp_path / "pyspark-3.4.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pyspark\nVersion: 3.4.1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "python")])}
    env.pop("SPARKTRAIN_ALLOW_UNSUPPORTED", None)
    out = subprocess.run([sys.executable, "-c", "import sparktrain"], capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert "UnsupportedVersionError: pyspark 3.4.1 is not supported by sparktrain" in out.stderr


# -- the package metadata -----------------------------------------------------------------------------------

def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "python" / "pyproject.toml").read_text())


def test_metadata_has_ranges_and_the_lock_has_the_pins():
    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    assert project["requires-python"] == ">=3.10,<3.13"
    deps = {Requirement(d).name: Requirement(d) for d in project["dependencies"]}
    assert str(deps["pyspark"].specifier) in ("<5,>=3.5", ">=3.5,<5")
    assert not [d for d in project["dependencies"] if "==" in d], "exact pins belong in requirements.lock"
    lock = dict(ln.split("==", 1) for ln in (REPO / "python" / "requirements.lock").read_text().splitlines()
                if "==" in ln and not ln.startswith("#"))
    lock = {k.lower().replace("_", "-"): v for k, v in lock.items()}
    for name, req in deps.items():
        assert name.lower() in lock, f"{name} is not pinned in requirements.lock"
        assert req.specifier.contains(lock[name.lower()], prereleases=True), f"lock's {name}=={lock[name.lower()]}"
    assert set(project["optional-dependencies"]) >= {"torch", "tensorflow", "test"}
    assert project["optional-dependencies"]["torch"] == ["torch==2.13.0"]  # never an unpinned torch
    assert _pyproject()["tool"]["setuptools"]["package-data"]["sparktrain"] == ["jars/*.jar", "spark-defaults.conf"]


def test_the_compat_pins_of_spark_35_lie_in_the_ranges():
    from packaging.requirements import Requirement

    sys.path.insert(0, str(REPO / "tests" / "compat"))
    try:
        from test_compat import LINE_PINS
    finally:
        sys.path.pop(0)
    deps = {Requirement(d).name: Requirement(d) for d in _pyproject()["project"]["dependencies"]}
    for pins in LINE_PINS.values():
        for pin in pins:
            name, version = pin.split("==")
            assert deps[name].specifier.contains(version), pin


def test_the_code_parses_as_python_310():
    """requires-python says 3.10: no 3.11-only syntax (except*), and no 3.11-only typing/stdlib names."""
    later = re.compile(r"\bfrom typing import[^\n]*\b(Self|Never|LiteralString|assert_never|reveal_type|TypeVarTuple|"
                       r"Unpack|NotRequired|Required|override)\b|^\s*import tomllib|\bdatetime\.UTC\b|StrEnum|"
                       r"itertools\.batched|asyncio\.TaskGroup|contextlib\.chdir", re.M)
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        ast.parse(text, str(path), feature_version=(3, 10))
        assert not later.search(text), f"{path}: {later.search(text).group(0)} needs Python 3.11"


# -- what differs between Spark lines (spark_compat), on this venv's Spark; tests/compat runs the others -------

def test_try_cast_with_and_without_column_try_cast(spark, monkeypatch):
    from pyspark.sql import Column

    from sparktrain._internal.spark_compat import try_cast

    df = spark.createDataFrame([("1.5", "2", "3"), ("NA", "x", None)], ["a", "b.c", "d `e"])
    expected = [(1.5, 2.0, 3.0), (None, None, None)]
    casts = [try_cast(n, "double") for n in ("a", "b.c", "d `e")]  # a dot or a backtick is part of the name
    assert [tuple(r) for r in df.select(*casts).collect()] == expected
    monkeypatch.delattr(Column, "try_cast", raising=False)  # pyspark 3.5: SQL try_cast only
    casts = [try_cast(n, "double") for n in ("a", "b.c", "d `e")]
    assert [tuple(r) for r in df.select(*casts).collect()] == expected


def test_inheritable_target_carries_the_job_group(spark):
    from concurrent.futures import ThreadPoolExecutor

    from sparktrain._internal.spark_compat import inheritable_target, job_group

    with job_group(spark, "compat-group"):
        run = inheritable_target(spark)
        with ThreadPoolExecutor(1) as pool:
            group = pool.submit(run(lambda: spark.sparkContext.getLocalProperty("spark.jobGroup.id"))).result()
    assert group == "compat-group"


def test_jvm_stage_helpers_of_this_spark(spark):
    from pyspark.ml.feature import ImputerModel, SQLTransformer

    from sparktrain._internal.spark_compat import connect_server_bundled, java_imputer_model, java_params_metadata

    model = ImputerModel(java_imputer_model(spark, "imp_1", ["x", "y"], [1.5, 2.0]))
    row = model.surrogateDF.head().asDict()
    assert row == {"x": 1.5, "y": 2.0}
    stage = SQLTransformer(statement="SELECT * FROM __THIS__")
    stage._transfer_params_to_java()
    meta = java_params_metadata(spark, stage._java_obj)
    assert '"class":"org.apache.spark.ml.feature.SQLTransformer"' in meta and stage.uid in meta
    assert connect_server_bundled() is spark.version.startswith("4.")
