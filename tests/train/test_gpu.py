"""GPUs as Spark task resources: stage-level scheduling, each rank's device from its task, the GPU slot check.

No GPU in CI: a standalone ``local-cluster[2,1,1024]`` whose Workers discover fake GPUs with a
discovery script (as xgboost's and joblibspark's tests do).  The script hands each Worker a
different address ("3" and "5": not the ranks' numbers), so a rank that picked its device by
rank would be caught.  Without CUDA the ranks train on CPU and say so.  Tests that need a real
CUDA device are marked ``gpu`` and skip elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_DISCOVERY = """#!/bin/bash
# a different fake GPU address for every Worker that asks: 3, 5, 7, ...
exec 9>"{dir}/lock"
flock 9
n=$(cat "{dir}/count" 2>/dev/null || echo 0)
echo $((n + 1)) > "{dir}/count"
echo "{{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"$((2 * n + 3))\\"]}}"
"""

_SCRIPT = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
sys.path.insert(0, {python!r})
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from sparktrain.session import get_or_create_session
from sparktrain.data import build_manifest, write_manifest
from sparktrain.errors import PreflightError
from sparktrain.train.estimator import KerasEstimator, TorchEstimator

spark = get_or_create_session("local-cluster[2,1,1024]", conf={{
    "spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": {script!r},
    "spark.executor.resource.gpu.amount": "1", "spark.executor.cores": "1", "spark.executor.memory": "768m",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.ui.enabled": "false"}})
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 2)).astype("float32")
root = {data!r}
pq.write_table(pa.table({{"a": x[:, 0], "b": x[:, 1], "label": (x[:, 0] > 0).astype("float32")}}),
               root + "/part-0.parquet")
write_manifest(root, build_manifest(root))
out = {{}}
for name, cls in (("torch", TorchEstimator), ("keras", KerasEstimator)):
    est = cls(numWorkers=2, gpusPerWorker=1, epochs=1, batchSize=128, labelCol="label", store={store!r})
    est.show_progress = False
    model = est.fit(root)
    out[name] = {{"devices": est.last_launch.devices, "history": model.history}}
try:  # fp16 where the ranks have no CUDA: refused on the rank, not trained unscaled on CPU (probe U)
    TorchEstimator(numWorkers=2, gpusPerWorker=1, epochs=1, precision="fp16", labelCol="label",
                   store={store!r}).fit(root)
    out["fp16"] = "not refused"
except Exception as e:
    out["fp16"] = str(e)
try:
    TorchEstimator(numWorkers=2, gpusPerWorker=2, epochs=1, labelCol="label", store={store!r}).fit(root)
    out["preflight"] = "not refused"
except PreflightError as e:
    out["preflight"] = str(e)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.cluster
@pytest.mark.slow
def test_each_rank_trains_on_the_gpu_its_task_was_given(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text(_DISCOVERY.format(dir=tmp_path))
    script.chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    code = _SCRIPT.format(python=str(REPO / "python"), script=str(script), data=str(data),
                          store=str(tmp_path / "store"))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-8000:]
    out = json.loads(line[0][len("RESULT "):])
    for framework in ("torch", "keras"):
        devices = {int(rank): d for rank, d in out[framework]["devices"].items()}
        assert sorted(devices) == [0, 1], (framework, devices)
        addresses = sorted(a for d in devices.values() for a in d["addresses"])
        assert addresses == ["3", "5"], (framework, devices)  # one distinct address each, from the task
        assert all(d["device"] == "cpu" for d in devices.values()), devices  # no CUDA here
        assert all("training on CPU" in d["note"] for d in devices.values()), devices
        assert len(out[framework]["history"]) == 1 and out[framework]["history"][0]["train_loss"] > 0
    assert out["preflight"].startswith("gpusPerWorker = 2 x numWorkers = 2 needs 2 GPU task slot(s), but the "
                                       "cluster's executors hold 2 GPU(s) (1, 1 per executor), room for 0 rank(s)")
    assert "no executor holds 2 GPU(s): lower gpusPerWorker (train.gpus_per_worker) to <= 1" in out["preflight"]
    assert "parameter 'precision' = 'fp16': fp16 is mixed precision for GPUs, and this rank has none (it " \
           "trains on cpu)" in out["fp16"], out["fp16"][:3000]
    # the driver logged one line per rank with its addresses and device
    logged = [x for x in proc.stderr.splitlines() if "GPU addresses" in x and "from its task's resources" in x]
    assert len(logged) >= 4, proc.stderr[-4000:]


def test_a_gpu_request_on_a_master_that_gives_no_gpu_warns_and_fp16_is_refused_before_any_job(spark, tmp_path,
                                                                                               caplog):
    """Probe U: on local[N] without task GPUs, gpusPerWorker=1 trained on CPU with INFO lines only, and fp16
    (refused without a GPU request) trained on CPU with no loss scaling."""
    import logging

    from sparktrain.errors import ConfigError
    from sparktrain.train import resources
    from sparktrain.train.estimator import TorchEstimator

    df = spark.range(64).selectExpr("cast(id as double) as x", "cast(id % 2 as double) as label")
    est = TorchEstimator(numWorkers=1, gpusPerWorker=1, precision="fp16", epochs=1, store=str(tmp_path / "s"))
    est.show_progress = False
    with pytest.raises(ConfigError, match=r"^parameter 'precision' = 'fp16': fp16 is mixed precision for GPUs, "
                                          r"and this rank has none \(gpusPerWorker = 1, but master local"
                                          r".* gives tasks no GPU\).* Fix: precision bf16"):
        est.fit(df)
    assert not [r for r in (tmp_path / "s").rglob("checkpoints/*")]  # refused in preflight: nothing trained
    resources._said.discard("local-no-gpu")
    with caplog.at_level(logging.WARNING, logger="sparktrain.train.resources"):
        resources.check_gpu_slots(spark, 1, 1, "fp32")
    assert any(r.levelno == logging.WARNING and "gpusPerWorker = 1 on master local" in r.getMessage() and
               "the ranks train on CPU" in r.getMessage() for r in caplog.records), caplog.records


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.torch
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (none here)")
def test_torch_trains_on_its_cuda_device_in_fp16_and_bf16(spark, tmp_path):
    """On a GPU machine: one rank on cuda:<its address>, fp16 with a loss scaler and bf16 both learn."""
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet
    from sparktrain.train.estimator import TorchEstimator

    df = spark.range(4096).select((F.rand(1) * 2 - 1).cast("float").alias("x"))
    write_parquet(df.withColumn("label", (F.col("x") > 0).cast("float")), str(tmp_path / "ds" / "train"))
    for precision in ("fp16", "bf16"):
        est = TorchEstimator(numWorkers=1, gpusPerWorker=1, precision=precision, epochs=2, labelCol="label",
                             store=str(tmp_path / "store"))
        est.show_progress = False
        model = est.fit(str(tmp_path / "ds"))
        assert est.last_launch.devices[0]["device"].startswith("cuda"), est.last_launch.devices
        assert model.history[-1]["train_accuracy"] > 0.9
