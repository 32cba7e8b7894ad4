"""No secret at rest: plant secrets where a real job uses them, run it, grep every file it wrote.

Where the secrets are planted, and why the job still works with them:

* ``spark.conf.spark.hadoop.fs.s3a.secret.key`` (and ``...access.key``): the
  usual way to give Spark's S3A connector credentials; set on the session,
  never used by a job on local files.
* ``spark.conf.spark.executorEnv.AWS_SECRET_ACCESS_KEY``: how a cluster job
  hands S3 credentials to pyarrow on the executors; an environment variable
  of the Python workers, unused here.
* ``tracking.uri = http://sweep-user:<password>@127.0.0.1:<port>``: a real
  MLflow server without authentication; MLflow's client sends the password
  as a Basic header, which the server ignores (the CLI sweep only: a sqlite
  URI cannot carry a password).
* ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` in the job's
  environment, which MLflow's client reads (the CLI sweep).
* a trial whose objective fails quoting credentials the way libraries do: a
  URL with a password, ``password=...``, a ``Basic`` header, JSON
  ``"api_key": ...``; its error and traceback go to MLflow (tag
  ``sparktrain.error``, ``error.txt``, ``tune/trials.json``) and the logs.
* a fit whose model factory fails on the executor with ``token=...`` in its
  message: the failure travels through the store (``failures/``), the
  progress channel and Spark's task error to the driver.

Every file under the test's folder is then read as bytes: the store, the
materialized dataset, the MLflow database (and its journal), its artifacts,
the server's log, the job's working folder, its captured stdout and stderr.
Zero hits, and the job's results are checked, so the test cannot pass by
doing nothing.  The job runs as the console script does (``cli.main``), in a
process of its own, so the Spark conf is the session's and stderr is the
JVM's too.  It takes a minute or more (slow); the default suite's variant is
``test_no_secret_at_rest`` in tests/track/test_job.py (the shared job, a
failing search, a failing fit; files and records, not a fresh process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._sweep import FIT_ERROR, SECRETS, TRIAL_ERROR, leaks

REPO = Path(__file__).resolve().parents[2]


def _raw(tmp_path: Path, rows: int = 600) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "raw" / "part-0.parquet"
    path.parent.mkdir()
    x1 = [((i * 37) % 101) / 50.0 - 1 for i in range(rows)]
    x2 = [((i * 53) % 97) / 48.0 - 1 for i in range(rows)]
    pq.write_table(pa.table({"x1": x1, "x2": x2, "kind": [["a", "b", "c"][i % 3] for i in range(rows)],
                             "label": [a + 0.5 * b > 0 for a, b in zip(x1, x2, strict=True)]}), path)
    return path.parent


def _config(tmp_path: Path, tracking_uri: str, artifacts: str, tune: bool) -> dict:
    cfg = {
        "name": "sweep",
        "spark": {"conf": {"spark.hadoop.fs.s3a.access.key": SECRETS["s3a_id"],
                           "spark.hadoop.fs.s3a.secret.key": SECRETS["s3a"],
                           "spark.executorEnv.AWS_SECRET_ACCESS_KEY": SECRETS["executor_env"],
                           "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}},
        "data": {"source": str(tmp_path / "raw"), "label": "label"},
        "features": [{"name": "x1", "type": "numeric"}, {"name": "x2", "type": "numeric"},
                     {"name": "kind", "type": "categorical"}],
        "output": {"path": str(tmp_path / "dataset")},
        "train": {"num_workers": 1, "epochs": 1, "batch_size": 64, "store": str(tmp_path / "store"),
                  "compare_baseline": False, "hidden_units": [8]},
        "tracking": {"uri": tracking_uri, "artifact_location": artifacts, "experiment": "sweep",
                     "model_name": "sweep-model"},
    }
    if tune:
        cfg["tune"] = {"max_trials": 2, "parallelism": 1, "algo": "random",
                       "space": {"learning_rate": {"loguniform": [1.0e-3, 1.0e-2]}}}
    return cfg


_CLI_JOB = '''
import logging
from sparktrain import cli
from sparktrain.config import load_config
from sparktrain.errors import SparktrainError

rc = cli.main(["run", {config!r}, "--master", "local[2]"])  # the console script's code: logging, filter, job
print("JOB RC", rc, flush=True)
from pyspark.sql import SparkSession
from sparktrain.train.estimator import TorchEstimator
from sparktrain.tune.search import run_search


def failing_objective(params):
    raise ConnectionError({trial_error!r})


def failing_factory(inputs, model_spec):
    raise RuntimeError({fit_error!r})


spark = SparkSession.getActiveSession()
cfg = load_config({config!r})
log = logging.getLogger("sparktrain.sweep")
try:
    run_search(spark, cfg, None, tracking_uri=cfg.tracking.uri, objective=failing_objective)
except SparktrainError as exc:
    log.error("search failed: %s", exc)                     # unmasked text: the CLI's log filter masks it
try:
    TorchEstimator(numWorkers=1, epochs=1, labelCol="label", store={store!r}).setModelFactory(
        failing_factory).fit({dataset!r})
except SparktrainError:
    log.exception("fit failed")
print("SWEEP DONE", flush=True)
'''


@pytest.mark.slow
@pytest.mark.torch
def test_a_cli_job_with_a_password_in_its_tracking_uri_leaves_no_secret(tmp_path):
    """``sparktrain run`` (preprocess, train, tune, MLflow server) then a failing search and fit, one process."""
    import yaml
    from mlflow import MlflowClient

    from sparktrain.track.server import MlflowServer

    _raw(tmp_path)
    with MlflowServer(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}", str(tmp_path / "mlflow" / "artifacts"),
                      log_path=str(tmp_path / "mlflow" / "server.log")) as server:
        uri = server.url.replace("http://", f"http://sweep-user:{SECRETS['uri_password']}@")
        config = tmp_path / "input" / "job.yaml"  # the job's input: the only file that may hold the secrets
        config.parent.mkdir()
        config.write_text(yaml.safe_dump(_config(tmp_path, uri, str(tmp_path / "mlflow" / "artifacts"), tune=True)))
        script = _CLI_JOB.format(config=str(config), store=str(tmp_path / "store"), dataset=str(tmp_path / "dataset"),
                                 trial_error=TRIAL_ERROR, fit_error=FIT_ERROR)
        work = tmp_path / "work"
        work.mkdir()
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO / "python"),
                   MLFLOW_TRACKING_USERNAME="sweep-user", MLFLOW_TRACKING_PASSWORD=SECRETS["env_password"])
        for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS"):
            env.pop(key, None)
        proc = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        (tmp_path / "job.stdout").write_text(proc.stdout)
        (tmp_path / "job.stderr").write_text(proc.stderr)
        assert "JOB RC 0" in proc.stdout and "SWEEP DONE" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
        client = MlflowClient(server.url, registry_uri=server.url)  # not the registry URI an earlier test set
        versions = client.search_model_versions("name = 'sweep-model'")
        runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id], max_results=100)
    # the train stage's model, the search's best
    assert sorted(v.version for v in versions) == ["1", "2"], proc.stdout[-3000:] + proc.stderr[-6000:]
    assert sum(r.data.tags.get("sparktrain.kind") == "trial" and r.info.status == "FAILED" for r in runs) == 2
    assert sum(r.data.tags.get("sparktrain.kind") == "trial" and r.info.status == "FINISHED" for r in runs) == 2
    assert "password=***" in proc.stderr and "cannot fetch the pretrained weights with token=***" in proc.stderr
    assert leaks([p for p in tmp_path.iterdir() if p.name != "input"], {}) == []
