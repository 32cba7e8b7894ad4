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
                 "examples:", "sparktrain run conf/job.yaml --set train.epochs=1",
                 'spark-submit --jars "$(python -m sparktrain.jvm)" "$(python -m sparktrain.jvm --entry)" '
                 'conf/job.yaml']:
        assert text in out


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_job_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    usage = " ".join(out.split())  # argparse wraps the usage line at the terminal width
    resume = " [--resume RUN_ID]" if command == "train" else ""  # train resumes a failed run
    assert usage.startswith(f"usage: sparktrain {command} [-h] [--master MASTER] [--set KEY.PATH=VALUE]{resume} "
                            f"config")
    assert "job config YAML, e.g. conf/job.yaml" in out
    assert "ignored when a SparkSession is already" in out
    assert "override a config key, value parsed as YAML" in out
    assert f"  sparktrain {command} conf/job.yaml --master local[2] --set data.label=price" in out
    assert f'  spark-submit --master local[2] --jars "$(python -m sparktrain.jvm)" "$(python -m sparktrain.jvm ' \
           f'--entry)" {command} conf/job.yaml' in out


def test_score_and_server_help(capsys):
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    out = capsys.readouterr().out
    for text in ["--model MODEL", "--input INPUT", "--table TABLE", "--query QUERY", "--output OUTPUT",
                 "models:/my-job@champion", "{parquet,csv,json,orc}"]:
        assert text in out
    with pytest.raises(SystemExit):
        main(["mlflow-server", "--help"])
    out = capsys.readouterr().out
    assert "--port PORT" in out and "127.0.0.1" in out and "sqlite" in out


def test_score_chooses_the_reader_given_then_the_models_then_by_extension():
    """``sparktrain score``'s reader: --format/--option, else the model's data.format/options, else the extension."""
    from sparktrain.errors import ConfigError
    from sparktrain.features.reader_options import reader_record
    from sparktrain.features.sections import DataConfig
    from sparktrain.serve.scoring import choose_reader

    trained = reader_record(DataConfig(source="in.csv", format="csv", options={"sep": ";", "nullValue": "NA"}))
    assert trained == {"input": "source", "format": "csv",
                       "options": {"header": "true", "inferSchema": "true", "sep": ";", "nullValue": "NA"}}
    assert choose_reader("new.txt", None, None, trained) == (
        "csv", trained["options"], "the format the model was trained with (data.format)")
    fmt, options, _ = choose_reader("new.txt", None, {"sep": ",", "header": "false"}, trained)
    assert (fmt, options["sep"], options["header"], options["nullValue"]) == ("csv", ",", "false", "NA")
    assert choose_reader("new.json", "json", None, trained) == ("json", {}, "--format")  # csv options not carried
    assert choose_reader("rows.json", None, None, None) == ("json", {}, "the input's extension")
    assert choose_reader("rows.orc", None, None, reader_record(DataConfig(table="db.t"))) == \
        ("orc", {}, "the input's extension")
    assert choose_reader("rows", None, None, None)[0] == "parquet"
    with pytest.raises(ConfigError, match=r"'--option delimter' = ';': unknown key; did you mean"):
        choose_reader("x.csv", None, {"delimter": ";"}, None)


def test_score_takes_exactly_one_input(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["score", "--model", "m", "--input", "a", "--table", "t", "--output", str(tmp_path / "o")])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["score", "--model", "m", "--output", str(tmp_path / "o")])
    assert "one of the arguments --input --table --query is required" in capsys.readouterr().err


def test_score_without_a_store_names_the_flag_creates_nothing_and_starts_no_spark(tmp_path, monkeypatch):
    """The default store (./work/mlflow.db) does not exist: the error says so and how to point at the job's
    store, before Spark starts, and no empty store is left behind."""
    raw = tmp_path / "raw.csv"
    raw.write_text("a,b\n1,2\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # _env() copies os.environ
    rc, out, err = _sparktrain(tmp_path, "score", "--model", "models:/prices@champion", "--input", raw,
                               "--output", tmp_path / "scored", timeout=120)
    assert rc == 1 and out == ""
    assert (f"error: cannot look up models:/prices@champion: there is no MLflow store at "
            f"sqlite:///{tmp_path / 'work' / 'mlflow.db'} (the file does not exist). This store is the default, as "
            f"neither --tracking-uri nor MLFLOW_TRACKING_URI is set: if the model was registered in another one "
            f"(the job config's tracking.uri), pass that with --tracking-uri URI or set MLFLOW_TRACKING_URI") in err
    assert "log4j" not in err and "Traceback" not in err  # Spark never started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.csv"]


def test_a_model_missing_from_the_default_store_hints_at_the_other_store(tmp_path, monkeypatch, restore_mlflow_uri):
    """(MLFLOW_TRACKING_URI is set and unset directly: restore_mlflow_uri puts it back, after MLflow wrote it.)"""
    from mlflow import MlflowClient

    from sparktrain.errors import ModelNotFoundError
    from sparktrain.serve.scoring import check_request

    monkeypatch.chdir(tmp_path)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    (tmp_path / "work").mkdir()
    MlflowClient(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}").create_registered_model("other")
    with pytest.raises(ModelNotFoundError) as err:
        check_request("models:/prices@champion", "raw.csv", str(tmp_path / "scored"))
    assert "Registered models: other" in str(err.value)
    assert "This store is the default, as neither --tracking-uri nor MLFLOW_TRACKING_URI is set" in str(err.value)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}"
    with pytest.raises(ModelNotFoundError, match="This store is MLFLOW_TRACKING_URI: if the model"):
        check_request("models:/prices@champion", "raw.csv", str(tmp_path / "scored"))
    with pytest.raises(ModelNotFoundError) as err:  # the user named the store: no advice to name one
        check_request("models:/prices@champion", "raw.csv", str(tmp_path / "scored"),
                      tracking_uri=f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    assert "Registered models: other" in str(err.value) and "--tracking-uri" not in str(err.value)
    with pytest.raises(ModelNotFoundError, match=r"no MLflow store at .*nope.db \(the file does not exist\)\. "
                                                 r"Fix --tracking-uri"):
        check_request("models:/prices@champion", "raw.csv", str(tmp_path / "scored"),
                      tracking_uri=f"sqlite:///{tmp_path / 'nope.db'}")
    assert not (tmp_path / "nope.db").exists() and not (tmp_path / "scored").exists()


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
    assert err.count("must be >= 1") == 1  # probe I: once, not also as an ERROR log record

    rc, _, err = _sparktrain(tmp_path, "profile", tmp_path / "missing.yaml", timeout=60)
    assert rc == 1
    assert "no such config file; pass a path like conf/job.yaml" in err


def test_a_config_without_input_exits_1_naming_data_source(tmp_path):
    cfg = tmp_path / "noinput.yaml"
    cfg.write_text("name: noinput\nfeatures: [{name: price, type: numeric}]\ntracking: {enabled: false}\n")
    rc, out, err = _sparktrain(tmp_path, "preprocess", cfg, timeout=60)
    assert (rc, out) == (1, "")
    assert "error: config key 'data.source' = None: no input data: set data.source to a path" in err
    assert "Traceback" not in err and "SparkSession ready" not in err  # before any JVM


def test_stage_available_when_the_package_is_missing(monkeypatch):
    monkeypatch.setitem(job.STAGE_MODULES, "later", "sparktrain.not_a_package_yet.module")
    assert job.stage_available("later") is False
    assert job.stage_available("profile") is True


# ---------------------------------------------------------------- end to end on real Spark


@pytest.mark.slow  # flights' profile through the CLI: test_spark_submit_runs_the_same_job checks the same output
def test_profile_end_to_end(tmp_path):
    rc, out, err = _sparktrain(tmp_path, "profile", FLIGHTS_YAML, "--master", "local[2]", *NO_TRACKING)
    assert rc == 0, err
    _assert_flights_profile(out)
    assert "SparkSession ready: master local[2]" in err
    assert "flights: 9430 cancelled or diverted flights (null arr_delay) excluded" in err


def test_spark_submit_runs_the_same_job(tmp_path):
    """The command the help and README give a wheel user: `python -m sparktrain.jvm` for --jars, and `--entry`
    for the script, both printed by the installed package."""
    assert SPARK_SUBMIT.is_file()
    rc, jar, err = _run([sys.executable, "-m", "sparktrain.jvm"], tmp_path, timeout=60)
    assert rc == 0 and jar.strip().endswith(".jar") and Path(jar.strip()).is_file(), err
    rc, entry, err = _run([sys.executable, "-m", "sparktrain.jvm", "--entry"], tmp_path, timeout=60)
    assert rc == 0 and Path(entry.strip()) == REPO / "python" / "sparktrain" / "__main__.py", (entry, err)
    rc, out, err = _run([SPARK_SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                         "--jars", jar.strip(), entry.strip(), "profile", FLIGHTS_YAML, *NO_TRACKING], tmp_path)
    assert rc == 0, err
    _assert_flights_profile(out)
    # --jars put the JVM part on spark-submit's driver: the lineage listener is registered
    assert "data lineage: io.sparktrain.lineage.LineageListener registered on this session" in out + err
    # spark-submit's --master wins over the config's spark.master (local[*]); under spark-submit the
    # Python driver's stderr (our log lines) reaches us merged into stdout.
    assert "SparkSession ready: master local[1]" in out + err
    assert "ignoring master" not in out + err  # the config's default local[*] was no choice to report (probe Q)


@pytest.mark.slow  # profiles 654,692 rows (~35 s); every CLI test passes --set, this one checks a changed count
def test_set_override_changes_the_job(tmp_path):
    rc, out, err = _sparktrain(tmp_path, "profile", FLIGHTS_YAML, "--master", "local[2]", "--set", "data.scale=2",
                               *NO_TRACKING)
    assert rc == 0, err
    assert "== profile of flights (scale 2)" in out.splitlines()
    assert "rows: 654,692" in out.splitlines()  # 2 x 327,346
    assert re.search(r"^  dest_name\s+15,074 nulls \(  2\.3%\)$", out, re.MULTILINE)


def test_preprocess_a_csv_with_a_string_label_na_nulls_and_no_key(tmp_path):
    """Any tabular file through the CLI: `;`-separated, `NA` for missing, a string label, no id column."""
    import json

    import pyarrow.parquet as pq

    rows = ["city;rooms;price;grade"]
    for i in range(300):
        grade = "NA" if i % 50 == 7 else ["good", "fair", "poor"][i % 3]
        rooms = "NA" if i % 13 == 0 else str(1 + i % 5)
        rows.append(f"{['Lima', 'Oslo', 'Rome', 'Kyiv'][i % 4]};{rooms};{100.0 + i * 2.5};{grade}")
    (tmp_path / "houses.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "job.yaml").write_text(
        "name: houses\n"
        "data:\n"
        f"  source: {tmp_path / 'houses.csv'}\n"
        "  format: csv\n"
        "  options: {delimiter: ';', nullValue: NA}\n"
        "  label: grade\n"
        "features:\n"
        "  - {name: city, type: categorical}\n"
        "  - {name: rooms, type: numeric, impute: median}\n"
        "  - {name: price, type: numeric, log1p: true}\n"
        "tracking: {enabled: false}\n")
    rc, out, err = _sparktrain(tmp_path, "preprocess", tmp_path / "job.yaml", "--master", "local[2]")
    assert rc == 0, err
    assert "SparkSession ready: master local[2]" in err  # the CLI's own --master (profile_end_to_end is slow)
    assert "no data.key: a row's split is a hash of its columns city, rooms, price, grade" in err
    assert "6 of 300 rows have a null label and are dropped" in err
    from sparktrain.data.commit import resolve

    root = Path(resolve(str(tmp_path / "work" / "houses" / "dataset")))  # output.path follows the job name
    meta = json.loads((root / "features.json").read_text())
    assert meta["key"] is None
    assert {k: meta["label"][k] for k in ("column", "source_dtype", "dtype", "task", "vocabulary", "num_classes")} \
        == {"column": "grade", "source_dtype": "string", "dtype": "int32", "task": "multiclass",
            "vocabulary": ["fair", "good", "poor"], "num_classes": 3}
    tables = [pq.read_table(root / s) for s in ("train", "validation", "test")]
    assert sum(t.num_rows for t in tables) == 294
    assert str(tables[0].schema.field("grade").type) == "int32"
    assert sorted(set(v for t in tables for v in t.column("grade").to_pylist())) == [0, 1, 2]
    rc, out, err = _sparktrain(tmp_path, "profile", tmp_path / "job.yaml", "--master", "local[2]")
    assert rc == 0, err  # a string label is counted per class, never cast to double
    assert f"== profile of {tmp_path / 'houses.csv'}" in out
    assert "label 'grade' (string): 3 classes" in out
    assert re.search(r"^  fair\s+98 \( 33\.3%\)$", out, re.MULTILINE), out
    assert re.search(r"^  grade\s+6 nulls \(  2\.0%\)$", out, re.MULTILINE), out


@pytest.mark.slow  # a whole job (preprocess, train, MLflow) and two scoring runs, each its own Spark
def test_score_reads_a_json_file_as_the_model_was_trained(tmp_path):
    """A model trained on `data.format: json` scores the same raw JSON without --format; a CSV is refused clearly."""
    import json

    lines = [json.dumps({"city": ["Lima", "Oslo", "Rome"][i % 3], "rooms": 1 + i % 5, "price": 100.0 + 2.5 * i,
                         "good": i % 3 == 1}) for i in range(300)]
    (tmp_path / "houses.json").write_text("\n".join(lines) + "\n")
    (tmp_path / "houses.csv").write_text("city,rooms,price,good\n" + "\n".join(
        f"{r['city']},{r['rooms']},{r['price']},{r['good']}" for r in map(json.loads, lines)) + "\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "job.yaml").write_text(
        "name: houses\n"
        f"data: {{source: {tmp_path / 'houses.json'}, format: json, label: good}}\n"
        "features:\n"
        "  - {name: city, type: categorical}\n"
        "  - {name: rooms, type: numeric}\n"
        "  - {name: price, type: numeric}\n"
        "train: {epochs: 1, num_workers: 1, compare_baseline: false}\n"
        f"tracking: {{uri: '{uri}', artifact_location: {tmp_path / 'mlartifacts'}}}\n")
    rc, out, err = _sparktrain(tmp_path, "run", tmp_path / "job.yaml", "--master", "local[2]", timeout=600)
    assert rc == 0, err[-3000:]
    rc, out, err = _sparktrain(tmp_path, "score", "--model", "models:/houses@champion", "--input",
                               tmp_path / "houses.json", "--output", tmp_path / "scored", "--tracking-uri", uri,
                               "--master", "local[2]")
    assert rc == 0, err[-3000:]
    assert "scored 300 rows with models:/houses@champion" in out
    assert "reading" in err and "as json (the format the model was trained with (data.format))" in err
    rc, out, err = _sparktrain(tmp_path, "score", "--model", "models:/houses@champion", "--input",
                               tmp_path / "houses.csv", "--output", tmp_path / "scored_csv", "--tracking-uri", uri,
                               "--master", "local[2]")
    assert rc == 1 and out == ""
    assert f"error: option '--format' = 'json': Spark cannot read the scoring input '{tmp_path / 'houses.csv'}' " \
           f"as json (chosen by the format the model was trained with (data.format))" in err
    assert "Traceback" not in err and not (tmp_path / "scored_csv").exists()


def test_ctrl_c_ends_a_command_with_one_line_and_130(monkeypatch, capsys):
    from sparktrain import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)  # what a Ctrl-C in any stage reaches main as
    assert cli.main(["tune", str(FLIGHTS_YAML)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted: sparktrain tune stopped by Ctrl-C" and "Traceback" not in err


def test_the_run_summary_names_the_store_its_commands_need(tmp_path, monkeypatch):
    """`score` and the UI read the default store unless told: the summary of a run elsewhere says where."""
    from sparktrain.job import TrackingSummary
    from sparktrain.track.registry import RegisteredVersion

    monkeypatch.chdir(tmp_path)
    model = RegisteredVersion("prices", 2, "models:/prices/2", "models:/m-1", "r1", "test_rmse", 0.5, True)
    other = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    text = TrackingSummary(other, "3", "r1", model).format()
    assert (f"score:    sparktrain score --model models:/prices@champion --input RAW --output OUT --tracking-uri "
            f"{other}") in text
    assert (f"UI:       sparktrain mlflow-server --backend-store-uri {other}, then open "
            f"http://127.0.0.1:5000/#/experiments/3/runs/r1") in text
    default = TrackingSummary(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}", "1", "r1", model).format()
    assert "--input RAW --output OUT\n" in default and "UI:       sparktrain mlflow-server, then open" in default
    remote = TrackingSummary("http://user:pw@127.0.0.1:5999", "1", "r1", model).format()
    assert "--tracking-uri http://user:***@127.0.0.1:5999" in remote and ":pw@" not in remote
    assert "UI:       http://user:***@127.0.0.1:5999/#/experiments/1/runs/r1" in remote
    # probe K: after the tune stage registered version 3 and moved the alias, the summary still said the train
    # stage's version 2 had it
    from dataclasses import replace

    from sparktrain.tune.result import SearchResult

    tuned = SearchResult(trials=(), best_params={}, best_metric=0.2, best_number=4, model_version="3",
                         model_champion=True, test_metrics={"test_rmse": 0.41}, registered_number=4)
    text = TrackingSummary(other, "3", "r1", model, "prices", tuned).format()
    assert "model:    registered 'prices' version 2, test_rmse 0.5000; champion until the search's version below" \
        in text
    assert "tuned:    registered version 3 (trial 4), test_rmse 0.4100; alias champion -> this version" in text
    assert text.count("score:    sparktrain score --model models:/prices@champion") == 1
    earlier = replace(tuned, registered_number=2)  # a continued study's earlier trial: its test metric is not here
    assert "tuned:    registered version 3 (trial 2); alias champion" in \
        TrackingSummary(other, "3", "r1", model, "prices", earlier).format()


def test_sigterm_to_mlflow_server_stops_the_server_it_started(tmp_path):
    """Probe K: `kill <pid>` of `sparktrain mlflow-server` ended the CLI, and the real MLflow server (its child)
    went on listening on the port; a supervisor's stop or a closed terminal left it behind."""
    import signal
    import time

    from sparktrain.track.server import free_port, health_ok, port_in_use

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparktrain", "mlflow-server", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--artifacts-destination", str(tmp_path / "artifacts")],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not health_ok(f"http://127.0.0.1:{port}"):
            time.sleep(0.5)
        assert health_ok(f"http://127.0.0.1:{port}"), proc.communicate(timeout=30)[0][-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and port_in_use(port):
            time.sleep(0.5)
        assert not port_in_use(port), "the MLflow server outlived the CLI that started it"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_regression_model_worse_than_the_mean_is_said_with_the_settings_to_change(caplog):
    """Probe J: a 3-epoch regression ended with test_r2 -0.95 and no word (a binary model below chance warns)."""
    import logging

    from sparktrain.config import parse_config
    from sparktrain.job import _warn_below_mean

    cfg = parse_config({"data": {"label": "price"}, "train": {"epochs": 3, "learning_rate": 0.001}})
    with caplog.at_level(logging.WARNING, logger="sparktrain.job"):
        _warn_below_mean({"test_rmse": 2.1, "test_r2": -0.953}, cfg)
        _warn_below_mean({"test_rmse": 0.4, "test_r2": 0.81}, cfg)
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "worse than the label's mean would (test_r2 -0.953)" in text
    assert "raise train.epochs (now 3) or train.learning_rate (now 0.001)" in text


def test_a_dataset_preprocessed_from_another_config_is_described_key_by_key():
    """Probe I: `sparktrain tune` on an output.path preprocessed with 2 features and split seed 99 said nothing,
    while the job's MLflow run logged the config's 5 features and seed 42."""
    from sparktrain.config import parse_config
    from sparktrain.job import config_differences

    cfg = parse_config({"data": {"label": "species"}, "split": {"seed": 42},
                        "features": [{"name": "x1", "type": "numeric"}, {"name": "x2", "type": "numeric"},
                                     {"name": "color", "type": "categorical"}]})
    meta = {"label": {"column": "species"},
            "features": [{"name": "x1", "type": "numeric"}, {"name": "color", "type": "numeric"}],
            "dataset": {"split": {"seed": 99, "fractions": {"train": 0.8, "validation": 0.1, "test": 0.1}}}}
    assert config_differences(cfg, meta) == [
        "features the config lists but the dataset lacks: x2",
        "feature 'color' is numeric in the dataset, categorical in the config",
        "split.seed: 99 in the dataset, 42 in the config"]
    same = dict(meta, features=[{"name": "x1", "type": "numeric"}, {"name": "x2", "type": "numeric"},
                                {"name": "color", "type": "categorical"}],
                dataset={"split": {"seed": 42, "fractions": {"train": 0.8, "validation": 0.1, "test": 0.1}}})
    assert config_differences(cfg, same) == []


def test_a_missing_local_source_fails_before_mlflow_and_spark(tmp_path, monkeypatch, capsys):
    """Probe Q: `profile` of a config whose data.source is not there printed ~90 lines of Java stack and left an
    MLflow store and a failed run in the working directory; a local path is checked first."""
    conf = tmp_path / "houses.yaml"
    conf.write_text("name: houses\ndata: {source: data/houses.csv, format: csv, label: price}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["profile", str(conf)]) == 1
    err = capsys.readouterr().err
    assert f"data.source 'data/houses.csv' does not exist (relative to the working directory {tmp_path})" in err
    assert not (tmp_path / "work").exists() and "Traceback" not in err  # no MLflow store, no run, no JVM
    # a glob, a URI and an embedded name are Spark's to read
    from sparktrain.features.load import check_local_source
    from sparktrain.features.sections import DataConfig

    for source in ("data/*.csv", "s3a://bucket/houses.csv", "hdfs:///x", "flights"):
        check_local_source(DataConfig(source=source, label="y"), {"flights": lambda spark, scale: None})
    with pytest.raises(Exception, match="does not exist"):
        check_local_source(DataConfig(source=f"file://{tmp_path}/nope.parquet", label="y"))
    (tmp_path / "my data.csv").write_text("y\n1\n")
    for there in (f"file://localhost{tmp_path}/my%20data.csv", f"file:{tmp_path}/my%20data.csv"):
        check_local_source(DataConfig(source=there, label="y"))  # a URI's escapes and host read as Spark reads them
    # a master whose paths are not this machine's (Connect, YARN with HDFS as default filesystem): Spark's to say
    from sparktrain.job import _local_files

    assert _local_files("local[2]") and _local_files(None)
    assert not _local_files("sc://host:15002") and not _local_files("yarn")
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop/conf")
    assert not _local_files("local[2]")
