"""The same job against a Spark Connect server (sc://): preprocess, barrier training, MLflow, scoring, from the CLI."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests._connect import connect_env, connect_server

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.connect


_env = connect_env


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """A real Spark Connect server (local[2], 127.0.0.1, free port) in its own JVM; yields its sc:// URL."""
    with connect_server(tmp_path_factory.mktemp("connect"), "sparktrain-connect-test") as url:
        yield url


def _sparktrain(cwd, *args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "sparktrain", *map(str, args)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _assert_close(a, b, path="features"):
    """Equal JSON, floats to 1e-9 relative."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (path, sorted(a), sorted(b))
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def test_preprocess_and_train_over_spark_connect(connect_url, spark, flights_sample, tmp_path):
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize
    from sparktrain.jvm import local_path

    sample = os.path.dirname(local_path(flights_sample.inputFiles()[0]))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [f"data.source={sample}", f"output.path={tmp_path / 'dataset'}", f"train.store={tmp_path / 'store'}",
                 "train.epochs=2", "train.num_workers=2", "train.compare_baseline=false", f"tracking.uri={tracking}",
                 "tracking.model_name=connect-model"]
    sets = [x for o in overrides for x in ("--set", o)]
    config = REPO / "conf" / "flights.yaml"

    rc, out, err = _sparktrain(tmp_path, "preprocess", config, "--master", connect_url, *sets)
    assert rc == 0, err[-3000:]
    assert "SparkSession ready: master local[2]" in err  # the client reads the server's master
    from sparktrain.data.commit import resolve
    from sparktrain.data.manifest import committed_files

    remote = json.loads((Path(resolve(str(tmp_path / "dataset"))) / "features.json").read_text())

    # the same job on the classic local session: the same splits and the same fitted values
    cfg = load_config(config, overrides=overrides)
    local = materialize(spark, replace(cfg, output=replace(cfg.output, path=str(tmp_path / "local"))))
    for split, rows in local.row_counts.items():
        assert remote["dataset"]["splits"][split]["rows"] == rows
        got, want = (pq.read_table(committed_files(str(root / split))).sort_by("flight_id")
                     for root in (tmp_path / "dataset", tmp_path / "local"))
        assert got.schema == want.schema and got.equals(want), split  # the same rows, features and values
    _assert_close(remote["features"], local.features["features"])
    assert remote["columns"] == local.features["columns"]
    # no JVM on a Connect client: no lineage listener, so no sources (the splits are the lineage)
    assert "sources" not in remote["dataset"] and local.features["dataset"]["sources"]

    rc, out, err = _sparktrain(tmp_path, "train", config, "--master", connect_url, *sets)
    assert rc == 0, err[-3000:]
    assert "training torch (ddp) with 2 workers" in err
    assert "cannot tell how many tasks" not in err  # the slot check read local[2] from the server
    auc = float(re.search(r"^  test_auc\s+([0-9.]+)", out, re.MULTILINE).group(1))
    assert 0.75 < auc <= 1.0, out
    assert re.search(r"^epochs: 2 ", out, re.MULTILINE), out

    # MLflow: the run, its metric and the registered model, logged from the Connect client
    from mlflow import MlflowClient

    client = MlflowClient(tracking, tracking)
    version = client.get_model_version_by_alias("connect-model", "champion")
    assert str(version.version) == "1"
    assert client.get_run(version.run_id).data.metrics["test_auc"] == pytest.approx(auc, abs=1e-4)

    # scoring through Connect with the registered model (it carries the fitted feature pipeline)
    rc, out, err = _sparktrain(tmp_path, "score", "--model", "models:/connect-model@champion", "--input", sample,
                               "--output", tmp_path / "scored", "--tracking-uri", tracking, "--master", connect_url)
    assert rc == 0, err[-3000:]
    scored = pq.read_table(committed_files(str(tmp_path / "scored")))
    assert scored.num_rows == flights_sample.count()
    probability = scored.column("probability").to_numpy()
    assert ((probability > 0) & (probability < 1)).all()
    assert set(scored.column("prediction").to_pylist()) == {0.0, 1.0}
