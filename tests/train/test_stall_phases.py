"""Which rank a stall blames: the heartbeat's phase tells a rank running its own code from its peers waiting for
it in a collective (probe U: a rank stuck in its forward pass was reported as rank 0 "stuck in a collective,
waiting for its peers", and one stuck in its model factory as a raw gloo timeout on rank 0)."""

from __future__ import annotations

import logging
import time

import pytest

from sparktrain.errors import TrainingStalledError


def _dog(timeout: float):
    from sparktrain.train.watchdog import StallWatchdog

    return StallWatchdog(2, timeout=timeout, on_stall=lambda info: None, poll=3600)


def _beat(dog, rank: int, at: float, phase: str, step: int) -> None:
    dog({"type": "heartbeat", "rank": rank, "host": f"h{rank}", "epoch": 0, "step": step, "phase": phase})
    dog.ranks[rank].update(seen=at, progress=dog.started)


def test_the_rank_in_its_own_code_is_blamed_and_a_shared_step_is_said_to_be_ambiguous():
    dog = _dog(10.0)
    try:
        t0 = dog.started
        _beat(dog, 0, t0 + 12, "collective", 3)  # waiting in DDP's all-reduce
        _beat(dog, 1, t0 + 12, "compute", 3)  # its forward never returns
        info = dog.check(now=t0 + 12)
        assert info["rank"] == 1 and info["phase"] == "compute" and not info["all_in_step"]
        text = str(TrainingStalledError(info, 10.0))
        assert "rank 1 made no progress" in text and "was stuck in a step's computation" in text

        _beat(dog, 0, t0 + 12, "step", 3)  # a fused step (Keras): nobody can be told apart
        _beat(dog, 1, t0 + 12, "step", 3)
        info = dog.check(now=t0 + 12)
        assert info["all_in_step"]
        text = str(TrainingStalledError(info, 10.0))
        assert "was stuck in its training step (forward, backward and the gradients' all-reduce in one call); so " \
               "was every overdue rank, so the heartbeats cannot tell the one stuck in its network" in text
        assert "waiting for its peers" not in text
    finally:
        dog.close()


def test_before_the_first_step_the_rank_in_setup_is_blamed_at_the_start_up_allowance(caplog):
    from sparktrain.train._executor.collectives import STARTUP_S, collective_timeout

    assert collective_timeout(10.0) > STARTUP_S  # gloo's backstop no longer fires before the watchdog can
    dog = _dog(10.0)
    try:
        t0 = dog.started
        _beat(dog, 0, t0 + 30, "collective", 0)  # DDP's first broadcast, waiting for rank 1
        _beat(dog, 1, t0 + 30, "setup", 0)  # its model factory never returns
        with caplog.at_level(logging.WARNING, logger="sparktrain.train.watchdog"):
            assert dog.check(now=t0 + 30) is None  # 10 s is the step timeout; start-up gets 120 s
        said = [r.getMessage() for r in caplog.records]
        assert any("rank 1 (h1): no step for 30 s (epoch 0, step 0, setup); the fit stops at 120 s (the first "
                   "step's allowance, 120 s)" in m for m in said), said
        for rank in range(2):  # still heard from each second: stuck, not silent
            dog.ranks[rank]["seen"] = t0 + STARTUP_S + 1
        info = dog.check(now=t0 + STARTUP_S + 1)
        assert info["rank"] == 1 and info["phase"] == "setup"
        assert "was stuck in setting up (building its network: the model factory" in str(TrainingStalledError(info,
                                                                                                             10.0))
    finally:
        dog.close()


@pytest.mark.torch
def test_a_rank_stuck_in_its_forward_pass_is_the_one_named(spark, tmp_path):
    from pyspark.sql import functions as F

    from sparktrain.train.estimator import TorchEstimator

    def hangs_in_forward(inputs, model_spec):
        """Rank 1's 4th training forward pass blocks for good (the two-row checks run in eval mode)."""
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(inputs.numeric_width, 1)
                self.calls = 0

            def forward(self, x_num, x_cat):
                import torch.distributed as dist

                if self.training and dist.is_initialized() and dist.get_rank() == 1:
                    self.calls += 1
                    if self.calls == 4:
                        time.sleep(10 ** 6)
                return self.lin(x_num)

        return Net()

    df = spark.range(2000).select((F.rand(1) * 2 - 1).alias("x")).withColumn("label", (F.col("x") > 0).cast("double"))
    est = TorchEstimator(numWorkers=2, epochs=1, batchSize=64, labelCol="label", store=str(tmp_path / "store"),
                         stallTimeout=8.0).setModelFactory(hangs_in_forward)
    est.show_progress = False
    with pytest.raises(TrainingStalledError) as info:
        est.fit(df)
    err = info.value
    assert err.rank == 1 and err.info["phase"] == "compute" and err.info["step"] == 3, err.info
    assert "rank 1 made no progress" in str(err) and "waiting for its peers" not in str(err)
