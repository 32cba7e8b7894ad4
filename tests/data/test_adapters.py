"""TF and torch adapters feed a real one-epoch training step (issue 4 §6, §8)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktrain.data import (
    build_manifest,
    make_reader,
    make_tf_dataset,
    make_torch_dataloader,
    write_manifest,
)
from sparktrain.errors import ConfigError

N = 2000


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """y = x @ [1, -2, 0.5, 3] + 0.1, with x as an array<float> column."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    y = (x @ np.array([1, -2, 0.5, 3], np.float32) + 0.1).astype(np.float32)
    d = tmp_path_factory.mktemp("adapters") / "reg"
    d.mkdir()
    t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4).cast(pa.list_(pa.float32())),
                  "y": y, "id": np.arange(N), "name": [f"r{i}" for i in range(N)]})
    pq.write_table(t, d / "part-0.parquet", row_group_size=512)
    write_manifest(str(d), build_manifest(str(d)))
    return str(d)


@pytest.mark.tensorflow
def test_tf_dataset_spec_and_keras_epoch(regression):
    tf = pytest.importorskip("tensorflow")
    before = threading.active_count()
    with make_tf_dataset(regression, ["x", "y", "id", "name"], batch_size=100, rank=1, world_size=2,
                         seed=1) as ds:
        spec = ds.element_spec
        assert spec["x"] == tf.TensorSpec((None, 4), tf.float32, name="x")
        assert spec["y"] == tf.TensorSpec((None,), tf.float32, name="y")
        assert spec["id"].dtype == tf.int64 and spec["name"].dtype == tf.string
        # one pass = one epoch of this rank's shard: 1000 rows in 10 batches, every row once
        first = list(ds)
        assert len(first) == 10 and sum(int(b["x"].shape[0]) for b in first) == N // 2
        ids = np.concatenate([b["id"].numpy() for b in first])
        assert len(set(ids)) == N // 2
        assert first[0]["name"].numpy()[0].decode() == f"r{ids[0]}"
        second = np.concatenate([b["id"].numpy() for b in ds])
        assert len(set(second)) == N // 2 and not np.array_equal(second, ids)  # next epoch, reshuffled

    # a Keras epoch: the documented pattern (a Reader we hold, repeat(), steps_per_epoch)
    with make_reader(regression, ["x", "y"], 100, num_epochs=None, seed=1) as reader, \
            make_tf_dataset(reader) as train:
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
        probe_x, probe_y = first[0]["x"], first[0]["y"]
        loss_before = float(model.evaluate(probe_x, probe_y, verbose=0))
        hist = model.fit(train.map(lambda b: (b["x"], b["y"])).repeat(), steps_per_epoch=reader.steps_per_epoch,
                         epochs=1, verbose=0)
        loss_after = float(model.evaluate(probe_x, probe_y, verbose=0))
        assert len(hist.history["loss"]) == 1 and reader.steps_per_epoch == N // 100
        assert loss_after < 0.5 * loss_before, (loss_before, loss_after)
    assert threading.active_count() <= before + 1  # TF may keep its own pool thread; ours is gone


@pytest.mark.torch
def test_torch_loader_and_training_epoch(regression):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    with make_torch_dataloader(regression, ["x", "y", "name"], batch_size=64, seed=2) as loader:
        assert len(loader) == -(-N // 64)
        batches = list(loader)
        assert len(batches) == len(loader) and loader.cursor.epoch == 1
        b = batches[0]
        assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.float32 and b["x"].shape == (64, 4)
        assert b["y"].shape == (64,) and isinstance(b["name"], np.ndarray)
        torch.testing.assert_close(b["x"] @ torch.tensor([1, -2, 0.5, 3]) + 0.1, b["y"])

        model = torch.nn.Linear(4, 1)
        w0 = model.weight.detach().clone()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for batch in loader:  # second pass: one full epoch of training
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert len(losses) == len(loader)
        assert np.mean(losses[-5:]) < 0.1 * np.mean(losses[:5])
        assert not torch.equal(model.weight, w0)
        torch.testing.assert_close(model.weight.detach().squeeze(), torch.tensor([1, -2, 0.5, 3.0]),
                                   atol=0.25, rtol=0)


@pytest.mark.torch
def test_torch_loader_over_an_existing_reader(regression):
    pytest.importorskip("torch")
    with make_reader(regression, ["y"], 500, shuffle=False, num_epochs=1) as reader:
        with make_torch_dataloader(reader) as loader:
            ys = [b["y"] for b in loader]
        assert [len(y) for y in ys] == [500] * 4
        with pytest.raises(ConfigError, match="batch_size"):
            with make_torch_dataloader(reader, batch_size=3):
                pass
