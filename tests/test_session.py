"""sparktrain.session: reuse of the active session, environment defaults, spark-defaults.conf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sparktrain.session import get_or_create_session, read_spark_defaults

REPO = Path(__file__).resolve().parents[1]


def test_active_session_is_reused_not_replaced(spark):
    again = get_or_create_session(master="local[1]", app_name="other", conf={"spark.sql.shuffle.partitions": "7"})
    assert again is spark
    assert again.sparkContext.master == "local[2]"  # the active session's master wins over --master
    assert again.conf.get("spark.sql.shuffle.partitions") == "2"  # and its settings are left alone
    assert again.sparkContext.appName == "sparktrain-tests"


def test_spark_defaults_conf_applied_under_job_conf(spark):
    # from conf/spark-defaults.conf
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.sparkContext.getConf().get("spark.task.maxFailures") == "2"
    # the fixture's conf overrides the defaults file (which says 4)
    assert read_spark_defaults()["spark.sql.shuffle.partitions"] == "4"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"
    assert spark.range(10).selectExpr("sum(id)").first()[0] == 45


def test_spark_log_level_is_warn(spark):
    log_manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    assert str(log_manager.getRootLogger().getLevel()) == "WARN"


def test_read_spark_defaults_parses_properties(tmp_path):
    conf = tmp_path / "spark-defaults.conf"
    conf.write_text(
        "# a comment\n"
        "   # an indented comment\n"
        "! a properties-style comment\n"
        "\n"
        "spark.a            1\n"
        "spark.b\ttwo words  here   \n"
        "  spark.c=3\n"
        "spark.d: 4\n"
        "spark.e = five\n"
        "spark.driver.extraJavaOptions -Dx=1 -Dy=2\n"
        "spark.no.value\n"
    )
    assert read_spark_defaults(conf) == {
        "spark.a": "1",
        "spark.b": "two words  here",
        "spark.c": "3",
        "spark.d": "4",
        "spark.e": "five",
        "spark.driver.extraJavaOptions": "-Dx=1 -Dy=2",
    }


def test_read_spark_defaults_location(tmp_path, monkeypatch):
    assert read_spark_defaults(tmp_path / "missing.conf") == {}
    repo_defaults = read_spark_defaults()
    assert repo_defaults["spark.sql.session.timeZone"] == "UTC"
    lines = [ln for ln in (REPO / "conf" / "spark-defaults.conf").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(repo_defaults) == len(lines) == 12
    # MLlib's netlib must not try (and loudly fail) to dlopen a native libblas.so.3 in every JVM
    for side in ("driver", "executor"):
        assert "-Ddev.ludovic.netlib.blas.allowNative=false" in repo_defaults[f"spark.{side}.extraJavaOptions"]
    other = tmp_path / "other.conf"
    other.write_text("spark.sql.session.timeZone America/New_York\n")
    monkeypatch.setenv("SPARKTRAIN_SPARK_DEFAULTS", str(other))
    assert read_spark_defaults() == {"spark.sql.session.timeZone": "America/New_York"}

    # an installed wheel carries its own copy (make dist), read from wherever the job runs (probe Q: none was read)
    import sparktrain.session as session

    monkeypatch.delenv("SPARKTRAIN_SPARK_DEFAULTS")
    packaged = tmp_path / "site-packages" / "sparktrain" / "spark-defaults.conf"
    packaged.parent.mkdir(parents=True)
    packaged.write_text("spark.sql.session.timeZone UTC\nspark.task.maxFailures 2\n")
    monkeypatch.setattr(session, "_PACKAGE_DEFAULTS", packaged)
    monkeypatch.chdir(tmp_path)
    assert session.spark_defaults_path() == packaged
    assert read_spark_defaults() == {"spark.sql.session.timeZone": "UTC", "spark.task.maxFailures": "2"}
    from sparktrain.session import LOCAL_ONLY, defaults_for

    defaults = read_spark_defaults(REPO / "conf" / "spark-defaults.conf")
    assert defaults_for("local[2]", defaults) == defaults  # a laptop's values, for local[*] only (review)
    on_cluster = defaults_for("spark://host:7077", defaults)
    assert "spark.sql.session.timeZone" in on_cluster and not LOCAL_ONLY & set(on_cluster)
    assert LOCAL_ONLY <= set(defaults)  # each is in the file: a renamed key would silently apply again
    assert "cp conf/spark-defaults.conf build/dist-src/sparktrain/spark-defaults.conf" in \
        (REPO / "Makefile").read_text()  # what puts it in the wheel (make test-compat checks the built one)


_PREPARE = (
    "import json, os, sys\n"
    "sys.path.insert(0, {pkg!r})\n"
    "from sparktrain.session import prepare_environment\n"
    "prepare_environment()\n"
    "print(json.dumps({{k: os.environ.get(k) for k in "
    "('PYSPARK_PYTHON', 'PYSPARK_DRIVER_PYTHON', 'SPARK_LOCAL_IP', 'PYTHONPATH')}}))\n"
)


def _prepare_in_clean_env(**env):
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    proc = subprocess.run([sys.executable, "-c", _PREPARE.format(pkg=str(REPO / "python"))],
                          env={**base, **env}, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def test_prepare_environment_sets_unset_variables():
    got = _prepare_in_clean_env()
    assert got["PYSPARK_PYTHON"] == sys.executable
    assert got["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert got["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert got["PYTHONPATH"] == str(REPO / "python")


def test_prepare_environment_keeps_user_values():
    got = _prepare_in_clean_env(PYSPARK_PYTHON="/opt/py/bin/python", SPARK_LOCAL_IP="10.1.2.3",
                                PYTHONPATH="/somewhere")
    assert got["PYSPARK_PYTHON"] == "/opt/py/bin/python"
    assert got["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert got["SPARK_LOCAL_IP"] == "10.1.2.3"
    assert got["PYTHONPATH"].split(os.pathsep) == [str(REPO / "python"), "/somewhere"]


def test_prepare_environment_does_not_duplicate_pythonpath():
    pkg = str(REPO / "python")
    assert _prepare_in_clean_env(PYTHONPATH=pkg)["PYTHONPATH"] == pkg


def _collectors_of_a_new_session(conf):
    code = ("import json, sys\n"
            f"sys.path.insert(0, {str(REPO / 'python')!r})\n"
            "from sparktrain.session import get_or_create_session\n"
            f"spark = get_or_create_session('local[1]', 'gc-check', conf={conf!r})\n"
            "beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()\n"
            "print('GC ' + json.dumps([b.getName() for b in beans]))\n"
            "spark.stop()\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("GC ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return sorted(json.loads(line[0][3:]))


def test_a_new_local_session_runs_the_parallel_collector_unless_the_options_pick_one():
    """A local session's driver JVM (the whole engine) gets -XX:+UseParallelGC; a job's own choice wins."""
    assert _collectors_of_a_new_session({"spark.ui.enabled": "false"}) == ["PS MarkSweep", "PS Scavenge"]
    assert _collectors_of_a_new_session({"spark.ui.enabled": "false",
                                         "spark.driver.extraJavaOptions": "-Dx=1 -XX:+UseG1GC"}) == [
        "G1 Old Generation", "G1 Young Generation"]


def test_the_local_collector_is_added_to_other_java_options_but_never_over_a_chosen_one():
    from sparktrain.session import LOCAL_COLLECTOR, _local_collector

    settings = {"spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp/d"}
    _local_collector(settings)
    assert settings["spark.driver.extraJavaOptions"] == f"-Dderby.system.home=/tmp/d {LOCAL_COLLECTOR}"
    empty: dict = {}
    _local_collector(empty)
    assert empty == {"spark.driver.extraJavaOptions": LOCAL_COLLECTOR}
    chosen = {"spark.driver.extraJavaOptions": "-XX:+UseZGC -Dx=1"}
    _local_collector(chosen)
    assert chosen == {"spark.driver.extraJavaOptions": "-XX:+UseZGC -Dx=1"}


_CTRL_C_SCRIPT = r'''
import json, os, signal, sys, threading, time
sys.path.insert(0, {python!r})
if {own!r}:
    from sparktrain.session import get_or_create_session
    spark = get_or_create_session("local[2]", conf={{"spark.ui.enabled": "false"}})
else:  # the control: a plain session keeps PySpark's own handler
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
sc = spark.sparkContext

def slow(rows):
    time.sleep(120)
    yield from rows

def interrupt():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sc.statusTracker().getActiveStageIds():
            time.sleep(1.0)  # the main thread now waits inside py4j's collect
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.2)

threading.Thread(target=interrupt, daemon=True).start()
t0 = time.monotonic()
try:
    sc.parallelize(range(4), 2).mapPartitions(slow).collect()
    out = {{"raised": None}}
except BaseException as exc:
    out = {{"raised": type(exc).__name__}}
deadline = time.monotonic() + 60
while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
    time.sleep(0.5)
out.update(seconds=time.monotonic() - t0, active_jobs=list(sc.statusTracker().getActiveJobsIds()))
print("RESULT", json.dumps(out), flush=True)
'''


def _ctrl_c(own: bool):
    script = _CTRL_C_SCRIPT.format(python=str(REPO / "python"), own=own)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    lines = [json.loads(x.split(" ", 1)[1]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-6000:]
    return lines[0], proc.stderr


def test_ctrl_c_while_the_driver_waits_on_a_job_interrupts_it_cleanly():
    """Ctrl-C while the main thread waits inside a py4j call (a collect): a session sparktrain built raises
    KeyboardInterrupt, its job is cancelled, and no py4j traceback is printed. PySpark's own handler (the control,
    ``_ctrl_c(own=False)``) makes a nested py4j call on the waiting socket: 'reentrant call' tracebacks; raising in
    the read instead raced py4j's socket cleanup (Py4JNetworkError in 1 of 8 runs here)."""
    out, err = _ctrl_c(own=True)
    assert out["raised"] == "KeyboardInterrupt" and out["active_jobs"] == [], out
    assert out["seconds"] < 100, out  # the 120 s tasks were cancelled, not waited for
    assert "reentrant call" not in err and "Py4JNetworkError" not in err and "Traceback" not in err, err[-4000:]
