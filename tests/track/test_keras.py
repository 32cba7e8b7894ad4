"""A Keras job on the default sqlite backend: tracked, registered, and scored alike with and without Spark."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_job_on_sqlite(spark, flights_sample, tracking_uri, tmp_path):
    import mlflow.pyfunc
    from mlflow import MlflowClient

    from sparktrain.config import load_config
    from sparktrain.job import run_job
    from sparktrain.serve.pyfunc import load_spark_model, raw_columns

    source = os.path.dirname(flights_sample.inputFiles()[0].replace("file://", ""))
    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        f"data.source={source}", "train.framework=keras", "train.epochs=2", "train.num_workers=2",
        "train.batch_size=1024", "train.compare_baseline=false", f"output.path={tmp_path / 'ds'}",
        f"train.store={tmp_path / 'store'}", f"tracking.uri={tracking_uri}",
        f"tracking.artifact_location={tmp_path / 'art'}", "tracking.model_name=flights-keras"])
    result = run_job(cfg, stages=("preprocess", "train"), spark=spark)
    reg = result.tracking.model
    assert (reg.name, reg.version, reg.champion, reg.metric) == ("flights-keras", 1, True, "test_auc")

    client = MlflowClient(tracking_uri)
    train_run = client.get_run(reg.run_id)
    assert train_run.data.tags["mlflow.parentRunId"] == result.tracking.run_id
    assert len(client.get_metric_history(reg.run_id, "val_loss")) == 2
    assert client.get_run(result.tracking.run_id).data.tags["sparktrain.framework"] == "keras"

    uri = "models:/flights-keras@champion"
    raw = flights_sample.where("abs(hash(flight_id, 11)) % 80 = 5")
    meta = json.loads(Path(result.preprocess.features_json).read_text())
    cols = [c for c, _ in raw_columns(meta)]
    pdf = raw.select("flight_id", *cols).toPandas()
    b = mlflow.pyfunc.load_model(uri).predict(pdf[cols])
    b.index = pdf["flight_id"]
    c = load_spark_model(uri).transform(raw).select("flight_id", "probability").toPandas().set_index("flight_id")
    np.testing.assert_allclose(b.sort_index()["probability"].to_numpy(), c.sort_index()["probability"].to_numpy(),
                               rtol=0, atol=1e-6)
    assert len(pdf) > 50
