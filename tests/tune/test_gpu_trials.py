"""GPU-aware trials: a search's trials ask for ``train.gpus_per_worker`` through stage-level scheduling.

As tests/train/test_gpu.py does for fits: a standalone ``local-cluster[2,1,1024]`` whose Workers
discover fake GPUs "3" and "5" with a discovery script (no CUDA here: the trials train on CPU).
Single-task trials and a distributed trial on a reused gang must each get GPU addresses from
their tasks' resources, and the driver logs the ResourceProfile it asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_gpu import _DISCOVERY

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
sys.path.insert(0, {python!r})
from pyspark.sql import functions as F
from sparktrain.config import parse_config
from sparktrain.data.manifest import write_parquet
from sparktrain.session import get_or_create_session
from sparktrain.tune.search import run_search

spark = get_or_create_session("local-cluster[2,1,1024]", conf={{
    "spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": {script!r},
    "spark.executor.resource.gpu.amount": "1", "spark.executor.cores": "1", "spark.executor.memory": "768m",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.ui.enabled": "false"}})
root = {data!r}
df = spark.range(2000).select((F.rand(3) * 2 - 1).cast("float").alias("x1"),
                              (F.rand(4) * 2 - 1).cast("float").alias("x2"))
df = df.withColumn("label", F.col("x1") + 0.5 * F.col("x2") > 0)
write_parquet(df.where("x2 > -0.6").coalesce(1), root + "/train")
write_parquet(df.where("x2 <= -0.6").coalesce(1), root + "/validation")
out = {{}}
for mode, workers, trials in (("single", 1, 2), ("distributed", 2, 1)):
    cfg = parse_config({{
        "data": {{"label": "label"}}, "tracking": {{"enabled": False}},
        "train": {{"epochs": 1, "batch_size": 256, "num_workers": workers, "gpus_per_worker": 1,
                   "store": {store!r}}},
        "tune": {{"mode": mode, "max_trials": trials, "parallelism": 2, "algo": "random",
                  "space": {{"learning_rate": {{"loguniform": [1.0e-3, 1.0e-2]}}}}}}}})
    result = run_search(spark, cfg, root)
    out[mode] = [{{"status": t.status, "gpus": list(t.gpus), "error": t.error, "epochs": t.epochs}}
                 for t in result.trials]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.torch
def test_each_trial_trains_on_the_gpus_its_tasks_were_given(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text(_DISCOVERY.format(dir=tmp_path))
    script.chmod(0o755)
    code = _SCRIPT.format(python=str(REPO / "python"), script=str(script), data=str(tmp_path / "data"),
                          store=str(tmp_path / "store"))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                          cwd=str(tmp_path))
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-8000:]
    out = json.loads(line[0][len("RESULT "):])
    single = out["single"]
    assert [t["status"] for t in single] == ["FINISHED", "FINISHED"], single
    assert all(t["epochs"] == 1 for t in single), single
    for t in single:  # one address each, from the task's resources (the Workers have "3" and "5")
        assert len(t["gpus"]) == 1 and t["gpus"][0] in ("3", "5"), single
    [gang] = out["distributed"]
    assert gang["status"] == "FINISHED", gang
    assert sorted(gang["gpus"]) == ["3", "5"], gang  # rank 0 and rank 1, a GPU each
    # the trials' stages asked for the GPU through a ResourceProfile (not the session's task resources)
    asked = [x for x in proc.stderr.splitlines() if "each task asks for 1 GPU(s)" in x and "ResourceProfile" in x]
    assert len(asked) >= 2, proc.stderr[-4000:]
