"""The one training loop (train/_executor/loop.py): accumulation, hooks, checkpoints and resume.

The unit tests drive :class:`Loop` with a numpy linear-regression adapter (no Spark, no framework)
over a real Parquet split; the integration tests check that torch and Keras, through their
adapters, give the weights of one large batch when accumulating small ones (plain SGD).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.loop import Adapter, Hook, Loop
from sparktrain.train._executor.reporter import Reporter
from sparktrain.train._executor.spec import CheckpointSpec, InputSpec, OptimSpec, ScalingSpec, WorkerSpec

FEATURES = ("x1", "x2", "x3")
ROWS = 1024
TRUE_W = np.array([0.5, -1.0, 2.0])


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, len(FEATURES))).astype(np.float32)
    y = (x @ TRUE_W + rng.normal(scale=0.1, size=ROWS)).astype(np.float32)
    root = tmp_path_factory.mktemp("loop") / "train"
    root.mkdir()
    table = pa.table({**{c: x[:, i] for i, c in enumerate(FEATURES)}, "label": y})
    pq.write_table(table, str(root / "part-0.parquet"), row_group_size=256)
    from sparktrain.data import build_manifest, write_manifest
    write_manifest(str(root), build_manifest(str(root)))
    return str(root)


class NumpyLinear(Adapter):
    """y = x.w + b trained by plain SGD on the mean squared error; one rank."""

    def __init__(self) -> None:
        self.micro_sizes: List[List[int]] = []

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        return np.asarray(vec, dtype=np.float64)

    def setup(self, loop: Loop) -> None:
        self.lr = loop.learning_rate
        self.w = np.zeros(len(FEATURES) + 1)
        if loop.resume.state is not None:
            self.w = np.frombuffer(loop.resume.state).copy()

    def train_step(self, micros, weight, after_micro):
        rows = sum(len(m[2]) for m in micros)
        grad = np.zeros_like(self.w)
        loss, preds = 0.0, []
        for i, (x_num, _, y) in enumerate(micros):
            xb = np.c_[x_num.astype(np.float64), np.ones(len(y))]
            err = xb @ self.w - y
            grad += 2 * xb.T @ err / rows * weight
            loss += float(err @ err) * weight
            preds.append(xb @ self.w)
            after_micro(i + 1)
        self.micro_sizes.append([len(m[2]) for m in micros])
        self.w = self.w - self.lr * grad
        return loss, np.concatenate(preds)

    def eval_step(self, x_num, x_cat, y):
        xb = np.c_[x_num.astype(np.float64), np.ones(len(y))]
        err = xb @ self.w - y
        return float(err @ err), xb @ self.w

    def state(self) -> bytes:
        return self.w.tobytes()

    def export(self) -> bytes:
        return self.w.tobytes()

    def digest(self) -> str:
        return hashlib.sha256(self.w.tobytes()).hexdigest()


def _spec(split: str, store: str, run: str, **optim: Any) -> WorkerSpec:
    inputs = InputSpec(numeric=FEATURES, categorical=(), label="label", task="regression")
    params = dict(epochs=2, batch_size=256, learning_rate=0.2, seed=1, shuffle_buffer=512)
    params.update(optim)
    return WorkerSpec(framework="numpy", inputs=inputs, train_path=split, val_path=None, store=store, run_id=run,
                      scaling=ScalingSpec(num_workers=1), optim=OptimSpec(**params),
                      checkpoint=CheckpointSpec(checkpoint_every_steps=1, checkpoint_every_s=None))


def _run(spec: WorkerSpec, hooks=(), attempt: int = 0):
    ctx = WorkerContext(rank=0, world_size=1, host="127.0.0.1", master_host="127.0.0.1", master_port=0, aux_port=0,
                        attempt=attempt, checkpointer=Checkpointer(spec.store, spec.run_id, "launch"),
                        reporter=Reporter(None, 0, "127.0.0.1"), listen_sock=None)
    adapter = NumpyLinear()
    loop = Loop(spec, ctx, adapter.allreduce, hooks)
    return loop.run(adapter), adapter, loop


def test_accumulating_micro_batches_gives_the_weights_of_one_large_batch(split, tmp_path):
    big, big_adapter, _ = _run(_spec(split, str(tmp_path), "big", batch_size=256))
    acc, acc_adapter, loop = _run(_spec(split, str(tmp_path), "acc", batch_size=64, accumulate_steps=4))
    w_big, w_acc = np.frombuffer(big["model_bytes"]), np.frombuffer(acc["model_bytes"])
    np.testing.assert_allclose(w_acc, w_big, rtol=0, atol=1e-12)
    assert loop.batch == 256 and loop.global_batch == 256  # an optimizer step is 4 x 64 rows
    assert all(sizes == [64, 64, 64, 64] for sizes in acc_adapter.micro_sizes)
    assert len(acc_adapter.micro_sizes) == len(big_adapter.micro_sizes) == 2 * ROWS // 256  # optimizer steps
    assert [h["train_loss"] for h in acc["history"]] == pytest.approx([h["train_loss"] for h in big["history"]])
    assert np.abs(w_acc[:3] - TRUE_W).max() < 0.1  # it learned the true weights


def test_checkpoints_and_events_count_optimizer_steps(split, tmp_path):
    _run(_spec(split, str(tmp_path), "acc", batch_size=32, accumulate_steps=8, epochs=1))
    events = Checkpointer(str(tmp_path), "acc").events()
    steps = [e["step"] for e in events if e["event"] == "checkpoint" and e["epoch"] == 0]
    assert steps == [1, 2, 3]  # 4 steps of 256 rows; the last one is the end-of-epoch checkpoint (epoch 1, step 0)
    started = next(e for e in events if e["event"] == "started")
    assert started["batch_size"] == 256 and started["global_batch"] == 256


class _Crash(RuntimeError):
    pass


class _CrashAt(Hook):
    def __init__(self, epoch: int, step: int) -> None:
        self.at = (epoch, step)

    def on_step(self, epoch: int, step: int, steps: int) -> None:
        if (epoch, step) == self.at:
            raise _Crash(f"crash at {self.at}")


def test_resume_after_a_crash_continues_at_the_last_checkpoint_with_the_same_result(split, tmp_path):
    clean, _, _ = _run(_spec(split, str(tmp_path), "clean", batch_size=64, accumulate_steps=2, epochs=2))
    spec = _spec(split, str(tmp_path), "crashed", batch_size=64, accumulate_steps=2, epochs=2)
    with pytest.raises(_Crash):
        _run(spec, hooks=[_CrashAt(1, 3)])
    resumed, adapter, loop = _run(spec, attempt=1)
    assert loop.resume.epoch == 1 and loop.resume.layers[-1].done == 3  # checkpointed after step 3
    assert len(adapter.micro_sizes) == ROWS // 128 - 3  # only the rest of epoch 1 was trained
    np.testing.assert_allclose(np.frombuffer(resumed["model_bytes"]), np.frombuffer(clean["model_bytes"]),
                               rtol=0, atol=1e-12)
    assert [h["epoch"] for h in resumed["history"]] == [0, 1]


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before_with_nothing_lost(split, tmp_path, caplog):
    clean, _, _ = _run(_spec(split, str(tmp_path), "clean", batch_size=64, accumulate_steps=2, epochs=2))
    spec = _spec(split, str(tmp_path), "torn", batch_size=64, accumulate_steps=2, epochs=2)
    with pytest.raises(_Crash):
        _run(spec, hooks=[_CrashAt(1, 3)])
    ck = Checkpointer(str(tmp_path), "torn")
    seq, newest = ck.latest()
    path = tmp_path / newest
    path.write_bytes(path.read_bytes()[:-100])  # the newest checkpoint (epoch 1, step 3) torn
    with caplog.at_level("WARNING"):
        resumed, adapter, loop = _run(spec, attempt=1)
    assert f"checkpoint {seq} is unreadable" in caplog.text
    assert loop.resume.epoch == 1 and loop.resume.layers[-1].done == 2  # the one before: after step 2
    assert len(adapter.micro_sizes) == ROWS // 128 - 2  # step 3 trained again, nothing skipped
    np.testing.assert_allclose(np.frombuffer(resumed["model_bytes"]), np.frombuffer(clean["model_bytes"]),
                               rtol=0, atol=1e-12)  # nothing lost or counted twice: the clean run's weights
    (event,) = [e for e in ck.events() if e["event"] == "resumed"]
    assert (event["from_epoch"], event["from_step"], event["skipped_checkpoints"]) == (1, 2, [seq])
    assert [h["epoch"] for h in resumed["history"]] == [0, 1]


class _StopAfter(Hook):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.seen: List[int] = []

    def on_epoch(self, epoch: int, metrics) -> bool:
        self.seen.append(epoch)
        return epoch >= self.epoch


def test_an_epoch_hook_stops_the_run(split, tmp_path):
    hook = _StopAfter(0)
    result, _, _ = _run(_spec(split, str(tmp_path), "stopped", epochs=5), hooks=[hook])
    assert hook.seen == [0] and [h["epoch"] for h in result["history"]] == [0]
    assert result["model_bytes"]  # the model of the epochs it ran


def test_micro_batches_split_a_step_at_batch_size(split, tmp_path):
    spec = _spec(split, str(tmp_path), "m", batch_size=3, accumulate_steps=3)
    ctx = WorkerContext(rank=0, world_size=1, host="h", master_host="h", master_port=0, aux_port=0, attempt=0,
                        checkpointer=Checkpointer(str(tmp_path), "m"), reporter=Reporter(None, 0, "h"))
    loop = Loop(spec, ctx, lambda v: v)
    x, c, y = np.arange(16).reshape(8, 2), np.zeros((8, 0), np.int64), np.arange(8)
    assert [len(m[2]) for m in loop.micro_batches(x, c, y)] == [3, 3, 2]  # a short tail step
    assert [len(m[2]) for m in loop.micro_batches(x[:2], c[:2], y[:2])] == [2]
    loop.close()


# -- the real frameworks ------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _factories_by_value():
    """The executors cannot import this test module: ship its factories by value."""
    import sys

    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _linear(inputs, model):
    from torch import nn

    class Linear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(len(inputs.numeric), 1)

        def forward(self, x_num, x_cat):
            return self.fc(x_num)

    return Linear()


def _sgd(params, lr):
    import torch
    return torch.optim.SGD(params, lr=lr)


def _torch_weights(model) -> np.ndarray:
    import torch
    state = torch.load(io.BytesIO(model.model_bytes), weights_only=False)["state_dict"]
    return np.concatenate([v.numpy().reshape(-1) for _, v in sorted(state.items())])


@pytest.mark.torch
@pytest.mark.parametrize("workers", [1, 2])
def test_torch_accumulate_4_of_64_equals_batch_256(spark, split, tmp_path, workers):
    from sparktrain.train.estimator import TorchEstimator

    def fit(**kw):
        est = TorchEstimator(numWorkers=workers, epochs=2, learningRate=0.05, labelCol="label", task="regression",
                             store=str(tmp_path), shuffleBuffer=512, seed=5, **kw)
        est.setModelFactory(_linear).setOptimizerFactory(_sgd)
        est.show_progress = False
        return est.fit(split)

    big, acc = fit(batchSize=256), fit(batchSize=64, accumulateSteps=4)
    np.testing.assert_allclose(_torch_weights(acc), _torch_weights(big), rtol=0, atol=1e-5)
    assert len(acc.history) == 2 and acc.history[-1]["train_loss"] < acc.history[0]["train_loss"]


@pytest.mark.tensorflow
def test_keras_accumulate_4_of_64_equals_batch_256_on_2_workers(spark, split, tmp_path):
    import keras

    from sparktrain.train.estimator import KerasEstimator

    def sgd(lr):
        return keras.optimizers.SGD(learning_rate=lr)

    def weights(model) -> np.ndarray:
        path = tmp_path / f"m{len(list(tmp_path.glob('m*.keras')))}.keras"
        path.write_bytes(model.model_bytes)
        net = keras.models.load_model(str(path))
        return np.concatenate([w.reshape(-1) for w in net.get_weights()])

    def fit(**kw):
        est = KerasEstimator(numWorkers=2, epochs=1, learningRate=0.05, labelCol="label", task="regression",
                             store=str(tmp_path), shuffleBuffer=512, seed=5, hiddenUnits=[8], **kw)
        est.setOptimizerFactory(sgd)
        est.show_progress = False
        return est.fit(split)

    big, acc = fit(batchSize=256), fit(batchSize=64, accumulateSteps=4)
    np.testing.assert_allclose(weights(acc), weights(big), rtol=0, atol=1e-5)
    assert acc.launch.param_digests[0] == acc.launch.param_digests[1]  # ranks agree



@pytest.mark.tensorflow
def test_keras_bf16_with_accumulation_learns(spark, split, tmp_path):
    """Keras' mixed_bfloat16 policy on CPU, 2 micro-batches per step: the loss falls."""
    from sparktrain.train.estimator import KerasEstimator

    est = KerasEstimator(numWorkers=1, epochs=3, learningRate=0.01, labelCol="label", task="regression",
                         store=str(tmp_path), batchSize=64, accumulateSteps=2, precision="bf16", hiddenUnits=[16])
    est.show_progress = False
    model = est.fit(split)
    losses = [h["train_loss"] for h in model.history]
    assert losses[-1] < 0.5 * losses[0], losses
    assert np.isfinite(losses).all()

@pytest.mark.torch
@pytest.mark.slow
def test_bf16_on_cpu_trains_flights_to_within_001_auc_of_fp32(spark, flights_sample, tmp_path):
    """bf16 autocast on CPU, on a 5% flights sample preprocessed by the demo's config."""
    import os
    from pathlib import Path

    from sparktrain.config import load_config
    from sparktrain.job import run_preprocess
    from sparktrain.train.evaluate import evaluate_model
    from sparktrain.train.estimator import TorchEstimator

    repo = Path(__file__).resolve().parents[2]
    source = os.path.dirname(flights_sample.inputFiles()[0].replace("file://", ""))
    cfg = load_config(repo / "conf" / "flights.yaml", overrides=[
        f"data.source={source}", "data.scale=1", f"output.path={tmp_path / 'ds'}", "tracking.enabled=false"])
    test = spark.read.parquet(run_preprocess(spark, cfg).split_path("test"))
    auc = {}
    for precision in ("fp32", "bf16"):
        est = TorchEstimator(numWorkers=2, epochs=3, batchSize=512, learningRate=0.002, precision=precision,
                             labelCol="late", store=str(tmp_path / "store"), shuffleBuffer=65536)
        est.show_progress = False
        auc[precision] = evaluate_model(est.fit(str(tmp_path / "ds")), test).metrics["test_auc"]
    assert auc["fp32"] > 0.8, auc  # a 5% sample, 3 epochs (MLlib LR on the whole table: 0.906)
    assert abs(auc["bf16"] - auc["fp32"]) < 0.01, auc
