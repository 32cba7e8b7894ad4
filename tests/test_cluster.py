"""The same jobs on a real Spark standalone cluster: a Master and 2 Workers, each its own JVM, on 127.0.0.1.

The module fixture ``standalone_cluster`` starts the daemons with pyspark's
own ``bin/spark-class`` (free ports, work and local dirs under tmp, logs
beside them), waits until the master's JSON lists both workers ALIVE, yields
the master URL and kills the daemons' process groups (executors included) at
teardown.

A SparkSession is per process and the suite's ``spark`` fixture is
``local[2]``, so every cluster job runs as a driver SUBPROCESS given the
master URL, sized so that each Worker (1 core, 1 GB) hosts one 1-core
executor: ``spark.executor.cores=1``, ``spark.cores.max=2``,
``spark.task.cpus=1``, ``spark.executor.memory=768m``.  Barrier mode then
needs both executors, so the two ranks cannot share a JVM.

Cost on 2 busy cores: the cluster starts in 15-45 s and each driver needs
20-60 s for its session, so only the estimator test runs by default; the
whole CLI job (profile, preprocess, train, MLflow registry) is ``slow``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyspark
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
CONSOLE_SCRIPT = Path(sys.executable).with_name("sparktrain")
WORKERS = 2
#: What each driver asks of the cluster: one 1-core executor per Worker (2 slots).  With
#: minRegisteredResourcesRatio=1 the SparkContext waits (up to 30 s) for both executors, so the
#: barrier preflight never counts slots before the executors have registered.
CLUSTER_CONF = {
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.task.cpus": "1",
    "spark.executor.memory": "768m",
    "spark.driver.memory": "1g",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.sql.shuffle.partitions": "2",
}


# ---------------------------------------------------------------- the cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@dataclass
class StandaloneCluster:
    """A running Master and its Workers (``master_url`` is what drivers connect to)."""

    master_url: str
    master_ui: str
    worker_uis: list[str]
    base: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def state(self) -> dict:
        """The master's ``/json/`` (workers, apps)."""
        return _get_json(f"{self.master_ui}/json/")

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log\n{_tail(self.base / f'{name}.log')}" for name in self.procs)

    def stop(self) -> None:
        """SIGTERM each daemon's process group (its executors and their Python workers too), then SIGKILL."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group may outlive its leader (an executor JVM); this session owns the whole group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _daemon_env(base: Path) -> dict[str, str]:
    conf_dir = base / "conf"  # empty: nothing from a user's SPARK_CONF_DIR leaks in
    conf_dir.mkdir(exist_ok=True)
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(conf_dir),
               SPARK_DAEMON_MEMORY="512m", SPARK_LOCAL_DIRS=str(base / "local"))
    for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS", "SPARK_MASTER"):
        env.pop(key, None)
    return env


def _spawn(cluster: StandaloneCluster, name: str, args: list[str], env: dict[str, str]) -> None:
    log = open(cluster.base / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps writing to it
    cluster.procs[name] = subprocess.Popen([str(SPARK_CLASS), *args], cwd=cluster.base, env=env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
    log.close()


def start_standalone_cluster(base: Path, workers: int = WORKERS, timeout: float = 240.0) -> StandaloneCluster:
    """Start a Master and ``workers`` Workers (1 core, 1 GB each) on 127.0.0.1; return once all are ALIVE."""
    base.mkdir(parents=True, exist_ok=True)
    env = _daemon_env(base)
    port, ui = _free_port(), _free_port()
    worker_uis = [_free_port() for _ in range(workers)]
    cluster = StandaloneCluster(master_url=f"spark://127.0.0.1:{port}", master_ui=f"http://127.0.0.1:{ui}",
                                worker_uis=[f"http://127.0.0.1:{p}" for p in worker_uis], base=base)
    # Workers retry their registration, so all daemons start at once (the JVMs' start-up overlaps).
    _spawn(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env)
    for i, wport in enumerate(worker_uis):
        work = base / f"worker{i}"
        work.mkdir(exist_ok=True)
        _spawn(cluster, f"worker{i}", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                       "--cores", "1", "--memory", "1g", "--webui-port", str(wport),
                                       "--work-dir", str(work), cluster.master_url], env)
    deadline = time.monotonic() + timeout
    alive = 0
    try:
        while time.monotonic() < deadline:
            dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"Spark daemon(s) {dead} exited during start-up:\n{cluster.logs()}")
            try:
                state = cluster.state()
                alive = sum(1 for w in state["workers"] if w["state"] == "ALIVE")
                if state["status"] == "ALIVE" and alive == workers:
                    return cluster
            except (OSError, ValueError):  # the master's UI is not up yet
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{alive}/{workers} workers registered with {cluster.master_url} after "
                           f"{timeout:.0f} s:\n{cluster.logs()}")
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """A real standalone cluster (Master + 2 Workers, separate JVMs, 127.0.0.1); yields the cluster object."""
    cluster = start_standalone_cluster(tmp_path_factory.mktemp("standalone"))
    yield cluster
    cluster.stop()


def kill_a_worker_mid_run(base: Path, script, started) -> tuple:
    """Run a driver on a fresh cluster and SIGKILL a Worker (its JVM and executor) once ``started()`` holds.

    ``script(master_url, conf_json)`` is the driver's Python code; it prints one ``RESULT {json}`` line.
    Returns ``(result, stderr, seconds from the kill to the driver's end)``.
    """
    cluster = start_standalone_cluster(base / "cluster")
    try:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        proc = subprocess.Popen([sys.executable, "-c", script(cluster.master_url, json.dumps(CLUSTER_CONF))],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 400
        running = False
        while time.monotonic() < deadline and not running and proc.poll() is None:
            running = started()
            time.sleep(0.5)
        assert running, proc.communicate(timeout=60)
        os.killpg(cluster.procs["worker1"].pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=600)
        ended = time.monotonic() - killed
    finally:
        cluster.stop()
    lines = [json.loads(x.split(" ", 1)[1]) for x in out.splitlines() if x.startswith("RESULT ")]
    assert lines, out[-3000:] + err[-6000:]
    return lines[0], err, ended


# ---------------------------------------------------------------- drivers


def _driver_env() -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO / "python"))
    for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    return env


def _run_driver(cmd: list[str], cwd: Path, timeout: float = 540) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_driver_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _app_executors(cluster: StandaloneCluster, app_id: str) -> dict[str, list[str]]:
    """Executor ids of ``app_id`` that each Worker ran (live or finished), by Worker UI."""
    out = {}
    for ui in cluster.worker_uis:
        state = _get_json(f"{ui}/json/")
        out[ui] = sorted(str(e["id"]) for e in state["executors"] + state["finishedexecutors"]
                         if e.get("appid") == app_id)
    return out


# ---------------------------------------------------------------- (b) the estimator on the cluster

_FIT_SCRIPT = r"""
import json, sys, urllib.request
from sparktrain.errors import PreflightError
from sparktrain.session import get_or_create_session
from sparktrain.train.estimator import TorchEstimator

master, dataset, store, conf = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
spark = get_or_create_session(master, "sparktrain-cluster-fit", dict(conf, **{
    "spark.ui.enabled": "true", "spark.ui.port": "0"}))  # the driver's REST API tells where tasks ran
sc = spark.sparkContext
out = {"master": sc.master, "app_id": sc.applicationId}
try:
    TorchEstimator(numWorkers=3, epochs=1, labelCol="label", store=store).fit(dataset)
except PreflightError as exc:
    out["three_workers_error"] = str(exc)

sc.setJobGroup("sparktrain-fit", "TorchEstimator.fit")
est = TorchEstimator(numWorkers=2, epochs=2, batchSize=256, learningRate=0.01, labelCol="label", store=store,
                     logEverySteps=5)
est.show_progress = False
model = est.fit(dataset)
sc.setJobGroup("sparktrain-transform", "transform")
launch = est.last_launch
out["param_digests"] = {str(k): v for k, v in launch.param_digests.items()}
out["hosts"] = {str(k): v for k, v in launch.hosts.items()}
out["history"] = model.history

api = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
get = lambda path: json.load(urllib.request.urlopen(api + path, timeout=10))
stages = []
for job in get("/jobs"):
    if job.get("jobGroup") != "sparktrain-fit":
        continue
    for sid in job["stageIds"]:
        for att in get(f"/stages/{sid}"):
            if att["status"] == "COMPLETE" and att["numTasks"] == 2:
                tasks = get(f"/stages/{sid}/{att['attemptId']}/taskList")
                stages.append({str(t["index"]): t["executorId"] for t in tasks if t["status"] == "SUCCESS"})
out["two_task_stages"] = stages
out["executors"] = sorted(e["id"] for e in get("/executors") if e["id"] != "driver")

test = spark.read.parquet(dataset + "/test")
row = model.transform(test).selectExpr(
    "count(*) AS n", "avg(cast(prediction = cast(label AS double) AS double)) AS acc",
    "min(probability) AS lo", "max(probability) AS hi").first()
out["scored"] = row.asDict()
out["test_rows"] = test.count()
print("RESULT " + json.dumps(out), flush=True)
spark.stop()
"""


def _synthetic(spark, n: int):
    from pyspark.sql import functions as F

    df = spark.range(n).select((F.rand(1) * 2 - 1).cast("float").alias("x1"),
                               (F.rand(2) * 2 - 1).cast("float").alias("x2"),
                               (F.col("id") % 7).cast("int").alias("c1"))
    return df.withColumn("label", F.col("x1") + F.col("x2") * 0.5 + (F.col("c1") == 3).cast("float") > 0.2)


@pytest.mark.cluster
@pytest.mark.torch
def test_torch_estimator_ranks_in_different_executor_jvms(standalone_cluster, spark, tmp_path):
    from sparktrain.data.manifest import write_parquet

    dataset = tmp_path / "ds"  # written by the local session: the cluster's time goes to training
    df = _synthetic(spark, 6_001).cache()
    for name, cond in (("train", "x2 > -0.6"), ("validation", "x2 <= -0.6 and x2 > -0.8"), ("test", "x2 <= -0.8")):
        write_parquet(df.where(cond).coalesce(1), str(dataset / name))
    df.unpersist()

    script = tmp_path / "fit_on_cluster.py"
    script.write_text(_FIT_SCRIPT)
    proc = _run_driver([sys.executable, script, standalone_cluster.master_url, dataset, tmp_path / "store",
                        json.dumps(CLUSTER_CONF)], tmp_path)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n{standalone_cluster.logs()}"
    out = json.loads(line[0][len("RESULT "):])

    assert out["master"] == standalone_cluster.master_url
    # preflight counts the cluster's slots: 2 one-core executors
    assert "numWorkers = 3, but the cluster can run only 2 task(s) at once" in out["three_workers_error"]
    # both ranks trained and DDP kept their parameters identical
    assert set(out["param_digests"]) == {"0", "1"}
    assert out["param_digests"]["0"] == out["param_digests"]["1"]
    assert [h["epoch"] for h in out["history"]] == [0, 1]
    assert out["history"][-1]["val_auc"] > 0.9
    # ...in two different executor JVMs: the barrier stage's task for rank i ran on executor e_i, e_0 != e_1
    assert len(out["executors"]) == 2
    barrier = [s for s in out["two_task_stages"] if set(s) == {"0", "1"}]
    assert barrier, out["two_task_stages"]
    for stage in barrier:
        assert stage["0"] != stage["1"] and set(stage.values()) == set(out["executors"])
    # ...and each Worker JVM launched exactly one of those executors
    by_worker = _app_executors(standalone_cluster, out["app_id"])
    assert sorted(len(v) for v in by_worker.values()) == [1, 1], by_worker
    assert sorted(e for v in by_worker.values() for e in v) == out["executors"]
    # the fitted model scores on the cluster
    scored = out["scored"]
    assert scored["n"] == out["test_rows"] > 200
    assert scored["acc"] > 0.85 and 0.0 <= scored["lo"] <= scored["hi"] <= 1.0


# ---------------------------------------------------------------- (a) the whole CLI job, unchanged


@pytest.fixture(scope="module")
def flights_tiny(spark, flights_df, tmp_path_factory) -> str:
    """About 2% of flights (~6.5k rows), written once to Parquet; returns its path."""
    path = tmp_path_factory.mktemp("flights_tiny") / "raw.parquet"
    flights_df.where("abs(hash(flight_id)) % 50 = 0").coalesce(1).write.parquet(str(path))
    return str(path)


def _job_yaml(tmp_path: Path, source: str) -> Path:
    """A small job: the features and split of conf/flights.yaml over ``source``, everything under tmp."""
    flights = yaml.safe_load((REPO / "conf" / "flights.yaml").read_text())
    job = {
        "name": "flights-late-cluster",
        "spark": {"app_name": "sparktrain-flights-cluster"},
        "data": {"source": source, "label": "late", "key": "flight_id"},
        "features": flights["features"],
        "split": flights["split"],
        # relative, as conf/flights.yaml has them (probe Q: the ranks looked for the dataset under their executor's
        # working directory); the driver runs in tmp_path
        "output": {"path": "work/dataset"},
        "train": {"framework": "torch", "num_workers": 2, "epochs": 3, "batch_size": 256,
                  "learning_rate": 0.002, "store": "work/store", "compare_baseline": False},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "artifact_location": str(tmp_path / "mlartifacts"),
                     "experiment": "sparktrain-cluster", "model_name": "flights-late-cluster"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


@pytest.mark.cluster
@pytest.mark.torch
@pytest.mark.slow
def test_cli_job_runs_unchanged_on_the_cluster(standalone_cluster, flights_tiny, tmp_path):
    config = _job_yaml(tmp_path, flights_tiny)
    sets = ["train.epochs=1", *(f"spark.conf.{k}={v}" for k, v in CLUSTER_CONF.items())]
    proc = _run_driver([CONSOLE_SCRIPT, "run", config, "--master", standalone_cluster.master_url,
                        *[a for s in sets for a in ("--set", s)]], tmp_path)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, f"{out[-4000:]}\n{err[-8000:]}\n{standalone_cluster.logs()}"
    assert f"SparkSession ready: master {standalone_cluster.master_url}" in err
    lines = out.splitlines()
    for header in ("== profile of " + flights_tiny, "== preprocess", "== train", "== MLflow"):  # a path: no scale
        assert header in lines, out
    assert re.search(r"^epochs: 1 ", out, re.MULTILINE), out  # --set train.epochs=1 beat the file's 3
    auc = re.search(r"^  test_auc\s+(\d\.\d+)", out, re.MULTILINE)
    assert auc, out
    assert float(auc.group(1)) > 0.6
    assert "model:    registered 'flights-late-cluster' version 1" in out
    assert "alias champion -> this version" in out

    # the executors, not the driver, did the work: both Workers ran one executor of this app
    apps = [a for a in standalone_cluster.state()["completedapps"] if a["name"] == "sparktrain-flights-cluster"]
    assert len(apps) == 1, standalone_cluster.state()["completedapps"]
    by_worker = _app_executors(standalone_cluster, apps[0]["id"])
    assert sorted(len(v) for v in by_worker.values()) == [1, 1], by_worker

    # MLflow: the job run and its stage runs, the master tag, the registered champion
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    exp = client.get_experiment_by_name("sparktrain-cluster")
    runs = client.search_runs([exp.experiment_id])
    jobs = [r for r in runs if r.data.tags.get("sparktrain.kind") == "job"]
    assert len(jobs) == 1
    job = jobs[0]
    assert job.info.status == "FINISHED"
    assert job.data.tags["sparktrain.spark.master"] == standalone_cluster.master_url
    assert job.data.params["train.epochs"] == "1"
    stages = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == job.info.run_id}
    assert {"profile", "preprocess", "train"} <= set(stages)
    assert all(stages[s].info.status == "FINISHED" for s in ("profile", "preprocess", "train"))
    train = stages["train"]
    assert train.data.metrics["test_auc"] == pytest.approx(float(auc.group(1)), abs=1e-4)
    assert client.get_metric_history(train.info.run_id, "val_loss")  # per-epoch metrics from the progress channel
    version = client.get_model_version_by_alias("flights-late-cluster", "champion")
    assert str(version.version) == "1"


# ---------------------------------------------------------------- the docker/ cluster's job (no engine needed)


def test_cluster_config_is_the_demo_job_with_another_master():
    """conf/flights-cluster.yaml differs from conf/flights.yaml only where a cluster must differ."""
    from sparktrain.config import load_config

    local, cluster = load_config(REPO / "conf" / "flights.yaml"), load_config(REPO / "conf" / "flights-cluster.yaml")
    assert cluster.spark.master == "spark://master:7077"
    assert (cluster.name, cluster.data, cluster.features, cluster.split) == (local.name, local.data, local.features,
                                                                           local.split)
    assert cluster.train == replace(local.train, store="/shared/store")
    assert cluster.output == replace(local.output, path="/shared/flights/dataset")
    assert cluster.tracking.uri == "http://mlflow:5000"
    conf = cluster.spark.conf
    slots = int(conf["spark.cores.max"]) // int(conf["spark.task.cpus"])
    assert slots >= cluster.train.num_workers and conf["spark.dynamicAllocation.enabled"] == "false"


def test_compose_file_runs_that_job_on_its_services():
    compose = yaml.safe_load((REPO / "docker" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"master", "worker1", "worker2", "mlflow", "submit"} <= set(services)
    submit = services["submit"]["command"]
    assert submit[:3] == ["spark-submit", "--master", "spark://master:7077"]
    assert submit[-3:] == ["python/sparktrain/__main__.py", "run", "conf/flights-cluster.yaml"]
    assert (REPO / submit[-3]).is_file() and (REPO / submit[-1]).is_file()
    # the lineage listener: the jar the image builds where `make jar` puts it
    from sparktrain.jvm import _DEFAULT_JAR
    assert REPO / submit[submit.index("--jars") + 1] == _DEFAULT_JAR
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert "COPY src/ src/" in dockerfile and "../libs/sparktrain-listener.jar" in dockerfile
    for name, svc in services.items():
        assert "shared:/shared" in svc["volumes"], name  # output.path, train.store and MLflow live there
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # published on the host's loopback only
    workers = [s for s in services.values() if "org.apache.spark.deploy.worker.Worker" in s["command"]]
    cores = sum(int(w["command"][w["command"].index("--cores") + 1]) for w in workers)
    assert cores >= 2  # the barrier stage's 2 ranks fit
