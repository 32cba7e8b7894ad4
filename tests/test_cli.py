"""The ``sparktrain`` CLI: help texts, and the same job end to end from the console script and spark-submit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from sparktrain import __version__, job
from sparktrain.cli import main

REPO = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = Path(sys.executable).with_name("sparktrain")
SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"
FLIGHTS_YAML = REPO / "conf" / "flights.yaml"
# MLflow tracking has its own tests; here it would only add minutes and a work/ directory.
NO_TRACKING = ("--set", "tracking.enabled=false")
JOB_COMMANDS = ["run", "profile", "preprocess", "train", "tune"]

# What `profile conf/flights.yaml` must print (rows after dropping 9,430 cancelled flights).
PROFILE_LINES = [
    "== profile of flights (scale 1)",
    "rows: 327,346",
    "label 'late' rate: 0.2371",
    "columns: 42 (21 with nulls)",
]
PROFILE_NULLS = [r"^  dest_name\s+7,537 nulls \(  2\.3%\)$", r"^  plane_type\s+48,329 nulls \( 14\.8%\)$",
                 r"^  wind_gust\s+249,912 nulls \( 76\.3%\)$", r"^time: \d+\.\d s$"]


def _env():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO / "python"))
    for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    return env


def _run(cmd, cwd, timeout=300):
    """Run ``cmd`` in ``cwd`` (a tmp dir, so nothing lands in the repo); paths in ``cmd`` are absolute."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _sparktrain(cwd, *args, timeout=300):
    return _run([sys.executable, "-m", "sparktrain", *args], cwd, timeout=timeout)


def _assert_flights_profile(stdout):
    for line in PROFILE_LINES:
        assert line in stdout.splitlines(), stdout
    for pattern in PROFILE_NULLS:
        assert re.search(pattern, stdout, re.MULTILINE), (pattern, stdout)


# ---------------------------------------------------------------- help


def test_console_script_help(tmp_path):
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"{CONSOLE_SCRIPT} is missing: run `make setup` (installs the package editable)")
    rc, out, _ = _run([CONSOLE_SCRIPT, "--help"], tmp_path, timeout=60)
    assert rc == 0
    assert out.startswith("usage: sparktrain [-h] [--version] [-v] COMMAND ...")
    for text in ["run ", "profile ", "preprocess ", "train ", "tune ", "score ", "mlflow-server",
                 "examples:", "sparktrain run conf/flights.yaml --set train.epochs=1",
                 "spark-submit python/sparktrain/__main__.py conf/flights.yaml"]:
        assert text in out


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_job_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    usage = " ".join(out.split())  # argparse wraps the usage line at the terminal width
    assert usage.startswith(f"usage: sparktrain {command} [-h] [--master MASTER] [--set KEY.PATH=VALUE] config")
    assert "job config YAML, e.g. conf/flights.yaml" in out
    assert "ignored when a SparkSession is already" in out
    assert "override a config key, value parsed as YAML" in out
    assert f"  sparktrain {command} conf/flights.yaml --master local[2] --set data.scale=3" in out
    assert f"  spark-submit --master local[2] python/sparktrain/__main__.py {command} conf/flights.yaml" in out


def test_score_and_server_help(capsys):
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    out = capsys.readouterr().out
    for text in ["--model MODEL", "--input INPUT", "--output OUTPUT", "models:/flights-late@champion",
                 "{parquet,csv}"]:
        assert text in out
    with pytest.raises(SystemExit):
        main(["mlflow-server", "--help"])
    out = capsys.readouterr().out
    assert "--port PORT" in out and "127.0.0.1" in out and "sqlite" in out


def test_no_command_prints_help_and_version(capsys):
    assert main([]) == 2
    assert "examples:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sparktrain {__version__}"


# ---------------------------------------------------------------- errors: exit 1 before any Spark work


def test_bad_config_exits_1_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLIGHTS_YAML.read_text().replace("train:", "trian:"))
    message = "error: config key 'trian' = "
    hint = "unknown key; did you mean 'train'?"

    rc, out, err = _sparktrain(tmp_path, "run", bad, timeout=60)
    assert (rc, out) == (1, "")
    assert message in err and hint in err
    assert "Traceback" not in err and "log4j" not in err

    rc, _, err = _sparktrain(tmp_path, bad, timeout=60)  # a bare CONFIG means `run` (the spark-submit form)
    assert rc == 1 and message in err and hint in err

    rc, _, err = _sparktrain(tmp_path, "profile", FLIGHTS_YAML, "--set", "train.num_workers=0", timeout=60)
    assert rc == 1
    assert "error: config key 'train.num_workers' = 0: must be >= 1" in err

    rc, _, err = _sparktrain(tmp_path, "profile", tmp_path / "missing.yaml", timeout=60)
    assert rc == 1
    assert "no such config file; pass a path like conf/flights.yaml" in err


def test_stage_available_when_the_package_is_missing(monkeypatch):
    monkeypatch.setitem(job.STAGE_MODULES, "later", "sparktrain.not_a_package_yet.module")
    assert job.stage_available("later") is False
    assert job.stage_available("profile") is True


# ---------------------------------------------------------------- end to end on real Spark


def test_profile_end_to_end(tmp_path):
    rc, out, err = _sparktrain(tmp_path, "profile", FLIGHTS_YAML, "--master", "local[2]", *NO_TRACKING)
    assert rc == 0, err
    _assert_flights_profile(out)
    assert "SparkSession ready: master local[2]" in err
    assert "flights: 9430 cancelled or diverted flights (null arr_delay) excluded" in err


def test_spark_submit_runs_the_same_job(tmp_path):
    assert SPARK_SUBMIT.is_file()
    from sparktrain.jvm import listener_jar

    rc, out, err = _run([SPARK_SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                         "--jars", listener_jar(required=True),
                         REPO / "python" / "sparktrain" / "__main__.py", "profile", FLIGHTS_YAML, *NO_TRACKING],
                        tmp_path)
    assert rc == 0, err
    _assert_flights_profile(out)
    # --jars put the JVM part on spark-submit's driver: the lineage listener is registered
    assert "data lineage: io.sparktrain.lineage.LineageListener registered on this session" in out + err
    # spark-submit's --master wins over the config's spark.master (local[*]); under spark-submit the
    # Python driver's stderr (our log lines) reaches us merged into stdout.
    assert "SparkSession ready: master local[1]" in out + err
    assert "ignoring master=local[*]" in out + err


def test_set_override_changes_the_job(tmp_path):
    rc, out, err = _sparktrain(tmp_path, "profile", FLIGHTS_YAML, "--master", "local[2]", "--set", "data.scale=2",
                               *NO_TRACKING)
    assert rc == 0, err
    assert "== profile of flights (scale 2)" in out.splitlines()
    assert "rows: 654,692" in out.splitlines()  # 2 x 327,346
    assert re.search(r"^  dest_name\s+15,074 nulls \(  2\.3%\)$", out, re.MULTILINE)
