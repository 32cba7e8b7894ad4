"""Vector, text and set features and ``datetime.format``: preprocess -> fit torch and Keras -> score the raw frame.

One synthetic table carries four independent signals, one per new feature
type; the label is 1 when at least three of them are on.  A model that
misses any one of them cannot pass ~0.81 accuracy; with all four it can
reach 1.0, so the bound below shows that every type reaches the network.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
WORDS = "array('alpha','beta','gamma','delta','eps','zeta','eta','theta','iota','kappa')"
SPECS = [
    {"name": "emb", "type": "vector", "scale": True},
    {"name": "title", "type": "text", "max_tokens": 8},
    {"name": "tags", "type": "set", "delimiter": "|", "max_items": 4},
    {"name": "day", "type": "datetime", "format": "yyyy/MM/dd", "parts": ["month"], "cyclical": False},
]


def _cfg(source, out, features=SPECS, key="id"):
    from sparktrain.config import load_config
    from sparktrain.features.spec import parse_features

    cfg = load_config(REPO / "conf" / "flights.yaml")
    return replace(cfg, data=replace(cfg.data, source=str(source), label="label", key=key),
                   features=parse_features(features),
                   output=replace(cfg.output, path=str(out), row_group_rows=1024))


@pytest.fixture(scope="module")
def raw_dir(spark, tmp_path_factory):
    """4,000 rows: a 4-float array ``emb``, a text ``title``, '|'-joined ``tags``, a ``yyyy/MM/dd`` string ``day``."""
    df = spark.sql("SELECT id, array(randn(1), randn(2), randn(3), randn(4)) AS emb, pmod(hash(id, 1), 2) AS b, "
                   "pmod(hash(id, 2), 2) AS c FROM range(4000)")
    word = lambda k: f"element_at({WORDS}, pmod(hash(id, {k}), 10) + 1)"  # noqa: E731
    df = df.selectExpr(
        "*",
        f"concat_ws(' ', {word(4)}, {word(5)}, IF(b = 1, 'Great!', 'awful,'), {word(6)}, {word(9)}) AS title",
        "concat_ws('|', element_at(array('x', 'y', 'z', 'w'), pmod(hash(id, 7), 4) + 1), IF(c = 1, ' vip', NULL)) "
        "AS tags",
        "date_format(date_add(DATE'2020-01-01', CAST(pmod(hash(id, 8), 365) AS INT)), 'yyyy/MM/dd') AS day")
    df = df.selectExpr("*", "CAST(IF(emb[0] + emb[1] > 0, 1, 0) + b + c + "
                            "IF(month(to_date(day, 'yyyy/MM/dd')) >= 7, 1, 0) >= 3 AS INT) AS label")
    path = tmp_path_factory.mktemp("arrays") / "raw"
    df.drop("b", "c").coalesce(1).write.parquet(str(path))
    return path


@pytest.fixture(scope="module")
def dataset(spark, raw_dir, tmp_path_factory):
    from sparktrain.features.materialize import materialize

    return materialize(spark, _cfg(raw_dir, tmp_path_factory.mktemp("arrays_ds") / "dataset"))


@pytest.mark.slow  # the module's dataset: materialize of 4,000 rows with fallback fitting, ~40-80 s here
def test_the_new_types_are_written_as_fixed_length_arrays(dataset):
    meta = json.loads(Path(dataset.features_json).read_text())
    cols = {c["name"]: c for c in meta["columns"]}
    assert cols["emb"] == {"name": "emb", "dtype": "array<float>", "feature": "emb", "role": "block", "width": 4}
    feats = {f["name"]: f for f in meta["features"]}
    vocab = feats["title"]["vocabulary"]
    assert set(vocab) == {"great", "awful", *"alpha beta gamma delta eps zeta eta theta iota kappa".split()}
    assert cols["title"]["length"] == 8 and cols["title"]["cardinality"] == len(vocab) + 2
    assert sorted(feats["tags"]["vocabulary"]) == ["vip", "w", "x", "y", "z"]  # trimmed
    assert cols["tags"]["pooling"] == "sum" and cols["title"]["pooling"] == "mean"
    assert feats["day"]["format"] == "yyyy/MM/dd" and len(feats["emb"]["scale"]["mean"]) == 4
    from sparktrain.data import commit

    table = pq.read_table(commit.resolve(str(Path(dataset.path) / "train")))  # the committed generation
    assert str(table.schema.field("emb").type) == "list<element: float>"
    rows = table.slice(0, 50).to_pylist()
    assert all(len(r["emb"]) == 4 and len(r["title"]) == 8 and len(r["tags"]) == 4 for r in rows)
    great, vip = vocab.index("great") + 2, feats["tags"]["vocabulary"].index("vip") + 2
    for r in rows:  # five tokens then padding; one or two items then padding
        assert r["title"][5:] == [0, 0, 0] and all(t >= 2 for t in r["title"][:5])
        assert r["tags"][2:] == [0, 0] and r["tags"][0] >= 2
    assert any(great in r["title"] for r in rows) and any(vip in r["tags"] for r in rows)
    assert {r["day_month"] for r in table.select(["day_month"]).to_pylist()} == set(range(12))


def _accuracy(spark, dataset, raw_dir, est):
    from pyspark.ml import PipelineModel

    est.show_progress = False
    net = est.fit(dataset.path)
    assert [c for c, _ in net.inputs.vectors] == ["emb"]
    assert [(c, n, p) for c, n, _, p in net.inputs.bags] == [("title", 8, "mean"), ("tags", 4, "sum")]
    model = PipelineModel(stages=[*PipelineModel.load(dataset.pipeline_model).stages, net])
    raw = spark.read.parquet(str(raw_dir))
    scored = model.transform(raw)
    return scored.selectExpr("avg(CAST(prediction = label AS DOUBLE))").first()[0], net


@pytest.mark.slow
@pytest.mark.torch
def test_torch_learns_from_every_new_type_and_scores_the_raw_frame(spark, dataset, raw_dir, tmp_path, caplog,
                                                                   restore_mlflow_uri):
    import mlflow
    from mlflow.models import Model

    from sparktrain.serve.pyfunc import log_pyfunc_model
    from sparktrain.train.estimator import TorchEstimator

    est = TorchEstimator(labelCol="label", numWorkers=1, epochs=12, batchSize=64, learningRate=0.01,
                         store=str(tmp_path / "store"))
    acc, net = _accuracy(spark, dataset, raw_dir, est)
    assert acc > 0.93, acc  # without any one of the four signals the best is ~0.81
    # logged to MLflow: no input example (MLflow would predict it outside Spark, which text features refuse)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = mlflow.MlflowClient().create_run(mlflow.MlflowClient().create_experiment("arrays")).info.run_id
    example = spark.read.parquet(str(raw_dir)).limit(3).toPandas()
    with caplog.at_level("INFO", logger="sparktrain.serve.pyfunc"):
        info = log_pyfunc_model(net, dataset.path, run, input_example=example)
    assert "without an input example: a feature of it is applied by Spark only" in caplog.text
    assert Model.load(info.model_uri).saved_input_example_info is None and info.signature is not None


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_learns_from_every_new_type_and_scores_the_raw_frame(spark, dataset, raw_dir, tmp_path):
    from sparktrain.train.estimator import KerasEstimator

    est = KerasEstimator(labelCol="label", numWorkers=1, epochs=12, batchSize=64, learningRate=0.01,
                         store=str(tmp_path / "store"))
    acc, _ = _accuracy(spark, dataset, raw_dir, est)
    assert acc > 0.93, acc
