"""One small flights job against a real ``mlflow server`` over HTTP; assertions on what MLflow holds.

The job (profile -> preprocess -> train, 2 epochs, 2 workers) runs once in a
module fixture; every test reads the tracking server or scores with the
registered model.  Scoring paths are compared on the same raw rows:
(a) ``spark_udf`` through ``score_path``, (b) ``pyfunc.load_model().predict``
and ``mlflow models serve`` over HTTP, (c) Spark-native: the fitted
``PipelineModel`` then the fitted network's ``transform``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from sparktrain.data.manifest import committed_files
from sparktrain.errors import ColumnClashError, MissingColumnError, ModelNotFoundError
from tests._sweep import SECRETS

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 2
MODEL = "flights-late-e2e"
EXPERIMENT = "sparktrain-e2e"


def _sample_path(df) -> str:
    return os.path.dirname(df.inputFiles()[0].replace("file://", ""))


@pytest.fixture(scope="module")
def job(spark, flights_sample, mlflow_server, tmp_path_factory):
    """The job's result, config and an MlflowClient on the server."""
    from mlflow import MlflowClient

    from sparktrain.config import load_config
    from sparktrain.job import run_job

    base = tmp_path_factory.mktemp("track_job")
    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        f"data.source={_sample_path(flights_sample)}", f"train.epochs={EPOCHS}", "train.num_workers=2",
        "train.batch_size=1024", "train.compare_baseline=false", f"output.path={base / 'dataset'}",
        f"train.store={base / 'store'}", f"tracking.uri={mlflow_server}", f"tracking.experiment={EXPERIMENT}",
        f"tracking.model_name={MODEL}", "spark.conf.spark.hadoop.fs.s3a.secret.key=do-not-log-me",
        f"spark.conf.spark.executorEnv.AWS_SECRET_ACCESS_KEY={SECRETS['executor_env']}"])
    result = run_job(cfg, stages=("profile", "preprocess", "train"), spark=spark)
    client = MlflowClient(mlflow_server, mlflow_server)
    return {"cfg": cfg, "result": result, "client": client, "uri": mlflow_server, "base": base,
            "sample": _sample_path(flights_sample)}


def _runs(job):
    client = job["client"]
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_id == job["result"].tracking.run_id][0]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return parent, children


def _artifacts(client, run_id, path=None):
    out = []
    for a in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, a.path) if a.is_dir else [a.path]
    return out


def test_run_hierarchy_params_and_tags(job, spark):
    from sparktrain.track.params import MASK, job_params

    parent, children = _runs(job)
    assert parent.info.status == "FINISHED"
    assert parent.data.params == job_params(job["cfg"])
    assert parent.data.params["spark.conf.spark.hadoop.fs.s3a.secret.key"] == MASK
    assert parent.data.params["data.key"] == "flight_id"
    assert parent.data.params["train.epochs"] == str(EPOCHS)
    tags = parent.data.tags
    assert tags["sparktrain.spark.version"] == spark.version
    assert tags["sparktrain.spark.master"] == "local[2]"
    assert tags["sparktrain.num_workers"] == "2"
    for dist in ("torch", "pyspark", "mlflow", "pyarrow", "tensorflow"):
        assert tags[f"sparktrain.version.{dist}"]
    commit = tags["mlflow.source.git.commit"]
    # HEAD at job start; others may have committed since, so check it is HEAD or one of its ancestors
    assert len(commit) == 40
    assert subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=REPO).returncode == 0
    assert set(children) == {"profile", "preprocess", "train"}
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert children["train"].data.params["train.batch_size"] == "1024"
    for name, run in children.items():
        assert run.data.metrics["seconds"] > 0
        assert parent.data.metrics[f"{name}_seconds"] == pytest.approx(run.data.metrics["seconds"])
    assert parent.data.metrics["job_seconds"] >= sum(r.data.metrics["seconds"] for r in children.values())


def test_stage_metrics(job, flights_sample):
    _, children = _runs(job)
    client, result = job["client"], job["result"]
    assert children["profile"].data.metrics["rows"] == flights_sample.count()
    pre = children["preprocess"].data.metrics
    assert {k: int(pre[f"rows_{k}"]) for k in ("train", "validation", "test")} == dict(result.preprocess.row_counts)
    train_id = children["train"].info.run_id
    for key in ("train_loss", "val_loss", "val_auc", "train_accuracy"):
        history = client.get_metric_history(train_id, key)
        assert len(history) == EPOCHS
        assert sorted(m.step for m in history) == list(range(EPOCHS))
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
            [h[key] for h in result.train.history])
    metrics = children["train"].data.metrics
    assert metrics["test_auc"] == pytest.approx(result.train.test["test_auc"])
    assert 0.5 < metrics["test_auc"] <= 1.0


def _png_size(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_artifacts(job, tmp_path):
    from mlflow.artifacts import download_artifacts

    parent, children = _runs(job)
    client = job["client"]
    assert _artifacts(client, parent.info.run_id) == ["config/job.yaml"]
    cfg_file = download_artifacts(run_id=parent.info.run_id, artifact_path="config/job.yaml", dst_path=str(tmp_path))
    saved = yaml.safe_load(Path(cfg_file).read_text())
    assert saved["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == "***"
    assert saved["train"]["epochs"] == EPOCHS and saved["data"]["key"] == "flight_id"

    pre = children["preprocess"].info.run_id
    assert sorted(_artifacts(client, pre)) == ["features/features.json", "manifests/test/_manifest.json",
                                                "manifests/train/_manifest.json",
                                                "manifests/validation/_manifest.json"]
    got = download_artifacts(run_id=pre, artifact_path="features/features.json", dst_path=str(tmp_path))
    assert json.loads(Path(got).read_text()) == json.loads(Path(job["result"].preprocess.features_json).read_text())

    train = children["train"].info.run_id
    assert {"history.json", "plots/learning_curve.png", "plots/roc_curve.png",
            "plots/confusion_matrix.png"} <= set(_artifacts(client, train))
    for name in ("learning_curve", "roc_curve", "confusion_matrix"):
        png = download_artifacts(run_id=train, artifact_path=f"plots/{name}.png", dst_path=str(tmp_path))
        width, height = _png_size(Path(png).read_bytes())
        assert width >= 500 and height >= 400
        assert os.path.getsize(png) > 15_000  # axes, labels and curves, not an empty canvas


def test_confusion_matrix_counts_the_test_split(job, spark):
    from sparktrain.track.plots import histogram_auc, test_score_summary

    model, dataset = job["result"].train.model, job["result"].preprocess.path
    summary = test_score_summary(model, spark.read.parquet(*committed_files(os.path.join(dataset, "test"))))
    assert summary.rows == job["result"].preprocess.row_counts["test"]
    assert summary.pos.sum() + summary.neg.sum() == summary.rows
    assert histogram_auc(summary.pos, summary.neg) == pytest.approx(job["result"].train.test["test_auc"], abs=2e-3)
    accuracy = np.trace(summary.confusion) / summary.rows
    assert accuracy == pytest.approx(job["result"].train.test["test_accuracy"], abs=1e-9)


def test_dataset_lineage(job):
    from sparktrain.data.commit import resolve
    from sparktrain.data.manifest import read_manifest

    parent, children = _runs(job)
    dataset = job["result"].preprocess.path
    sample = job["sample"]
    for run in (parent, children["train"], children["preprocess"]):
        inputs = {[t.value for t in d.tags if t.key == "mlflow.data.context"][0]: d.dataset
                  for d in run.inputs.dataset_inputs}
        # the source: the raw Parquet the features were computed from, as the JVM lineage listener saw it
        assert len(run.inputs.dataset_inputs) == len(inputs)
        source = inputs.pop("source")
        assert json.loads(source.source)["path"] == os.path.abspath(sample)
        profile = json.loads(source.profile)
        files = [f for f in os.listdir(sample) if f.endswith(".parquet")]
        assert profile["format"] == "parquet" and profile["files"] == len(files) == 1
        assert profile["size_bytes"] == sum(os.path.getsize(os.path.join(sample, f)) for f in files)
        assert source.digest == profile["listing_sha256"][:32]
        if run is children["preprocess"]:
            assert inputs == {}
            continue
        assert set(inputs) == {"training", "validation", "testing"}
        for context, split in (("training", "train"), ("validation", "validation"), ("testing", "test")):
            manifest = read_manifest(os.path.join(dataset, split))
            ds = inputs[context]
            assert ds.digest == manifest["digest"][:32]
            assert json.loads(ds.profile)["num_rows"] == manifest["num_rows"]
            # the committed generation's split: the exact files trained on, never rewritten in place
            assert json.loads(ds.source)["path"] == os.path.abspath(resolve(os.path.join(dataset, split)))
            names = [c["name"] for c in json.loads(ds.schema)["mlflow_colspec"]]
            assert names == [c["name"] for c in manifest["schema"]]


def test_registered_version_and_champion(job):
    client, reg = job["client"], job["result"].tracking.model
    assert (reg.name, reg.version, reg.champion) == (MODEL, 1, True)
    mv = client.get_model_version_by_alias(MODEL, "champion")
    assert int(mv.version) == 1
    assert mv.run_id == _runs(job)[1]["train"].info.run_id
    assert mv.tags["sparktrain.score_metric"] == "test_auc"
    assert float(mv.tags["sparktrain.score"]) == pytest.approx(job["result"].train.test["test_auc"])


@pytest.fixture(scope="module")
def raw_rows(flights_sample, tmp_path_factory):
    """~250 raw rows (written to Parquet) that every scoring path scores."""
    path = tmp_path_factory.mktemp("raw_rows") / "rows.parquet"
    flights_sample.where("abs(hash(flight_id, 7)) % 64 = 3").coalesce(1).write.parquet(str(path))
    return str(path)


def _by_key(pdf):
    return pdf.set_index("flight_id").sort_index()


def test_scoring_paths_agree(job, spark, raw_rows, tmp_path):
    import mlflow.pyfunc
    from pyspark.ml import PipelineModel

    from sparktrain.serve.pyfunc import load_spark_model, raw_columns
    from sparktrain.serve.scoring import score_path

    uri = f"models:/{MODEL}@champion"
    raw = spark.read.parquet(raw_rows)
    n = raw.count()
    assert 100 < n < 1000
    # (a) in Spark through spark_udf (what `sparktrain score` runs)
    out = str(tmp_path / "scored.parquet")
    assert score_path(spark, uri, raw_rows, out, tracking_uri=job["uri"]) == n
    a = _by_key(spark.read.parquet(*committed_files(out)).select("flight_id", "prediction", "probability").toPandas())
    # (b) without Spark: the pyfunc model on pandas
    meta = json.loads(Path(job["result"].preprocess.features_json).read_text())
    cols = [c for c, _ in raw_columns(meta)]
    pdf = raw.select("flight_id", *cols).toPandas()
    b = mlflow.pyfunc.load_model(uri).predict(pdf[cols].set_index(pdf["flight_id"]))
    assert list(b.index) == list(pdf["flight_id"])  # the caller's index comes back with each row's prediction
    b = b.sort_index()
    # (c) Spark-native: the fitted PipelineModel, then the fitted network's transform
    features = PipelineModel.load(job["result"].preprocess.pipeline_model).transform(raw)
    c = _by_key(job["result"].train.model.transform(features).select("flight_id", "prediction", "probability")
                .toPandas())
    d = _by_key(load_spark_model(uri).transform(raw).select("flight_id", "prediction", "probability").toPandas())
    assert list(a.index) == list(b.index) == list(c.index) == list(d.index)
    for other in (b, c, d):
        np.testing.assert_allclose(a["probability"].to_numpy(), other["probability"].to_numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(a["prediction"].to_numpy(), other["prediction"].to_numpy())
    assert a["probability"].std() > 0.01  # real scores, not a constant


def test_spark_model_keeps_every_raw_column_and_loads_back_as_it_scores(job, spark, raw_rows, tmp_path):
    """``load_spark_model(uri).transform(raw)``: each input column with its raw value and type (the numeric features
    were overwritten by their transformed values, the label re-encoded, the other columns dropped), then the outputs,
    scored as ``score_dataframe`` scores; a saved copy loads back with ``PipelineModel.load`` and does the same."""
    import pandas as pd
    from pyspark.ml import PipelineModel
    from pyspark.sql import functions as F

    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_dataframe, score_with_pipeline

    uri = f"models:/{MODEL}@champion"
    raw = spark.read.parquet(raw_rows).withColumn("order_ref", F.concat(F.lit("o-"), F.col("flight_id")))
    model = load_spark_model(uri)
    assert isinstance(model, PipelineModel)
    out = model.transform(raw)
    assert out.columns == [*raw.columns, "prediction", "probability", "rawPrediction"]
    assert [(f.name, f.dataType) for f in out.schema.fields[:len(raw.columns)]] == \
        [(f.name, f.dataType) for f in raw.schema.fields]
    want = raw.toPandas().sort_values("flight_id", ignore_index=True)
    got = out.toPandas().sort_values("flight_id", ignore_index=True)
    pd.testing.assert_frame_equal(got[raw.columns], want)
    assert got["dep_delay"].equals(want["dep_delay"]) and got["late"].equals(want["late"])  # not features, not 0/1
    a = score_dataframe(spark, raw, uri).select("flight_id", "prediction", "probability").toPandas() \
        .sort_values("flight_id", ignore_index=True)
    np.testing.assert_allclose(got["probability"], a["probability"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got["prediction"], a["prediction"])
    assert got["probability"].std() > 0.01
    # probe H: a column of the user's named like score_dataframe's temporary one is kept; a join's duplicate
    # columns are refused by name (Spark's raw AMBIGUOUS_REFERENCE before)
    from sparktrain.errors import DuplicateColumnError

    mine = score_dataframe(spark, raw.withColumn("__sparktrain_scores", F.lit("user data")), uri)
    assert mine.columns == [*raw.columns, "__sparktrain_scores", "prediction", "probability"]
    assert {r[0] for r in mine.select("__sparktrain_scores").distinct().collect()} == {"user data"}
    with pytest.raises(DuplicateColumnError, match="has more than one column named 'dep_delay'"):
        score_dataframe(spark, raw.join(raw.select("flight_id", "dep_delay"), "flight_id"), uri)
    # score_dataframe's Spark path (a model with a text feature) is the same model: raw columns, signature outputs
    piped = score_with_pipeline(model, raw, [("prediction", "double"), ("probability", "double")])
    assert piped.columns == [*raw.columns, "prediction", "probability"]
    pd.testing.assert_frame_equal(piped.toPandas().sort_values("flight_id", ignore_index=True), got.drop(
        columns="rawPrediction"))
    # refused before any job, as score_dataframe refuses: a column the model reads is missing, or one it adds is there
    with pytest.raises(MissingColumnError) as err:
        model.transform(raw.drop("dep_delay"))
    assert err.value.column == "dep_delay"
    text = str(err.value)
    assert text.startswith(f"column 'dep_delay' is not in the DataFrame to score (model {uri} reads it).") and \
        "Columns that exist: " in text and "order_ref" in text and "SQL" not in text, text
    with pytest.raises(ColumnClashError, match=r"already has column\(s\) prediction, probability, rawPrediction that "
                                               rf"model {uri} adds; drop or rename them"):
        model.transform(out)
    # saved and loaded with Spark ML's own reader: the same raw-in, raw-out model
    model.save(str(tmp_path / "saved"))
    again = PipelineModel.load(str(tmp_path / "saved"))
    pd.testing.assert_frame_equal(again.transform(raw).toPandas().sort_values("flight_id", ignore_index=True), got)
    with pytest.raises(MissingColumnError, match="'dep_delay'"):
        again.transform(raw.drop("dep_delay"))


def test_models_serve_over_http(job, spark, raw_rows, tmp_path):
    """``mlflow models serve --env-manager local`` on 127.0.0.1 gives the pyfunc's predictions."""
    import mlflow.pyfunc

    from sparktrain.serve.pyfunc import raw_columns
    from sparktrain.track.server import free_port, health_ok

    meta = json.loads(Path(job["result"].preprocess.features_json).read_text())
    cols = [c for c, _ in raw_columns(meta)]
    pdf = spark.read.parquet(raw_rows).select(*cols).limit(40).toPandas()
    expected = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(pdf)
    port = free_port()
    env = dict(os.environ, MLFLOW_TRACKING_URI=job["uri"],
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{MODEL}@champion",
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{port}"
        while not _ping(url):
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "mlflow models serve did not start"
            time.sleep(0.5)
        body = json.dumps({"dataframe_split": json.loads(pdf.to_json(orient="split", date_format="iso",
                                                                     index=False))}).encode()
        req = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            got = json.loads(resp.read())["predictions"]
        assert health_ok(job["uri"])
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()
    assert len(got) == len(pdf)
    np.testing.assert_allclose([g["probability"] for g in got], expected["probability"], rtol=0, atol=1e-6)


def _ping(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_score_input_missing_a_column(job, spark, raw_rows, tmp_path):
    from sparktrain.serve.scoring import score_path

    thin = str(tmp_path / "thin.parquet")
    spark.read.parquet(raw_rows).drop("dep_delay").write.parquet(thin)
    with pytest.raises(MissingColumnError, match="'dep_delay'") as err:
        score_path(spark, f"models:/{MODEL}@champion", thin, str(tmp_path / "out"), tracking_uri=job["uri"])
    assert err.value.column == "dep_delay"
    assert not (tmp_path / "out").exists()


def test_score_output_is_replaced_atomically_and_a_failed_score_keeps_the_previous_one(job, spark, raw_rows, tmp_path,
                                                                                       monkeypatch):
    """Through a filesystem that cannot move a directory (as S3): the commit protocol never renames one."""
    from pyspark.sql import functions as F

    from sparktrain.serve.scoring import score_path
    from tests._nomove import no_directory_moves

    nomove = no_directory_moves(monkeypatch)

    uri, out = f"models:/{MODEL}@champion", tmp_path / "scored"
    n = score_path(spark, uri, raw_rows, str(out), tracking_uri=job["uri"])
    record = json.loads((out / "_manifest.json").read_text())  # the commit record names the generation
    assert (record["format"], record["kind"], record["rows"]) == ("sparktrain.commit/1", "score", n)
    manifest = json.loads((out / record["path"] / "_manifest.json").read_text())
    assert (manifest["written_by"], manifest["model"], manifest["num_rows"]) == ("sparktrain score", uri, n)
    from mlflow import MlflowClient
    champion = MlflowClient(job["uri"], job["uri"]).get_model_version_by_alias(MODEL, "champion").version
    assert manifest["model_version"] == f"models:/{MODEL}/{champion}"  # the version the whole job read
    before = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*")}
    # a job that fails while writing: one file of the input has 'distance' as a string
    broken = tmp_path / "broken.parquet"
    spark.read.parquet(raw_rows).write.parquet(str(broken))
    spark.read.parquet(raw_rows).limit(1).withColumn("distance", F.col("distance").cast("string")) \
        .write.mode("append").parquet(str(broken))
    with pytest.raises(Exception, match="(?i)parquet|convert|distance"):
        score_path(spark, uri, str(broken), str(out), tracking_uri=job["uri"])
    assert {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*")} == before  # its generation went
    assert json.loads((out / "_manifest.json").read_text()) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.parquet", "scored"]  # no lease left
    # again onto its own earlier output: replaced whole
    few = tmp_path / "few.parquet"
    spark.read.parquet(raw_rows).orderBy("flight_id").limit(10).write.parquet(str(few))
    assert score_path(spark, uri, str(few), str(out), tracking_uri=job["uri"]) == 10
    newer = json.loads((out / "_manifest.json").read_text())
    assert newer["rows"] == 10 and sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", newer["path"]])
    assert spark.read.parquet(*committed_files(str(out))).count() == 10
    assert nomove.refused == []


def test_score_reads_with_the_models_format_and_refuses_another_without_format(job, spark, raw_rows, tmp_path):
    """The model records data.format (parquet here): a JSON file is read as parquet unless --format says json."""
    from sparktrain.errors import ConfigError
    from sparktrain.serve.scoring import score_path, trained_reader

    uri = f"models:/{MODEL}@champion"
    assert trained_reader(uri) == {"input": "source", "format": "parquet", "options": {}}
    as_json = tmp_path / "rows.json"  # the extension says json; the model's format wins without --format
    spark.read.parquet(raw_rows).write.json(str(as_json))
    out = tmp_path / "scored"
    with pytest.raises(ConfigError) as err:
        score_path(spark, uri, str(as_json), str(out), tracking_uri=job["uri"])
    text = str(err.value)
    assert f"Spark cannot read the scoring input '{as_json}' as parquet (chosen by the format the model was " \
           f"trained with (data.format))" in text
    assert "Fix: pass --format with the file's own format (csv, json, orc)" in text
    # Spark's reason, not py4j's "An error occurred while calling o54.load"
    assert "as parquet (chosen by the format the model was trained with (data.format)): SparkException: " \
           "[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER]" in text and "An error occurred while calling" not in text
    assert "Traceback" not in text and "\tat " not in text and not out.exists()
    n = score_path(spark, uri, str(as_json), str(out), fmt="json", tracking_uri=job["uri"])
    from_json = _by_key(spark.read.parquet(*committed_files(str(out))).select("flight_id", "probability").toPandas())
    parquet_out = tmp_path / "scored_parquet"
    assert score_path(spark, uri, raw_rows, str(parquet_out), tracking_uri=job["uri"]) == n
    from_parquet = _by_key(spark.read.parquet(*committed_files(str(parquet_out))).select("flight_id", "probability")
                           .toPandas())
    np.testing.assert_allclose(from_json["probability"], from_parquet["probability"], rtol=0, atol=1e-6)
    # a catalog table or view, as data.table reads it
    spark.read.parquet(raw_rows).createOrReplaceTempView("score_rows_view")
    assert score_path(spark, uri, None, str(tmp_path / "from_table"), table="score_rows_view",
                      tracking_uri=job["uri"]) == n
    with pytest.raises(ConfigError, match=r"'--table' = 'no_such_view': no such table or view in the catalog"):
        score_path(spark, uri, None, str(tmp_path / "t2"), table="no_such_view", tracking_uri=job["uri"])


def test_unknown_model_name_lists_registered_models(job, spark, raw_rows, tmp_path):
    from sparktrain.serve.scoring import score_path

    with pytest.raises(ModelNotFoundError) as err:
        score_path(spark, "models:/flights-lat@champion", raw_rows, str(tmp_path / "o"), tracking_uri=job["uri"])
    text = str(err.value)
    assert "'flights-lat'" in text and MODEL in text and "Registered models" in text
    with pytest.raises(ModelNotFoundError, match="no alias 'best'.*champion"):
        score_path(spark, f"models:/{MODEL}@best", raw_rows, str(tmp_path / "o"), tracking_uri=job["uri"])


def test_tracking_server_listens_on_loopback_only(job):
    import psutil

    port = int(job["uri"].rsplit(":", 1)[1])
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == port]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}


@pytest.mark.slow
def test_cli_scores_csv(job, spark, raw_rows, tmp_path):
    """``sparktrain score`` on CSV (types inferred, then cast to the signature) matches the pyfunc model."""
    import mlflow.pyfunc

    from sparktrain.cli import main

    csv = str(tmp_path / "rows_csv")
    spark.read.parquet(raw_rows).coalesce(1).write.option("header", True).csv(csv)
    out = str(tmp_path / "scored")
    assert main(["score", "--model", f"models:/{MODEL}@champion", "--input", csv, "--output", out,
                 "--format", "csv", "--tracking-uri", job["uri"]]) == 0
    scored = _by_key(spark.read.parquet(*committed_files(out)).select("flight_id", "probability").toPandas())
    pq_scored = spark.read.parquet(raw_rows)
    from sparktrain.serve.pyfunc import raw_columns

    meta = json.loads(Path(job["result"].preprocess.features_json).read_text())
    cols = [c for c, _ in raw_columns(meta)]
    pdf = pq_scored.select("flight_id", *cols).toPandas()
    expected = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(pdf[cols])
    expected.index = pdf["flight_id"]
    np.testing.assert_allclose(scored["probability"].to_numpy(), expected.sort_index()["probability"].to_numpy(),
                               rtol=0, atol=1e-6)


@pytest.mark.torch
def test_no_secret_at_rest(job, spark, tmp_path, caplog):
    """The job's Spark conf secret, a search whose trials fail quoting credentials, a fit that fails on the executor
    with a token in its message: none of them in the store, the dataset, MLflow (every run's params, tags and
    artifacts, the registry's tags) or the log records; the failures are recorded, masked.

    The default suite's variant of tests/track/test_secret_sweep.py (slow: a fresh ``sparktrain run`` process,
    a password in the tracking URI, the MLflow database grepped as bytes, the job's stderr).
    """
    import dataclasses
    import logging

    from sparktrain._internal.log_masking import SecretFilter
    from sparktrain.config import TuneConfig
    from sparktrain.errors import TrainingError, TuneError
    from sparktrain.train.estimator import TorchEstimator
    from sparktrain.tune.search import run_search
    from tests._sweep import FIT_ERROR, TRIAL_ERROR, leaks

    def failing_objective(params):  # shipped to the executor by value
        raise ConnectionError(TRIAL_ERROR)

    def failing_factory(inputs, model_spec):
        raise RuntimeError(FIT_ERROR)

    cfg, client, log = job["cfg"], job["client"], logging.getLogger("sparktrain.sweep")
    search = dataclasses.replace(
        cfg, tracking=dataclasses.replace(cfg.tracking, experiment=f"{EXPERIMENT}-secrets"),
        tune=TuneConfig(max_trials=2, parallelism=1, algo="random",
                        space={"learning_rate": {"uniform": [1.0e-3, 1.0e-2]}}))
    caplog.handler.addFilter(SecretFilter())  # what the CLI puts on its log handlers
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        with pytest.raises(TuneError) as tune_error:
            run_search(spark, search, None, tracking_uri=job["uri"], objective=failing_objective)
        log.error("search failed: %s", tune_error.value)  # the raw text: the filter masks it
        est = TorchEstimator(numWorkers=1, epochs=1, labelCol=cfg.data.label, store=str(job["base"] / "store"))
        with pytest.raises(TrainingError) as fit_error:
            est.setModelFactory(failing_factory).fit(job["result"].preprocess.path)
        log.error("fit failed", exc_info=fit_error.value)

    assert "password=*** headers={'Authorization': 'Basic ***'}" in str(tune_error.value)
    assert "cannot fetch the pretrained weights with token=***" in str(fit_error.value)
    assert fit_error.value.rank == 0 and "failing_factory" in fit_error.value.remote_traceback
    failures = list((job["base"] / "store").glob("*/failures/*"))
    assert failures and "token=***" in failures[0].read_text()
    bundle = json.loads(next((job["base"] / "store").glob("*/model/bundle.json")).read_text())
    assert bundle["config"]["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == "***"
    assert bundle["config"]["data"]["label"] == cfg.data.label  # the rest stays readable
    records, downloaded = [], tmp_path / "artifacts"
    for name in (EXPERIMENT, f"{EXPERIMENT}-secrets"):
        for run in client.search_runs([client.get_experiment_by_name(name).experiment_id], max_results=200):
            records.append(json.dumps({"params": run.data.params, "tags": run.data.tags}))
            client.download_artifacts(run.info.run_id, "", str(downloaded / run.info.run_id))
    trials = [r for r in records if '"sparktrain.kind": "trial"' in r]
    assert len(trials) == 2 and all("'Authorization': 'Basic ***'" in r for r in trials)
    records += [json.dumps(v.tags) for v in client.search_model_versions(f"name = '{MODEL}'")]
    assert leaks([job["base"], downloaded], {"MLflow params and tags": "\n".join(records), "log": caplog.text,
                                             "errors": f"{tune_error.value}\n{fit_error.value}"}) == []


def test_a_store_model_folder_given_to_score_says_how_to_register_it(spark, tmp_path):
    from sparktrain.errors import ConfigError
    from sparktrain.serve.scoring import score_path

    run = tmp_path / "store" / "abc123"
    (run / "model").mkdir(parents=True)
    (run / "model" / "bundle.json").write_text("{}")  # what `model saved: .../model` points at
    with pytest.raises(ConfigError) as info:  # before: MlflowException "No such artifact: 'MLmodel'"
        score_path(spark, str(run / "model"), str(tmp_path / "in.csv"), str(tmp_path / "out"))
    assert info.value.path == "--model" and info.value.value == str(run / "model")
    assert f"sparktrain register --from-store {run}" in info.value.fix
    assert not (tmp_path / "out").exists()


def test_score_names_text_values_that_are_not_numbers(job, spark, raw_rows, tmp_path, caplog):
    """A CSV-like input whose numeric column holds 'n/a': scored as missing, and said so with the count."""
    from pyspark.sql import functions as F

    from sparktrain.serve.scoring import score_path

    texty = str(tmp_path / "texty.parquet")
    df = spark.read.parquet(raw_rows)
    bad = F.abs(F.hash("flight_id")) % 10 == 0
    df.withColumn("distance", F.when(bad, F.lit("n/a")).otherwise(F.col("distance").cast("string"))) \
        .write.parquet(texty)
    expected = df.where(bad).count()
    assert expected > 0
    with caplog.at_level(logging.WARNING, logger="sparktrain.serve.scoring"):
        n = score_path(spark, f"models:/{MODEL}@champion", texty, str(tmp_path / "out"), tracking_uri=job["uri"])
    assert n == df.count()
    assert f"column 'distance' of the scoring input '{texty}' (read as parquet) has {expected} of {n} values that " \
        "are not numbers (e.g. 'n/a')" in caplog.text  # before: scored as missing without a word
    # the Spark path (a model with a text, set, vector or datetime-format feature) reads them the same way; it
    # failed in the fitted SQL ("Column __st_distance__prep must be of type numeric but was ... string")
    from sparktrain.serve.pyfunc import load_spark_model
    from sparktrain.serve.scoring import score_with_pipeline

    uri = f"models:/{MODEL}@champion"
    rows = spark.read.parquet(texty)
    piped = score_with_pipeline(load_spark_model(uri), rows, [("prediction", "double"), ("probability", "double")]) \
        .toPandas().sort_values("flight_id", ignore_index=True)  # the model itself reads the text as numbers
    assert piped.columns.tolist() == [*rows.columns, "prediction", "probability"]
    assert (piped["distance"] == "n/a").sum() == expected  # the raw text comes back as given
    scored = spark.read.parquet(*committed_files(str(tmp_path / "out"))).toPandas() \
        .sort_values("flight_id", ignore_index=True)
    np.testing.assert_allclose(piped["probability"], scored["probability"], rtol=0, atol=1e-6)


def test_score_refuses_an_output_spark_has_no_filesystem_for_before_scoring(job, spark, raw_rows, s3):
    """``--output s3a://...`` / ``s3://...`` with no Hadoop S3 connector in this Spark: refused before any scoring
    (it used to score every row, then fail on the write with py4j's error; s3a:// failed in pyarrow first).

    The bucket is moto's: pyarrow reads s3a:// as s3:// (the ownership check passes), and nothing is written.
    """
    from sparktrain.errors import ConfigError
    from sparktrain.serve.scoring import score_path

    base = s3.prefix("scored")
    for scheme, words in (("s3a", "hadoop-aws and its AWS SDK bundle"),
                          ("s3", "spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem")):
        out = base.replace("s3://", f"{scheme}://", 1)
        with pytest.raises(ConfigError) as err:
            score_path(spark, f"models:/{MODEL}@champion", raw_rows, out, tracking_uri=job["uri"])
        text = str(err.value)
        assert err.value.path == "--output" and err.value.value == out, text
        assert f"Spark has no Hadoop filesystem for {scheme}:// URIs" in text and words in text, text
        assert "An error occurred while calling" not in text and "\tat " not in text
    assert s3.keys(base) == []  # no lease, no generation, no marker left in the bucket
